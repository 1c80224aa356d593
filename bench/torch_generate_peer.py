#!/usr/bin/python3
"""The PyTorch peer of `brisk bench generate` (docs/workloads.md, I1).

GPT-2 decoding with a key/value cache, written the way a careful PyTorch user
would: weights loaded from the same brisk checkpoint (model.safetensors, Hugging
Face layout), torch.inference_mode(), keys and values preallocated per layer
(B, H, max_len, D) and written in place, the LM head applied only to the last
position, greedy argmax, or with --temperature > 0 the usual top-p sampling
(softmax, a descending sort, the cumulative sum cut at --top-p,
torch.multinomial). One prefill pass over the prompt, then one forward per
new token. The environment is set up as in torch_peer.py (OpenBLAS, threads,
AVX-512 kernels). Prints one JSON line per run: prefill and decode times of
each round and the tokens produced, so the caller can check they match its own.

    /usr/bin/python3 bench/torch_generate_peer.py --checkpoint runs/w1/step_0000300 \
        --prompt 464,3139,286,... --new 128 --rounds 3 [--batch 1]
"""
import argparse
import json
import math
import os
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_peer  # noqa: E402  (environment helpers; importing it does not import torch)


def read_safetensors(torch, path):
    """name -> float32 tensor from a safetensors file (f32 tensors only, which brisk writes)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        blob = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            torch_peer.fail(f"{path}: tensor {name} is {info['dtype']}; the peer reads F32 checkpoints")
        a, b = info["data_offsets"]
        out[name] = torch.frombuffer(bytearray(blob[a:b]), dtype=torch.float32).reshape(info["shape"])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True, help="a brisk checkpoint directory (model.safetensors, state.json)")
    ap.add_argument("--prompt", required=True, help="comma-separated token ids")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1, help="the same prompt decoded this many times at once")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--blas", choices=("openmp", "system"), default="openmp")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    if "avx512f" in torch_peer.cpu_flags():
        os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx512")
    torch_peer.check_system_blas(False)
    torch_peer.prefer_openblas_openmp(args.blas)
    import torch
    import torch.nn.functional as F
    baseline_rss = torch_peer.current_rss_bytes()
    torch.set_num_threads(args.threads)

    with open(os.path.join(args.checkpoint, "state.json")) as f:
        state = json.load(f)
    mc = state["model"]
    V, L, C, H, block = mc["vocab_size"], mc["n_layer"], mc["n_embd"], mc["n_head"], mc["block_size"]
    D = C // H
    w = read_safetensors(torch, os.path.join(args.checkpoint, "model.safetensors"))
    w = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in w.items()}
    for k in list(w):  # HF Conv1D weights are (in, out): make them nn.Linear's (out, in), contiguous
        if k.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
            w[k] = w[k].t().contiguous()
    wte, wpe = w["wte.weight"], w["wpe.weight"]
    weight_bytes = sum(t.numel() * t.element_size() for t in w.values())

    prompt = [int(t) for t in args.prompt.split(",") if t.strip()]
    P, B = len(prompt), args.batch
    total = P + args.new
    if total > block:
        torch_peer.fail(f"prompt {P} + new {args.new} tokens exceed the context of {block}", 2)

    def layer_norm(x, name):
        return F.layer_norm(x, (C,), w[name + ".weight"], w[name + ".bias"], 1e-5)

    def forward(ids, start, kc, vc):
        """ids (B, T) at positions start..start+T-1; returns the last position's logits (B, V)."""
        T = ids.shape[1]
        x = F.embedding(ids, wte) + wpe[start:start + T]
        for l in range(L):
            p = f"h.{l}."
            q, k, v = F.linear(layer_norm(x, p + "ln_1"), w[p + "attn.c_attn.weight"],
                               w[p + "attn.c_attn.bias"]).split(C, dim=2)
            q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))
            kc[l][:, :, start:start + T] = k
            vc[l][:, :, start:start + T] = v
            keys, vals = kc[l][:, :, :start + T], vc[l][:, :, :start + T]
            att = (q @ keys.transpose(-2, -1)) * (1.0 / math.sqrt(D))
            if T > 1:  # causal within the new tokens
                mask = torch.ones(T, start + T, dtype=torch.bool).tril(diagonal=start)
                att = att.masked_fill(~mask, float("-inf"))
            y = (att.softmax(dim=-1) @ vals).transpose(1, 2).reshape(B, T, C)
            x = x + F.linear(y, w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"])
            h = F.gelu(F.linear(layer_norm(x, p + "ln_2"), w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"]),
                       approximate="tanh")
            x = x + F.linear(h, w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"])
        return F.linear(layer_norm(x[:, -1], "ln_f"), wte)

    gen = torch.Generator().manual_seed(args.seed)

    def pick(logits):
        """The next token per sequence: argmax, or a top-p draw at the temperature."""
        if args.temperature == 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits / args.temperature, dim=-1)
        sorted_p, order = probs.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(dim=-1) - sorted_p  # the mass of the tokens ahead of each
        sorted_p = sorted_p.masked_fill(before >= args.top_p, 0.0)  # the top one always stays
        choice = torch.multinomial(sorted_p, 1, generator=gen)
        return order.gather(-1, choice).squeeze(-1)

    runs = []
    with torch.inference_mode():
        for r in range(args.rounds + 1):  # round 0 warms up
            kc = [torch.empty(B, H, total, D) for _ in range(L)]
            vc = [torch.empty(B, H, total, D) for _ in range(L)]
            ids = torch.tensor([prompt] * B, dtype=torch.long)
            t0 = time.perf_counter()
            nxt = pick(forward(ids, 0, kc, vc))
            t1 = time.perf_counter()
            out = [nxt[0].item()]
            for i in range(1, args.new):
                nxt = pick(forward(nxt.view(B, 1), P + i - 1, kc, vc))
                out.append(nxt[0].item())
            t2 = time.perf_counter()
            if r > 0:
                runs.append({"prefill_ms": (t1 - t0) * 1e3, "decode_ms": (t2 - t1) * 1e3, "tokens": out})
    print(json.dumps({
        "engine": "pytorch", "torch": torch.__version__, "threads": torch.get_num_threads(),
        "batch": B, "prompt_tokens": P, "new_tokens": args.new, "decode_steps": args.new - 1, "runs": runs,
        "weight_bytes": weight_bytes,
        "peak_rss_bytes": torch_peer.resource.getrusage(torch_peer.resource.RUSAGE_SELF).ru_maxrss * 1024,
        "baseline_rss_bytes": baseline_rss,
    }), flush=True)


if __name__ == "__main__":
    main()
