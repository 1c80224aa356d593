#!/usr/bin/python3
"""The PyTorch peer of `brisk bench train` (docs/workloads.md, "Peers").

GPT-2 exactly as docs/workloads.md defines it, trained eagerly in fp32 (or under
torch.autocast bf16 with --bf16) with the same hyperparameters, batch, sequence
length, data and even the same windows in the same order as brisk: it reads
brisk's token shards directly and replays brisk's WindowSampler. It times one
full optimizer step (zero grads, forward + backward, clip, AdamW) per step and
prints one JSON line on stdout (progress goes to stderr); `brisk bench train`
starts it as a child process so its peak RSS is its own.

Why it is this careful about the environment: Debian's python3-torch 1.13
silently uses whatever libblas.so.3 the alternatives system points at (the
reference BLAS is ~20x slower), one thread unless told otherwise, and AVX2
kernels unless ATEN_CPU_CAPABILITY says avx512. Any of those makes the
comparison meaningless, so the script sets what it can before importing torch,
checks what the process really mapped, and reports all of it.

Run it with Debian's interpreter (/usr/bin/python3), not a pyenv python:
    /usr/bin/python3 bench/torch_peer.py --workload W2 [--bf16] [--fix-blas]
"""
import argparse
import json
import math
import os
import platform
import re
import resource
import struct
import subprocess
import sys
import time

PRESETS = {  # docs/workloads.md: vocab, layers, embd, heads, seq (= block size), default data
    "W1": dict(vocab=50304, layers=4, embd=256, heads=4, block=256, data="data/kjv-gpt2"),
    "W2": dict(vocab=256, layers=6, embd=384, heads=6, block=256, data="data/kjv-bytes"),
}
ALIASES = {"gpt2-tiny": "W1", "char-small": "W2"}
MASK64 = (1 << 64) - 1


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def fail(msg, code=3):
    """Says why on stderr and in the JSON report (the parent prints it)."""
    log("torch_peer: error: " + msg)
    print(json.dumps({"engine": "pytorch", "error": msg}), flush=True)
    sys.exit(code)


# ---- the environment, before torch is imported ------------------------------------


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def multiarch():
    try:
        return subprocess.run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return platform.machine() + "-linux-gnu"


def alternatives(name):
    try:
        out = subprocess.run(["update-alternatives", "--list", name], capture_output=True, text=True).stdout
        return [l.strip() for l in out.splitlines() if l.strip()]
    except OSError:
        return []


def check_system_blas(fix):
    """The libblas.so.3 that the alternatives system selects must be OpenBLAS.

    Checked before torch is imported: fixing it afterwards would need a
    re-exec, because the loader has already mapped the library."""
    arch = multiarch()
    commands = []
    for lib in ("libblas.so.3", "liblapack.so.3"):
        link = f"/usr/lib/{arch}/{lib}"
        if not os.path.exists(link):
            continue
        target = os.path.realpath(link)
        if "openblas" in target:
            continue
        alt = f"{lib}-{arch}"
        choices = [c for c in alternatives(alt) if "openblas" in c]
        if not choices:
            fail(f"{link} is {target}, not OpenBLAS, and no OpenBLAS is installed: "
                 f"apt-get install libopenblas0-pthread, then update-alternatives --set {alt} "
                 f"/usr/lib/{arch}/openblas-pthread/{lib}")
        best = next((c for c in choices if "openblas-pthread" in c), choices[0])
        commands.append(["update-alternatives", "--set", alt, best])
    if not commands:
        return
    shown = "; ".join(("sudo " if os.geteuid() != 0 else "") + " ".join(c) for c in commands)
    if not fix:
        fail("the system BLAS is the slow reference implementation, so PyTorch would be measured on it. "
             f"Select OpenBLAS with: {shown}   (or run `brisk bench train ... --fix-blas`)")
    for c in commands:
        cmd = c if os.geteuid() == 0 else ["sudo"] + c
        log("torch_peer: --fix-blas: " + " ".join(cmd))
        if subprocess.run(cmd).returncode != 0:
            fail("could not run: " + " ".join(cmd))


