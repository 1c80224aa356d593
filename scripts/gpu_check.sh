#!/usr/bin/env bash
# Everything brisk checks on a GPU, in one go, results in one folder:
#   1. the op harness: every case of every op on the CUDA backend against the
#      CPU reference (brisk_op_tests), and the CUDA backend unit tests;
#   2. the PyTorch cross-check of the GPT with brisk on the GPU;
#   3. G1 (GPT-2 124M, bf16) against PyTorch's strongest configuration,
#      interleaved rounds (bench/gpu_g1_bench.py);
#   4. a per-op profile of one G1 step on the GPU (brisk train --profile),
#      and a trace of two steps summarised by kernel and shape;
#   5. (kernels) PyTorch's time for the same pieces one at a time
#      (bench/torch_gpu_kernels.py), to set beside that trace;
#   6. (ncu) two G1 steps under Nsight Compute: every kernel's time, DRAM
#      traffic and SM load, summarised by scripts/ncu_summary.py.
# Binaries come from .gpu/bundle.tar.xz when present (scripts/gpu_pack.sh
# makes it on a machine with brisk's build dependencies), else this builds
# into build/gpu (needs those dependencies here).
#   OUT=results STAGES="ops cross g1 profile" G1_BATCH=16 G1_ROUNDS=3 bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
STAGES=${STAGES:-"ops cross g1 profile"}
G1_BATCH=${G1_BATCH:-16}
G1_ROUNDS=${G1_ROUNDS:-3}
G1_STEPS=${G1_STEPS:-20}
STAGE_TIMEOUT=${STAGE_TIMEOUT:-240}  # seconds per stage: a hung kernel must not eat the lease
G1_EXTRA_BATCHES=${G1_EXTRA_BATCHES:-}  # more batch sizes for the g1 stage, one round each, e.g. "32 64"
G1_VARIANTS=${G1_VARIANTS:-}  # more brisk configurations for every g1 round, "name:k=v,k=v name2:k=v"
G1_SET=${G1_SET:-}  # more brisk train overrides for the g1 stage, e.g. "model.fused_classifier=false"
mkdir -p "$OUT"
PY=${PYTHON:-python3}

if [ -f .gpu/bundle.tar.xz ]; then
  root=/tmp/brisk-gpu
  rm -rf "$root" && mkdir -p "$root" && tar -C "$root" -xJf .gpu/bundle.tar.xz
  BIN=$root/bin
  DATA=$root/data/kjv-gpt2
  export LD_LIBRARY_PATH="$root/lib:${LD_LIBRARY_PATH:-}"
else
  cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DBRISK_CUDA=ON >"$OUT/build.log" 2>&1 &&
    cmake --build build/gpu -j "$(nproc)" >>"$OUT/build.log" 2>&1 || { echo "build failed: $OUT/build.log"; exit 1; }
  BIN=build/gpu
  mkdir -p "$BIN/bin" && ln -sf ../tests/brisk_op_tests ../tests/brisk_unit_tests ../tests/brisk_gpt_dump ../brisk "$BIN/bin/"
  cp -f build/gpu/lib/libbrisk_cuda.so "$BIN/bin/" && BIN=$BIN/bin
  DATA=data/kjv-gpt2
