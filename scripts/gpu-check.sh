#!/usr/bin/env bash
# gpu-check.sh - what a lent GPU can prove, in one command (docs/cuda.md, "A GPU day in one command").
#
# usage: scripts/gpu-check.sh [--emulated] [--build DIR] OUTDIR
#        scripts/gpu-check.sh --pack BUILD_DIR PACK_DIR
#
# Run from the repository root. Parts, each under its own time budget (seconds; a part that runs
# out is reported as "timeout" and the next one still runs), all within GPU_CHECK_SECONDS (470 by
# default, 8 minutes with room for the machine's start; a part left with under 5 s is "skip"):
#   preflight      nvidia-smi, driver and runtime versions, ldd of the binaries, `offload-run --version`
#                  and `offload-run info --system`
#   cuda-backend   the suite, every test, on the GPU
#   device         the suite, every test, with the GPU as the default device
#   tp             the suite over two GPUs (skipped with fewer)
#   bench-decode   GPU, then CPU: decode tokens/s of Llama2-7B and llama-68m shapes, bandwidth
#   bench-offload  --device cuda, a synthetic Llama2-7B-shaped model at 32K tokens under --gpu-mem 16G
#                  (KV off the card), then the same run on the simulator: its error per row
#   memcheck, racecheck, synccheck
#                  compute-sanitizer over a fixed subset of the cuda-backend suite, following the
#                  suite's forked test processes (--target-processes all)
# OUTDIR receives summary.md, summary.json ({"parts": [...]}, each part with its status, seconds,
# budget and figures) and logs.tar.gz (every part's full log), rewritten after each part, so a
# run cut short still leaves what it did.
#
# --emulated runs every part on the emulated GPU of a -Dcudaemu=true build (default build dir:
# build-emu) with small shapes and subsets of the suites; the sanitizer parts are skipped. CI runs
# it (scripts/test.sh). Without --emulated the build dir defaults to build-gpu: a pack made here
# with --pack (the binaries the parts run and the Debian libraries they link that the GPU machine
# lacks; the CUDA runtime and cuBLAS are the machine's own), or any meson build with -Dcuda=enabled.
set -uo pipefail

usage() {
  echo "usage: scripts/gpu-check.sh [--emulated] [--build DIR] OUTDIR" >&2
  echo "       scripts/gpu-check.sh --pack BUILD_DIR PACK_DIR" >&2
  exit 2
}

# The programs the parts run, relative to a build dir.
PROGRAMS="cli/offload-run tests/test-cuda-backend tests/test-device tests/test-tp tests/tri-gen-model
benchmarks/bench-decode benchmarks/bench-offload"

