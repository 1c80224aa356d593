#!/usr/bin/env python3
"""Where the traced steps of `brisk train --trace FILE` went, as text.

Per traced step: its time and the trainer's spans (data wait, forward +
backward, the optimizer's update). Then the kernels, grouped by op and input
shapes, as the mean time per step, largest first: the table tells a product's
forward from its two backward products, which `--profile` (by op) does not.
Times come from the trace's spans, which the trainer takes with a device
synchronisation after every kernel: the kernels' sum is above the step time
of an untraced (graph-replayed) step.

    python3 scripts/trace_summary.py trace.json [--top 30]
"""
import argparse
import collections
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    with open(args.trace) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    spans = [e for e in events if e.get("ph") == "X"]
    steps = sorted({e["args"]["step"] for e in spans if e.get("cat") == "step"})
    if not steps:
        print(f"{args.trace}: no traced step", file=sys.stderr)
        return 1
    n = len(steps)
    for s in steps:
        whole = [e for e in spans if e.get("cat") == "step" and e["args"]["step"] == s]
        parts = collections.defaultdict(float)
        for e in spans:
            if e["args"].get("step") == s and e.get("cat") not in ("step", "forward", "backward"):
                parts[e["name"]] += e["dur"] / 1e3
        print(f"step {s}: {whole[0]['dur'] / 1e3:.2f} ms | "
              + " | ".join(f"{k} {v:.2f} ms" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])))
    kernels = collections.defaultdict(lambda: [0.0, 0])
    total = 0.0
    for e in spans:
        if e.get("cat") in ("forward", "backward"):
            shapes = " ".join(e["args"].get("inputs") or [])
            key = (e["name"], e["cat"], shapes)
            kernels[key][0] += e["dur"] / 1e3
            kernels[key][1] += 1
            total += e["dur"] / 1e3
    print(f"\nkernels: {total / n:.2f} ms per step (each timed alone), by op and inputs, mean per step:")
    print(f"{'ms':>8} {'share':>6} {'calls':>5}  op (pass) inputs")
    rows = sorted(kernels.items(), key=lambda kv: -kv[1][0])
    for (name, cat, shapes), (ms, calls) in rows[:args.top]:
        print(f"{ms / n:8.3f} {100 * ms / total:5.1f}% {calls // n:5d}  {name} ({cat}) {shapes}")
    rest = sum(ms for _, (ms, _) in rows[args.top:])
    if rest:
        print(f"{rest / n:8.3f} {100 * rest / total:5.1f}%        the other {len(rows) - args.top} groups")
    return 0


if __name__ == "__main__":
    sys.exit(main())