fi
# CUDA libraries: the toolkit's, else the ones PyTorch's wheels bring.
for d in /usr/local/cuda/lib64 $("$PY" -c 'import nvidia, os; print(" ".join(os.path.join(p, q, "lib") for p in nvidia.__path__ for q in os.listdir(p)))' 2>/dev/null); do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
export BRISK_CUDA_LIBRARY=$BIN/libbrisk_cuda.so
# NCCL is not in the bundle (gpu_pack.sh): it comes from PyTorch's wheels
# above. A library that is still missing would make every CUDA test skip.
missing=$(ldd "$BRISK_CUDA_LIBRARY" 2>&1 | grep "not found" || true)
if [ -n "$missing" ]; then
  for lib in $(echo "$missing" | awk '{print $1}'); do
    found=$(find / -xdev -name "$lib" -path '*lib*' 2>/dev/null | head -1)
    [ -n "$found" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$found")"
  done
  ldd "$BRISK_CUDA_LIBRARY" 2>&1 | grep "not found" | sed 's/^/MISSING for libbrisk_cuda.so: /'
fi

{ nvidia-smi; nvcc --version; "$PY" -c 'import torch; print("torch", torch.__version__)'; } >"$OUT/machine.txt" 2>&1
head -20 "$OUT/machine.txt"
status=0
sets=()
for kv in $G1_SET; do sets+=(--set "$kv"); done
variants=()
for v in $G1_VARIANTS; do variants+=(--variant "$v"); done
# An earlier build packed beside this one (gpu_pack.sh's BASE_BUILD): timed in
# every round as "base", with its own CUDA library and its own defaults.
if [ -n "${root:-}" ] && [ -x "$root/base/brisk" ]; then
  variants+=(--variant "base:bin=$root/base/brisk,env.BRISK_CUDA_LIBRARY=$root/base/libbrisk_cuda.so")
fi
# g1_bench NAME BATCH ROUNDS [--variant ...]: one G1 benchmark into $OUT/NAME.{json,log}.
g1_bench() {
  local name=$1 batch=$2 rounds=$3
  shift 3
  timeout "$STAGE_TIMEOUT" "$PY" bench/gpu_g1_bench.py --brisk "$BIN/brisk" --data "$DATA" --batch "$batch" \
    --rounds "$rounds" --steps "$G1_STEPS" "${sets[@]}" "$@" --out "$OUT/$name.json" >"$OUT/$name.log" 2>&1 || status=1
  tail -8 "$OUT/$name.log"
}
for stage in $STAGES; do
  started=$SECONDS
  case $stage in
    ops)
      timeout "$STAGE_TIMEOUT" "$BIN/brisk_op_tests" >"$OUT/ops.log" 2>&1 || status=1
      grep -E "^\[  (PASSED|FAILED) |FAIL|CUDA op cases" "$OUT/ops.log" | head -60
      grep -E " cuda " "$OUT/ops.log" | head -120 >"$OUT/ops_cuda_table.txt"
      timeout "$STAGE_TIMEOUT" "$BIN/brisk_unit_tests" --gtest_filter='Cuda*:*Graph*:Nccl*' >"$OUT/unit_cuda.log" 2>&1 || status=1
      tail -5 "$OUT/unit_cuda.log" ;;
    cross)
      timeout "$STAGE_TIMEOUT" "$PY" tests/models/gpt_torch_check.py --dump "$BIN/brisk_gpt_dump" --device cuda >"$OUT/crosscheck.log" 2>&1 || status=1
      tail -8 "$OUT/crosscheck.log" ;;
    g1)
      g1_bench g1 "$G1_BATCH" "$G1_ROUNDS" "${variants[@]}"
      for b in $G1_EXTRA_BATCHES; do g1_bench "g1_b$b" "$b" 1; done ;;
    kernels)
      timeout "$STAGE_TIMEOUT" "$PY" bench/torch_gpu_kernels.py --batch "$G1_BATCH" --out "$OUT/torch_kernels.json" \
        >"$OUT/torch_kernels.log" 2>&1 || status=1
      cat "$OUT/torch_kernels.log" ;;
    profile)
      # 8 steps: the per-op table leaves out the first; --trace times steps 4
      # and 5 whole (the optimizer's update too), summarised below.
      rm -rf /tmp/brisk-g1-profile /tmp/brisk-g1-ncu  # a fresh run refuses a directory holding checkpoints
      timeout "$STAGE_TIMEOUT" "$BIN/brisk" train --config configs/g1.toml --no-progress --profile --set train.steps=8 \
        --trace "$OUT/trace.json" --trace-steps 4,5 \
        --set "train.batch=$G1_BATCH" --set "data.dir=$DATA" --set checkpoint.dir=/tmp/brisk-g1-profile "${sets[@]}" \
        >"$OUT/profile.log" 2>&1 || status=1
      tail -30 "$OUT/profile.log"
      "$PY" scripts/trace_summary.py "$OUT/trace.json" 2>&1 | tee "$OUT/trace_summary.txt" | head -30 ;;
    ncu)
      # --profile: ops one by one (no graph); ncu replays each kernel alone,
      # saving and restoring the memory it writes: on an H200 a whole G1 step
      # took 100 s that way, and cuBLAS's splitKreduce_kernel could not be
      # profiled. NCU_KERNELS (a regex over kernel names) and NCU_COUNT (the
      # first N of those) keep the stage short; then the summary's per-step
      # figures are per profiled call set, not per step.
      NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      if [ -z "$NCU" ]; then echo "ncu stage: no ncu on this machine"; status=1; continue; fi
      ncu_args=(--clock-control none --csv --page raw
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed)
      [ -n "${NCU_KERNELS:-}" ] && ncu_args+=(--kernel-name "regex:$NCU_KERNELS")
      [ -n "${NCU_COUNT:-}" ] && ncu_args+=(--launch-count "$NCU_COUNT")
      ncu_steps=${NCU_STEPS:-2}
      timeout "$STAGE_TIMEOUT" "$NCU" "${ncu_args[@]}" \
        "$BIN/brisk" train --config configs/g1.toml --no-progress --profile --set "train.steps=$ncu_steps" \
        --set "train.batch=$G1_BATCH" --set "data.dir=$DATA" --set checkpoint.dir=/tmp/brisk-g1-ncu "${sets[@]}" \
        >"$OUT/ncu.csv" 2>"$OUT/ncu.err" || status=1
      "$PY" scripts/ncu_summary.py "$OUT/ncu.csv" --steps "$([ -n "${NCU_COUNT:-}" ] && echo 1 || echo "$ncu_steps")" 2>&1 |
        tee "$OUT/ncu_summary.txt" | head -45 ;;
    *) echo "unknown stage $stage (known: ops cross g1 profile kernels ncu)"; status=1 ;;
  esac
  echo "stage $stage: $((SECONDS - started)) s"
done
exit $status
