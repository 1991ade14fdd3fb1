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
export TRI_TEST_MODEL="$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf"
meson test -C build-test --print-errorlogs --num-processes "$(nproc)" || rc=$?

# The layers (docs/architecture.md): no layer uses a symbol of a layer above it, no two use each
# other's (an upward #include already fails to compile).
python3 scripts/check-layers.py build-test > build-test/check-layers.log || { cat build-test/check-layers.log; rc=1; }
tail -1 build-test/check-layers.log

# Static checks of the CUDA code (when nvcc exists): every warning an error, ptxas's resource
# report on every target architecture (no spills, registers x threads within an SM).
python3 scripts/check-cuda.py build-test > build-test/check-cuda.log || { tail -20 build-test/check-cuda.log; rc=1; }
tail -1 build-test/check-cuda.log
# The predicted share of memory bandwidth of the matvec and decode attention kernels (Little's law
# over their SASS, docs/cuda.md "Roofline"): printed, not a pass/fail check.
.venv/bin/python3 scripts/roofline.py build-test --json build-test/roofline.json > build-test/roofline.log ||
    { tail -20 build-test/roofline.log; rc=1; }
tail -1 build-test/roofline.log
# The CUDA module compiled with CUDA 12.4 too (warnings as errors), for the R535-R570 drivers that
# CUDA 13 binaries refuse: the toolkit is fetched into ~/.cache/triforce-cuda12 on the first run
# (docs/cuda.md, "CUDA 12").
echo "CUDA 12 compile of backends/cuda/*.cu:"
./scripts/cuda12-compile.sh build-test > build-test/cuda12-compile.log 2>&1 ||
  { tail -40 build-test/cuda12-compile.log; rc=1; }
tail -1 build-test/cuda12-compile.log

# The sanitizer build: ASan + UBSan (+ LeakSanitizer), with the CUDA backend compiled for the CPU
# emulator in tests/cudaemu (docs/cuda.md, docs/reliability.md).
setup_build build-emu -Dcudaemu=true -Db_sanitize=address,undefined -Db_lundef=false -Dwerror=true \
  -Dbuildtype=debugoptimized -Dbenchmarks=true -Dreference=enabled -Dpython="$PWD/.venv/bin/python3"
ninja -C build-emu
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions="$PWD/tests/lsan.supp"  # third-party leaks only, each justified there
# 1. The whole suite under the sanitizers, on the CPU (the emulator reports no device), with the
#    fault-injection sweeps that a sanitizer build arms.
CUDAEMU_DEVICES=0 meson test -C build-emu --print-errorlogs --num-processes "$(nproc)" \
  --logbase asan || rc=$?
# 2. The CUDA code executed on the emulated GPU: the CUDA backend's own suite with every block's
#    threads, and the grid's blocks, in forward, reverse and random order (a missing barrier shows
#    up as a wrong result in some order), then the suites that take a device end to end (device:
#    offloaded KV, streamed weights and the speculative engine on the device against the CPU).
meson test -C build-emu --print-errorlogs cuda-backend device --logbase emu || rc=$?
# allocation failures at every site of the CUDA backend and around it, on the emulated GPU (the
# CPU scenarios of the suite ran in step 1)
meson test -C build-emu --print-errorlogs faults --test-args=--filter=faults/cuda_* --logbase emu-faults || rc=$?
# tensor parallelism over two emulated GPUs (the suite turns peer access on and off itself)
CUDAEMU_DEVICES=2 meson test -C build-emu --print-errorlogs tp --logbase emu-tp || rc=$?
CUDAEMU_SCHED=rev CUDAEMU_BLOCKS=rev meson test -C build-emu --print-errorlogs cuda-backend \
  --logbase emu-rev || rc=$?
seed=${CUDAEMU_SEED:-$RANDOM}
echo "cuda-backend in random orders: CUDAEMU_SEED=$seed"
CUDAEMU_SCHED=rand CUDAEMU_BLOCKS=rand CUDAEMU_SEED=$seed \
  meson test -C build-emu --print-errorlogs cuda-backend --logbase emu-rand || rc=$?
# Once more with floating-point contraction on, as nvcc compiles device code (the emulated module
# is built with -ffp-contract=off): the suite's tolerances must hold for a GPU's fused multiply-adds.
ninja -C build-emu backends/cuda/libtriforce-cuda-fma.so
TRI_CUDA_MODULE="$PWD/build-emu/backends/cuda/libtriforce-cuda-fma.so" \
  meson test -C build-emu --print-errorlogs cuda-backend --logbase emu-fma || rc=$?
