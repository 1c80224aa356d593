#!/usr/bin/env python3
"""What response_format json_object costs per generated token.

Starts `brisk serve` on a checkpoint with one slot, then sends the same
sampled /v1/completions request (ignore_eos, so every answer runs to
max_tokens) with and without {"type": "json_object"}, the two interleaved
in every round, and prints the median time per completion token of each
and the median of the per-round ratios with its range. Writes them as JSON
with --json.

  python3 bench/json_mode.py --brisk build/release/brisk --checkpoint runs/w1 \
      [--rounds 12] [--max-tokens 64] [--threads 2] [--json out.json]

A GPT-2-vocabulary checkpoint (W1) is the case that matters: the mask is a
pass over the vocabulary per token (docs/serving.md, JSON output).
"""
import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t = time.perf_counter()
    out = json.loads(urllib.request.urlopen(req, timeout=600).read())
    return time.perf_counter() - t, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--brisk", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", default="And God said")
    ap.add_argument("--json")
    a = ap.parse_args()
    port = free_port()
    server = subprocess.Popen([a.brisk, "serve", "--model", a.checkpoint, "--port", str(port), "--slots", "1",
                               "--threads", str(a.threads)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(600):  # until /health answers 200
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.1)
        else:
            sys.exit("json_mode: the server did not come up")
        base = {"prompt": a.prompt, "max_tokens": a.max_tokens, "temperature": 0.8, "ignore_eos": True}
        ms = {"plain": [], "json_object": []}
        post(port, dict(base, seed=0))  # warm-up, untimed
        for r in range(a.rounds):
            for kind in ms:
                body = dict(base, seed=r)
                if kind == "json_object":
                    body["response_format"] = {"type": "json_object"}
                dt, out = post(port, body)
                ms[kind].append(dt * 1e3 / out["usage"]["completion_tokens"])
        ratios = [j / p for j, p in zip(ms["json_object"], ms["plain"])]
        result = {k: {"median_ms_per_token": statistics.median(v), "min": min(v), "max": max(v)} for k, v in ms.items()}
        result["ratio"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
        result.update(checkpoint=a.checkpoint, rounds=a.rounds, max_tokens=a.max_tokens, threads=a.threads)
        for k in ms:
            print(f"{k:12s} {result[k]['median_ms_per_token']:.2f} ms/token [{result[k]['min']:.2f}, {result[k]['max']:.2f}]")
        print(f"json_object / plain: {result['ratio']['median']:.2f}x [{result['ratio']['min']:.2f}, {result['ratio']['max']:.2f}]")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=1)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