def prefer_openblas_openmp(choice):
    """Re-executes this script so that torch loads the OpenMP build of OpenBLAS.

    Debian's torch runs its own kernels on an OpenMP team; with the pthread
    build of OpenBLAS (the alternatives' default) the BLAS starts a second
    team of threads that fights torch's spinning OpenMP workers for the same
    cores, and steps become 1.5-4x slower and erratic on a 2-core machine. The
    OpenMP build shares torch's team, as brisk does. The loader reads
    LD_LIBRARY_PATH only at start-up, hence the re-exec; the system-wide
    selection is left alone."""
    if choice != "openmp" or os.environ.get("BRISK_PEER_REEXEC"):
        return
    d = f"/usr/lib/{multiarch()}/openblas-openmp"
    if not os.path.exists(os.path.join(d, "libblas.so.3")):
        log(f"torch_peer: {d} is missing (apt-get install libopenblas0-openmp): using the system's BLAS selection")
        return
    env = dict(os.environ, BRISK_PEER_REEXEC="1")
    env["LD_LIBRARY_PATH"] = d + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


def mapped_blas():
    """The BLAS libraries this process has mapped, as the loader resolved them."""
    found = []
    with open("/proc/self/maps") as f:
        for line in f:
            i = line.find("/")
            if i < 0:
                continue
            path = line[i:].strip()
            base = os.path.basename(path)
            if ("openblas" in base or base.startswith(("libblas", "libblis", "libmkl", "libcblas"))) \
                    and path not in found:
                found.append(path)
    return found


def openblas_info(paths):
    import ctypes
    for p in paths:
        if "openblas" in os.path.basename(p):
            try:
                lib = ctypes.CDLL(p)
                lib.openblas_get_config.restype = ctypes.c_char_p
                lib.openblas_get_corename.restype = ctypes.c_char_p
                return lib.openblas_get_config().decode(), lib.openblas_get_corename().decode()
            except (OSError, AttributeError):
                pass
    return "", ""


# ---- brisk's data: token shards and the window sampler ---------------------------------


def load_tokens(data_dir, split="train"):
    """All shards of a split as one int array (src/data/shards.cpp's format)."""
    import numpy as np
    meta_path = os.path.join(data_dir, "meta.json")
    if not os.path.exists(meta_path):
        fail(f"{meta_path} not found: create the dataset with `brisk data prepare` (see `brisk bench train`)")
    with open(meta_path) as f:
        meta = json.load(f)
    names = meta.get(f"{split}_shards") or sorted(n for n in os.listdir(data_dir)
                                                   if n.startswith(split + "_") and n.endswith(".bin"))
    parts = []
    for name in names:
        path = os.path.join(data_dir, name)
        with open(path, "rb") as f:
            header = f.read(64)
        if len(header) < 64:
            fail(f"{path}: truncated header")
        magic, version, dtype, vocab, count, _checksum = struct.unpack("<8sIIqqQ", header[:40])
        if magic != b"BRISKTOK" or version != 1 or dtype not in (0, 1):
            fail(f"{path}: not a brisk token shard (magic {magic!r}, version {version}, dtype {dtype})")
        width = 2 if dtype == 0 else 4
        if os.path.getsize(path) != 64 + count * width:
            fail(f"{path}: size {os.path.getsize(path)} does not match {count} tokens")
        if count:
            parts.append(np.memmap(path, dtype=np.uint16 if dtype == 0 else np.int32, mode="r", offset=64,
                                   shape=(count,)))
    if not parts:
        fail(f"{data_dir} has no {split} tokens")
    tokens = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return tokens, int(meta["vocab_size"])


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


