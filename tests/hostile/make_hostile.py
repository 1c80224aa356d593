#!/usr/bin/env python3
"""Hostile input files for every loader of the brisk CLI.

Each case is one damaged or malicious file (a safetensors header with a
negative dimension, a state.json whose n_layer is a string, a token shard whose
count overflows, an encoder.json with a duplicate id, a TOML config with a
wrong type, ...) plus the `brisk` command that loads it and the fragments its
error message must hold. run_hostile.py runs them; this file only makes them.

The damaged files are derived from good ones made first under OUTDIR/_base: a
small token dataset written here, a one-step checkpoint trained by the real
`brisk train` on it, a small GPT-2 style vocabulary, a text file and a FASTA
file. Only the standard library is used (xxh64, which token shards carry as
their checksum, is implemented below).

Usage: make_hostile.py --brisk build/release/brisk OUTDIR
  writes every case under OUTDIR/<case>/ and prints each case's command.
"""

import argparse
import json
import os
import shlex
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Callable, List

# ---- xxh64 (the checksum of a token shard's payload) -------------------------------------

_M = (1 << 64) - 1
_P1, _P2, _P3, _P4, _P5 = (11400714785074694791, 14029467366897019727, 1609587929392839161,
                           9650029242287828579, 2870177450012600261)


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & _M


def _round(acc, lane):
    return (_rotl((acc + lane * _P2) & _M, 31) * _P1) & _M


def xxh64(data: bytes, seed: int = 0) -> int:
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & _M, (seed + _P2) & _M, seed & _M, (seed - _P1) & _M]
        while i + 32 <= n:
            for k in range(4):
                v[k] = _round(v[k], int.from_bytes(data[i:i + 8], "little"))
                i += 8
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M
        for k in range(4):
            h = ((h ^ _round(0, v[k])) * _P1 + _P4) & _M
    else:
        h = (seed + _P5) & _M
    h = (h + n) & _M
    while i + 8 <= n:
        h = (_rotl(h ^ _round(0, int.from_bytes(data[i:i + 8], "little")), 27) * _P1 + _P4) & _M
        i += 8
    if i + 4 <= n:
        h = (_rotl(h ^ (int.from_bytes(data[i:i + 4], "little") * _P1 & _M), 23) * _P2 + _P3) & _M
        i += 4
    while i < n:
        h = (_rotl(h ^ (data[i] * _P5 & _M), 11) * _P1) & _M
        i += 1
    h ^= h >> 33
    h = h * _P2 & _M
    h ^= h >> 29
    h = h * _P3 & _M
    return h ^ (h >> 32)


# ---- file writers ------------------------------------------------------------------------


def write(path, data):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def shard_bytes(tokens, vocab, dtype=None, count=None, checksum=None, magic=b"BRISKTOK", version=1):
    """A token shard (src/data/shards.cpp): 64-byte header, then uint16 or int32 tokens."""
    if dtype is None:
        dtype = 0 if vocab <= 65536 else 1
    payload = b"".join(struct.pack("<H" if dtype == 0 else "<i", t) for t in tokens)
    header = struct.pack("<8sIIqqQ24x", magic, version, dtype, vocab, len(tokens) if count is None else count,
                         xxh64(payload) if checksum is None else checksum)
    return header + payload


def write_dataset(d, train, val, vocab=256, tokenizer="bytes", meta=None):
    os.makedirs(d, exist_ok=True)
    write(os.path.join(d, "train_0000.bin"), shard_bytes(train, vocab))
    write(os.path.join(d, "val_0000.bin"), shard_bytes(val, vocab))
    m = {"format": "brisk token shards", "version": 1, "tokenizer": tokenizer, "vocab_size": vocab,
         "eot_token": -1, "train_tokens": len(train), "val_tokens": len(val)}
    write(os.path.join(d, "meta.json"), json.dumps(m if meta is None else meta, indent=2) + "\n")


def read_safetensors(path):
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack_from("<Q", b)[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def write_safetensors(path, header, data, header_len=None):
    """header: a dict (dumped as JSON) or the raw header text/bytes."""
    if isinstance(header, dict):
        header = json.dumps(header)
    if isinstance(header, str):
        header = header.encode()
    n = len(header) if header_len is None else header_len
    write(path, struct.pack("<Q", n) + header + data)


def gpt2_bytes_to_unicode():
    out, nxt = [], 256
    for b in range(256):
        printable = ord("!") <= b <= ord("~") or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF
        out.append(chr(b) if printable else chr(nxt))
        nxt += 0 if printable else 1
    return out


def gpt2_vocab():
    """A small GPT-2 style vocabulary: the 256 byte tokens, three merges, <|endoftext|>."""
    enc = {ch: i for i, ch in enumerate(gpt2_bytes_to_unicode())}
    merges = [("\u0120", "t"), ("h", "e"), ("\u0120t", "he")]
    for a, b in merges:
        enc[a + b] = len(enc)
    enc["<|endoftext|>"] = len(enc)
    bpe = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)
    return enc, bpe


def write_gpt2_vocab(d, encoder=None, bpe=None):
    enc, merges = gpt2_vocab()
    encoder = enc if encoder is None else encoder
    if not isinstance(encoder, (str, bytes)):
        encoder = json.dumps(encoder, ensure_ascii=False)
    write(os.path.join(d, "encoder.json"), encoder)
    write(os.path.join(d, "vocab.bpe"), merges if bpe is None else bpe)


TINY_TOML = """[model]
vocab_size = 256
n_layer = 1
n_embd = 16
n_head = 2
block_size = 16

[data]
dir = "{data}"

[train]
batch = 2
seq = 16
steps = 1
lr = 1e-3
warmup = 0
threads = 1
loader_workers = 0
eval_every = 0
log_every = 1

[checkpoint]
dir = "{run}"
every = 1
keep = 1
"""

TEXT = ("In the beginning God created the heaven and the earth. And the earth was without form, and void; "
        "and darkness was upon the face of the deep.\n") * 40

# ---- the good files every case starts from -------------------------------------------------


@dataclass
class Base:
    root: str
    brisk: str
    data: str = ""          # a valid bytes dataset
    config: str = ""        # a valid tiny config training on it
    run: str = ""           # the run directory of that config (one checkpoint)
    checkpoint: str = ""    # run/step_0000001
    vocab: str = ""         # a valid GPT-2 style vocabulary directory
    text: str = ""          # a small text file
    fasta: str = ""         # a valid FASTA file


