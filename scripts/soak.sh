#!/usr/bin/env bash
# soak.sh [SECONDS] [BUILD_DIR]: the long run of docs/reliability.md. Builds the tree with ASan and
# UBSan into BUILD_DIR (default build-asan) unless it is there, writes a seeded target and draft
# model with tri-gen-model, and runs benchmarks/soak for SECONDS (default 3600) under the
# sanitizers, LeakSanitizer checking at exit. Prints the soak's minute-by-minute figures.
set -euo pipefail
secs=${1:-3600}
build=${2:-build-asan}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if [ ! -d "$build" ]; then
  # gcc, as the CI's sanitizer build: its libubsan also serves the C++ file's checks, which a
  # clang-linked C program lacks (and clang objects need libomp, which g++ does not link)
  CC=${CC:-gcc} CXX=${CXX:-g++} meson setup "$build" -Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled \
    -Dbenchmarks=true
fi
meson configure "$build" -Dbenchmarks=true >/dev/null
ninja -C "$build" benchmarks/soak tests/tri-gen-model
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$build/tests/tri-gen-model" --seed 101 --layers 3 --vocab 400 --embd 64 --ff 128 --heads 4 --kv-heads 2 \
  --out-gguf "$tmp/target.gguf" >/dev/null
"$build/tests/tri-gen-model" --seed 102 --layers 1 --vocab 400 --embd 32 --ff 64 --heads 2 --kv-heads 1 \
  --out-gguf "$tmp/draft.gguf" >/dev/null
# a small quarantine, so that resident memory shows the runtime's growth rather than ASan's
# quarantine of freed blocks filling up (256 MiB by default)
ASAN_OPTIONS=${ASAN_OPTIONS:-quarantine_size_mb=16:detect_leaks=1} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
  "$build/benchmarks/soak" "$tmp/target.gguf" "$tmp/draft.gguf" "$secs" "${SOAK_SEED:-1}"