# ---- --pack: what must travel to the GPU machine ----
#
# Copies the programs, libtriforce and the CUDA module at their relative places (the programs
# find the library by RUNPATH $ORIGIN/.., the library finds the module in backends/cuda/), and into lib/
# every library they link except the C runtime, the GCC runtime and the CUDA libraries: Criterion
# and what it links (nanomsg, libgit2, mbedtls, ...), json-c, hwloc, liburing, OpenMP, BLAS.
pack() {
  local build=$1 dest=$2
  [ -f "$build/backends/cuda/libtriforce-cuda.so" ] || { echo "gpu-check: $build/backends/cuda/libtriforce-cuda.so is missing: configure $build with -Dcuda=enabled" >&2; exit 1; }
  rm -rf "$dest"
  mkdir -p "$dest/backends/cuda" "$dest/cli" "$dest/tests" "$dest/benchmarks" "$dest/lib"
  cp -a "$build"/libtriforce.so "$build"/libtriforce.so.[0-9]* "$dest/"
  rm -rf "$dest"/libtriforce.so*.p
  cp "$build/backends/cuda/libtriforce-cuda.so" "$dest/backends/cuda/"
  local p
  for p in $PROGRAMS; do
    [ -x "$build/$p" ] || { echo "gpu-check: $build/$p is missing (build with -Dtests=enabled -Dbenchmarks=true)" >&2; exit 1; }
    cp "$build/$p" "$dest/$p"
  done
  # the libraries, resolved here; kept out: glibc's, the GCC runtime's and CUDA's
  local objs="$dest/libtriforce.so $dest/backends/cuda/libtriforce-cuda.so"
  for p in $PROGRAMS; do objs="$objs $dest/$p"; done
  # shellcheck disable=SC2086
  ldd $objs 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
    while read -r name path; do
      case "$name" in
        libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | libresolv.so* | ld-linux*) ;;
        libgcc_s.so* | libstdc++.so*) ;;
        libcuda.so* | libcudart.so* | libcublas.so* | libcublasLt.so* | libnccl.so*) ;;
        libtriforce*) ;;
        *) cp -L "$path" "$dest/lib/$name" ;;
      esac
    done
  {
    echo "pack of $build, made $(date -u +%FT%TZ) on $(uname -n), commit $(git rev-parse --short HEAD 2>/dev/null)"
    echo "carried libraries:" "$dest"/lib/*
    echo "from the GPU machine: libcudart.so.13, libcublas.so.13, libcublasLt.so.13 (the CUDA toolkit), glibc, libstdc++"
    echo
    # shellcheck disable=SC2086
    ldd $objs 2>&1
  } > "$dest/PACK-INFO"
  local kib
  kib=$(du -sk "$dest" | cut -f1)
  echo "gpu-check: packed $build into $dest: $((kib / 1024)) MiB (carry at most 64 MiB with the working tree)"
  [ "$kib" -lt $((60 * 1024)) ] || { echo "gpu-check: the pack is too large to carry" >&2; exit 1; }
}

EMULATED=0
BUILD=
OUTDIR=
while [ $# -gt 0 ]; do
  case "$1" in
    --pack) [ $# -eq 3 ] || usage; pack "$2" "$3"; exit 0 ;;
    --emulated) EMULATED=1 ;;
    --build) [ $# -ge 2 ] || usage; BUILD=$2; shift ;;
    -h | --help) usage ;;
    -*) echo "gpu-check: unknown option '$1'" >&2; usage ;;
    *) [ -z "$OUTDIR" ] || usage; OUTDIR=$1 ;;
  esac
  shift
done
[ -n "$OUTDIR" ] || usage
ROOT=$(pwd)
[ -f "$ROOT/scripts/gpu-check.sh" ] || { echo "gpu-check: run it from the repository root" >&2; exit 2; }
if [ -z "$BUILD" ]; then
  if [ "$EMULATED" = 1 ]; then BUILD="build-emu"; else BUILD="build-gpu"; fi
fi
BUILD=$(cd "$BUILD" 2>/dev/null && pwd) || { echo "gpu-check: no build dir '$BUILD' (docs/cuda.md says how to make one)" >&2; exit 2; }
for p in $PROGRAMS; do
  [ -x "$BUILD/$p" ] || { echo "gpu-check: $BUILD/$p is missing: build it first (docs/cuda.md)" >&2; exit 2; }
done
mkdir -p "$OUTDIR" || exit 2
OUTDIR=$(cd "$OUTDIR" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
LOGS=$WORK/logs
mkdir -p "$LOGS" "$WORK/tmp"
PARTS=$WORK/parts.tsv
: > "$PARTS"
trap 'rm -rf "$WORK"' EXIT

# The environment the suites get from meson test (tests/meson.build), without meson.
export TRI_TEST_SRC="$ROOT/tests" TRI_TEST_FIXTURES="$BUILD/tests/fixtures" TRI_TEST_TMP="$WORK/tmp"
export TRI_GEN_MODEL="$BUILD/tests/tri-gen-model" TRI_OFFLOAD_RUN="$BUILD/cli/offload-run"
TRI_TEST_REFERENCE=0
[ -d "$BUILD/tests/fixtures" ] && TRI_TEST_REFERENCE=1
export TRI_TEST_REFERENCE
[ -f "$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf" ] && export TRI_TEST_MODEL="$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf"
# A pack's libraries that this machine lacks (those it has are its own, of the same soname: the
# machine's tools keep their libraries), then the CUDA toolkit's (the module links libcudart and
# libcublas).
mkdir -p "$WORK/lib"
for f in "$BUILD"/lib/*.so*; do
  [ -e "$f" ] || continue
  ldconfig -p 2> /dev/null | grep -q "^[[:space:]]*$(basename "$f") " || ln -s "$f" "$WORK/lib/"
done
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib "$WORK/lib"; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export BUILD ROOT WORK

TOTAL=${GPU_CHECK_SECONDS:-470}
[ "$EMULATED" = 1 ] && TOTAL=${GPU_CHECK_SECONDS:-900}
START=$(date +%s)
N_GPUS=0

# ---- the summary ----

json_str() { printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g' | tr -d '\n\r\t'; }

# Rewrites OUTDIR's summary.md, summary.json and logs.tar.gz from the parts so far.
write_summary() {
  local mode=real gpu
  [ "$EMULATED" = 1 ] && mode=emulated
  gpu=$(cat "$WORK/gpu-name" 2>/dev/null || echo unknown)
  {
    printf '{"mode": "%s", "gpu": "%s", "build": "%s", "commit": "%s", "started": "%s", "parts": [' "$mode" \
      "$(json_str "$gpu")" "$(json_str "$BUILD")" "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)" \
      "$(date -u -d "@$START" +%FT%TZ)"
    awk -F'\t' 'BEGIN { first = 1 }
      { printf "%s\n  {\"name\": \"%s\", \"status\": \"%s\", \"seconds\": %s, \"budget\": %s, \"note\": \"%s\", \"figures\": {%s}}",
          first ? "" : ",", $1, $2, $3, $4, $6, $5; first = 0 }' "$PARTS"
    printf '\n]}\n'
  } > "$OUTDIR/summary.json"
  {
    echo "# gpu-check ($mode): $gpu"
    echo
    echo "commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null), build $BUILD, started $(date -u -d "@$START" +%FT%TZ)"
    echo
    echo "| part | status | seconds | budget | figures | note |"
    echo "|---|---|---|---|---|---|"
    awk -F'\t' '{ f = $5; gsub(/"/, "", f); gsub(/, /, "; ", f); printf "| %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, f, $6 }' "$PARTS"
    local name
    cut -f1 "$PARTS" | while read -r name; do
      [ -s "$LOGS/$name.table" ] || continue
      echo
      echo "## $name"
      echo
      cat "$LOGS/$name.table"
    done
  } > "$OUTDIR/summary.md"
  tar -C "$WORK" -czf "$OUTDIR/logs.tar.gz" logs 2>/dev/null
}

# record NAME STATUS SECONDS BUDGET FIGURES NOTE: one part's line (figures: JSON members).
record() {
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$(json_str "$6" | cut -c1-300)" >> "$PARTS"
  echo "gpu-check: $1: $2 (${3} s of ${4}) $6"
  write_summary
}

# Kills pid and every process below it (Criterion's workers start sessions of their own, so a
# process group would not reach them): the tree is listed first, then killed.
descendants() {
  local c
  for c in $(ps -o pid= --ppid "$1" 2> /dev/null); do
    echo "$c"
    descendants "$c"
  done
}
kill_tree() {
  local all
  all="$1 $(descendants "$1")"
  # shellcheck disable=SC2086
  kill -STOP $all 2> /dev/null
  all="$all $(descendants "$1")"
  # shellcheck disable=SC2086
  kill -KILL $all 2> /dev/null
}

# part NAME BUDGET FUNCTION: runs FUNCTION (a shell function, exported) under the budget, shrunk to
# what is left of TOTAL, logs to $LOGS/NAME.log, then asks figures_NAME (when defined) for its
# figures from the log.
part() {
  local name=$1 budget=$2 fn=$3 left now t0 rc status secs figs note=
  now=$(date +%s)
  left=$((TOTAL - (now - START)))
  [ "$EMULATED" = 0 ] || budget=$((2 * budget))  # the emulator under the sanitizers, on a loaded machine
  [ "$budget" -le "$left" ] || budget=$left
  if [ "$budget" -lt 5 ]; then
    record "$name" skip 0 0 "" "out of the total time (${TOTAL} s)"
    return
  fi
  echo "gpu-check: $name (budget ${budget} s)"
  t0=$(date +%s.%N)
  bash -c "$fn" > "$LOGS/$name.log" 2>&1 &
  local pid=$! deadline=$(($(date +%s) + budget)) timed_out=0
  while kill -0 "$pid" 2> /dev/null; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      kill_tree "$pid"
      timed_out=1
      break
    fi
    sleep 0.5
  done
  wait "$pid" 2> /dev/null
  rc=$?
  [ "$timed_out" = 0 ] || rc=124
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  case $rc in
    0) status=pass ;;
    77) status=skip; note=$(tail -1 "$LOGS/$name.log") ;;
    124 | 137) status=timeout; note="ran out of its ${budget} s budget" ;;
    *) status=fail; note="exit status $rc: $(grep -v '^[[:space:]]*$' "$LOGS/$name.log" | tail -1)" ;;
  esac
  # tests that skipped (no usable device, a missing model) are named in the note
  local skipped
  skipped=$(grep '\[SKIP\]' "$LOGS/$name.log" | grep -v 'Test is disabled' | sed 's/^\[SKIP\] //; s/: .*//' | tr '\n' ' ')
  [ -z "$skipped" ] || note="${note:+$note; }skipped: $skipped"
  figs=
  if [ "$status" != skip ] && declare -F "figures_$name" > /dev/null; then figs=$("figures_$name" "$LOGS/$name.log" 2>/dev/null); fi
  record "$name" "$status" "$secs" "$budget" "$figs" "$note"
}

