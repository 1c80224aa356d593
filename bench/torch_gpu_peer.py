#!/usr/bin/env python3
"""The PyTorch peer of the G1 GPU benchmark (bench/gpu_g1_bench.py).

GPT-2 124M (G1 of docs/workloads.md: vocab 50304, 12 layers, 768 wide, 12 heads,
sequence 1024) trained on one GPU in PyTorch's strongest configuration for
this model: bf16 autocast, F.scaled_dot_product_attention (flash kernels),
torch.compile of the whole model, fused AdamW, TF32 allowed for what stays
fp32. Same hyperparameters as brisk (AdamW lr 6e-4, betas 0.9/0.95, eps 1e-8,
weight decay 0.1 on matrices, clip 1.0) and the same batches: brisk's token
shards read through torch_peer.py's loader and WindowSampler.

Timed per optimizer step: zero grads, forward + backward, clip, AdamW, with a
device synchronisation at the end of each step (the loss is read back, as
brisk does). Prints one JSON line on stdout; progress on stderr.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_peer import WindowSampler, load_tokens, log  # noqa: E402  (same data, same windows)


def build_model(torch, V, L, C, H, block):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C, eps=1e-5)
            self.c_attn = nn.Linear(C, 3 * C)
            self.attn_proj = nn.Linear(C, C)
            self.ln_2 = nn.LayerNorm(C, eps=1e-5)
            self.c_fc = nn.Linear(C, 4 * C)
            self.mlp_proj = nn.Linear(4 * C, C)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, C)
            self.wpe = nn.Embedding(block, C)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C, eps=1e-5)
            for name, p in self.named_parameters():
                if name.endswith(".bias"):
                    nn.init.zeros_(p)
                elif "ln_" in name:
                    nn.init.ones_(p)
                else:
                    nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02)

        def forward(self, idx, targets):
            T = idx.shape[1]
            pos = torch.arange(T, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for blk in self.h:
                x = blk(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)
            return F.cross_entropy(logits.view(-1, V).float(), targets.reshape(-1))

    return Gpt()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="brisk dataset directory (GPT-2 BPE token shards)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--no-compile", action="store_true", help="eager mode (torch.compile off)")
    args = ap.parse_args()

    import torch
    if not torch.cuda.is_available():
        print(json.dumps({"engine": "pytorch", "error": "no CUDA device visible to torch"}))
        return 3
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device("cuda")
    V, L, C, H = 50304, 12, 768, 12
    model = build_model(torch, V, L, C, H, 1024).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    step_model = model if args.no_compile else torch.compile(model)
    tokens, _ = load_tokens(args.data)
    sampler = WindowSampler(tokens, args.batch, args.seq, args.seed)

    times, losses = [], []
    torch.cuda.reset_peak_memory_stats()
    base_mem = torch.cuda.memory_allocated()
    for step in range(args.warmup + args.steps):
        x, y = sampler.next()
        x = torch.from_numpy(x).to(dev, non_blocking=True)
        y = torch.from_numpy(y).to(dev, non_blocking=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = loss.item()  # synchronises, as brisk's loss read-back does
        dt = time.perf_counter() - t0
        if step >= args.warmup:
            times.append(dt)
        losses.append(lv)
        log(f"torch step {step + 1}/{args.warmup + args.steps}: loss {lv:.4f}, {dt * 1e3:.1f} ms")
    times.sort()
    med = statistics.median(times)
    print(json.dumps({
        "engine": "pytorch", "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
        "config": "bf16 autocast, torch.compile" + (" off" if args.no_compile else "") +
                  ", scaled_dot_product_attention, fused AdamW, TF32",
        "batch": args.batch, "seq": args.seq, "steps": args.steps, "warmup": args.warmup,
        "median_ms": med * 1e3, "min_ms": times[0] * 1e3, "max_ms": times[-1] * 1e3,
        "tokens_per_s": args.batch * args.seq / med, "losses": losses,
        "peak_mem_growth_bytes": torch.cuda.max_memory_allocated() - base_mem}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
