#!/usr/bin/env bash
# Builds with warnings as errors and runs every test suite, the references included, then the
# fuzz targets for a bounded time. Used by CI (.ci/run) through the README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup-python.sh
./scripts/get-model.sh >/dev/null

# setup_build DIR ARGS...: configures DIR afresh or reconfigures it with ARGS.
setup_build() {
  local dir=$1
  shift
  if [ -d "$dir/meson-private" ]; then
    meson setup "$dir" --reconfigure "$@" >/dev/null
  else
    meson setup "$dir" "$@" >/dev/null
  fi
}

setup_build build-test -Dwerror=true -Dreference=enabled -Dpython="$PWD/.venv/bin/python3"
ninja -C build-test
rc=0
TRI_TEST_MODEL="$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf" \
  meson test -C build-test --print-errorlogs --num-processes "$(nproc)" || rc=$?
# One closing line over every Criterion test case of every suite.
awk '/Synthesis: Tested:/ { for (i = 1; i <= NF; i++) { if ($i == "Passing:") p += $(i + 1);
       if ($i == "Failing:" || $i == "Crashing:") f += $(i + 1) } }
     END { printf "tests: %d passed, %d failed\n", p, f }' build-test/meson-logs/testlog.txt
[ "$rc" = 0 ] || exit "$rc"

# Fuzz targets: clang with libFuzzer, ASan and UBSan, FUZZ_SECONDS each (default 60).
if [ -d tests/fuzz ]; then
  CC=clang setup_build build-fuzz -Dfuzz=true -Dtests=disabled -Dbenchmarks=false \
    -Dcuda=disabled -Dfaiss=disabled -Dopenmp=disabled
  ninja -C build-fuzz
  ./tests/fuzz/run-all.sh build-fuzz "${FUZZ_SECONDS:-60}"
fi
