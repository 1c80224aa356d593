#!/usr/bin/python3
"""brisk's GPT against an independent GPT-2 written in PyTorch.

Run with Debian's /usr/bin/python3 (python3-torch and python3-numpy are
Debian packages, see scripts/install_deps.sh); ctest runs it as
gpt_torch_crosscheck. The script runs brisk_gpt_dump into a temporary
directory, builds the same GPT-2 here from scratch (pre-LN, LayerNorm eps
1e-5, tanh GELU, learned positions, biases everywhere, final LayerNorm, LM
head tied to wte), loads brisk's initial weights from the HF-layout
checkpoint brisk wrote, and compares in fp32:
  - the logits and the loss of one batch,
  - the gradient of every parameter (by name),
  - the losses (and the pre-clip grad norms) of 10 AdamW steps with
    lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on every
    parameter of rank >= 2 (as brisk does: Linear weights, wte and wpe), no
    decay on biases and LayerNorm parameters, global grad-norm clip 1.0,
  - every parameter after those 10 steps (the losses alone would not notice
    a missing weight decay or clip; these do, by 5x the tolerance or more).
Each tensor's error is max|brisk - torch| / max|torch|; all must be <= 1e-4.

With --dropout P brisk trains with model.dropout = P, and the model here
drops the same elements: the embeddings' sum and each block's attention
and MLP branches before their residual adds, each with a mask this script
makes from the step's key (results.json) by its own copy of the hash that
docs/architecture.md ("Dropout") writes out (sites 0, then 1 + 2l and 2 + 2l for block l).
With --attention-dropout A (model.attention_dropout) each block's attention
probabilities (B, n_head, T, T) are dropped the same way after the softmax,
at site 2^31 + l, element index their flat index.
The logits (Gpt::logits) are compared without dropout: evaluation never
drops.
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

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # a missing dependency must fail the test, not skip it
    print(f"gpt_torch_check: FAIL: {sys.executable} cannot import torch/numpy ({e}): "
          "install python3-torch (scripts/install_deps.sh)", file=sys.stderr)
    sys.exit(1)


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


# ---- GPT-2, from scratch ------------------------------------------------------------
# ---- dropout masks: brisk's hash (docs/architecture.md ("Dropout")), written here from its description

M32 = 0xFFFFFFFF


def mix32(h):
    """MurmurHash3's 32-bit finalizer on uint64 arrays holding 32-bit values."""
    h = h ^ (h >> np.uint64(16))
    h = (h * np.uint64(0x85EBCA6B)) & np.uint64(M32)
    h = h ^ (h >> np.uint64(13))
    h = (h * np.uint64(0xC2B2AE35)) & np.uint64(M32)
    return h ^ (h >> np.uint64(16))


def keep_mask(shape, p, key, site):
    """Which elements brisk's dropout keeps: bits(i) >= floor(p * 2^32)."""
    k0, k1 = (np.uint64(k) for k in key)
    i = np.arange(int(np.prod(shape)), dtype=np.uint64)
    hi = i >> np.uint64(32)
    s0 = mix32(k0 ^ mix32(np.uint64(site) ^ (((hi + np.uint64(1)) * np.uint64(0x9E3779B9)) & np.uint64(M32))))
    s1 = mix32(k1 ^ s0 ^ np.uint64(0x85EBCA6B))
    bits = mix32(mix32((i & np.uint64(M32)) ^ s0) ^ s1)
    threshold = min(int(float(np.float32(p)) * 4294967296.0), M32)
    return torch.from_numpy((bits >= np.uint64(threshold)).reshape(shape))


def dropped(x, p, key, site):
    """x with brisk's dropout of probability p at `site` applied (x's flat index is the element index)."""
    if not p:
        return x
    scale = np.float32(1.0 / (1.0 - float(np.float32(p))))
    return x * keep_mask(tuple(x.shape), p, key, site).to(x.dtype) * float(scale)


class Dropout:
    """One micro-step's dropout: model.dropout's p, model.attention_dropout's and the step's key."""

    def __init__(self, p, attention_p, key):
        self.p, self.attention_p, self.key = p, attention_p, key

    def __call__(self, x, site):
        return dropped(x, self.p, self.key, site)

    def probs(self, att, layer):
        """Block `layer`'s attention probabilities (B, n_head, T, T), at site 2^31 + layer."""
        return dropped(att, self.attention_p, self.key, 0x80000000 | layer)


