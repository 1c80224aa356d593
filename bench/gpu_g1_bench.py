#!/usr/bin/env python3
"""G1 on one GPU: brisk against PyTorch's strongest configuration, interleaved.

Each round runs `brisk train` (configs/g1.toml: GPT-2 124M, bf16, flash
attention, the step captured as a CUDA graph) and bench/torch_gpu_peer.py
(bf16 autocast, torch.compile, SDPA, fused AdamW) for the same batch, steps
and data, one after the other, so a slow spell of the machine lands on both.
Per side: the median step time of the steps after warm-up, per round; the
headline is the median over rounds with the min-max spread, and the ratio is
formed within each round. MFU is against the card's dense bf16 peak (brisk's
start-up line names it, from the GPU's name). Writes JSON with every number.

    python3 bench/gpu_g1_bench.py --brisk build/release/brisk --batch 16 --rounds 3 --out g1.json
"""
import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run_brisk(args, run_dir, extra_sets=()):
    cmd = [args.brisk, "train", "--config", os.path.join(ROOT, "configs", "g1.toml"), "--no-progress",
           "--set", f"train.batch={args.batch}", "--set", f"train.steps={args.warmup + args.steps}",
           "--set", f"data.dir={args.data}", "--set", f"checkpoint.dir={run_dir}",
           "--set", f"checkpoint.every={10 ** 9}"]
    env = dict(os.environ)
    for kv in list(args.set) + list(extra_sets):
        if kv.startswith("env."):  # an environment variable for this run, e.g. env.BRISK_CUDA_GEMM_TUNE=1
            name, _, value = kv[4:].partition("=")
            env[name] = value
        elif kv.startswith("bin="):  # another brisk binary, e.g. the build before a change, in the same rounds
            cmd[0] = kv[4:]
        else:
            cmd += ["--set", kv]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if r.returncode != 0:
        return {"engine": "brisk", "error": (r.stderr or r.stdout)[-3000:]}
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl")) if l.strip()]
    ms = sorted(row["ms_per_step"] for row in rows[args.warmup:])
    m = re.search(r"peak (\d+) GFLOP/s", r.stderr)
    head = [l for l in r.stderr.splitlines() if l.startswith(("brisk train:", "precision", "recompute"))]
    # The driver's figure beside the plan's (what brisk tune's fixed GPU share is checked against).
    memory = [l for l in r.stdout.splitlines() if l.startswith("GPU memory")]
    return {"engine": "brisk", "median_ms": statistics.median(ms), "min_ms": ms[0], "max_ms": ms[-1],
            "losses": [row["loss"] for row in rows], "peak_gflops": float(m.group(1)) if m else 0.0,
            "startup": head, "gpu_memory": memory[0] if memory else ""}


