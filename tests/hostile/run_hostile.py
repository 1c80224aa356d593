#!/usr/bin/env python3
"""Runs the real `brisk` binary on every hostile input of make_hostile.py.

Each case must end the way a user error ends: exit code 2, "brisk: error:" on
stderr, no "internal error", and every fragment the case expects (the file,
the field, the problem) in the message. Any other outcome (a crash, exit 3, a
vague message, success) is reported with the command and its stderr, and the
run exits 1.

Usage:
  run_hostile.py --brisk build/release/brisk --workdir /tmp/hostile
  run_hostile.py ... --markdown      # also print the table of docs/hostile-inputs.md
  run_hostile.py ... -k st_          # only the cases whose name contains st_
"""

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_hostile  # noqa: E402

TIMEOUT_S = 60


def run_case(brisk, args):
    """(exit code or a description of the signal, stderr)"""
    try:
        r = subprocess.run([brisk] + args, capture_output=True, text=True, errors="replace", timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"timeout after {TIMEOUT_S} s", ""
    if r.returncode < 0:
        return f"killed by {signal.Signals(-r.returncode).name}", r.stderr
    return r.returncode, r.stderr


def first_error_line(stderr):
    for line in stderr.splitlines():
        if line.startswith("brisk: "):
            return line
    lines = [l for l in stderr.splitlines() if l.strip()]
    return lines[-1] if lines else ""


def problems_of(case, code, stderr, case_dir):
    # The case's directory is in most messages and its name could match a
    # fragment ("header", "loop"): fragments are looked for without it.
    message = stderr.replace(case_dir, "<case>")
    out = []
    if code != 2:
        out.append(f"exit code {code}, expected 2")
    if "brisk: error:" not in stderr:
        out.append("no 'brisk: error:' line")
    if "internal error" in stderr:
        out.append("'internal error' in the message")
    out += [f"'{f}' not in the message" for f in case.expect if f not in message]
    return out


def markdown(rows, workdir):
    def short(s):
        return s.replace(workdir + "/", "")

    def cell(s):
        return short(s).replace("|", "\\|")

    print("| # | loader | hostile input | command | exit | message (first line) |")
    print("|---|---|---|---|---|---|")
    for i, (case, args, code, stderr) in enumerate(rows, 1):
        cmd = "brisk " + shlex.join(args)
        msg = first_error_line(stderr)
        if msg.startswith("brisk: error: "):
            msg = msg[len("brisk: error: "):]
        print(f"| {i} | {case.loader} | {cell(case.what)} | `{cell(cmd)}` | {code} | {cell(msg)} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brisk", required=True, help="the brisk binary to test")
    ap.add_argument("--workdir", required=True, help="scratch directory (recreated)")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table of every case and its message")
    ap.add_argument("-k", default="", help="run only cases whose name contains this")
    a = ap.parse_args()
    brisk, workdir = os.path.abspath(a.brisk), os.path.abspath(a.workdir)
    if a.k:
        make_hostile.CASES[:] = [c for c in make_hostile.CASES if a.k in c.name]

    t0 = time.time()
    cases = make_hostile.make_all(brisk, workdir)
    rows, failed = [], []
    for case, args in cases:
        code, stderr = run_case(brisk, args)
        rows.append((case, args, code, stderr))
        problems = problems_of(case, code, stderr, os.path.join(workdir, case.name))
        status = "ok  " if not problems else "FAIL"
        print(f"{status} {case.name:32s} exit {code}  {first_error_line(stderr)[:150]}")
        if problems:
            failed.append((case, args, problems, stderr))

    for case, args, problems, stderr in failed:
        print(f"\n==== {case.name} ({case.loader}: {case.what})")
        print("command: " + shlex.join([brisk] + args))
        for p in problems:
            print("  - " + p)
        print("stderr:\n" + stderr.strip()[-3000:])
    if a.markdown:
        print()
        markdown(rows, workdir)
    print(f"\n{len(cases) - len(failed)}/{len(cases)} hostile inputs give a clean exit-2 error "
          f"({time.time() - t0:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
