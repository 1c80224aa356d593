#!/usr/bin/python3
"""brisk's encoder classifier against an independent encoder written in PyTorch.

Run with Debian's /usr/bin/python3 (python3-torch and python3-numpy are
Debian packages, see scripts/install_deps.sh); ctest runs it as
encoder_torch_crosscheck. The script runs brisk_encoder_dump into a temporary
directory, which writes one dump per attention kernel (plain, flash), builds
the same encoder here from scratch (token + learned position embeddings,
pre-LN blocks with LayerNorm eps 1e-5, bidirectional attention whose padded
keys are masked for every query, tanh GELU, biases everywhere, final
LayerNorm, mean over the first lengths[b] positions, Linear head, mean
cross-entropy), loads brisk's initial weights, and compares:
  - the logits and the loss of one right-padded batch,
  - the gradient of every parameter (by name),
  - brisk's logits against this encoder run on each row alone, cut to its
    length: agreement says padding (filled with random ids) changes nothing.
With --dropout P, --attention-dropout A and --classifier-dropout K brisk's
train step drops with model.dropout = P (the embeddings' sum and each
block's two residual branches), model.attention_dropout = A (the attention
probabilities, inside the masked attention kernels) and
model.classifier_dropout = K (the pooled features before the head), under
step 0's key (results.json); the model here drops the same elements with
gpt_torch_check.py's copy of the hash (written from docs/architecture.md,
"Dropout"), the pooled features at site 2^30. The loss and every gradient
must agree; the logits never drop. With --label-smoothing E the train
step's loss is F.cross_entropy(..., label_smoothing=E) on both sides, and
with --class-weights W0,W1,W2 F.cross_entropy(..., weight=W) (brisk's
train.class_weights).
The reference runs in float64, so each error is brisk's own f32 rounding.
Each tensor's error is max|brisk - torch| / max|torch|; all must be <= 1e-4.
Exits non-zero with a message naming what differs.

The model here is deliberately written without reusing anything from brisk
(no shared code, its own safetensors reader), so agreement means two
independent implementations agree, not that one was copied into the other.
"""

import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

TOL = 1e-4
ATTENTIONS = ("plain", "flash")

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # a missing dependency must fail the test, not skip it
    print(f"encoder_torch_check: FAIL: {sys.executable} cannot import torch/numpy ({e}): "
          "install python3-torch (scripts/install_deps.sh)", file=sys.stderr)
    sys.exit(1)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_torch_check  # noqa: E402  brisk's dropout masks, written there from their description

CLASSIFIER_SITE = 0x40000000  # the pooled features' site (models::Dropout::kClassifierInput)


class Dropout(gpt_torch_check.Dropout):
    """The GPT's dropout (the blocks' sites, the attention probabilities over
    the padded T), and the pooled features'."""

    def __init__(self, p, attention_p, classifier_p, key):
        super().__init__(p, attention_p, key)
        self.classifier_p = classifier_p

    def pooled(self, x):
        return gpt_torch_check.dropped(x, self.classifier_p, self.key, CLASSIFIER_SITE)


# ---- safetensors: 8-byte LE header length, JSON header, raw little-endian bytes

