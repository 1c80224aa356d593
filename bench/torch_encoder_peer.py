#!/usr/bin/python3
"""The PyTorch peer of `brisk bench train --workload E1` (docs/workloads.md, "Peers").

The E1 spam encoder written in PyTorch (token + position embeddings, pre-LN
blocks with bidirectional attention masked at padded keys, tanh GELU, final
LayerNorm, mean over the real positions, Linear head, mean cross-entropy),
trained eagerly in fp32 (or under torch.autocast bf16 with --bf16: the
mixed precision a PyTorch user reaches for on a CPU) on the batches and
from the initial weights that
`brisk bench train` wrote into its plan: the same padded batches (ids,
lengths, labels), in the same order, as the brisk side. It times one full
optimizer step (zero grads, forward + backward, clip, AdamW) per step and
prints one JSON line on stdout (progress goes to stderr).

What a PyTorch user would reach for to make this fast on a CPU is used where
this torch has it: F.scaled_dot_product_attention with the key-padding mask
as attn_mask (torch >= 2.0; older torch gets the explicit masked softmax),
fused AdamW where it runs on the CPU, else the multi-tensor (foreach=True)
one. The report says which were used. The model code is the one that
tests/models/encoder_torch_check.py checks against brisk (to ~1e-6 in
float64), with the attention call swapped for the fast one.

The environment (threads, ATEN_CPU_CAPABILITY, OpenBLAS and its OpenMP build)
is set up exactly as bench/torch_peer.py does for W1/W2, by its own functions.

    /usr/bin/python3 bench/torch_encoder_peer.py --plan PLAN.json --batches bucketed|padded [--bf16]
"""
import argparse
import json
import os
import platform
import resource
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_peer  # noqa: E402  (the W1/W2 peer's environment set-up; it imports no torch itself)
from torch_peer import MASK64, fail, log  # noqa: E402

# ---- the plan's files -------------------------------------------------------------------


def read_batches(path):
    """src/bench/e1_batches.h's file: "BRISKE1B", u32 version 1, u32 count,
    then per batch i64 rows, i64 cols, i32 ids[rows*cols], i32 lengths[rows],
    i32 labels[rows]."""
    import numpy as np
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        fail(f"cannot read the batch file {path}: {e}")
    if len(raw) < 16 or raw[:8] != b"BRISKE1B" or struct.unpack("<I", raw[8:12])[0] != 1:
        fail(f"{path} is not an E1 batch file (version 1)")
    (count,) = struct.unpack("<I", raw[12:16])
    pos, out = 16, []
    for _ in range(count):
        if len(raw) - pos < 16:
            fail(f"{path}: truncated")
        rows, cols = struct.unpack("<qq", raw[pos:pos + 16])
        pos += 16
        n = rows * cols + 2 * rows
        if rows <= 0 or cols <= 0 or len(raw) - pos < 4 * n:
            fail(f"{path}: bad or truncated batch ({rows} x {cols})")
        a = np.frombuffer(raw, dtype="<i4", count=n, offset=pos)
        pos += 4 * n
        out.append((a[:rows * cols].reshape(rows, cols), a[rows * cols:rows * cols + rows], a[rows * cols + rows:]))
    if pos != len(raw):
        fail(f"{path}: trailing bytes after {count} batches")
    return out


def batch_hash(ids, lengths, labels):
    """e1_batch_hash (src/bench/e1_batches.cpp), mod 2^64."""
    import numpy as np
    flat = ids.reshape(-1).astype(np.uint64)
    h = int((flat * np.arange(1, flat.size + 1, dtype=np.uint64)).sum(dtype=np.uint64))
    for r in range(lengths.size):
        h += int(lengths[r]) * (r + 7) * 1000003 + int(labels[r]) * (r + 11) * 998244353
    return h & MASK64


