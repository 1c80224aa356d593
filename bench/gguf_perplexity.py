#!/usr/bin/env python3
"""What each `brisk export gguf --type` costs, measured in llama.cpp.

Exports one checkpoint in every GGUF type, runs each file in llama.cpp (npm
node-llama-cpp, prebuilt CPU binaries, through tests/export/run_gguf.mjs) on
the same windows of a dataset's validation tokens, and prints each type's
file size and perplexity, with the change against the f32 file in the same
run. Writes the table as JSON with --json.

  python3 bench/gguf_perplexity.py --brisk build/release/brisk \
      --checkpoint runs/demo --data data/kjv-bytes [--windows 8] [--json out.json]

Each window is the model's whole context (block_size tokens) taken at evenly
spaced offsets of the first validation shard; every position but the first
scores the next token, so a window of T tokens scores T - 1.
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TYPES = ["f32", "f16", "q8_0", "q6_k", "q5_k_m", "q5_k_s", "q4_k_m", "q4_k_s", "q4_0"]


def die(msg):
    print(f"gguf_perplexity: {msg}", file=sys.stderr)
    sys.exit(2)


def read_val_tokens(data_dir):
    """The first validation shard's token ids (docs/formats.md: 64-byte header)."""
    path = os.path.join(data_dir, "val_0000.bin")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        die(f"cannot read {path}: {e}")
    if len(raw) < 64 or raw[:8] != b"BRISKTOK":
        die(f"{path} is not a brisk token shard")
    dtype, _vocab, count = struct.unpack_from("<Iqq", raw, 12)
    fmt, size = ("H", 2) if dtype == 0 else ("i", 4)
    if len(raw) < 64 + count * size:
        die(f"{path} is shorter than its {count} tokens")
    return list(struct.unpack_from(f"<{count}{fmt}", raw, 64))


def block_size(brisk, checkpoint, tmp):
    """The model's context, from the f32 export's summary line."""
    out = os.path.join(tmp, "probe.gguf")
    r = subprocess.run([brisk, "export", "gguf", "--checkpoint", checkpoint, "--out", out],
                       capture_output=True, text=True)
    if r.returncode != 0:
        die(f"export failed: {r.stderr.strip()}")
    for word in r.stdout.split(","):
        if word.strip().startswith("block "):
            return int(word.split()[1])
    die("no block size in the export summary")


def perplexity(modules, gguf, windows, tmp):
    nll, scored = 0.0, 0
    for w in windows:
        ids_file, probs_file = os.path.join(tmp, "ids.bin"), os.path.join(tmp, "probs.bin")
        with open(ids_file, "wb") as f:
            f.write(struct.pack(f"<{len(w)}i", *w))
        r = subprocess.run(["node", os.path.join(ROOT, "tests", "export", "run_gguf.mjs"), modules, gguf, ids_file,
                            probs_file], capture_output=True, text=True)
        if r.returncode != 0:
            die(f"llama.cpp run failed on {gguf}: {r.stderr.strip() or r.stdout.strip()}")
        vocab = json.loads(r.stdout.strip().splitlines()[-1])["vocab"]
        with open(probs_file, "rb") as f:
            raw = f.read()
        for t in range(len(w) - 1):
            p = struct.unpack_from("<f", raw, 4 * (t * vocab + w[t + 1]))[0]
            nll -= math.log(max(p, 1e-30))
            scored += 1
    return math.exp(nll / scored), scored


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--brisk", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--data", required=True, help="a brisk token-shard dataset (its val_0000.bin)")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--modules", default=os.environ.get("BRISK_LLAMA_NPM_MODULES",
                                                       os.path.join(ROOT, "third_party", "npm-llama",
                                                                    "node_modules")))
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.windows < 1:
        die("--windows must be at least 1")
    types = [t for t in a.types.split(",") if t]
    if "f32" not in types:
        types.insert(0, "f32")
    tokens = read_val_tokens(a.data)
    with tempfile.TemporaryDirectory() as tmp:
        T = block_size(a.brisk, a.checkpoint, tmp)
        if len(tokens) < T:
            die(f"the validation shard has {len(tokens)} tokens, fewer than one window of {T}")
        step = (len(tokens) - T) // max(1, a.windows - 1) if a.windows > 1 else 0
        windows = [tokens[i * step:i * step + T] for i in range(a.windows)]
        rows = []
        for t in types:
            out = os.path.join(tmp, f"model-{t}.gguf")
            r = subprocess.run([a.brisk, "export", "gguf", "--checkpoint", a.checkpoint, "--out", out, "--type", t],
                               capture_output=True, text=True)
            if r.returncode != 0:
                die(f"export --type {t} failed: {r.stderr.strip()}")
            ppl, scored = perplexity(a.modules, out, windows, tmp)
            rows.append({"type": t, "bytes": os.path.getsize(out), "perplexity": ppl, "tokens_scored": scored})
    base = next(r for r in rows if r["type"] == "f32")
    print(f"{'type':<8} {'file':>12} {'perplexity':>11} {'vs f32':>8}")
    for r in rows:
        r["vs_f32"] = r["perplexity"] / base["perplexity"] - 1
        print(f"{r['type']:<8} {r['bytes']:>12,} {r['perplexity']:>11.4f} {100 * r['vs_f32']:>+7.2f}%")
    print(f"{rows[0]['tokens_scored']} tokens scored in {a.windows} windows of {T}")
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            json.dump({"checkpoint": a.checkpoint, "windows": a.windows, "window": T, "rows": rows}, f, indent=1)
        os.replace(a.json + ".tmp", a.json)


if __name__ == "__main__":
    main()