_DTYPES = {"F32": "<f4", "I32": "<i4", "F64": "<f8", "I64": "<i8"}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise RuntimeError(f"{path}: truncated (no header length)")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise RuntimeError(f"{path}: header length {n} exceeds file size {len(raw)}")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            raise RuntimeError(f"{path}: tensor '{name}' has unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        dt = np.dtype(_DTYPES[info["dtype"]])
        count = int(np.prod(info["shape"], dtype=np.int64))
        if end - begin != count * dt.itemsize or end > len(data):
            raise RuntimeError(f"{path}: tensor '{name}' has bad data_offsets {info['data_offsets']}")
        out[name] = np.frombuffer(data, dtype=dt, count=count, offset=begin).reshape(info["shape"]).copy()
    return out


# ---- the encoder, from scratch ------------------------------------------------------
# Module names are chosen so that named_parameters() yields brisk's names.

class LayerNorm(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.bias = nn.Parameter(torch.zeros(c))

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, eps=1e-5)


class Attention(nn.Module):
    def __init__(self, c, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)

    def forward(self, x, key_valid, drop=None, layer=0):
        """key_valid (B, T) bool: True at real positions. Every query row,
        padded ones included, attends over its row's real keys only (PyTorch's
        key_padding_mask semantics), so no row is all -inf."""
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)  # packed [q | k | v], head h at columns h*hs..
        q, k, v = (t.view(B, T, self.n_head, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~key_valid[:, None, None, :], float("-inf")).softmax(dim=-1)
        if drop:
            att = drop.probs(att, layer)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c, 4 * c)
        self.c_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, c, n_head):
        super().__init__()
        self.ln_1 = LayerNorm(c)
        self.attn = Attention(c, n_head)
        self.ln_2 = LayerNorm(c)
        self.mlp = Mlp(c)

    def forward(self, x, key_valid, drop=None, layer=0):
        a = self.attn(self.ln_1(x), key_valid, drop, layer)
        x = x + (drop(a, 1 + 2 * layer) if drop else a)
        m = self.mlp(self.ln_2(x))
        return x + (drop(m, 2 + 2 * layer) if drop else m)


class Encoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c = cfg["n_embd"]
        self.wte = nn.Embedding(cfg["vocab_size"], c)
        self.wpe = nn.Embedding(cfg["max_len"], c)
        self.h = nn.ModuleList(Block(c, cfg["n_head"]) for _ in range(cfg["n_layer"]))
        self.ln_f = LayerNorm(c)
        self.head = nn.Linear(c, cfg["n_classes"])

    def forward(self, ids, lengths, labels=None, drop=None, label_smoothing=0.0, weight=None):
        B, T = ids.shape
        key_valid = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
        x = self.wte(ids) + self.wpe(torch.arange(T))
        if drop:
            x = drop(x, 0)
        for l, block in enumerate(self.h):
            x = block(x, key_valid, drop, l)
        x = self.ln_f(x)
        # Mean over the real positions: padded rows are zeroed, not just
        # excluded from the count, so they get no gradient through the pool.
        w = key_valid.to(x.dtype)[:, :, None]
        pooled = (x * w).sum(dim=1) / lengths.to(x.dtype)[:, None]
        if drop:
            pooled = drop.pooled(pooled)
        logits = self.head(pooled)
        loss = None if labels is None else F.cross_entropy(logits, labels, weight=weight,
                                                           label_smoothing=label_smoothing)
        return logits, loss


def load_weights(model, tensors):
    """brisk's "param.<name>" tensors: brisk names, Linear weights (out, in) like nn.Linear."""
    sd = {k[len("param."):]: v for k, v in tensors.items() if k.startswith("param.")}
    ours = dict(model.named_parameters())
    if set(sd) != set(ours):
        raise RuntimeError(f"parameter names differ: only in brisk {sorted(set(sd) - set(ours))}, "
                           f"only here {sorted(set(ours) - set(sd))}")
    with torch.no_grad():
        for name, p in ours.items():
            w = sd[name]
            if w.shape != tuple(p.shape):
                raise RuntimeError(f"'{name}' is {w.shape} in brisk's dump, expected {tuple(p.shape)}")
            p.copy_(torch.from_numpy(w.astype(np.float64)))


# ---- comparison ----------------------------------------------------------------------