class WindowSampler:
    """brisk's data::WindowSampler, bit for bit: window p starts at a pure
    function of (seed, p), so both engines see the same batches."""

    def __init__(self, tokens, batch, seq, seed):
        self.tokens, self.batch, self.seq = tokens, batch, seq
        self.key = mix64((seed ^ 0x6A09E667F3BCC909) & MASK64)
        self.position = 0

    def next(self):
        import numpy as np
        starts = len(self.tokens) - self.seq
        w = np.empty((self.batch, self.seq + 1), dtype=np.int64)
        for b in range(self.batch):
            bits = mix64((self.key + (self.position + 1) * 0x9E3779B97F4A7C15) & MASK64)
            start = (bits * starts) >> 64
            self.position += 1
            w[b] = self.tokens[start:start + self.seq + 1]
        return w[:, :-1], w[:, 1:]


# ---- the model --------------------------------------------------------------------------


def build_model(torch, V, L, C, H, block):
    nn, F = torch.nn, torch.nn.functional

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(C, 3 * C)
            self.c_proj = nn.Linear(C, C)
            self.register_buffer("mask", torch.tril(torch.ones(block, block, dtype=torch.bool)), persistent=False)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
            att = att.masked_fill(~self.mask[:T, :T], float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
            return self.c_proj(y)

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
            self.ln_1 = nn.LayerNorm(C, eps=1e-5)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(C, eps=1e-5)
            self.mlp = Mlp()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

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
                elif ".ln_" in name or name.startswith("ln_f"):
                    nn.init.ones_(p)
                else:
                    std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx, targets):
            T = idx.shape[1]
            pos = torch.arange(T, dtype=torch.long)
            x = self.wte(idx) + self.wpe(pos)
            for blk in self.h:
                x = blk(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # the LM head tied to the embedding
            return F.cross_entropy(logits.view(-1, V).float(), targets.reshape(-1))

    return Gpt()


# ---- main --------------------------------------------------------------------------------


def current_rss_bytes():
    """VmRSS of this process, from /proc/self/status (0 where there is none)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="W2", help="W1 | W2 (sets the model shape and default data)")
    ap.add_argument("--data", help="brisk dataset directory (default per workload)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--bf16", action="store_true", help="torch.autocast(device_type='cpu', dtype=torch.bfloat16)")
    ap.add_argument("--fix-blas", action="store_true", help="select OpenBLAS system-wide if the reference BLAS is")
    ap.add_argument("--blas", choices=("openmp", "system"), default="openmp",
                    help="openmp: load OpenBLAS's OpenMP build for this process (default); system: the alternatives' pick")
    args = ap.parse_args()
    wl = ALIASES.get(args.workload, args.workload)
    if wl not in PRESETS:
        fail(f"unknown workload {args.workload} (W1 | W2)", 2)
    cfg = PRESETS[wl]
    data_dir = args.data or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", cfg["data"])

    # Threads and kernels are fixed at library load time: set them first.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    if "avx512f" in cpu_flags():
        os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx512")
    check_system_blas(args.fix_blas)
    prefer_openblas_openmp(args.blas)

    try:
        import numpy as np
        import torch
    except ImportError as e:
        fail(f"{sys.executable} cannot import torch/numpy ({e}); run the peer with Debian's /usr/bin/python3 "
             "(apt-get install python3-torch)")
    # Memory is reported as growth over this: the process with torch imported,
    # before the run builds anything (brisk takes its own the same way).
    baseline_rss_bytes = current_rss_bytes()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    # What BLAS did we really get? Exercise it, then read the process's maps.
    a = torch.randn(512, 512)
    torch.mm(a, a)
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < 0.2:
        torch.mm(a, a)
        n += 1
    sgemm_gflops = 2 * 512 ** 3 * n / (time.perf_counter() - t0) / 1e9
    maps = mapped_blas()
    openblas = [p for p in maps if "openblas" in p]
    if len({os.path.dirname(os.path.realpath(p)) for p in openblas}) > 1:  # two builds fighting over the symbols
        log("torch_peer: warning: more than one OpenBLAS build is mapped: " + ", ".join(openblas))
    if not openblas:
        fail("torch is not using OpenBLAS: this process mapped " + (", ".join(maps) or "no BLAS library") +
             f" (sgemm {sgemm_gflops:.1f} GFLOP/s); select OpenBLAS with update-alternatives (see --fix-blas)")
    ob_config, ob_core = openblas_info(openblas)
    variant = next((v for v in ("openblas-pthread", "openblas-openmp", "openblas-serial") if v in openblas[0]),
                   "openblas")
    blas = {"name": f"OpenBLAS ({variant.split('-')[-1]})", "mapped": openblas[0], "all_mapped": maps,
            "selected_by": "LD_LIBRARY_PATH (this process)" if os.environ.get("BRISK_PEER_REEXEC") else
            "update-alternatives (system)", "config": ob_config,
            "core": ob_core, "libblas_so_3": os.path.realpath(f"/usr/lib/{multiarch()}/libblas.so.3"),
            "sgemm_512_gflops": round(sgemm_gflops, 1)}
    show = torch.__config__.show()
    cap = next((l.split(":", 1)[1].strip() for l in show.splitlines() if "CPU capability usage" in l), "?")
    m = re.search(r"BLAS_INFO=([^,\s]+)", show)
    blas_info = m.group(1) if m else "?"
    blas["torch_build_blas_info"] = blas_info
    precision = "bf16" if args.bf16 else "fp32"
    log(f"  pytorch {precision}: torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability {cap}, "
        f"BLAS {blas['name']} {openblas[0]} [{ob_config}], sgemm(512) {sgemm_gflops:.1f} GFLOP/s")

    tokens, data_vocab = load_tokens(data_dir)
    V, L, C, H, T = cfg["vocab"], cfg["layers"], cfg["embd"], cfg["heads"], cfg["block"]
    if data_vocab > V:
        fail(f"{data_dir} has vocab {data_vocab}, more than {wl}'s {V}")
    model = build_model(torch, V, L, C, H, T)
    params = sum(p.numel() for p in model.parameters())  # the tied head is one parameter
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    sampler = WindowSampler(tokens, args.batch, T, args.seed)

    tty = sys.stderr.isatty()
    total = args.warmup + args.steps
    losses, step_ms = [], []
    data_hash = 0
    for s in range(total):
        xn, yn = sampler.next()
        data_hash = (data_hash * 1000003 + int((xn.reshape(-1) * np.arange(1, xn.size + 1)).sum())) & MASK64
        x, y = torch.from_numpy(xn), torch.from_numpy(np.ascontiguousarray(yn))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if args.bf16:
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                loss = model(x, y)
        else:
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = loss.item()
        ms = (time.perf_counter() - t0) * 1e3
        losses.append(lv)
        if s >= args.warmup:
            step_ms.append(ms)
        warm = " (warm-up)" if s < args.warmup else ""
        name = f"pytorch {precision}"
        if tty:
            print(f"\r  {name:<13} step {s + 1:2d}/{total}{warm:<10} loss {lv:.4f}  {ms:7.1f} ms   ", end="",
                  file=sys.stderr, flush=True)
        elif s == 0 or s + 1 == args.warmup or (s + 1) % 5 == 0 or s + 1 == total:
            log(f"  {name:<13} step {s + 1:2d}/{total}{warm} loss {lv:.4f}  {ms:7.1f} ms")
    if tty:
        print(file=sys.stderr)

    print(json.dumps({
        "engine": "pytorch", "precision": precision, "workload": wl,
        "torch": torch.__version__, "python": sys.executable + " " + platform.python_version(),
        "threads": torch.get_num_threads(), "cpu_capability": cap,
        "aten_cpu_capability_env": os.environ.get("ATEN_CPU_CAPABILITY", ""),
        "blas": blas, "params": params, "batch": args.batch, "seq": T, "warmup": args.warmup, "steps": args.steps,
        "optimizer": "torch.optim.AdamW (default implementation), clip_grad_norm_ 1.0",
        "step_ms": step_ms, "losses": losses, "data_hash": data_hash,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "baseline_rss_bytes": baseline_rss_bytes,
    }), flush=True)


if __name__ == "__main__":
    main()
