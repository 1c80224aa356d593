#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, docs/fuzzing.md) with clang in
# build/sanitize, writes their seed corpora, runs each for FUZZ_SECONDS and fails
# when any of them found a crash. `make fuzz` calls it.
#
#   scripts/fuzz.sh [TARGET...]        all targets when none is named
#
#   FUZZ_SECONDS  seconds per target (default 60)
#   FUZZ_JOBS     build parallelism (default 2)
#   FUZZ_BUILD    build directory (default build/sanitize, shared with `make sanitize`)
#
# Per target: corpus in build/sanitize/corpus/<target>/ (grows from run to run),
# crash inputs in build/sanitize/crashes/<target>/, libFuzzer's log in
# build/sanitize/logs/<target>.log. A crash input, once fixed, belongs in
# fuzz/regressions/<target>/, where the normal build's tests replay it.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

seconds=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-2}
build=${FUZZ_BUILD:-build/sanitize}

if [ $# -gt 0 ]; then
  targets=("$@")
else
  # The one list of targets is fuzz/CMakeLists.txt's.
  read -r -a targets < <(sed -n 's/^set(BRISK_FUZZ_TARGETS \(.*\))$/\1/p' fuzz/CMakeLists.txt)
fi
[ ${#targets[@]} -gt 0 ] || { echo "fuzz: no targets found in fuzz/CMakeLists.txt" >&2; exit 1; }

# The clang build that `make sanitize` uses too (ASan + UBSan + coverage).
bash scripts/configure_clang.sh "$build"
cmake --build "$build" -j "$jobs" --target "${targets[@]/#/fuzz_}"

python3 fuzz/make_seeds.py --out "$build/corpus"

# Targets that need real files write them under $TMPDIR: memory, not disk.
scratch=$(mktemp -d /dev/shm/brisk_fuzz.XXXXXX 2>/dev/null || mktemp -d)
trap 'rm -rf "$scratch"' EXIT

mkdir -p "$build/logs"
summary=()
failed=0
for t in "${targets[@]}"; do
  crashes="$build/crashes/$t"
  log="$build/logs/$t.log"
  mkdir -p "$crashes" "$build/corpus/$t"
  marker="$build/logs/.$t.start"
  touch "$marker"
  echo "fuzz: $t for ${seconds}s (log: $log)"
  rc=0
  # -rss_limit_mb also caps single allocations (libFuzzer's -malloc_limit_mb
  # defaults to it): a hostile size field that makes a loader ask for
  # gigabytes is a finding. -timeout: one input running 10 s is a hang.
  TMPDIR="$scratch" "$build/fuzz/fuzz_$t" "$build/corpus/$t" \
    -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix="$crashes/" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
  found=$(find "$crashes" -maxdepth 1 -type f -newer "$marker" \
            \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | sort)
  rm -f "$marker"
  if [ "$rc" -ne 0 ] || [ -n "$found" ]; then
    failed=1
    summary+=("$(printf '%-18s %12s  FOUND A CRASH (exit %d)' "$t" "${execs:-?}" "$rc")")
    # The sanitizer's or libFuzzer's own account of it.
    grep -m1 -E '^(==[0-9]+==ERROR|.*runtime error:|.*FUZZ_CHECK failed|==[0-9]+== ERROR: libFuzzer)' "$log" |
      sed 's/^/fuzz:   /' || true
    for f in $found; do echo "fuzz:   input: $f"; done
  else
    summary+=("$(printf '%-18s %12s  ok' "$t" "${execs:-?}")")
  fi
done

echo "fuzz: ${seconds}s per target"
printf 'fuzz: %-18s %12s  %s\n' target executions result
for line in "${summary[@]}"; do echo "fuzz: $line"; done
if [ "$failed" -ne 0 ]; then
  echo "fuzz: crashes found; logs under $build/logs, inputs under $build/crashes" >&2
  exit 1
fi