def run_torch(args):
    cmd = [args.python, os.path.join(HERE, "torch_gpu_peer.py"), "--data", args.data, "--batch", str(args.batch),
           "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if args.no_compile:
        cmd.append("--no-compile")
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if r.returncode != 0 or not lines:
        return {"engine": "pytorch", "error": (r.stderr or r.stdout)[-3000:]}
    return json.loads(lines[-1])


def diverged(result):
    """A round whose losses are not all finite numbers (NaN is written as null
    by brisk, as NaN by the peer) failed: its speed is no figure to report."""
    if not result or "losses" not in result:
        return result
    bad = [l for l in result["losses"] if not isinstance(l, (int, float)) or not math.isfinite(l)]
    if bad:
        return {"engine": result.get("engine", "?"), "error": f"loss not finite at {len(bad)} of "
                f"{len(result['losses'])} steps (diverged)"}
    return result


def strict_json(x):
    """The report with every non-finite number as null: json.dump writes bare
    NaN otherwise, which strict JSON readers refuse."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: strict_json(v) for k, v in x.items()}
    if isinstance(x, list):
        return [strict_json(v) for v in x]
    return x


def loss_agreement(pairs):
    """How far a variant's per-step losses stray from the default's in the
    same rounds (a change that should not alter the math shows 0): the
    largest difference over every round's steps, and at the last step."""
    diffs, last = [], []
    for a, b in pairs:
        la, lb = a.get("losses") or [], b.get("losses") or []
        n = min(len(la), len(lb))
        if n:
            diffs += [abs(x - y) for x, y in zip(la[:n], lb[:n])]
            last.append(abs(la[n - 1] - lb[n - 1]))
    if not diffs:
        return None
    return {"max_abs_diff": max(diffs), "last_abs_diff": max(last), "steps": len(diffs) // len(last)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--brisk", default=os.path.join(ROOT, "build", "release", "brisk"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "kjv-gpt2"))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--no-compile", action="store_true", help="the peer in eager mode")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="another override for brisk train (repeatable), e.g. model.fused_classifier=false")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE[,KEY=VALUE]",
                    help="another brisk configuration run in every round beside the default one "
                         "(reported, never the headline), e.g. unfused:model.fuse_bias_gelu=false; "
                         "env.NAME=VALUE sets an environment variable instead, bin=PATH runs another brisk binary")
    ap.add_argument("--out", help="JSON report path")
    args = ap.parse_args()
    if args.batch < 1 or args.rounds < 1 or args.warmup < 0:
        ap.error("--batch and --rounds must be at least 1, --warmup at least 0")
    if args.steps <= args.warmup:
        ap.error(f"--steps ({args.steps}) must be more than --warmup ({args.warmup}): the timed steps are those after it")

    tokens_per_step = args.batch * 1024
    V, L, C, T = 50304, 12, 768, 1024
    n_params = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    flops_per_token = 6 * n_params + 12 * L * T * C
    variants = []
    for v in args.variant:
        name, _, sets = v.partition(":")
        variants.append((name, [kv for kv in sets.split(",") if kv]))
    rounds = []
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="brisk_g1_") as run_dir:
            b = diverged(run_brisk(args, run_dir))
        others = {}
        for name, sets in variants:
            with tempfile.TemporaryDirectory(prefix="brisk_g1_") as run_dir:
                others[name] = diverged(run_brisk(args, run_dir, sets))
        t = None if args.no_peer else diverged(run_torch(args))
        rounds.append({"brisk": b, "pytorch": t, "variants": others})
        print(f"round {r + 1}/{args.rounds}: brisk {b.get('median_ms', b.get('error'))} ms"
              + "".join(f", {n} {x.get('median_ms', x.get('error'))} ms" for n, x in others.items())
              + ("" if t is None else f", pytorch {t.get('median_ms', t.get('error'))} ms"), file=sys.stderr, flush=True)

    report = {"workload": "G1", "batch": args.batch, "seq": T, "steps": args.steps, "warmup": args.warmup,
              "rounds": rounds, "flops_per_token": flops_per_token}
    peak = max((x["brisk"].get("peak_gflops", 0) for x in rounds), default=0) * 1e9

    failed_rounds = []  # (side, round): a headline over fewer rounds than asked says so, and the run exits 1

    def summary(results, side):  # per-round results of one engine or variant -> the headline figures
        tps = [tokens_per_step / (x["median_ms"] / 1e3) for x in results if x and "median_ms" in x]
        failed_rounds.extend((side, i + 1) for i, x in enumerate(results) if x and "median_ms" not in x)
        if not tps:
            return None
        med = statistics.median(tps)
        return {"tokens_per_s": med, "tokens_per_s_min": min(tps), "tokens_per_s_max": max(tps), "rounds": len(tps),
                "ms_per_step": tokens_per_step / med * 1e3, "mfu": med * flops_per_token / peak if peak else None}

    for side in ("brisk", "pytorch"):
        s = summary([x[side] for x in rounds], side)
        if s:
            report[side] = s
    for name, sets in variants:
        s = summary([x["variants"][name] for x in rounds], name)
        if s:
            # The default's speed over the variant's, formed within each round like the peer's ratio.
            over = [x["variants"][name]["median_ms"] / x["brisk"]["median_ms"] for x in rounds
                    if "median_ms" in x["variants"][name] and "median_ms" in x["brisk"]]
            report.setdefault("variants", {})[name] = dict(s, sets=sets, brisk_over_variant={
                "median": statistics.median(over), "min": min(over), "max": max(over)} if over else None,
                losses_vs_brisk=loss_agreement([(x["brisk"], x["variants"][name]) for x in rounds]))
    ratios = [x["pytorch"]["median_ms"] / x["brisk"]["median_ms"] for x in rounds
              if x["pytorch"] and "median_ms" in x["pytorch"] and "median_ms" in x["brisk"]]
    if ratios:
        report["ratio_brisk_over_pytorch"] = {"median": statistics.median(ratios), "min": min(ratios),
                                              "max": max(ratios)}
    print(f"G1 GPT-2 124M, batch {args.batch} x seq {T}, {args.rounds} rounds of {args.steps} steps "
          f"(after {args.warmup} warm-up); peak {peak / 1e12:.0f} TFLOP/s bf16")
    for side in ("brisk", "pytorch"):
        if side in report:
            s = report[side]
            mfu = f"{100 * s['mfu']:.1f}%" if s["mfu"] else "-"
            print(f"  {side:8s} {s['tokens_per_s']:10.0f} tok/s  ({s['tokens_per_s_min']:.0f}-{s['tokens_per_s_max']:.0f})"
                  f"  {s['ms_per_step']:7.1f} ms/step  MFU {mfu}")
        else:
            errs = [x[side].get("error", "") for x in rounds if x[side]]
            print(f"  {side:8s} failed: {errs[0][-600:] if errs else 'not run'}")
    for name, v in report.get("variants", {}).items():
        mfu = f"{100 * v['mfu']:.1f}%" if v["mfu"] else "-"
        q = v.get("brisk_over_variant")
        vs = f", brisk / it {q['median']:.3f}x ({q['min']:.3f}-{q['max']:.3f})" if q else ""
        agree = v.get("losses_vs_brisk")
        if agree:
            vs += (f"; losses {'equal' if agree['max_abs_diff'] == 0 else 'within %.2g' % agree['max_abs_diff']}"
                   f" over {agree['steps']} steps (last step within {agree['last_abs_diff']:.2g})")
        print(f"  variant {name} ({','.join(v['sets'])}): {v['tokens_per_s']:.0f} tok/s "
              f"({v['tokens_per_s_min']:.0f}-{v['tokens_per_s_max']:.0f}), {v['ms_per_step']:.1f} ms/step, MFU {mfu}{vs}")
    if ratios:
        q = report["ratio_brisk_over_pytorch"]
        print(f"  brisk / pytorch tokens/s: {q['median']:.2f}x ({q['min']:.2f}-{q['max']:.2f} over "
              f"{len(ratios)} rounds)")
    if failed_rounds:
        report["failed_rounds"] = [{"side": s, "round": r} for s, r in failed_rounds]
        print("  FAILED rounds (left out of the figures above): " +
              ", ".join(f"{s} round {r}" for s, r in failed_rounds))
    if args.out:  # written whole or not at all
        with open(args.out + ".tmp", "w") as f:
            json.dump(strict_json(report), f, indent=1, allow_nan=False)
        os.replace(args.out + ".tmp", args.out)
    return 1 if failed_rounds else 0


if __name__ == "__main__":
    sys.exit(main())