class Table:
    def __init__(self):
        self.rows = []

    def tensor(self, what, brisk, ref):
        brisk = np.asarray(brisk, dtype=np.float64)
        ref = np.asarray(ref, dtype=np.float64)
        if brisk.shape != ref.shape:
            self.rows.append((what, str(ref.shape), float("inf"), float("nan"), f"shape {brisk.shape} vs {ref.shape}"))
            return
        if not np.all(np.isfinite(brisk)):
            self.rows.append((what, str(tuple(ref.shape)), float("inf"), float("nan"), "brisk has non-finite values"))
            return
        diff = float(np.max(np.abs(brisk - ref))) if ref.size else 0.0
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        err = diff / scale if scale > 0 else diff  # all-zero reference: absolute
        self.rows.append((what, str(tuple(ref.shape)), err, scale, ""))

    def scalar(self, what, brisk, ref):
        self.tensor(what, np.array([brisk]), np.array([ref]))

    def report(self):
        w = max(len(r[0]) for r in self.rows)
        print(f"{'quantity':<{w}}  {'shape':<12}  {'max|ref|':>10}  {'rel err':>10}  ok")
        bad = []
        for what, shape, err, scale, note in self.rows:
            ok = err <= TOL
            if not ok:
                bad.append(what)
            print(f"{what:<{w}}  {shape:<12}  {scale:10.3e}  {err:10.3e}  {'yes' if ok else 'NO'} {note}")
        worst = max(self.rows, key=lambda r: r[2])
        print(f"{len(self.rows)} comparisons, worst {worst[0]} at {worst[2]:.3e} (tolerance {TOL:g})")
        return bad


