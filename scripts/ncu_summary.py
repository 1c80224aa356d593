#!/usr/bin/env python3
"""Where the GPU's time goes, by kernel, from Nsight Compute's raw CSV.

scripts/gpu_check.sh's `ncu` stage runs `brisk train` for a few G1 steps
under `ncu --csv --page raw` with four metrics (duration, DRAM bytes read
and written, SM throughput) and this prints, per kernel function (template
arguments kept, so f32 and bf16 instances stay apart): calls and time per
step, the bytes it moved, the DRAM bandwidth it reached and how busy the SMs
were. A memory-bound kernel far below the card's bandwidth, or a product far
below its matrix peak, is where a step can still get faster. ncu runs every
kernel alone, so small kernels show their own time without the gaps between
launches that a replayed graph also has.

    python3 scripts/ncu_summary.py ncu.csv --steps 2 [--top 40]
"""
import argparse
import collections
import csv
import io
import re
import sys

DURATION = "gpu__time_duration.sum"
READ = "dram__bytes_read.sum"
WRITE = "dram__bytes_write.sum"
SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
# Unit multipliers to seconds and bytes.
SCALE = {"ns": 1e-9, "nsecond": 1e-9, "us": 1e-6, "usecond": 1e-6, "ms": 1e-3, "msecond": 1e-3, "s": 1.0,
         "second": 1.0, "byte": 1.0, "Kbyte": 1e3, "KB": 1e3, "Mbyte": 1e6, "MB": 1e6, "Gbyte": 1e9, "GB": 1e9,
         "%": 1.0, "": 1.0}


def short_name(full):
    """The kernel's name without namespaces and argument list."""
    name = re.sub(r"^void ", "", full)
    # The anonymous namespace, as the demangler or ncu writes it ("unnamed>::": ncu drops the '<').
    name = re.sub(r"\(anonymous namespace\)::|<?unnamed>::", "", name)
    depth = 0
    for i, ch in enumerate(name):  # the argument list: the first '(' outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and i > 0:
            name = name[:i]
            break
    return re.sub(r"\bbrisk::cuda::", "", name)[:110]


def read_rows(path):
    with open(path, errors="replace") as f:
        lines = [l for l in f if l.startswith('"')]  # the program's own output is interleaved
    if not lines:
        return [], {}
    reader = csv.DictReader(io.StringIO("".join(lines)))
    rows, units = [], {}
    for row in reader:
        if row.get("ID", "") == "":  # the units row
            units = row
            continue
        if row.get("ID") == "ID":  # a repeated header
            continue
        rows.append(row)
    return rows, units


def value(row, units, metric):
    raw = (row.get(metric) or "").replace(",", "")
    try:
        return float(raw) * SCALE.get(units.get(metric, ""), 1.0)
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--steps", type=float, default=1.0, help="training steps the profile covers (per-step means)")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    rows, units = read_rows(args.csv)
    if not rows:
        print(f"{args.csv}: no kernel rows (did ncu run?)", file=sys.stderr)
        return 1
    groups = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])  # calls, seconds, bytes, sm% x seconds
    for row in rows:
        t = value(row, units, DURATION)
        g = groups[short_name(row.get("Kernel Name", "?"))]
        g[0] += 1
        g[1] += t
        g[2] += value(row, units, READ) + value(row, units, WRITE)
        g[3] += value(row, units, SM) * t
    total = sum(g[1] for g in groups.values())
    n = args.steps
    print(f"{len(rows)} kernels, {1e3 * total / n:.2f} ms per step (each run alone under ncu), "
          f"{sum(g[2] for g in groups.values()) / n / 1e9:.2f} GB of DRAM traffic per step")
    print(f"{'ms/step':>8} {'share':>6} {'calls':>6} {'GB/step':>8} {'TB/s':>6} {'SM%':>5}  kernel")
    ordered = sorted(groups.items(), key=lambda kv: -kv[1][1])
    for name, (calls, secs, nbytes, smw) in ordered[:args.top]:
        bw = nbytes / secs / 1e12 if secs > 0 else 0.0
        sm = smw / secs if secs > 0 else 0.0
        print(f"{1e3 * secs / n:8.3f} {100 * secs / total:5.1f}% {calls / n:6.1f} {nbytes / n / 1e9:8.3f} "
              f"{bw:6.2f} {sm:5.1f}  {name}")
    rest = ordered[args.top:]
    if rest:
        print(f"{1e3 * sum(g[1] for _, g in rest) / n:8.3f}        the other {len(rest)} kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
