#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh needs on a GPU machine that has the CUDA
# toolkit and PyTorch but none of brisk's Debian libraries and no network:
# the release binaries (brisk, the op harness, the unit tests, the GPT dump,
# libbrisk_cuda.so), the shared libraries they load that are not part of the
# C runtime, and the GPT-2 token shards of the G1 benchmark, into one
# compressed tarball (.gpu/bundle.tar.xz, ignored by git).
#   bash scripts/gpu_pack.sh [BUILD_DIR]
# With BASE_BUILD=DIR (a folder holding an earlier build's `brisk` and
# `libbrisk_cuda.so`), those two go into the bundle's base/ as well, and
# gpu_check.sh times them in every G1 round as the variant "base": a change
# measured against the code before it on the same GPU, in the same rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/release}
cmake --build "$BUILD" -j "$(nproc)" --target brisk brisk_op_tests brisk_unit_tests brisk_gpt_dump brisk_cuda
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/data"
bins=("$BUILD/brisk" "$BUILD/tests/brisk_op_tests" "$BUILD/tests/brisk_unit_tests" "$BUILD/tests/brisk_gpt_dump")
cp "${bins[@]}" "$BUILD/lib/libbrisk_cuda.so" "$stage/bin/"
# Every library the binaries resolve outside the C runtime and the CUDA
# toolkit (the GPU machine has its own CUDA libraries matching its driver,
# and NCCL from PyTorch's wheels: 200 MiB that would dwarf the rest).
for f in "${bins[@]}" "$BUILD/lib/libbrisk_cuda.so"; do
  ldd "$f" | awk '/=> \//{print $3}'
done | sort -u | grep -v -E '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libcuda|libcudart|libcublas[^/]*|libnccl)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
[ -d data/kjv-gpt2 ] && cp -r data/kjv-gpt2 "$stage/data/"
if [ -n "${BASE_BUILD:-}" ]; then
  mkdir -p "$stage/base" && cp "$BASE_BUILD/brisk" "$BASE_BUILD/libbrisk_cuda.so" "$stage/base/"
fi
mkdir -p .gpu
tar -C "$stage" -cJf .gpu/bundle.tar.xz .
grep -qxF '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
ls -la .gpu/bundle.tar.xz
# It travels to the GPU machine with the checkout: keep it small.
size=$(stat -c %s .gpu/bundle.tar.xz)
if [ "$size" -gt $((60 * 1024 * 1024)) ]; then
  echo "gpu_pack: the bundle is $((size / 1024 / 1024)) MiB, over 60 MiB; look for a large library that the GPU machine already has" >&2
  exit 1
fi