# Module names are chosen so that named_parameters() yields the HF GPT-2 names.

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

    def forward(self, x, drop=None, layer=0):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)  # HF / nanoGPT order: [q | k | v]
        q, k, v = (t.view(B, T, self.n_head, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
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

    def forward(self, x, drop=None, layer=0):
        a = self.attn(self.ln_1(x), drop, layer)
        x = x + (drop(a, 1 + 2 * layer) if drop else a)
        m = self.mlp(self.ln_2(x))
        return x + (drop(m, 2 + 2 * layer) if drop else m)


class Gpt(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c = cfg["n_embd"]
        self.wte = nn.Embedding(cfg["vocab_size"], c)
        self.wpe = nn.Embedding(cfg["block_size"], c)
        self.h = nn.ModuleList(Block(c, cfg["n_head"]) for _ in range(cfg["n_layer"]))
        self.ln_f = LayerNorm(c)

    def forward(self, ids, targets=None, drop=None):
        B, T = ids.shape
        x = self.wte(ids) + self.wpe(torch.arange(T))
        if drop:
            x = drop(x, 0)
        for l, block in enumerate(self.h):
            x = block(x, drop, l)
        logits = F.linear(self.ln_f(x), self.wte.weight).view(B * T, -1)  # tied head, no bias
        loss = None if targets is None else F.cross_entropy(logits, targets)
        return logits, loss


CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def load_hf_checkpoint(model, path):
    """brisk's model.safetensors: HF names, Conv1D weights stored (in, out)."""
    sd = read_safetensors(path)
    ours = dict(model.named_parameters())
    if set(sd) != set(ours):
        raise RuntimeError(f"{path}: tensor names differ from GPT-2's: only in file {sorted(set(sd) - set(ours))}, "
                           f"missing {sorted(set(ours) - set(sd))}")
    with torch.no_grad():
        for name, p in ours.items():
            w = sd[name]
            if name.endswith(CONV1D):
                expect = tuple(reversed(p.shape))  # HF Conv1D: (in, out)
                if w.shape != expect:
                    raise RuntimeError(f"{path}: '{name}' is {w.shape}, HF Conv1D layout is {expect}")
                w = w.T
            elif w.shape != tuple(p.shape):
                raise RuntimeError(f"{path}: '{name}' is {w.shape}, expected {tuple(p.shape)}")
            p.copy_(torch.from_numpy(np.ascontiguousarray(w)))


# ---- comparison ----------------------------------------------------------------------

class Table:
    def __init__(self):
        self.rows = []

    def tensor(self, what, brisk, ref, enforce=True):
        brisk = np.asarray(brisk, dtype=np.float64)
        ref = np.asarray(ref, dtype=np.float64)
        if brisk.shape != ref.shape:
            self.rows.append((what, str(ref.shape), float("inf"), float("nan"), f"shape {brisk.shape} vs {ref.shape}", True))
            return
        diff = float(np.max(np.abs(brisk - ref))) if ref.size else 0.0
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        err = diff / scale if scale > 0 else diff  # all-zero reference: absolute
        self.rows.append((what, str(tuple(ref.shape)), err, scale, "" if enforce else "(not compared: see below)", enforce))

    def scalar(self, what, brisk, ref):
        self.tensor(what, np.array([brisk]), np.array([ref]))

    def report(self):
        w = max(len(r[0]) for r in self.rows)
        print(f"{'quantity':<{w}}  {'shape':<12}  {'max|ref|':>10}  {'rel err':>10}  ok")
        bad = []
        for what, shape, err, scale, note, enforce in self.rows:
            ok = err <= TOL or not enforce
            if not ok:
                bad.append(what)
            print(f"{what:<{w}}  {shape:<12}  {scale:10.3e}  {err:10.3e}  {'-' if not enforce else 'yes' if ok else 'NO'} {note}")
        checked = [r for r in self.rows if r[5]]
        worst = max(checked, key=lambda r: r[2])
        print(f"{len(checked)} comparisons, worst {worst[0]} at {worst[2]:.3e} (tolerance {TOL:g})")
        return bad


def blas_info():
    """What torch says about its BLAS, and which BLAS library is actually mapped."""
    lines = [l.strip() for l in torch.__config__.show().splitlines() if "BLAS" in l or "LAPACK" in l]
    info = []
    for l in lines:
        info += [kv for kv in l.split(", ") if "BLAS" in kv or "LAPACK" in kv] or [l]
    torch.ones(64, 64) @ torch.ones(64, 64)  # make sure the BLAS is loaded
    try:
        with open("/proc/self/maps") as f:
            libs = sorted({l.split()[-1] for l in f if "blas" in l.lower() and "/" in l})
    except OSError:
        libs = []
    return info, libs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dump", required=True, help="path of the brisk_gpt_dump executable")
    ap.add_argument("--keep", help="write the dump here and keep it (default: a temporary directory)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="where brisk computes the dump (the PyTorch reference runs on the CPU either way)")
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="train with model.dropout = P on both sides (the same masks)")
    ap.add_argument("--attention-dropout", type=float, default=0.0,
                    help="train with model.attention_dropout = P on both sides (the same masks)")
    ap.add_argument("--attention", default="plain", choices=["plain", "flash"],
                    help="brisk's model.attention (the reference is the same function either way)")
    args = ap.parse_args()

    # Two threads like the brisk side. docs/workloads.md has the PyTorch peer use
    # OpenBLAS (update-alternatives for libblas.so.3); for a correctness check the
    # BLAS choice does not matter — any correct fp32 BLAS agrees far inside 1e-4 —
    # so it is only reported here, not enforced.
    torch.set_num_threads(2)
    torch.manual_seed(0)
    info, libs = blas_info()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {'; '.join(info)}")
    print(f"BLAS libraries mapped: {', '.join(libs) if libs else '(none found)'}")

    with tempfile.TemporaryDirectory(prefix="brisk_gpt_check_") as tmp:
        out = args.keep or tmp
        try:
            cmd = [args.dump, out, args.device]
            if args.dropout or args.attention_dropout or args.attention != "plain":
                cmd += [str(args.dropout), str(args.attention_dropout), args.attention]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            print(f"gpt_torch_check: FAIL: cannot run {args.dump}: {e}", file=sys.stderr)
            return 1
        if r.returncode != 0 and args.device == "cuda" and "CUDA backend is unavailable" in r.stderr:
            print(f"gpt_torch_check: SKIP: {r.stderr.strip()}")
            return 77
        if r.returncode != 0:
            print(f"gpt_torch_check: FAIL: {args.dump} exited with {r.returncode}:\n{r.stdout}{r.stderr}", file=sys.stderr)
            return 1
        print(r.stdout.strip())
        with open(os.path.join(out, "results.json")) as f:
            res = json.load(f)
        tensors = read_safetensors(os.path.join(out, "tensors.safetensors"))
        steps = read_safetensors(os.path.join(out, "steps.safetensors"))
        ckpt = os.path.join(out, res["checkpoint"], "model.safetensors")

        cfg = res["config"]
        for what, want in (("dropout", args.dropout), ("attention_dropout", args.attention_dropout)):
            if abs(res.get(what, 0.0) - want) > 1e-7:
                print(f"gpt_torch_check: FAIL: the dump trained with {what} {res.get(what)}, not {want}",
                      file=sys.stderr)
                return 1
        if res.get("attention", "plain") != args.attention:
            print(f"gpt_torch_check: FAIL: the dump ran {res.get('attention')} attention, not {args.attention}",
                  file=sys.stderr)
            return 1
        dropping = bool(args.dropout or args.attention_dropout)

        def dropout_of(step):  # the step's dropout, None without
            key = res["steps"][step]["dropout_key"]
            return Dropout(args.dropout, args.attention_dropout, key) if dropping else None

        model = Gpt(cfg)
        load_hf_checkpoint(model, ckpt)
        table = Table()

        # --- logits, loss and every gradient at the initial weights
        x = torch.from_numpy(tensors["x"].astype(np.int64))
        y = torch.from_numpy(tensors["y"].astype(np.int64))
        logits, _ = model(x)  # evaluation: no dropout
        _, loss = model(x, y, dropout_of(0))
        loss.backward()
        table.tensor("logits", tensors["logits"], logits.detach().numpy())
        table.scalar("loss", res["loss"], loss.item())
        params = dict(model.named_parameters())
        brisk_grads = {k[len("grad."):]: v for k, v in tensors.items() if k.startswith("grad.")}
        if set(brisk_grads) != set(params):
            print(f"gpt_torch_check: FAIL: gradient names differ: brisk only {sorted(set(brisk_grads) - set(params))}, "
                  f"torch only {sorted(set(params) - set(brisk_grads))}", file=sys.stderr)
            return 1
        for name in sorted(params):  # brisk's gradients are in nn.Linear (out, in) layout
            table.tensor("grad " + name, brisk_grads[name], params[name].grad.numpy())

        # --- 10 AdamW steps from the same initial weights
        model = Gpt(cfg)
        load_hf_checkpoint(model, ckpt)
        a = res["adamw"]
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": a["weight_decay"]},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=a["lr"], betas=(a["beta1"], a["beta2"]), eps=a["eps"], foreach=False)
        # With dropout, elements whose gradient was at rounding-noise level in
        # some step (nonzero, below 1e-6 of their tensor's largest; a few in
        # thousands here): there
        # AdamW's step is g / (|g| + eps) with |g| ~ eps, set by the noise, not
        # by the model. They are reported apart, and may be at most 1% of a
        # tensor (or 2 elements, for the 48-wide ones). (An
        # exact zero, as wpe's unused rows get, is no noise: both sides then
        # only decay the weight, which stays compared.) Without dropout no
        # element is set apart.
        noise_level = {name: np.zeros(tuple(p.shape), dtype=bool) for name, p in model.named_parameters()}
        for k, s in enumerate(res["steps"]):
            opt.zero_grad(set_to_none=True)
            xk = torch.from_numpy(steps[f"x.{k}"].astype(np.int64))
            yk = torch.from_numpy(steps[f"y.{k}"].astype(np.int64))
            _, loss = model(xk, yk, dropout_of(k))
            loss.backward()
            for name, p in model.named_parameters():
                g = np.abs(p.grad.numpy())
                if dropping:
                    noise_level[name] |= (g > 0) & (g < 1e-6 * g.max())
            # torch divides by (norm + 1e-6), brisk by norm: a 1e-6 relative difference in the
            # clip factor, which Adam's scale invariance shrinks further; far inside 1e-4.
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), a["grad_clip"])
            opt.step()
            table.scalar(f"step {k} loss", s["loss"], loss.item())
            table.scalar(f"step {k} grad norm", s["grad_norm"], norm.item())
        # The losses alone hardly see the optimizer (Adam's steps are small next to the
        # batch-to-batch spread: dropping weight decay or clipping changes them by < 1e-5),
        # so every parameter after the 10 steps is compared as well; that catches weight
        # decay (and on which parameters), clipping, lr, betas and bias corrections.
        final = read_safetensors(os.path.join(out, "final.safetensors"))
        key_bias_note = False
        noise_notes, noise_bad = [], []
        for name, p in sorted(model.named_parameters()):
            mine, ref = final[name], p.detach().numpy()
            noisy = noise_level[name]
            if noisy.any() and not name.endswith("attn.c_attn.bias"):
                table.tensor("final " + name + " [rest]", mine[~noisy], ref[~noisy])
                table.tensor(f"final {name} [noise]", mine[noisy], ref[noisy], enforce=False)
                moved = float(np.max(np.abs(mine[noisy] - ref[noisy])))
                noise_notes.append(f"{name}: {int(noisy.sum())} of {noisy.size}, apart by at most {moved:.2e}")
                if noisy.sum() > max(2, 0.01 * noisy.size):
                    noise_bad.append(name)
            elif name.endswith("attn.c_attn.bias"):
                # The key bias adds q.b_k to every score of a query, which softmax
                # cancels: its gradient is 0 analytically and ~1e-11 rounding noise in
                # both implementations, which Adam turns into ~1e-6 steps whose signs
                # are the noise's. It cannot affect any output, so only q and v count.
                c = cfg["n_embd"]
                table.tensor(f"final {name} [q]", mine[:c], ref[:c])
                table.tensor(f"final {name} [v]", mine[2 * c:], ref[2 * c:])
                table.tensor(f"final {name} [k]", mine[c:2 * c], ref[c:2 * c], enforce=False)
                key_bias_note = True
            else:
                table.tensor("final " + name, mine, ref)

    bad = table.report()
    if noise_notes:
        print("[noise] elements: a gradient below 1e-6 of the tensor's largest in some step makes AdamW's step "
              "follow rounding noise (|g| ~ eps); compared apart, at most 1% of a tensor (or 2 elements): "
              + "; ".join(noise_notes))
    bad += [f"final {name} [noise] (more than 1% of the tensor, or 2 elements)" for name in noise_bad]
    if key_bias_note:
        print("[k] rows: the attention key bias has a zero gradient analytically (softmax cancels it), so its "
              "AdamW steps follow rounding noise; they cannot change any output and are not compared.")
    if bad:
        print(f"gpt_torch_check: FAIL: brisk and PyTorch differ by more than {TOL:g} (relative to max|torch|) in: "
              f"{', '.join(bad)}", file=sys.stderr)
        return 1
    print("gpt_torch_check: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