# ---- parts ----

p_preflight() {
  echo "== machine"
  uname -a
  nproc
  free -g 2>/dev/null | head -2
  echo "== nvidia-smi"
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max,compute_cap \
      --format=csv
  else
    echo "nvidia-smi: not found"
  fi
  local gpu_ok=1
  [ "$EMULATED" = 1 ] || nvidia-smi -L 2> /dev/null | grep -q '^GPU' || { gpu_ok=0; echo "no GPU: nvidia-smi lists none"; }
  echo "== toolkit"
  command -v nvcc > /dev/null && nvcc --version | tail -2
  command -v compute-sanitizer > /dev/null && compute-sanitizer --version | tail -1
  if command -v cuobjdump > /dev/null && [ "$EMULATED" = 0 ]; then
    echo "== the module's SASS and PTX (cuobjdump)"
    cuobjdump --list-elf --list-ptx "$BUILD/backends/cuda/libtriforce-cuda.so" | sed 's/.*\.\(sm_[0-9a-z]*\)\..*/SASS \1/; s/.*\.\(compute_[0-9a-z]*\)\..*/PTX \1/' | sort | uniq -c
  fi
  echo "== libraries (ldd); taken from the pack:" "$WORK"/lib/*
  local p missing=0
  for p in libtriforce.so backends/cuda/libtriforce-cuda.so $PROGRAMS; do
    [ -e "$BUILD/$p" ] || continue
    if ldd "$BUILD/$p" | grep "not found"; then missing=1; echo "  ^ $p"; fi
  done
  [ "$missing" = 0 ] && echo "every library found"
  echo "== offload-run --version"
  "$BUILD/cli/offload-run" --version
  echo "== offload-run info --system"
  "$BUILD/cli/offload-run" info --system
  local rc=$? why=
  [ "$missing" = 0 ] || why="a library was not found (ldd above)"
  [ "$rc" = 0 ] || why="${why:+$why; }offload-run info --system failed"
  [ "$gpu_ok" = 1 ] || why="${why:+$why; }no GPU: nvidia-smi lists none"
  [ -z "$why" ] || { echo "preflight: $why"; return 1; }
}
figures_preflight() {
  local smi cuda
  smi=$(grep -A1 '^name, driver_version' "$1" | tail -1)
  cuda=$(grep -m1 '^backends:' "$1" | sed 's/^backends: //')
  printf '"gpu": "%s", "backends": "%s", "nproc": %s' "$(json_str "${smi:-none}")" "$(json_str "$cuda")" \
    "$(sed -n '/^== machine/,/^==/p' "$1" | sed -n 3p)"
}

# suite BINARY FILTER [ENV...]: a Criterion suite run directly, every test named in the log.
suite() {
  local bin=$1 filter=$2
  shift 2
  env "$@" "$BUILD/tests/$bin" --verbose ${filter:+--filter "$filter"} 2>&1
}
# figures of a suite's log: Criterion's synthesis line, and the tests that skipped for want of a device
criterion_figures() {
  awk '/Synthesis: Tested:/ { for (i = 1; i <= NF; i++) { if ($i == "Tested:") t = $(i + 1); if ($i == "Passing:") p = $(i + 1);
         if ($i == "Failing:") f = $(i + 1); if ($i == "Crashing:") c = $(i + 1) } }
       /\[SKIP\]/ && !/Test is disabled/ { s++ }
       END { printf "\"tested\": %d, \"passing\": %d, \"failing\": %d, \"crashing\": %d, \"skipped\": %d", t, p, f, c, s }' "$1"
}

# The emulated run takes subsets, a few seconds each (the emulator runs one GPU thread at a time, and CI
# runs the whole suites on it already: scripts/test.sh).
EMU_BACKEND='cuda_backend/@(matmul_float_weights|get_rows_every_type|rmsnorm_every_weight_type|swiglu_and_add|softmax_with_temperature_and_masked_entries|top_k_ties_nan_and_signed_zero|attention_causal_mask_and_nothing_visible|uploads_past_the_slots_without_synchronize|transfer_stream_and_events|device_indexed_ops|graph_replays_with_device_state)'
EMU_DEVICE='device/@(session_device_selection|copied_weights_compute_the_same_f16_gqa|cuda_engine_greedy_equals_cpu)'
# The sanitizers' subset: every kernel at small sizes, the upload ring, events, the graph.
SAN_SUBSET='cuda_backend/@(matmul_float_weights|matmul_quantized_weights|get_rows_every_type|gather_rows_words_and_bytes|chunk_mean_bit_exact|convert_bit_exact|rmsnorm_every_weight_type|swiglu_and_add|family_ops|softmax_with_temperature_and_masked_entries|top_k_ties_nan_and_signed_zero|attention_gqa_spans|attention_spans_of_their_own_types|attention_causal_mask_and_nothing_visible|uploads_past_the_slots_without_synchronize|transfer_stream_and_events|graph_replays_with_device_state)'
RACE_SUBSET='cuda_backend/@(matmul_float_weights|rmsnorm_every_weight_type|softmax_with_temperature_and_masked_entries|top_k_ties_nan_and_signed_zero|attention_gqa_spans|chunk_mean_bit_exact)'
export EMU_BACKEND EMU_DEVICE SAN_SUBSET RACE_SUBSET EMULATED

p_cuda_backend() { if [ "$EMULATED" = 1 ]; then suite test-cuda-backend "$EMU_BACKEND"; else suite test-cuda-backend ""; fi; }
p_device() { if [ "$EMULATED" = 1 ]; then suite test-device "$EMU_DEVICE"; else suite test-device ""; fi; }
p_tp() {
  if [ "$EMULATED" = 1 ]; then
    suite test-tp 'tp/@(two_cuda_devices|device_lists)' CUDAEMU_DEVICES=2
  elif [ "${N_GPUS:-0}" -ge 2 ]; then
    suite test-tp ""
  else
    echo "tp: ${N_GPUS:-0} GPU(s), the suite needs two"
    exit 77
  fi
}
figures_cuda_backend() { criterion_figures "$1"; }
figures_device() { criterion_figures "$1"; }
figures_tp() { criterion_figures "$1"; }

p_sanitizer() {  # TOOL SUBSET
  if [ "$EMULATED" = 1 ]; then
    echo "compute-sanitizer: skipped on the emulated GPU"
    exit 77
  fi
  command -v compute-sanitizer > /dev/null || { echo "compute-sanitizer: not found"; exit 1; }
  local extra=
  [ "$1" = memcheck ] && extra="--leak-check full"
  # shellcheck disable=SC2086
  compute-sanitizer --tool "$1" $extra --target-processes all --error-exitcode 1 --print-limit 50 \
    "$BUILD/tests/test-cuda-backend" --verbose --filter "$2" 2>&1
}
p_memcheck() { p_sanitizer memcheck "$SAN_SUBSET"; }
p_racecheck() { p_sanitizer racecheck "$RACE_SUBSET"; }
p_synccheck() { p_sanitizer synccheck "$RACE_SUBSET"; }
sanitizer_figures() {
  criterion_figures "$1"
  awk '/ERROR SUMMARY: [0-9]+ error/ { e += $3 } /RACECHECK SUMMARY: [0-9]+ hazard/ { h += $3 }
       END { printf ", \"sanitizer_errors\": %d, \"hazards\": %d", e, h }' "$1"
}
figures_memcheck() { sanitizer_figures "$1"; }
figures_racecheck() { sanitizer_figures "$1"; }
figures_synccheck() { sanitizer_figures "$1"; }

# bench-decode: the GPU, then the CPU on the same shapes (the CPU with fewer passes and without
# the 128K-key attention, for time).
decode_args() {
  if [ "$EMULATED" = 1 ]; then
    echo "--shapes tiny --ctx 64 --attn 256 --passes 2 --draft none"
  elif [ "$1" = cuda ]; then
    echo "--passes 5"
  else
    echo "--passes 2 --attn 4096,32768"
  fi
}
p_bench_decode() {
  echo "== bench-decode --device cuda $(decode_args cuda)"
  # shellcheck disable=SC2046
  "$BUILD/benchmarks/bench-decode" --device cuda $(decode_args cuda)
}
p_bench_decode_cpu() {
  echo "== bench-decode --device cpu $(decode_args cpu)"
  # shellcheck disable=SC2046
  "$BUILD/benchmarks/bench-decode" --device cpu $(decode_args cpu)
}
# awk: a figure as a JSON number when it is one, else as a string
AWK_NUM='function num(v) { gsub(/^ +| +$/, "", v); return v ~ /^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$/ ? v : "\"" v "\"" }'
figures_bench_decode() {
  awk "$AWK_NUM"'/^== bench-decode --device/ { dev = $4 }
       /^copy peak:/ { printf "%s\"%s_copy_peak_gbps\": %s", sep, dev, num($3); sep = ", " }
       /^\| shape \| weights/ { t = "decode"; next } /^\| shape \| keys/ { t = "attn"; next } /^\| draft/ { t = "draft"; next }
       /^\|---/ { next }
       /^\| / && t == "decode" { split($0, c, "|"); gsub(/ /, "", c[2]); gsub(/ /, "", c[5]); gsub(/ /, "", c[8]); gsub(/ /, "", c[9]);
         printf "%s\"%s_%s_ms_per_token\": %s, \"%s_%s_gbps\": %s", sep, dev, c[2], num(c[5]), dev, c[2], num(c[8]); sep = ", " }
       /^\| / && t == "attn" { split($0, c, "|"); gsub(/ /, "", c[2]); gsub(/ /, "", c[3]); gsub(/ /, "", c[4]);
         printf "%s\"%s_attn_%s_ms\": %s", sep, dev, c[3], num(c[4]); sep = ", " }
       /^\| / && t == "draft" { split($0, c, "|"); gsub(/ /, "", c[4]); gsub(/ /, "", c[6]);
         printf "%s\"%s_draft_op_ms\": %s, \"%s_draft_graph_ms\": %s", sep, dev, num(c[4]), dev, num(c[6]); sep = ", " }' "$1"
  awk '/^== bench-decode/ { print "`" substr($0, 4) "`:"; print ""; blank = 0; next }
       /^\|/ { if (blank) print ""; print; blank = 0; next } /^$/ { blank = 1 }' "$1" > "$LOGS/$(basename "$1" .log).table"
}
figures_bench_decode_cpu() { figures_bench_decode "$1"; }

# bench-offload: the KV forced off the card by --gpu-mem; then the simulator on the same run.
OFFLOAD_ARGS="--shape llama2-7b --ctx 32768 --gpu-mem 18G --budgets 4096 --gamma2 12 --passes 2"
OFFLOAD_EMU_ARGS="--shape tiny --ctx 1024 --gpu-mem 43M --reserve 0 --budgets 128 --gamma2 4 --passes 1"
export OFFLOAD_ARGS OFFLOAD_EMU_ARGS
offload_args() { [ "$EMULATED" = 1 ] && echo "$OFFLOAD_EMU_ARGS" || echo "$OFFLOAD_ARGS"; }
p_bench_offload() {
  # shellcheck disable=SC2046
  "$BUILD/benchmarks/bench-offload" --device cuda $(offload_args)
}
# The simulator's profile for the GPU nvidia-smi named (backends/sim/sim-backend.c).
sim_profile() {
  local gpu
  gpu=$(cat "$WORK/gpu-name" 2>/dev/null)
  case "$gpu" in
    *H200*) echo h200 ;;
    *H100*PCIe*) echo h100-pcie ;;
    *H100*) echo h100-sxm ;;
    *5090*) echo rtx5090 ;;
    *4090*) echo rtx4090 ;;
    *) echo h100-pcie ;;
  esac
}
p_offload_sim() {
  echo "profile: $SIM_PROFILE"
  # shellcheck disable=SC2046
  "$BUILD/benchmarks/bench-offload" --device "sim:$SIM_PROFILE" $(offload_args)
}
figures_bench_offload() {
  awk "$AWK_NUM"'/^host -> device peak/ { printf "\"h2d_peak_gbps\": %s", num($(NF - 1)); sep = ", " }
       /^\| (autoregressive|TriForce) \|/ { split($0, c, "|"); if (c[5] ~ /cannot/) next; for (i = 2; i <= 11; i++) gsub(/^ +| +$/, "", c[i]);
         k = c[2] == "autoregressive" ? "ar" : "triforce_b" c[3] "_g" c[4];
         printf "%s\"%s_ms_per_token\": %s, \"%s_kv_layers_on_device\": \"%s\"", sep, k, num(c[11]), k, c[6]; sep = ", " }' "$1"
  awk '/^\| mode/ { t++ } t == 1 && /^\|/ { print } t == 1 && /^$/ { exit }' "$1" > "$LOGS/bench_offload.table"
}
# The simulator's error: simulated against measured ms/token, row by row (mode, budget, gamma2).
figures_offload_sim() {
  awk 'FNR == 1 { f++ }
       /^\| (autoregressive|TriForce) \|/ { split($0, c, "|"); if (c[5] ~ /cannot/) next; k = c[2] "/" c[3] "/" c[4];
         gsub(/ /, "", k); v = c[11] + 0; if (f == 1) meas[k] = v; else sim[k] = v; if (!(k in seen)) order[n++] = k; seen[k] = 1 }
       END { print "| row (mode/budget/gamma2) | measured ms/token | simulated ms/token | simulator error |" > table;
         print "|---|---|---|---|" > table;
         for (i = 0; i < n; i++) { k = order[i]; if (!(k in meas) || !(k in sim) || meas[k] <= 0) continue;
           e = 100 * (sim[k] / meas[k] - 1);
           printf "| %s | %.2f | %.2f | %+.1f%% |\n", k, meas[k], sim[k], e > table;
           split(k, q, "/"); kk = q[1] == "autoregressive" ? "ar" : "triforce_b" q[2] "_g" q[3];
           printf "%s\"%s_sim_error_pct\": %.1f", sep, kk, e; sep = ", " }
         printf "%s\"profile\": \"%s\"", sep, prof }' table="$LOGS/offload_sim.table" prof="$SIM_PROFILE" \
    "$LOGS/bench_offload.log" "$1"
}
export -f suite p_cuda_backend p_device p_tp p_sanitizer p_memcheck p_racecheck p_synccheck p_bench_decode p_bench_decode_cpu decode_args p_bench_offload \
  p_offload_sim offload_args p_preflight json_str
export PROGRAMS

# ---- the run ----

if command -v nvidia-smi > /dev/null && [ "$EMULATED" = 0 ]; then
  nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -1 > "$WORK/gpu-name"
  N_GPUS=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')
elif [ "$EMULATED" = 1 ]; then
  echo "cudaemu (the emulated GPU, tests/cudaemu)" > "$WORK/gpu-name"
  N_GPUS=2
fi
SIM_PROFILE=$(sim_profile)
export N_GPUS SIM_PROFILE

part preflight 30 p_preflight
part cuda_backend 75 p_cuda_backend
part device 75 p_device
part tp 60 p_tp
part bench_decode 70 p_bench_decode
part bench_decode_cpu 75 p_bench_decode_cpu
part bench_offload 110 p_bench_offload
part offload_sim 15 p_offload_sim
part memcheck 50 p_memcheck
part synccheck 30 p_synccheck
part racecheck 50 p_racecheck

failed=$(awk -F'\t' '$2 == "fail" || $2 == "timeout"' "$PARTS" | wc -l)
echo "gpu-check: $(wc -l < "$PARTS") parts, $failed failed or timed out; summary in $OUTDIR/summary.md"
[ "$failed" = 0 ]
