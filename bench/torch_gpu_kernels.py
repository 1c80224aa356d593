#!/usr/bin/env python3
"""PyTorch's time for the pieces of a G1 step, one at a time, to set beside
`brisk train --trace` (scripts/trace_summary.py) on the same GPU.

bf16 on the GPU, G1's shapes (batch x seq rows of 768, MLP 3072, 12 heads of
64): the four Linears forward and their two backward products each,
scaled_dot_product_attention (causal) forward and forward + backward,
LayerNorm and GELU forward and backward, each timed with CUDA events as the
median of 20 runs after 5 warm-ups. Per layer, in ms; the G1 step has 12.

    python3 bench/torch_gpu_kernels.py --batch 16 [--out kernels.json]
"""
import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F


def timed(fn, reps=20, warmup=5):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--out")
    args = ap.parse_args()
    dev, dt = "cuda", torch.bfloat16
    B, T, C, H = args.batch, args.seq, 768, 12
    N = B * T
    torch.manual_seed(0)
    rows = {}
    x = torch.randn(N, C, device=dev, dtype=dt)
    for name, (fin, fout) in {"qkv": (C, 3 * C), "proj": (C, C), "fc": (C, 4 * C), "fc2": (4 * C, C)}.items():
        a = torch.randn(N, fin, device=dev, dtype=dt)
        w = torch.randn(fout, fin, device=dev, dtype=dt) * 0.02
        g = torch.randn(N, fout, device=dev, dtype=dt)
        flops = 2 * N * fin * fout
        for what, fn in (("fwd", lambda: a @ w.t()), ("dx", lambda: g @ w), ("dw", lambda: g.t() @ a)):
            ms = timed(fn)
            rows[f"linear {name} {what}"] = {"ms": ms, "tflops": flops / ms / 1e9}
    q, k, v = (torch.randn(B, H, T, 64, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
    dy = torch.randn(B, H, T, 64, device=dev, dtype=dt)
    rows["sdpa causal fwd"] = {"ms": timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))}

    def sdpa_fb():
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y.backward(dy)

    rows["sdpa causal fwd+bwd"] = {"ms": timed(sdpa_fb)}
    rows["sdpa causal bwd"] = {"ms": rows["sdpa causal fwd+bwd"]["ms"] - rows["sdpa causal fwd"]["ms"]}
    xf = torch.randn(N, C, device=dev, dtype=torch.float32, requires_grad=True)
    ln = torch.nn.LayerNorm(C, device=dev)
    gl = torch.randn(N, C, device=dev, dtype=torch.float32)
    rows["layernorm f32 fwd"] = {"ms": timed(lambda: ln(xf))}

    def ln_fb():
        ln(xf).backward(gl)

    rows["layernorm f32 fwd+bwd"] = {"ms": timed(ln_fb)}
    h = torch.randn(N, 4 * C, device=dev, dtype=dt, requires_grad=True)
    gh = torch.randn(N, 4 * C, device=dev, dtype=dt)
    rows["gelu tanh fwd"] = {"ms": timed(lambda: F.gelu(h, approximate="tanh"))}

    def gelu_fb():
        F.gelu(h, approximate="tanh").backward(gh)

    rows["gelu tanh fwd+bwd"] = {"ms": timed(gelu_fb)}
    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name()}: G1 pieces, batch {B} x seq {T}, "
          "bf16, ms per call (one layer)")
    for k_, r in rows.items():
        extra = f"  {r['tflops']:.0f} TFLOP/s" if "tflops" in r else ""
        print(f"  {k_:26s} {r['ms']:8.3f}{extra}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"batch": B, "seq": T, "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
