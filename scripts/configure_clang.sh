#!/usr/bin/env bash
# Configures the clang build shared by `make sanitize` and `make fuzz`:
# ASan + UBSan everywhere, libFuzzer coverage, the tests and the fuzz
# targets, no CUDA and no micro-benchmarks. Does nothing when the directory
# is already configured.
#
#   scripts/configure_clang.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: configure_clang.sh BUILD_DIR}
[ -f "$build/build.ninja" ] && exit 0
command -v clang++ >/dev/null || { echo "clang++ not found (scripts/install_deps.sh installs it)" >&2; exit 1; }
# RelWithDebInfo: optimised, with line numbers in the sanitizer reports.
CC=clang CXX=clang++ cmake -S "$(dirname "${BASH_SOURCE[0]}")/.." -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBRISK_FUZZ=ON -DBRISK_TESTS=ON -DBRISK_CUDA=OFF -DBRISK_BENCH=OFF
