"""What the generation checks share: a one-step byte-level GPT trained from
its own few kilobytes of text, and the texts `brisk generate --no-stream`
prints."""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys


def die(msg):
    print(f"{os.path.basename(sys.argv[0])}: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def run(cmd, **kw):
    """The command's result, its output decoded as UTF-8 without newline
    translation (text=True would turn a generated '\r' into '\n')."""
    r = subprocess.run(cmd, capture_output=True, **kw)
    r.stdout, r.stderr = (b.decode("utf-8", "surrogateescape") for b in (r.stdout, r.stderr))
    return r


def train_tiny(brisk, workdir):
    """A one-step byte-level GPT under workdir/run (its draws are close to
    uniform); returns the run directory."""
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    run_dir = os.path.join(workdir, "run")
    text_file, data_dir = os.path.join(workdir, "text.txt"), os.path.join(workdir, "data")
    with open(text_file, "w") as f:  # its own few kilobytes: the test needs no prepared corpus
        f.write("".join(f"line {i}: the quick brown fox jumps over the lazy dog {i * i}\n" for i in range(400)))
    r = run([brisk, "data", "prepare", "--input", text_file, "--tokenizer", "bytes", "--out", data_dir,
             "--val-fraction", "0.1"])
    if r.returncode != 0:
        die(f"preparing the tiny corpus failed: {r.stderr.strip()}")
    sets = {"model.n_layer": "1", "model.n_embd": "32", "model.n_head": "2", "model.block_size": "256",
            "model.vocab_size": "256", "data.dir": json.dumps(data_dir), "train.steps": "1",
            "train.batch": "2", "train.seq": "32", "train.eval_every": "1000", "train.log_every": "1",
            "checkpoint.dir": json.dumps(run_dir), "checkpoint.every": "1"}
    cfg = os.path.join(workdir, "tiny.toml")
    with open(cfg, "w") as f:
        f.write("[model]\n[data]\n[train]\n[checkpoint]\n")
    cmd = [brisk, "train", "-c", cfg]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    r = run(cmd)
    if r.returncode != 0:
        die(f"training the tiny model failed: {r.stderr.strip()[-2000:]}")
    return run_dir


def setup():
    """The checks' arguments (--brisk, --workdir, --batch) and the tiny model
    trained under the workdir."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--brisk", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--batch", type=int, default=12)
    a = ap.parse_args()
    return a, train_tiny(a.brisk, a.workdir)


def generated(r, batch, prompt, name):
    """(finish reason, text after the prompt) of each of a `brisk generate --no-stream` run's texts."""
    if r.returncode != 0:
        die(f"{name}: brisk generate failed: {r.stderr.strip()}")
    blocks = re.split(r"^=== (\d+): (.*)\n", r.stdout, flags=re.M)[1:]
    if len(blocks) != 3 * batch:
        die(f"{name}: expected {batch} texts, got output:\n{r.stdout[:2000]}")
    out = []
    for i in range(batch):
        reason, text = blocks[3 * i + 1], blocks[3 * i + 2]
        if not text.startswith(prompt):
            die(f"{name}: text {i} does not start with the prompt: {text!r}")
        out.append((reason, text[len(prompt):].removesuffix("\n")))
    return out