def make_base(root, brisk):
    b = Base(root=root, brisk=brisk)
    tokens = list(TEXT.encode())
    b.data = os.path.join(root, "data")
    write_dataset(b.data, tokens[: len(tokens) * 3 // 4], tokens[len(tokens) * 3 // 4:])
    b.run = os.path.join(root, "run")
    b.config = os.path.join(root, "tiny.toml")
    write(b.config, TINY_TOML.format(data=b.data, run=b.run))
    r = subprocess.run([brisk, "train", "--config", b.config, "--no-progress"], capture_output=True, text=True,
                       timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"training the base checkpoint failed (exit {r.returncode}):\n{r.stderr}")
    b.checkpoint = os.path.join(b.run, "step_0000001")
    b.vocab = os.path.join(root, "vocab")
    write_gpt2_vocab(b.vocab)
    b.text = os.path.join(root, "text.txt")
    write(b.text, TEXT)
    b.fasta = os.path.join(root, "good.fa")
    write(b.fasta, ">seq1 a protein\nMKVLAAGIV\nLLAAG\n>seq2\nACDEFGHIK\n")
    return b


# ---- cases ---------------------------------------------------------------------------------


@dataclass
class Case:
    name: str
    loader: str             # which loader: safetensors, checkpoint, quantized, shards, tokenizer, config, fasta, emails
    what: str               # the hostile input in a few words
    make: Callable          # make(ctx) -> brisk arguments
    expect: List[str] = field(default_factory=list)  # fragments the error message must hold


CASES: List[Case] = []


def case(name, loader, what, *expect):
    def register(fn):
        CASES.append(Case(name, loader, what, fn, list(expect)))
        return fn
    return register


class Ctx:
    """What a case's make() gets: its own directory and the good files."""

    def __init__(self, base: Base, dir: str):
        self.base, self.dir = base, dir
        os.makedirs(dir, exist_ok=True)

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def checkpoint(self):
        """A copy of the good checkpoint, to damage."""
        d = self.path("ckpt")
        shutil.copytree(self.base.checkpoint, d)
        return d

    def run_copy(self):
        """A copy of the good run directory (its checkpoint is what --resume loads), to damage."""
        d = self.path("run_resume")
        shutil.copytree(self.base.run, d)
        return d

    def dataset(self):
        d = self.path("data")
        shutil.copytree(self.base.data, d)
        return d

    def vocab(self):
        d = self.path("vocab")
        shutil.copytree(self.base.vocab, d)
        return d

    def generate(self, ckpt, vocab_dir=None):
        args = ["generate", "--checkpoint", ckpt, "--prompt", "In the", "--max-new", "2", "--threads", "1"]
        return args + (["--vocab-dir", vocab_dir] if vocab_dir else [])

    def eval(self, ckpt=None, data=None):
        return ["eval", "--checkpoint", ckpt or self.base.checkpoint, "--data", data or self.base.data, "--batches",
                "1", "--batch", "1", "--threads", "1"]

    def train(self, config=None, *sets):
        """Trains with `config` (whose run goes under this case's directory) or, by default, the good
        config with its run moved here."""
        args = ["train", "--config", config or self.base.config, "--no-progress"]
        if config is None:
            sets = ("checkpoint.dir=" + self.path("run"),) + sets
        for s in sets:
            args += ["--set", s]
        return args

    def resume(self, run):
        return ["train", "--config", self.base.config, "--no-progress", "--resume", "--set", "checkpoint.dir=" + run,
                "--set", "train.steps=2"]

    def prepare_gpt2(self, vocab_dir):
        return ["data", "prepare", "--input", self.base.text, "--tokenizer", "gpt2", "--vocab-dir", vocab_dir,
                "--out", self.path("out"), "--threads", "1"]

    def config(self, text):
        p = self.path("bad.toml")
        write(p, text)
        return p

    def good_toml(self):
        return TINY_TOML.format(data=self.base.data, run=self.path("run"))


def edit_model(ckpt, edit, file="model.safetensors"):
    """Rewrites a checkpoint's safetensors file through edit(header, data) -> (header, data)."""
    p = os.path.join(ckpt, file)
    h, data = read_safetensors(p)
    h, data = edit(h, data)
    write_safetensors(p, h, data)


def edit_tensor(ckpt, name, **fields):
    def edit(h, data):
        h[name].update(fields)
        return h, data
    edit_model(ckpt, edit)


def edit_state(ckpt, edit):
    p = os.path.join(ckpt, "state.json")
    with open(p) as f:
        st = json.load(f)
    edit(st)
    write(p, json.dumps(st, indent=2))


# -- safetensors (model.safetensors of a checkpoint, read by `brisk generate`)


@case("st_short_file", "safetensors", "file of 4 bytes (train --resume)", "optimizer.safetensors", "truncated")
def _(c):
    run = c.run_copy()
    write(os.path.join(run, "step_0000001", "optimizer.safetensors"), b"\x10\x00\x00\x00")
    return c.resume(run)


@case("st_header_len_huge", "safetensors", "header length 2^63", "model.safetensors", "header")
def _(c):
    ck = c.checkpoint()
    h, data = read_safetensors(os.path.join(ck, "model.safetensors"))
    write_safetensors(os.path.join(ck, "model.safetensors"), h, data, header_len=1 << 63)
    return c.generate(ck)


@case("st_header_not_json", "safetensors", "header is not JSON (train --resume)", "optimizer.safetensors",
      "bad safetensors header")
def _(c):
    run = c.run_copy()
    write_safetensors(os.path.join(run, "step_0000001", "optimizer.safetensors"), b"{not json at all", b"")
    return c.resume(run)


@case("st_header_array", "safetensors", "header is a JSON array (train --resume)", "optimizer.safetensors",
      "JSON object")
def _(c):
    run = c.run_copy()
    write_safetensors(os.path.join(run, "step_0000001", "optimizer.safetensors"), "[1, 2, 3]", b"")
    return c.resume(run)


@case("st_negative_dim", "safetensors", "shape [-1, 16]", "model.safetensors", "wte.weight", "dimension", "-1")
def _(c):
    ck = c.checkpoint()
    edit_tensor(ck, "wte.weight", shape=[-1, 16])
    return c.generate(ck)


@case("st_float_dim", "safetensors", "shape [256.5, 16]", "model.safetensors", "wte.weight", "dimension")
def _(c):
    ck = c.checkpoint()
    edit_tensor(ck, "wte.weight", shape=[256.5, 16])
    return c.generate(ck)


@case("st_shape_not_list", "safetensors", "shape is a string", "model.safetensors", "wte.weight", "shape")
def _(c):
    ck = c.checkpoint()
    edit_tensor(ck, "wte.weight", shape="256x16")
    return c.generate(ck)


@case("st_numel_overflow", "safetensors", "shape [2^62, 2^62]", "model.safetensors", "wte.weight", "too large")
def _(c):
    ck = c.checkpoint()
    edit_tensor(ck, "wte.weight", shape=[1 << 62, 1 << 62])
    return c.generate(ck)


@case("st_bytes_overflow", "safetensors", "shape [2^62] F32 (bytes overflow)", "model.safetensors", "wte.weight",
      "too large")
def _(c):
    ck = c.checkpoint()
    edit_tensor(ck, "wte.weight", shape=[1 << 62])
    return c.generate(ck)


@case("st_rank_7", "safetensors", "shape of rank 7", "model.safetensors", "wte.weight", "rank")
def _(c):
    ck = c.checkpoint()
    edit_tensor(ck, "wte.weight", shape=[1, 1, 1, 1, 1, 256, 16])
    return c.generate(ck)


@case("st_offsets_past_end", "safetensors", "data_offsets past the end of the file", "model.safetensors",
      "wte.weight", "data_offsets")
def _(c):
    ck = c.checkpoint()
    h, _ = read_safetensors(os.path.join(ck, "model.safetensors"))
    b, e = h["wte.weight"]["data_offsets"]
    edit_tensor(ck, "wte.weight", data_offsets=[b + 4096, e + 4096])
    return c.generate(ck)


@case("st_offsets_reversed", "safetensors", "data_offsets [end, begin]", "model.safetensors", "wte.weight",
      "data_offsets")
def _(c):
    ck = c.checkpoint()
    h, _ = read_safetensors(os.path.join(ck, "model.safetensors"))
    b, e = h["wte.weight"]["data_offsets"]
    edit_tensor(ck, "wte.weight", data_offsets=[e, b])
    return c.generate(ck)


@case("st_offsets_size_mismatch", "safetensors", "data_offsets span != dtype x shape", "model.safetensors",
      "wte.weight", "data_offsets")
def _(c):
    ck = c.checkpoint()
    h, _ = read_safetensors(os.path.join(ck, "model.safetensors"))
    b, e = h["wte.weight"]["data_offsets"]
    edit_tensor(ck, "wte.weight", data_offsets=[b, e - 4])
    return c.generate(ck)


@case("st_offsets_negative", "safetensors", "data_offsets [-8, 0]", "model.safetensors", "wte.weight",
      "data_offsets")
def _(c):
    ck = c.checkpoint()
    edit_tensor(ck, "wte.weight", data_offsets=[-8, 0])
    return c.generate(ck)


@case("st_offsets_wrap", "safetensors", "data_offsets near 2^64 (begin + header wraps)", "model.safetensors",
      "wte.weight", "data_offsets")
def _(c):
    ck = c.checkpoint()
    e = (1 << 64) - 1
    edit_tensor(ck, "wte.weight", data_offsets=[e - 256 * 16 * 4, e])
    return c.generate(ck)


@case("st_offsets_three", "safetensors", "data_offsets with three numbers", "model.safetensors", "wte.weight",
      "data_offsets")
def _(c):
    ck = c.checkpoint()
    edit_tensor(ck, "wte.weight", data_offsets=[0, 16384, 16384])
    return c.generate(ck)


@case("st_overlap", "safetensors", "two tensors share bytes", "model.safetensors", "overlap")
def _(c):
    ck = c.checkpoint()
    h, _ = read_safetensors(os.path.join(ck, "model.safetensors"))
    edit_tensor(ck, "ln_f.weight", data_offsets=h["ln_f.bias"]["data_offsets"])
    return c.generate(ck)


@case("st_bad_dtype", "safetensors", "dtype \"F64\"", "model.safetensors", "wte.weight", "dtype", "F64")
def _(c):
    ck = c.checkpoint()
    edit_tensor(ck, "wte.weight", dtype="F64")
    return c.generate(ck)


@case("st_dtype_not_string", "safetensors", "dtype is a number", "model.safetensors", "wte.weight", "dtype")
def _(c):
    ck = c.checkpoint()
    edit_tensor(ck, "wte.weight", dtype=32)
    return c.generate(ck)


@case("st_entry_not_object", "safetensors", "a tensor entry that is a number", "model.safetensors", "wte.weight", "JSON object")
def _(c):
    ck = c.checkpoint()
    def edit(h, data):
        h["wte.weight"] = 5
        return h, data
    edit_model(ck, edit)
    return c.generate(ck)


@case("st_missing_offsets", "safetensors", "entry without data_offsets", "model.safetensors", "wte.weight",
      "data_offsets")
def _(c):
    ck = c.checkpoint()
    def edit(h, data):
        del h["wte.weight"]["data_offsets"]
        return h, data
    edit_model(ck, edit)
    return c.generate(ck)


@case("st_metadata_number", "safetensors", "__metadata__ value is a number", "model.safetensors", "__metadata__",
      "format")
def _(c):
    ck = c.checkpoint()
    def edit(h, data):
        h["__metadata__"] = {"format": 1}
        return h, data
    edit_model(ck, edit)
    return c.generate(ck)


@case("st_metadata_not_object", "safetensors", "__metadata__ is a string", "model.safetensors", "__metadata__")
def _(c):
    ck = c.checkpoint()
    def edit(h, data):
        h["__metadata__"] = "pt"
        return h, data
    edit_model(ck, edit)
    return c.generate(ck)


@case("st_duplicate_name", "safetensors", "one tensor name twice", "model.safetensors", "duplicate", "ln_f.bias")
def _(c):
    ck = c.checkpoint()
    p = os.path.join(ck, "model.safetensors")
    h, data = read_safetensors(p)
    text = json.dumps(h)
    entry = json.dumps(h["ln_f.bias"])
    text = text[:-1] + ', "ln_f.bias": ' + entry + "}"
    write_safetensors(p, text, data)
    return c.generate(ck)


@case("st_deep_nesting", "safetensors", "header with 100000 nested arrays (train --resume)",
      "optimizer.safetensors", "wte.weight.exp_avg")
def _(c):
    run = c.run_copy()
    p = os.path.join(run, "step_0000001", "optimizer.safetensors")
    h, data = read_safetensors(p)
    text = json.dumps(h)[:-1] + ', "wte.weight.exp_avg": ' + "[" * 100000 + "]" * 100000 + "}"
    write_safetensors(p, text.replace('"wte.weight.exp_avg": {', '"unused": {', 1), data)
    return c.resume(run)


# -- checkpoints (state.json, tensors against the model)


@case("ck_missing_tensor", "checkpoint", "model.safetensors lacks wpe.weight", "model.safetensors", "missing",
      "wpe.weight")
def _(c):
    ck = c.checkpoint()
    def edit(h, data):
        del h["wpe.weight"]
        return h, data
    edit_model(ck, edit)
    return c.generate(ck)


@case("ck_extra_tensor", "checkpoint", "an extra tensor no model parameter matches", "model.safetensors",
      "h.7.attn.bias", "unexpected tensor")
def _(c):
    ck = c.checkpoint()
    def edit(h, data):
        h["h.7.attn.bias"] = {"dtype": "F32", "shape": [1], "data_offsets": [len(data), len(data) + 4]}
        return h, data + b"\0\0\0\0"
    edit_model(ck, edit)
    return c.generate(ck)


@case("ck_conv1d_dtype", "checkpoint", "c_attn.weight stored as F16 (half the bytes)", "model.safetensors",
      "h.0.attn.c_attn.weight", "f32")
def _(c):
    ck = c.checkpoint()
    def edit(h, data):
        b, e = h["h.0.attn.c_attn.weight"]["data_offsets"]
        h["h.0.attn.c_attn.weight"].update(dtype="F16", data_offsets=[b, b + (e - b) // 2])
        return h, data
    edit_model(ck, edit)
    return c.generate(ck)


@case("ck_conv1d_rank", "checkpoint", "c_attn.weight of rank 1", "model.safetensors", "h.0.attn.c_attn.weight",
      "f32(768), expected f32(16, 48)")
def _(c):
    ck = c.checkpoint()
    edit_tensor(ck, "h.0.attn.c_attn.weight", shape=[16 * 48])
    return c.generate(ck)


@case("ck_shape_mismatch", "checkpoint", "wte.weight stored as (16, 256)", "model.safetensors", "wte.weight",
      "expected")
def _(c):
    ck = c.checkpoint()
    edit_tensor(ck, "wte.weight", shape=[16, 256])
    return c.generate(ck)


@case("ck_state_not_json", "checkpoint", "state.json is not JSON", "state.json", "not JSON")
def _(c):
    ck = c.checkpoint()
    write(os.path.join(ck, "state.json"), "{ step: one ")
    return c.generate(ck)


@case("ck_state_deep_nesting", "checkpoint", "state.json of 100000 nested arrays", "state.json", "expected a JSON object")
def _(c):
    ck = c.checkpoint()
    write(os.path.join(ck, "state.json"), "[" * 100000 + "]" * 100000)
    return c.generate(ck)


@case("ck_state_deep_value", "checkpoint", "model.n_layer nested 100000 arrays deep", "state.json", "n_layer")
def _(c):
    ck = c.checkpoint()
    with open(os.path.join(ck, "state.json")) as f:
        text = f.read()
    write(os.path.join(ck, "state.json"), text.replace('"n_layer": 1', '"n_layer": ' + "[" * 100000 + "]" * 100000))
    return c.generate(ck)


@case("ck_path_is_file", "checkpoint", "--checkpoint names a file", "not a checkpoint directory")
def _(c):
    return c.generate(c.base.text)


@case("ck_state_wrong_type", "checkpoint", "model.n_layer is a string", "state.json", "n_layer")
def _(c):
    ck = c.checkpoint()
    edit_state(ck, lambda st: st["model"].update(n_layer="one"))
    return c.generate(ck)


@case("ck_state_missing_model", "checkpoint", "state.json without model", "state.json", "model")
def _(c):
    ck = c.checkpoint()
    edit_state(ck, lambda st: st.pop("model"))
    return c.generate(ck)


@case("ck_state_negative", "checkpoint", "model.n_embd = -16", "state.json", "n_embd")
def _(c):
    ck = c.checkpoint()
    edit_state(ck, lambda st: st["model"].update(n_embd=-16))
    return c.generate(ck)


@case("ck_state_huge_model", "checkpoint", "model.n_embd = 2^31 (would allocate terabytes)", "state.json",
      "n_embd")
def _(c):
    ck = c.checkpoint()
    edit_state(ck, lambda st: st["model"].update(n_embd=1 << 31, n_head=1))
    return c.generate(ck)


@case("ck_state_bigger_than_weights", "checkpoint", "model.n_layer = 64 but weights for 1 layer",
      "model.safetensors", "n_layer")
def _(c):
    ck = c.checkpoint()
    edit_state(ck, lambda st: st["model"].update(n_layer=64))
    return c.generate(ck)


@case("ck_state_tokenizer", "checkpoint", "tokenizer \"klingon\"", "state.json", "tokenizer", "klingon")
def _(c):
    ck = c.checkpoint()
    edit_state(ck, lambda st: st.update(tokenizer="klingon"))
    return c.generate(ck)


@case("ck_state_loss_scaler", "checkpoint", "loss_scaler.scale is a string", "state.json", "loss_scaler")
def _(c):
    ck = c.checkpoint()
    edit_state(ck, lambda st: st.update(loss_scaler={"scale": "big", "steps": 0, "skipped": 0, "growths": 0,
                                                     "backoffs": 0, "clean_streak": 0}))
    return c.generate(ck)


@case("ck_state_optimizer_steps", "checkpoint", "optimizer_steps is a string (train --resume)", "state.json",
      "optimizer_steps")
def _(c):
    run = c.run_copy()
    edit_state(os.path.join(run, "step_0000001"), lambda st: st.update(optimizer_steps="many"))
    return c.resume(run)


@case("ck_optimizer_missing", "checkpoint", "optimizer.safetensors missing (train --resume)",
      "optimizer.safetensors", "cannot open")
def _(c):
    run = c.run_copy()
    os.remove(os.path.join(run, "step_0000001", "optimizer.safetensors"))
    return c.resume(run)


@case("ck_optimizer_negative_dim", "checkpoint", "optimizer moment with shape [-4] (train --resume)",
      "optimizer.safetensors", "dimension")
def _(c):
    run = c.run_copy()
    ck = os.path.join(run, "step_0000001")
    def edit(h, data):
        h["wte.weight.exp_avg"]["shape"] = [-4]
        return h, data
    edit_model(ck, edit, file="optimizer.safetensors")
    return c.resume(run)


# -- token shards and meta.json (read by `brisk eval` and `brisk train`)


def edit_meta(d, drop=None, **values):
    """Rewrites dataset d's meta.json with `values` set and the key `drop` removed."""
    with open(os.path.join(d, "meta.json")) as f:
        m = json.load(f)
    m.update(values)
    if drop:
        del m[drop]
    write(os.path.join(d, "meta.json"), json.dumps(m))



@case("sh_meta_not_json", "shards", "meta.json is not JSON", "meta.json", "not valid JSON")
def _(c):
    d = c.dataset()
    write(os.path.join(d, "meta.json"), "{\"tokenizer\": ")
    return c.eval(data=d)


@case("sh_meta_not_object", "shards", "meta.json is an array", "meta.json", "JSON object")
def _(c):
    d = c.dataset()
    write(os.path.join(d, "meta.json"), "[]")
    return c.eval(data=d)


@case("sh_meta_vocab_string", "shards", "vocab_size is a string", "meta.json", "vocab_size")
def _(c):
    d = c.dataset()
    edit_meta(d, vocab_size="256")
    return c.eval(data=d)


@case("sh_meta_no_tokenizer", "shards", "meta.json without tokenizer", "meta.json", "tokenizer")
def _(c):
    d = c.dataset()
    edit_meta(d, drop="tokenizer")
    return c.train(None, "data.dir=" + d)


@case("sh_meta_unknown_tokenizer", "shards", "tokenizer 'foo' (checkpoints would name it)", "meta.json", "'foo'",
      "bytes")
def _(c):
    d = c.dataset()
    edit_meta(d, tokenizer="foo")
    return c.eval(data=d)


@case("sh_meta_tokens_wrong_type", "shards", "train_tokens is a list", "meta.json", "train_tokens")
def _(c):
    d = c.dataset()
    edit_meta(d, train_tokens=[1, 2])
    return c.train(None, "data.dir=" + d)


@case("sh_meta_deep_value", "shards", "meta.json tokenizer nested 100000 arrays deep", "meta.json", "tokenizer")
def _(c):
    d = c.dataset()
    with open(os.path.join(d, "meta.json")) as f:
        text = f.read()
    write(os.path.join(d, "meta.json"), text.replace('"bytes"', "[" * 100000 + "]" * 100000, 1))
    return c.eval(data=d)


@case("sh_bad_magic", "shards", "shard with a foreign magic", "val_0000.bin", "magic")
def _(c):
    d = c.dataset()
    write(os.path.join(d, "val_0000.bin"), shard_bytes(list(range(100)), 256, magic=b"NOTBRISK"))
    return c.eval(data=d)


@case("sh_short_header", "shards", "shard of 10 bytes", "val_0000.bin", "truncated")
def _(c):
    d = c.dataset()
    write(os.path.join(d, "val_0000.bin"), b"BRISKTOK\1\0")
    return c.eval(data=d)


@case("sh_count_overflow", "shards", "count 2^62 int32 tokens (count x 4 wraps to 0)", "val_0000.bin", "count", "2^64")
def _(c):
    d = c.dataset()
    write(os.path.join(d, "val_0000.bin"), shard_bytes([], 100000, dtype=1, count=1 << 62))
    return c.eval(data=d)


@case("sh_truncated_payload", "shards", "shard shorter than its count", "val_0000.bin", "truncated")
def _(c):
    d = c.dataset()
    with open(os.path.join(d, "val_0000.bin"), "rb") as f:
        b = f.read()
    write(os.path.join(d, "val_0000.bin"), b[:-100])
    return c.eval(data=d)


@case("sh_trailing_bytes", "shards", "shard longer than its count", "val_0000.bin", "bytes past the header")
def _(c):
    d = c.dataset()
    with open(os.path.join(d, "val_0000.bin"), "rb") as f:
        b = f.read()
    write(os.path.join(d, "val_0000.bin"), b + b"XXXX")
    return c.eval(data=d)


@case("sh_checksum", "shards", "one payload byte flipped", "val_0000.bin", "checksum")
def _(c):
    d = c.dataset()
    with open(os.path.join(d, "val_0000.bin"), "rb") as f:
        b = bytearray(f.read())
    b[100] ^= 0x01
    write(os.path.join(d, "val_0000.bin"), bytes(b))
    return c.eval(data=d)


@case("sh_token_out_of_vocab", "shards", "token 300 in a vocab-256 shard (valid checksum)", "val_0000.bin", "300",
      "vocab")
def _(c):
    d = c.dataset()
    write(os.path.join(d, "val_0000.bin"), shard_bytes([65] * 50 + [300] + [66] * 50, 256))
    return c.eval(data=d)


@case("sh_negative_token", "shards", "token -5 in an int32 shard (valid checksum)", "train_0000.bin", "-5")
def _(c):
    d = c.path("data")
    toks = list(TEXT.encode())
    write_dataset(d, toks[:1000] + [-5] + toks[:1000], toks[:500], vocab=70000)
    return c.train(None, "data.dir=" + d, "model.vocab_size=70000")


@case("sh_vocab_mismatch", "shards", "shard vocab 512, meta.json 256", "val_0000.bin", "meta.json")
def _(c):
    d = c.dataset()
    write(os.path.join(d, "val_0000.bin"), shard_bytes(list(range(100)), 512))
    return c.eval(data=d)


@case("sh_data_vocab_gt_model", "shards", "eval of a vocab-256 model on vocab-1000 data", "vocab", "1000")
def _(c):
    d = c.path("data")
    toks = [(i * 37) % 1000 for i in range(2000)]
    write_dataset(d, toks, toks, vocab=1000)
    return c.eval(data=d)


@case("sh_bad_version", "shards", "shard format version 9", "val_0000.bin", "version 9")
def _(c):
    d = c.dataset()
    write(os.path.join(d, "val_0000.bin"), shard_bytes(list(range(100)), 256, version=9))
    return c.eval(data=d)


@case("sh_bad_dtype", "shards", "shard token dtype 7", "val_0000.bin", "dtype 7")
def _(c):
    d = c.dataset()
    write(os.path.join(d, "val_0000.bin"), shard_bytes(list(range(100)), 256, dtype=7))
    return c.eval(data=d)


@case("sh_zero_vocab", "shards", "shard header vocab size 0", "val_0000.bin", "vocab size 0")
def _(c):
    d = c.dataset()
    write(os.path.join(d, "val_0000.bin"), shard_bytes(list(range(100)), 0, dtype=0))
    return c.eval(data=d)


@case("sh_negative_count", "shards", "shard header count -1", "val_0000.bin", "-1")
def _(c):
    d = c.dataset()
    write(os.path.join(d, "val_0000.bin"), shard_bytes([], 256, count=-1))
    return c.eval(data=d)


# -- tokenizer vocabulary (encoder.json / vocab.bpe, read by `brisk data prepare --tokenizer gpt2`)


@case("tok_encoder_not_json", "tokenizer", "encoder.json is not JSON", "encoder.json", "JSON")
def _(c):
    v = c.vocab()
    write(os.path.join(v, "encoder.json"), "{\"a\": 1,")
    return c.prepare_gpt2(v)


@case("tok_encoder_array", "tokenizer", "encoder.json is an array", "encoder.json", "object")
def _(c):
    v = c.vocab()
    write(os.path.join(v, "encoder.json"), "[1, 2]")
    return c.prepare_gpt2(v)


@case("tok_encoder_id_string", "tokenizer", "a token id that is a string", "encoder.json", "integer")
def _(c):
    v = c.vocab()
    enc, _ = gpt2_vocab()
    enc["he"] = "257"
    write_gpt2_vocab(v, encoder=enc)
    return c.prepare_gpt2(v)


@case("tok_encoder_id_range", "tokenizer", "a token id past the vocabulary", "encoder.json", "he")
def _(c):
    v = c.vocab()
    enc, _ = gpt2_vocab()
    enc["he"] = 1 << 40
    write_gpt2_vocab(v, encoder=enc)
    return c.prepare_gpt2(v)


@case("tok_encoder_dup_id", "tokenizer", "two tokens with one id", "encoder.json", "twice")
def _(c):
    v = c.vocab()
    enc, _ = gpt2_vocab()
    enc["he"] = enc["Ġt"]
    write_gpt2_vocab(v, encoder=enc)
    return c.prepare_gpt2(v)


@case("tok_encoder_no_byte", "tokenizer", "no token for byte 65 ('A')", "encoder.json", "byte 65")
def _(c):
    v = c.vocab()
    enc, _ = gpt2_vocab()
    last = max(enc, key=enc.get)
    enc[last] = enc.pop("A")  # keep the ids dense
    write_gpt2_vocab(v, encoder=enc)
    return c.prepare_gpt2(v)


@case("tok_encoder_bad_char", "tokenizer", "a token with a character that stands for no byte", "encoder.json",
      "stands for no byte")
def _(c):
    v = c.vocab()
    enc, _ = gpt2_vocab()
    enc["he\u4e2d"] = enc.pop("he")
    write_gpt2_vocab(v, encoder=enc)
    return c.prepare_gpt2(v)


@case("tok_bpe_three_symbols", "tokenizer", "vocab.bpe line with three symbols", "vocab.bpe", "line 2")
def _(c):
    v = c.vocab()
    write(os.path.join(v, "vocab.bpe"), "#version: 0.2\nĠ t x\nh e\n")
    return c.prepare_gpt2(v)


@case("tok_bpe_unknown_token", "tokenizer", "a merge of tokens encoder.json lacks", "vocab.bpe", "missing")
def _(c):
    v = c.vocab()
    write(os.path.join(v, "vocab.bpe"), "#version: 0.2\nq z\n")
    return c.prepare_gpt2(v)


@case("tok_bpe_missing", "tokenizer", "vocab.bpe missing", "vocab.bpe", "cannot open")
def _(c):
    v = c.vocab()
    os.remove(os.path.join(v, "vocab.bpe"))
    return c.prepare_gpt2(v)


@case("tok_checkpoint_gpt2_bad_vocab", "tokenizer", "generate with a gpt2 checkpoint and a bad encoder.json",
      "encoder.json", "JSON object")
def _(c):
    ck = c.checkpoint()
    edit_state(ck, lambda st: st.update(tokenizer="gpt2"))
    v = c.vocab()
    write(os.path.join(v, "encoder.json"), "\"just a string\"")
    return c.generate(ck, vocab_dir=v)


# -- TOML configs (`brisk train --config`)


@case("cfg_syntax", "config", "TOML syntax error", "bad.toml:")
def _(c):
    return c.train(c.config("[model\nn_layer = 2\n"))


@case("cfg_binary", "config", "binary garbage", "bad.toml", "saw")
def _(c):
    return c.train(c.config(bytes(range(256)) * 4))


@case("cfg_deep_nesting", "config", "an array nested 100000 deep", "bad.toml", "nested")
def _(c):
    return c.train(c.config(c.good_toml() + "\n[extra]\nx = " + "[" * 100000 + "]" * 100000 + "\n"))


@case("cfg_unknown_key", "config", "unknown key model.n_layers", "model.n_layers", "bad.toml")
def _(c):
    return c.train(c.config(c.good_toml().replace("n_layer = 1", "n_layers = 1")))


@case("cfg_unknown_section", "config", "unknown section [optimizer]", "[optimizer]", "bad.toml")
def _(c):
    return c.train(c.config(c.good_toml() + "\n[optimizer]\nlr = 1\n"))


@case("cfg_section_not_table", "config", "model = 5", "model", "section", "bad.toml")
def _(c):
    return c.train(c.config("model = 5\n" + c.good_toml().replace("[model]", "[unused]")))


@case("cfg_wrong_type", "config", "train.batch = \"2\"", "train.batch", "integer", "bad.toml")
def _(c):
    return c.train(c.config(c.good_toml().replace("batch = 2", "batch = \"2\"")))


@case("cfg_float_for_int", "config", "train.steps = 1.5", "train.steps", "integer", "bad.toml")
def _(c):
    return c.train(c.config(c.good_toml().replace("steps = 1", "steps = 1.5")))


@case("cfg_negative", "config", "model.n_layer = -2", "model.n_layer", "-2", "bad.toml")
def _(c):
    return c.train(c.config(c.good_toml().replace("n_layer = 1", "n_layer = -2")))


@case("cfg_int_truncates", "config", "train.threads = 2^32 + 1", "train.threads", "4294967297", "bad.toml")
def _(c):
    return c.train(c.config(c.good_toml().replace("threads = 1", "threads = 4294967297")))


@case("cfg_huge_model", "config", "model.n_embd = 2^40", "model.n_embd", "bad.toml")
def _(c):
    return c.train(c.config(c.good_toml().replace("n_embd = 16", "n_embd = 1099511627776")))


@case("cfg_huge_batch", "config", "train.batch = 2^40", "train.batch", "bad.toml")
def _(c):
    return c.train(c.config(c.good_toml().replace("batch = 2", "batch = 1099511627776")))


@case("cfg_nan_lr", "config", "train.lr = nan", "train.lr", "bad.toml")
def _(c):
    return c.train(c.config(c.good_toml().replace("lr = 1e-3", "lr = nan")))


@case("cfg_beta_range", "config", "train.beta1 = 1.5", "train.beta1", "bad.toml")
def _(c):
    return c.train(c.config(c.good_toml().replace("lr = 1e-3", "lr = 1e-3\nbeta1 = 1.5")))


@case("cfg_bad_enum", "config", "train.precision = \"fp8\"", "train.precision", "fp8", "bad.toml")
def _(c):
    return c.train(c.config(c.good_toml().replace("lr = 1e-3", "lr = 1e-3\nprecision = \"fp8\"")))


@case("cfg_set_no_equals", "config", "--set train.steps", "--set", "train.steps", "tiny.toml")
def _(c):
    return c.train(None, "train.steps")


@case("cfg_set_wrong_type", "config", "--set train.seq=abc", "train.seq", "integer", "tiny.toml")
def _(c):
    return c.train(None, "train.seq=abc")


@case("cfg_data_dir_missing", "config", "data.dir that does not exist", "nowhere", "does not exist")
def _(c):
    return c.train(None, "data.dir=" + c.path("nowhere"))


# -- quantized files (`brisk quantize` output, read by `brisk generate` and `brisk serve`)


def quantized(c):
    """An int8 file of the good checkpoint, made by the real `brisk quantize`, to damage."""
    out = c.path("q8.safetensors")
    r = subprocess.run([c.base.brisk, "quantize", "--checkpoint", c.base.checkpoint, "--scheme", "int8", "--out", out],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"quantizing the base checkpoint failed (exit {r.returncode}):\n{r.stderr}")
    return out


def edit_quantized_meta(path, edit):
    h, data = read_safetensors(path)
    edit(h["__metadata__"])
    write_safetensors(path, h, data)


@case("qz_scheme_fp32", "quantized", "brisk.scheme says fp32 over int8 tensors", "brisk.scheme", "fp32",
      "int8 or int4")
def _(c):
    q = quantized(c)
    edit_quantized_meta(q, lambda m: m.update({"brisk.scheme": "fp32"}))
    return c.generate(q)


@case("qz_float_n_layer", "quantized", "brisk.model has n_layer 1.5", "brisk.model", "n_layer is not an integer")
def _(c):
    q = quantized(c)
    def edit(m):
        model = json.loads(m["brisk.model"])
        model["n_layer"] = 1.5
        m["brisk.model"] = json.dumps(model)
    edit_quantized_meta(q, edit)
    return c.generate(q)


@case("qz_layer_past_n_layer", "quantized", "a second layer's tensors past brisk.model's n_layer 1", "tensor 'h.1.",
      "not part of the model", "n_layer 1")
def _(c):
    q = quantized(c)
    h, data = read_safetensors(q)
    for name in [n for n in h if n.startswith("h.0.")]:
        b, e = h[name]["data_offsets"]
        h["h.1." + name[4:]] = dict(h[name], data_offsets=[len(data), len(data) + (e - b)])
        data += data[b:e]
    write_safetensors(q, h, data)
    return c.generate(q)


# -- files that are not what they seem (links, directories)


@case("ck_weights_directory", "checkpoint", "model.safetensors is a directory", "model.safetensors", "directory")
def _(c):
    ck = c.checkpoint()
    os.remove(os.path.join(ck, "model.safetensors"))
    os.makedirs(os.path.join(ck, "model.safetensors"))
    return c.generate(ck)


@case("ck_state_symlink_loop", "checkpoint", "state.json is a symlink to itself", "state.json", "symbolic links")
def _(c):
    ck = c.checkpoint()
    os.remove(os.path.join(ck, "state.json"))
    os.symlink("state.json", os.path.join(ck, "state.json"))
    return c.generate(ck)


@case("prep_symlink_loop", "prepare", "an input directory holding a symlink loop", "<case>/texts/loop",
      "symbolic links")
def _(c):
    d = c.path("texts")
    write(os.path.join(d, "a.txt"), TEXT)
    os.symlink("loop", os.path.join(d, "loop"))
    return ["data", "prepare", "--input", d, "--out", c.path("out"), "--threads", "1"]


@case("prep_out_is_file", "prepare", "--out names an existing file", "<case>/out", "Not a directory")
def _(c):
    write(c.path("out"), "not a directory\n")
    return ["data", "prepare", "--input", c.base.text, "--out", c.path("out"), "--threads", "1"]


@case("em_symlink_loop", "emails", "a group entry that is a symlink loop", "spam-1", "symbolic links")
def _(c):
    write(c.path("mail", "ham-1", "00001.txt"), "Subject: hi\n\nhello\n")
    os.symlink("spam-1", c.path("mail", "spam-1"))
    return ["data", "emails", "--input", c.path("mail"), "--out", c.path("out.lmdb")]


# -- FASTA and e-mail converters (`brisk data fasta2lmdb`, `brisk data emails`)


@case("fa_invalid_residue", "fasta", "residue 'J' (not in the alphabet)", "bad.fa:3", "residue")
def _(c):
    p = c.path("bad.fa")
    write(p, ">r1\nMKV\nMKJV\n")
    return ["data", "fasta2lmdb", "--input", p, "--out", c.path("out.lmdb"), "--no-progress"]


@case("fa_no_header", "fasta", "sequence before any '>' header", "bad.fa:1", "header")
def _(c):
    p = c.path("bad.fa")
    write(p, "MKVLA\n>r1\nMK\n")
    return ["data", "fasta2lmdb", "--input", p, "--out", c.path("out.lmdb"), "--no-progress"]


@case("fa_binary", "fasta", "binary file with NUL bytes", "bad.fa", "0x00")
def _(c):
    p = c.path("bad.fa")
    write(p, b">r1\nMK\x00\x01\x02V\n")
    return ["data", "fasta2lmdb", "--input", p, "--out", c.path("out.lmdb"), "--no-progress"]


@case("fa_empty_record", "fasta", "a record without sequence", "bad.fa:1", "no sequence")
def _(c):
    p = c.path("bad.fa")
    write(p, ">empty\n>r2\nMK\n")
    return ["data", "fasta2lmdb", "--input", p, "--out", c.path("out.lmdb"), "--no-progress"]


@case("fa_gzip", "fasta", "a gzip-compressed FASTA", "bad.fa.gz", "gzip")
def _(c):
    import gzip
    p = c.path("bad.fa.gz")
    write(p, gzip.compress(b">r1\nMKV\n"))
    return ["data", "fasta2lmdb", "--input", p, "--out", c.path("out.lmdb"), "--no-progress", "--on-invalid", "skip"]


@case("fa_no_records", "fasta", "only lines before a first header, skipped", "no sequence records", "nothing written")
def _(c):
    p = c.path("bad.fa")
    write(p, "MKVLA\nGGT\n")
    return ["data", "fasta2lmdb", "--input", p, "--out", c.path("out.lmdb"), "--no-progress", "--on-invalid", "skip"]


@case("fa_directory", "fasta", "input is a directory", "regular file")
def _(c):
    os.makedirs(c.path("adir"), exist_ok=True)
    return ["data", "fasta2lmdb", "--input", c.path("adir"), "--out", c.path("out.lmdb"), "--no-progress"]


@case("fa_out_is_directory", "fasta", "--out names a directory", "directory", "is a directory")
def _(c):
    os.makedirs(c.path("out.lmdb"), exist_ok=True)
    return ["data", "fasta2lmdb", "--input", c.base.fasta, "--out", c.path("out.lmdb"), "--no-progress"]


@case("em_unlabeled_group", "emails", "group directory named neither ham nor spam", "misc", "spam")
def _(c):
    write(c.path("mail", "misc", "00001.txt"), "Subject: hi\n\nhello\n")
    return ["data", "emails", "--input", c.path("mail"), "--out", c.path("out.lmdb")]


@case("em_no_groups", "emails", "input directory without group directories", "no group directories")
def _(c):
    write(c.path("mail", "00001.txt"), "Subject: hi\n\nhello\n")
    return ["data", "emails", "--input", c.path("mail"), "--out", c.path("out.lmdb")]


@case("em_empty_group", "emails", "a group directory without messages", "spam-1", "no message files")
def _(c):
    write(c.path("mail", "ham", "00001.txt"), "Subject: hi\n\nhello\n")
    os.makedirs(c.path("mail", "spam-1", "empty"), exist_ok=True)
    return ["data", "emails", "--input", c.path("mail"), "--out", c.path("out.lmdb")]


@case("em_out_inside_input", "emails", "--out inside a mail group of --input", "lies inside the mail group")
def _(c):
    write(c.path("mail", "ham", "00001.txt"), "Subject: hi\n\nhello\n")
    write(c.path("mail", "spam", "00001.txt"), "Subject: buy\n\nnow\n")
    return ["data", "emails", "--input", c.path("mail"), "--out", c.path("mail", "spam", "out.lmdb")]


@case("em_input_is_file", "emails", "input is a file", "not a directory")
def _(c):
    return ["data", "emails", "--input", c.base.text, "--out", c.path("out.lmdb")]


@case("em_bad_vocab", "emails", "gpt2 e-mails with an encoder.json that is an array", "encoder.json", "JSON object")
def _(c):
    write(c.path("mail", "spam-1", "00001.txt"), "Subject: hi\n\nhello\n")
    v = c.vocab()
    write(os.path.join(v, "encoder.json"), "[]")
    return ["data", "emails", "--input", c.path("mail"), "--out", c.path("out.lmdb"), "--tokenizer", "gpt2",
            "--vocab-dir", v]


# -- grammar files (brisk generate --grammar-file: GBNF, docs/serving.md, Grammars)


def _grammar(c, text):
    p = c.path("bad.gbnf")
    write(p, text)
    return c.generate(c.base.checkpoint) + ["--grammar-file", p]


@case("gbnf_left_recursive", "grammar", "expr ::= expr \"+\" term", "bad.gbnf", "rule 'expr' is left-recursive")
def _(c):
    return _grammar(c, b'root ::= expr\nexpr ::= expr "+" term | term\nterm ::= [0-9]+\n')


@case("gbnf_not_utf8", "grammar", "a literal holding byte 0xFF", "bad.gbnf", "not UTF-8")
def _(c):
    return _grammar(c, b'root ::= "\xff"\n')


@case("gbnf_repeat_huge", "grammar", "a repetition {99999}", "bad.gbnf", "repetition count over 1000")
def _(c):
    return _grammar(c, b'root ::= "a"{99999}\n')


@case("gbnf_undefined_rule", "grammar", "root ::= item, no item", "bad.gbnf", "rule 'item' is used but never defined")
def _(c):
    return _grammar(c, b"root ::= item\n")


# ---- entry point ---------------------------------------------------------------------------


def make_all(brisk, outdir):
    """Writes the base files and every case; returns [(case, args)]."""
    if os.path.exists(outdir):
        shutil.rmtree(outdir)
    os.makedirs(outdir)
    base = make_base(os.path.join(outdir, "_base"), brisk)
    names = [c.name for c in CASES]
    assert len(names) == len(set(names)), "case names must be unique"
    return [(c, c.make(Ctx(base, os.path.join(outdir, c.name)))) for c in CASES]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brisk", required=True, help="the brisk binary (trains the base checkpoint)")
    ap.add_argument("outdir", help="directory to (re)create")
    a = ap.parse_args()
    for c, args in make_all(os.path.abspath(a.brisk), os.path.abspath(a.outdir)):
        print(f"{c.name}: brisk {shlex.join(args)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