def read_safetensors(path):
    """F32 tensors of a safetensors file, by name: (shape, read) pairs whose
    read() returns the tensor as a numpy array. Each tensor is read from the
    file when asked for, so the peer never holds the whole file: brisk's
    worker reads no weights file, and a file held for the run (or read
    whole) counted in the peer's RSS growth only."""
    import numpy as np
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            fail(f"{path}: '{name}' is {info['dtype']}, expected F32")
        begin, end = info["data_offsets"]

        def read(begin=begin, end=end, shape=tuple(info["shape"])):
            with open(path, "rb") as f:
                f.seek(8 + n + begin)
                return np.fromfile(f, dtype="<f4", count=(end - begin) // 4).reshape(shape)
        out[name] = (tuple(info["shape"]), read)
    return out


# ---- the model (tests/models/encoder_torch_check.py's, fast attention) -----------------------


def build_model(torch, cfg):
    nn, F = torch.nn, torch.nn.functional
    C, H = cfg["n_embd"], cfg["n_head"]
    sdpa = getattr(F, "scaled_dot_product_attention", None)

    class LayerNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(C))
            self.bias = nn.Parameter(torch.zeros(C))

        def forward(self, x):
            return F.layer_norm(x, (C,), self.weight, self.bias, eps=1e-5)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(C, 3 * C)
            self.c_proj = nn.Linear(C, C)

        def forward(self, x, key_mask):
            """key_mask: (B, 1, 1, T) additive, 0 at real keys and -inf at
            padded ones: every query row, padded ones too, attends over its
            row's real keys (never an all -inf row, since lengths >= 1)."""
            B, T, _ = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            if sdpa is not None:
                y = sdpa(q, k, v, attn_mask=key_mask)
            else:  # torch < 2.0: what F.scaled_dot_product_attention computes, spelled out
                mask = key_mask.expand(B, H, 1, T).reshape(B * H, 1, T)  # broadcast over the queries
                att = torch.baddbmm(mask, q.reshape(B * H, T, C // H),
                                    k.reshape(B * H, T, C // H).transpose(1, 2), alpha=(C // H) ** -0.5)
                y = torch.bmm(att.softmax(dim=-1), v.reshape(B * H, T, C // H)).view(B, H, T, C // H)
            return self.c_proj(y.transpose(1, 2).reshape(B, T, C))

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(C, 4 * C)
            self.c_proj = nn.Linear(4 * C, C)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = LayerNorm()
            self.attn = Attention()
            self.ln_2 = LayerNorm()
            self.mlp = Mlp()

        def forward(self, x, key_mask):
            x = x + self.attn(self.ln_1(x), key_mask)
            return x + self.mlp(self.ln_2(x))

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(cfg["vocab_size"], C)
            self.wpe = nn.Embedding(cfg["max_len"], C)
            self.h = nn.ModuleList(Block() for _ in range(cfg["n_layer"]))
            self.ln_f = LayerNorm()
            self.head = nn.Linear(C, cfg["n_classes"])

        def forward(self, ids, lengths, labels):
            B, T = ids.shape
            key_valid = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
            key_mask = torch.zeros(B, 1, 1, T).masked_fill_(~key_valid[:, None, None, :], float("-inf"))
            x = self.wte(ids) + self.wpe(torch.arange(T))
            for block in self.h:
                x = block(x, key_mask)
            x = self.ln_f(x)
            pooled = (x * key_valid[:, :, None]).sum(dim=1) / lengths[:, None]  # mean over the real positions
            return F.cross_entropy(self.head(pooled), labels)

    attention = "F.scaled_dot_product_attention(attn_mask = key-padding mask)" if sdpa is not None else \
        f"baddbmm + softmax + bmm with the key-padding mask (torch {torch.__version__} has no " \
        "F.scaled_dot_product_attention)"
    return Encoder(), attention


def make_optimizer(torch, model, o):
    """Fused AdamW where this torch runs it on the CPU, else foreach (multi-tensor)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]  # brisk decays 2-D weights and embeddings only
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": o["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]
    kw = dict(lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    try:
        opt = torch.optim.AdamW(groups, fused=True, **kw)
        # Some versions accept fused=True at construction and fail only at the first CPU step.
        p = torch.zeros(1, requires_grad=True)
        probe = torch.optim.AdamW([p], fused=True, lr=0.0)
        p.grad = torch.zeros(1)
        probe.step()
        return opt, "torch.optim.AdamW(fused=True)"
    except (TypeError, RuntimeError, ValueError):
        return torch.optim.AdamW(groups, foreach=True, **kw), "torch.optim.AdamW(foreach=True) (no fused AdamW on " \
            "this torch's CPU)"


# ---- main -------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plan", required=True, help="the plan brisk bench train wrote (model, optimizer, files)")
    ap.add_argument("--batches", required=True, help="which of the plan's batch files: bucketed | padded")
    ap.add_argument("--workload", default="E1")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true", help="torch.autocast(device_type='cpu', dtype=torch.bfloat16)")
    ap.add_argument("--fix-blas", action="store_true", help="select OpenBLAS system-wide if the reference BLAS is")
    ap.add_argument("--blas", choices=("openmp", "system"), default="openmp",
                    help="openmp: load OpenBLAS's OpenMP build for this process (default); system: the alternatives' pick")
    args = ap.parse_args()
    if args.workload not in ("E1", "spam-encoder"):
        fail(f"unknown workload {args.workload} (this peer runs E1; W1/W2 are bench/torch_peer.py's)", 2)

    # Threads and kernels are fixed at library load time: set them first (as torch_peer.py does).
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    if "avx512f" in torch_peer.cpu_flags():
        os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx512")
    torch_peer.check_system_blas(args.fix_blas)
    torch_peer.prefer_openblas_openmp(args.blas)

    try:
        import numpy as np
        import torch
    except ImportError as e:
        fail(f"{sys.executable} cannot import torch/numpy ({e}); run the peer with Debian's /usr/bin/python3 "
             "(apt-get install python3-torch)")
    baseline_rss_bytes = torch_peer.current_rss_bytes()  # growth is measured over this, as for W1/W2
    torch.set_num_threads(args.threads)

    a = torch.randn(64, 64)
    torch.mm(a, a)  # maps the BLAS if it was loaded lazily
    maps = torch_peer.mapped_blas()
    openblas = [p for p in maps if "openblas" in p]
    if not openblas:
        fail("torch is not using OpenBLAS: this process mapped " + (", ".join(maps) or "no BLAS library") +
             "; select OpenBLAS with update-alternatives (see --fix-blas)")
    ob_config, ob_core = torch_peer.openblas_info(openblas)
    show = torch.__config__.show()
    cap = next((l.split(":", 1)[1].strip() for l in show.splitlines() if "CPU capability usage" in l), "?")

    try:
        with open(args.plan) as f:
            plan = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"cannot read the plan {args.plan}: {e}")
    if args.batches not in plan["batches"]:
        fail(f"the plan has no '{args.batches}' batches (it has {', '.join(plan['batches'])})", 2)
    batches = read_batches(plan["batches"][args.batches])
    total = args.warmup + args.steps
    if len(batches) < total:
        fail(f"the plan holds {len(batches)} batches, the run needs {total}")

    model, attention = build_model(torch, plan["model"])
    weights = read_safetensors(plan["weights"])
    ours = dict(model.named_parameters())
    if set(weights) != set(ours):
        fail(f"parameter names differ: only in brisk {sorted(set(weights) - set(ours))}, "
             f"only here {sorted(set(ours) - set(weights))}")
    with torch.no_grad():
        for name, p in ours.items():
            shape, read = weights[name]
            if shape != tuple(p.shape):
                fail(f"'{name}' is {shape} in brisk's weights, {tuple(p.shape)} here")
            p.copy_(torch.from_numpy(read()))
    del weights
    o = plan["optimizer"]
    opt, opt_name = make_optimizer(torch, model, o)
    params = list(model.parameters())
    name = f"pytorch {args.batches}" + (" bf16" if args.bf16 else "")
    log(f"  {name}: torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability {cap}, "
        f"BLAS {openblas[0]}; {opt_name}")

    tty = sys.stderr.isatty()
    losses, step_ms = [], []
    data_hash = 0
    for s in range(total):
        ids_np, len_np, lab_np = batches[s]
        data_hash = (data_hash * 1000003 + batch_hash(ids_np, len_np, lab_np)) & MASK64
        # Converted before the clock starts, as brisk's batch is ready before its step.
        ids = torch.from_numpy(ids_np.astype(np.int64))
        lengths = torch.from_numpy(len_np.astype(np.int64))
        labels = torch.from_numpy(lab_np.astype(np.int64))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if args.bf16:
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                loss = model(ids, lengths, labels)
        else:
            loss = model(ids, lengths, labels)
        loss.backward()
        if o["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(params, o["grad_clip"])
        opt.step()
        lv = loss.item()
        ms = (time.perf_counter() - t0) * 1e3
        losses.append(lv)
        if s >= args.warmup:
            step_ms.append(ms)
        warm = " (warm-up)" if s < args.warmup else ""
        if tty:
            print(f"\r  {name:<16} step {s + 1:2d}/{total}{warm:<10} width {ids_np.shape[1]:3d} loss {lv:.4f}  "
                  f"{ms:7.1f} ms   ", end="", file=sys.stderr, flush=True)
        elif s == 0 or s + 1 == args.warmup or (s + 1) % 5 == 0 or s + 1 == total:
            log(f"  {name:<16} step {s + 1:2d}/{total}{warm} width {ids_np.shape[1]:3d} loss {lv:.4f}  {ms:7.1f} ms")
    if tty:
        print(file=sys.stderr)

    print(json.dumps({
        "engine": "pytorch", "precision": "bf16" if args.bf16 else "fp32", "workload": "E1", "variant": args.batches,
        "torch": torch.__version__, "python": sys.executable + " " + platform.python_version(),
        "threads": torch.get_num_threads(), "cpu_capability": cap,
        "aten_cpu_capability_env": os.environ.get("ATEN_CPU_CAPABILITY", ""),
        "blas": {"mapped": openblas[0], "config": ob_config, "core": ob_core, "all_mapped": maps},
        "attention": attention, "optimizer": opt_name + ", clip_grad_norm_",
        "params": sum(p.numel() for p in params), "warmup": args.warmup, "steps": args.steps,
        "step_ms": step_ms, "losses": losses, "data_hash": data_hash,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "baseline_rss_bytes": baseline_rss_bytes,
    }), flush=True)


if __name__ == "__main__":
    main()