# The real-GPU check's dry run: every part of scripts/gpu-check.sh on the emulated GPU, small
# shapes (docs/cuda.md), so that the script a lent GPU runs first cannot rot between devices.
rm -rf build-emu/gpu-check build-emu/gpu-check-nodev build-emu/gpu-check-subset
./scripts/gpu-check.sh --emulated --build build-emu build-emu/gpu-check > build-emu/gpu-check.log 2>&1 ||
  { cat build-emu/gpu-check.log build-emu/gpu-check/summary.md; rc=1; }
tail -1 build-emu/gpu-check.log
# ... without a usable device (the emulated module reports none): preflight fails, naming why, and
# nothing else runs or passes; within 60 s, so that a lent GPU's window is not spent on skips.
t0=$SECONDS
ok=1
CUDAEMU_DEVICES=0 ./scripts/gpu-check.sh --emulated --build build-emu build-emu/gpu-check-nodev \
  > build-emu/gpu-check-nodev.log 2>&1 && ok=0
s=build-emu/gpu-check-nodev/summary.json
grep -q '"name": "preflight", "status": "fail"' "$s" || ok=0
! grep -q '"status": "pass"' "$s" || ok=0
[ $((SECONDS - t0)) -le 60 ] || ok=0
[ "$ok" = 1 ] || { echo "gpu-check without a device: not a fast failure ($((SECONDS - t0)) s)"; cat build-emu/gpu-check-nodev.log; rc=1; }
echo "gpu-check without a device: $(tail -1 build-emu/gpu-check-nodev.log) ($((SECONDS - t0)) s)"
# ... a subset (GPU_CHECK_PARTS), with a part that never ends cut by the total: exit 3, only the
# parts named (and preflight), the cut part "cut" and named for the follow-up, no process of it left.
ok=1
sub_rc=0
GPU_CHECK_PARTS=offload_sim,hang GPU_CHECK_SECONDS=45 ./scripts/gpu-check.sh --emulated --build build-emu \
  build-emu/gpu-check-subset > build-emu/gpu-check-subset.log 2>&1 || sub_rc=$?
[ "$sub_rc" = 3 ] || ok=0
s=build-emu/gpu-check-subset/summary.json
[ "$(grep -c '"name": ' "$s")" = 3 ] || ok=0
grep -q '"name": "preflight", "status": "pass"' "$s" || ok=0
grep -q '"name": "offload_sim", "status": "pass"' "$s" || ok=0
grep -q '"name": "hang", "status": "cut"' "$s" || ok=0
grep -q 'GPU_CHECK_PARTS=hang`' build-emu/gpu-check-subset/summary.md || ok=0
for p in $(cat build-emu/gpu-check-subset/hang.pids 2>/dev/null || echo none); do  # alive: not a zombie
  grep -qs '^[^)]*) [^Z]' "/proc/$p/stat" && ok=0
done
[ -s build-emu/gpu-check-subset/hang.pids ] || ok=0
[ "$ok" = 1 ] || { echo "gpu-check subset: wrong"; cat build-emu/gpu-check-subset.log; rc=1; }
echo "gpu-check subset: $(tail -1 build-emu/gpu-check-subset.log)"

# One closing line over every Criterion test case of every run.
awk '/Synthesis: Tested:/ { for (i = 1; i <= NF; i++) { if ($i == "Passing:") p += $(i + 1);
       if ($i == "Failing:" || $i == "Crashing:") f += $(i + 1) } }
     END { printf "tests: %d passed, %d failed\n", p, f }' build-test/meson-logs/testlog.txt \
  build-emu/meson-logs/asan.txt build-emu/meson-logs/emu.txt build-emu/meson-logs/emu-rev.txt \
  build-emu/meson-logs/emu-rand.txt build-emu/meson-logs/emu-tp.txt build-emu/meson-logs/emu-faults.txt \
  build-emu/meson-logs/emu-fma.txt
[ "$rc" = 0 ] || exit "$rc"

# Fuzz targets: clang with libFuzzer, ASan and UBSan, FUZZ_SECONDS each (default 60).
if [ -d tests/fuzz ]; then
  CC=clang setup_build build-fuzz -Dfuzz=true -Dtests=disabled -Dbenchmarks=false \
    -Dcuda=disabled -Dfaiss=disabled -Dopenmp=disabled
  ninja -C build-fuzz
  ./tests/fuzz/run-all.sh build-fuzz "${FUZZ_SECONDS:-60}"
fi