def check_one(table, d, attention, args):
    """Adds the rows for one dump directory; returns an error string or None."""
    with open(os.path.join(d, "results.json")) as f:
        res = json.load(f)
    tensors = read_safetensors(os.path.join(d, "tensors.safetensors"))
    cfg = res["config"]
    if cfg["attention"] != attention:
        return f"{d}: dump says attention '{cfg['attention']}', expected '{attention}'"
    model = Encoder(cfg).double()
    load_weights(model, tensors)

    ids = torch.from_numpy(tensors["ids"].astype(np.int64))
    lengths = torch.from_numpy(tensors["lengths"].astype(np.int64))
    labels = torch.from_numpy(tensors["labels"].astype(np.int64))
    B, T = ids.shape
    # The batch must exercise what it claims to; a dump edited to drop the
    # edge cases would otherwise keep passing.
    lens = lengths.tolist()
    if min(lens) != 1 or max(lens) != T or not any(1 < l < T for l in lens):
        return f"{d}: lengths {lens} must include 1, T = {T} and a value between"
    padding = torch.cat([ids[b, l:] for b, l in enumerate(lens)])
    if padding.numel() and bool((padding == 0).all()):
        return f"{d}: the padding holds only id 0; it must hold random ids to show that it does not matter"

    probs = (args.dropout, args.attention_dropout, args.classifier_dropout)
    said = (cfg["dropout"], cfg["attention_dropout"], cfg["classifier_dropout"])
    if any(abs(a - b) > 1e-7 for a, b in zip(probs, said)):
        return f"{d}: dump trained with dropouts {said}, expected {probs}"
    if abs(cfg["label_smoothing"] - args.label_smoothing) > 1e-7:
        return f"{d}: dump trained with label smoothing {cfg['label_smoothing']}, expected {args.label_smoothing}"
    smoothing = float(np.float32(args.label_smoothing))  # brisk's is a 32-bit float
    weights = [float(np.float32(w)) for w in args.class_weights]  # likewise
    if len(cfg["class_weights"]) != len(weights) or any(abs(a - b) > 1e-7 for a, b in zip(cfg["class_weights"], weights)):
        return f"{d}: dump trained with class weights {cfg['class_weights']}, expected {weights}"
    weight = torch.tensor(weights, dtype=torch.float64) if weights else None
    drop = Dropout(*probs, res["dropout_key"]) if any(probs) else None

    tag = f"[{attention}] "
    with torch.no_grad():
        logits, _ = model(ids, lengths)  # evaluation: never drops
    _, loss = model(ids, lengths, labels, drop, smoothing, weight)
    loss.backward()
    table.tensor(tag + "logits", tensors["logits"], logits.numpy())
    table.scalar(tag + "loss", res["loss"], loss.item())

    # Each row on its own, without any padding: the same logits if padding is
    # truly invisible. Compared with brisk's padded logits, so a kernel that
    # leaked padding into real rows fails here even if torch's padded run
    # (built from the same masking idea) somehow agreed with it.
    with torch.no_grad():
        alone = torch.cat([model(ids[b:b + 1, :l], lengths[b:b + 1])[0] for b, l in enumerate(lens)])
    table.tensor(tag + "logits (each row unpadded)", tensors["logits"], alone.numpy())

    params = dict(model.named_parameters())
    brisk_grads = {k[len("grad."):]: v for k, v in tensors.items() if k.startswith("grad.")}
    if set(brisk_grads) != set(params):
        return (f"{d}: gradient names differ: brisk only {sorted(set(brisk_grads) - set(params))}, "
                f"torch only {sorted(set(params) - set(brisk_grads))}")
    for name in sorted(params):  # brisk's gradients are in nn.Linear (out, in) layout
        table.tensor(tag + "grad " + name, brisk_grads[name], params[name].grad.numpy())

    # Informational: ids that occur only in the padding get an exactly-zero
    # wte gradient here; brisk's value for those rows is shown (it is enforced
    # through "grad wte.weight" above).
    real = set(torch.cat([ids[b, :l] for b, l in enumerate(lens)]).tolist())
    pad_only = sorted(set(padding.tolist()) - real)
    if pad_only:
        g = brisk_grads["wte.weight"][pad_only]
        print(f"{tag}{len(pad_only)} token ids occur only in the padding; max |brisk grad| over their wte rows: "
              f"{float(np.max(np.abs(g))):.3e} (torch: {float(params['wte.weight'].grad[pad_only].abs().max()):.1e})")
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dump", required=True, help="path of the brisk_encoder_dump executable")
    ap.add_argument("--keep", help="write the dump here and keep it (default: a temporary directory)")
    ap.add_argument("--dropout", type=float, default=0.0, help="model.dropout for the train step, both sides")
    ap.add_argument("--attention-dropout", type=float, default=0.0, help="model.attention_dropout, likewise")
    ap.add_argument("--classifier-dropout", type=float, default=0.0, help="model.classifier_dropout, likewise")
    ap.add_argument("--label-smoothing", type=float, default=0.0, help="train.label_smoothing, likewise")
    ap.add_argument("--class-weights", type=lambda v: [float(w) for w in v.split(",")], default=[],
                    help="train.class_weights, one per class (3), comma-separated, likewise")
    args = ap.parse_args()
    dropping = args.dropout or args.attention_dropout or args.classifier_dropout

    torch.set_num_threads(2)  # two threads like the brisk side
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, reference in float64")

    table = Table()
    with tempfile.TemporaryDirectory(prefix="brisk_encoder_check_") as tmp:
        out = args.keep or tmp
        try:
            extra = []
            if dropping or args.label_smoothing or args.class_weights:
                extra = [str(args.dropout), str(args.attention_dropout), str(args.classifier_dropout)]
            if args.label_smoothing or args.class_weights:
                extra.append(str(args.label_smoothing))
            extra += [str(w) for w in args.class_weights]
            r = subprocess.run([args.dump, out] + extra, capture_output=True, text=True, timeout=100)
        except (OSError, subprocess.TimeoutExpired) as e:
            print(f"encoder_torch_check: FAIL: cannot run {args.dump}: {e}", file=sys.stderr)
            return 1
        if r.returncode != 0:
            print(f"encoder_torch_check: FAIL: {args.dump} exited with {r.returncode}:\n{r.stdout}{r.stderr}",
                  file=sys.stderr)
            return 1
        print(r.stdout.strip())
        for attention in ATTENTIONS:
            err = check_one(table, os.path.join(out, attention), attention, args)
            if err:
                print(f"encoder_torch_check: FAIL: {err}", file=sys.stderr)
                return 1

    bad = table.report()
    if bad:
        print(f"encoder_torch_check: FAIL: brisk and PyTorch differ by more than {TOL:g} (relative to max|torch|) in: "
              f"{', '.join(bad)}", file=sys.stderr)
        return 1
    print("encoder_torch_check: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
