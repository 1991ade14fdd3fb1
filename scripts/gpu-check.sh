#!/usr/bin/env bash
# gpu-check.sh - what a lent GPU can prove, in one command (docs/cuda.md, "A GPU day in one command").
#
# usage: scripts/gpu-check.sh [--emulated] [--build DIR] OUTDIR
#        scripts/gpu-check.sh --pack BUILD_DIR PACK_DIR
#
# Run from the repository root. Parts, in this order, each under its own time budget (seconds; a
# part that runs out is "timeout" and the next one still runs), all within GPU_CHECK_SECONDS (470
# by default: with the machine's start and a 3-minute follow-up call it fits the 15 minutes of
# device time; the budgets add up to 465):
#   preflight      nvidia-smi, driver and runtime versions, where cudart / cuBLAS / NCCL were found,
#                  ldd of the binaries, `offload-run --version` and `offload-run info --system`.
#                  When it fails (no usable CUDA device, a library missing) no other part runs: the
#                  window is not spent on suites whose every test would skip.
#   cuda_backend   the suite, every test, on the GPU
#   memcheck, synccheck, racecheck
#                  compute-sanitizer over a subset of the cuda-backend suite (memcheck every kernel,
#                  cuBLAS's included; synccheck and racecheck our kernels only), a few test
#                  processes at once, followed through Criterion's forks; skipped, with the
#                  sanitizer's own words, where it refuses the device
#   device         the suite, every test, with the GPU as the default device
#   tp             the suite over two GPUs (skipped with fewer)
#   bench_decode   decode tokens/s and bandwidth of Llama2-7B and llama-68m shapes, attention at
#                  4K-128K keys, the draft step op by op and as a replayed graph
#   bench_offload  --device cuda, a synthetic Llama2-7B-shaped model at 32K tokens under --gpu-mem 18G
#                  (KV off the card)
#   offload_sim    the same run on the simulator: its error per row
#   bench_decode_cpu  bench_decode's shapes on the CPU
# A test that skips for want of a CUDA device fails its part. A part that the total cuts short (its
# budget shrunk to what was left) is "cut", not failed. GPU_CHECK_PARTS=a,b,... runs only those
# parts (preflight always runs first): the follow-up call for what failed or was cut, which the
# summary names.
#
# OUTDIR receives summary.md, summary.json ({"parts": [...]}, each part with its status, seconds,
# budget and figures) and logs.tar.gz (every finished part's full log), rewritten after each part,
# and running.log, the running part's output as it is written: a call killed in the middle of a
# part still returns what it did (at most 8 files come back from a device call).
#
# --emulated runs every part on the emulated GPU of a -Dcudaemu=true build (default build dir:
# build-emu) with small shapes and subsets of the suites; the sanitizer parts are skipped. CI runs
# it (scripts/test.sh), with CUDAEMU_DEVICES=0 (preflight must fail fast) and with a subset. Without
# --emulated the build dir defaults to build-gpu: a pack made here with --pack (the binaries the
# parts run and the Debian libraries they link that the GPU machine lacks; the CUDA runtime and
# cuBLAS are the machine's own, found by ldconfig, in /usr/local/cuda*, or in a Python
# environment's nvidia/*/lib), or any meson build with -Dcuda=enabled.
set -uo pipefail

usage() {
  echo "usage: scripts/gpu-check.sh [--emulated] [--build DIR] OUTDIR" >&2
  echo "       scripts/gpu-check.sh --pack BUILD_DIR PACK_DIR" >&2
  exit 2
}

# The programs the parts run, relative to a build dir.
PROGRAMS="cli/offload-run tests/test-cuda-backend tests/test-device tests/test-tp tests/tri-gen-model
benchmarks/bench-decode benchmarks/bench-offload"

mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

# Bytes of the working tree that a device call sends (tracked files, untracked ones that git does
# not ignore, shared/; a symbolic link as a link), leaving out the folder $1 (carried: counted
# apart) when it is inside the tree.
travel_bytes() {
  local skip
  skip=$(realpath -m --relative-to=. "${1:-/nonexistent}" 2>/dev/null)
  {
    git ls-files -z --cached --others --exclude-standard 2>/dev/null
    [ -d shared ] && find shared -type f -print0
  } | tr '\0' '\n' | awk -v skip="$skip/" 'index($0, skip) != 1 && !seen[$0]++' | tr '\n' '\0' |
    xargs -0 -r stat -c %s -- 2> /dev/null | awk '{ t += $1 } END { print t + 0 }'
}

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
  # What travels with a device call: the working tree (tracked files and untracked ones git does
  # not ignore, shared/) and the carried pack, 64 MiB in all (the device's README).
  local tree pack_b
  tree=$(travel_bytes "$dest")
  pack_b=$(du -sb "$dest" | cut -f1)
  echo "what travels: working tree $(mib "$tree") MiB + pack $(mib "$pack_b") MiB = $(mib $((tree + pack_b))) MiB of 64" \
    >> "$dest/PACK-INFO"
  echo "gpu-check: packed $build into $dest: $(mib "$pack_b") MiB; with the working tree $(mib "$tree") MiB," \
    "$(mib $((tree + pack_b))) MiB travel (at most 64)"
  [ $((tree + pack_b)) -le $((62 * 1024 * 1024)) ] ||
    { echo "gpu-check: the working tree and the pack are too large to travel (62 MiB, with room)" >&2; exit 1; }
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

# The parts in the order they run, and their budgets (seconds). The sanitizers come right after the
# backend suite: they are the only race and barrier checks, and the first to be cut if they came
# last. The budgets add up to 465, under the default total of 470.
PART_ORDER="preflight cuda_backend memcheck synccheck racecheck device tp bench_decode bench_offload offload_sim bench_decode_cpu"
declare -A BUDGET=([preflight]=20 [cuda_backend]=70 [memcheck]=45 [synccheck]=25 [racecheck]=40 [device]=60 [tp]=15
  [bench_decode]=60 [bench_offload]=80 [offload_sim]=10 [bench_decode_cpu]=40 [hang]=600)
# The emulated dry run's (CI): the emulator under the sanitizers on a loaded 2-core machine, the tp
# suite on two emulated GPUs; the sanitizer parts skip at once.
declare -A EMU_BUDGET=([preflight]=90 [cuda_backend]=240 [memcheck]=20 [synccheck]=20 [racecheck]=20 [device]=360
  [tp]=300 [bench_decode]=480 [bench_offload]=300 [offload_sim]=60 [bench_decode_cpu]=160 [hang]=600)
# GPU_CHECK_PARTS: the parts to run (preflight always runs). "hang" (a process tree that never ends,
# emulated runs only) proves the kill through /proc and the cut; it never runs unless named.
SELECTED=" $PART_ORDER "
if [ -n "${GPU_CHECK_PARTS:-}" ]; then
  SELECTED=" preflight "
  for p in ${GPU_CHECK_PARTS//,/ }; do
    if [ -z "${BUDGET[$p]+x}" ] || { [ "$p" = hang ] && [ "$EMULATED" = 0 ]; }; then
      echo "gpu-check: GPU_CHECK_PARTS: unknown part '$p' (parts: ${PART_ORDER// /,})" >&2
      exit 2
    fi
    SELECTED="$SELECTED$p "
  done
fi

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

TOTAL=${GPU_CHECK_SECONDS:-470}
[ "$EMULATED" = 1 ] && TOTAL=${GPU_CHECK_SECONDS:-2100}  # EMU_BUDGET's sum, 2050, and room
START=$(date +%s)

# The environment the suites get from meson test (tests/meson.build), without meson.
export TRI_TEST_SRC="$ROOT/tests" TRI_TEST_FIXTURES="$BUILD/tests/fixtures" TRI_TEST_TMP="$WORK/tmp"
export TRI_GEN_MODEL="$BUILD/tests/tri-gen-model" TRI_OFFLOAD_RUN="$BUILD/cli/offload-run"
TRI_TEST_REFERENCE=0
[ -d "$BUILD/tests/fixtures" ] && TRI_TEST_REFERENCE=1
export TRI_TEST_REFERENCE
[ -f "$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf" ] && export TRI_TEST_MODEL="$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf"

# ---- libraries: the pack's, then the CUDA runtime, cuBLAS and NCCL wherever the machine has them ----
#
# A pack's libraries that this machine lacks (those it has are its own, of the same soname: the
# machine's tools keep their libraries).
mkdir -p "$WORK/lib"
for f in "$BUILD"/lib/*.so*; do
  [ -e "$f" ] || continue
  ldconfig -p 2> /dev/null | grep -q "^[[:space:]]*$(basename "$f") " || ln -s "$f" "$WORK/lib/"
done
export LD_LIBRARY_PATH="$WORK/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# The nvidia/*/lib folders of every Python environment in sight (pip's nvidia-cublas-cu13 & co.).
python_nvidia_dirs() {
  local py
  for py in python3 /usr/bin/python3 /usr/local/bin/python3 /opt/conda/bin/python3 /opt/*/bin/python3 \
    /opt/venv*/bin/python3 /venv/bin/python3 /root/.venv/bin/python3 "$ROOT/.venv/bin/python3"; do
    command -v "$py" > /dev/null 2>&1 || continue
    "$py" - 2> /dev/null << 'PY'
import glob, os, site, sysconfig
dirs = set(getattr(site, "getsitepackages", lambda: [])())
dirs |= {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
try:
    dirs.add(site.getusersitepackages())
except Exception:
    pass
for d in sorted(dirs):
    for lib in sorted(glob.glob(os.path.join(d, "nvidia", "*", "lib"))):
        print(os.path.realpath(lib))
PY
  done | awk '!seen[$0]++'
}
# find_lib SONAME: "PATH SOURCE" of the first copy: ldconfig's cache, /usr/local/cuda*, a Python
# environment's nvidia packages.
find_lib() {
  local so=$1 d p
  p=$(ldconfig -p 2> /dev/null | awk -v s="$so" '$1 == s { print $NF; exit }')
  [ -n "$p" ] && { echo "$p ldconfig"; return 0; }
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/*/lib /usr/local/cuda-*/lib64 /usr/local/cuda-*/targets/*/lib; do
    [ -e "$d/$so" ] && { echo "$d/$so /usr/local/cuda*"; return 0; }
  done
  while IFS= read -r d; do
    [ -e "$d/$so" ] && { echo "$d/$so python:${d%/lib}"; return 0; }
  done < "$WORK/python-nvidia-dirs"
  return 1
}
# What the module needs of CUDA's (ldd, whatever it resolves to now) and NCCL, which it opens itself.
python_nvidia_dirs > "$WORK/python-nvidia-dirs"
{
  echo "python environments' nvidia packages: $(tr '\n' ' ' < "$WORK/python-nvidia-dirs")"
  cuda_sonames=$( (ldd "$BUILD/backends/cuda/libtriforce-cuda.so" 2> /dev/null | awk '{ print $1 }' | grep -E '^lib(cudart|cublas|cublasLt|nvJitLink|nvrtc)\.so'; echo libnccl.so.2) | sort -u)
  for so in $cuda_sonames; do
    if found=$(find_lib "$so"); then
      path=${found%% *} src=${found#* }
      echo "$so: $path ($src)"
      [ "$src" = ldconfig ] || case ":$LD_LIBRARY_PATH:" in *":${path%/*}:"*) ;; *) LD_LIBRARY_PATH="$LD_LIBRARY_PATH:${path%/*}" ;; esac
    else
      echo "$so: not found (ldconfig, /usr/local/cuda*, Python environments' nvidia/*/lib)"
    fi
  done
} > "$WORK/cuda-libs.txt"
# The module is opened with dlopen by programs started below: LD_LIBRARY_PATH reaches it (a
# RUNPATH in the module could not know where a Python environment puts cuBLAS).
export LD_LIBRARY_PATH
export BUILD ROOT WORK

# ---- the summary ----

json_str() { printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g' | tr -d '\n\r\t'; }

# Rewrites OUTDIR's summary.md, summary.json and logs.tar.gz from the parts so far; RUNNING names
# the part under way (its output is OUTDIR/running.log).
RUNNING=
write_summary() {
  local mode=real gpu
  [ "$EMULATED" = 1 ] && mode=emulated
  gpu=$(cat "$WORK/gpu-name" 2>/dev/null || echo unknown)
  {
    printf '{"mode": "%s", "gpu": "%s", "build": "%s", "commit": "%s", "started": "%s", "total": %s, "running": "%s", "parts": [' \
      "$mode" "$(json_str "$gpu")" "$(json_str "$BUILD")" "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)" \
      "$(date -u -d "@$START" +%FT%TZ)" "$TOTAL" "$RUNNING"
    awk -F'\t' 'BEGIN { first = 1 }
      { printf "%s\n  {\"name\": \"%s\", \"status\": \"%s\", \"seconds\": %s, \"budget\": %s, \"note\": \"%s\", \"figures\": {%s}}",
          first ? "" : ",", $1, $2, $3, $4, $6, $5; first = 0 }' "$PARTS"
    printf '\n]}\n'
  } > "$OUTDIR/summary.json"
  {
    echo "# gpu-check ($mode): $gpu"
    echo
    echo "commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null), build $BUILD, started $(date -u -d "@$START" +%FT%TZ), total ${TOTAL} s"
    [ -z "$RUNNING" ] || { echo; echo "running now: $RUNNING (its output so far: running.log)"; }
    echo
    echo "| part | status | seconds | budget | figures | note |"
    echo "|---|---|---|---|---|---|"
    awk -F'\t' '{ f = $5; gsub(/"/, "", f); gsub(/, /, "; ", f); printf "| %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, f, $6 }' "$PARTS"
    local again
    again=$(awk -F'\t' '$2 != "pass" && $2 != "skip" && $1 != "preflight" { printf "%s%s", s, $1; s = "," }' "$PARTS")
    if [ "${PREFLIGHT_FAILED:-0}" = 1 ]; then
      echo; echo "preflight failed (its note and log say why): nothing else ran; a follow-up call would fail the same way"
    elif [ -n "$again" ]; then
      echo; echo "to run again in a follow-up call: \`GPU_CHECK_PARTS=$again\` (docs/cuda.md)"
    fi
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

# Every process below pid, from /proc (a minimal image may have no ps): Criterion's workers and
# compute-sanitizer's targets start sessions of their own, so a process group would not reach them.
descendants() {
  local f s p
  for f in /proc/[0-9]*/stat; do
    { read -r s < "$f"; } 2> /dev/null || continue  # gone meanwhile
    p=${f#/proc/}
    s=${s##*) }  # after the command name, which may hold spaces and parentheses
    echo "${p%/stat} ${s#* }"  # pid, then ppid and the rest
  done | awk -v root="$1" '{ par[$1] = $2 }
    END { for (p in par) { q = par[p]; for (d = 0; d < 64 && q > 1; d++) { if (q == root) { print p; break }; q = par[q] } } }'
}
# Stops pid and everything below it, looks again (a process may have forked meanwhile), kills all,
# and waits (5 s at most) until none is left but as a zombie: the next part must not share the GPU
# with them.
kill_tree() {
  local all p s left
  all="$1 $(descendants "$1")"
  # shellcheck disable=SC2086
  kill -STOP $all 2> /dev/null
  all="$all $(descendants "$1")"
  # shellcheck disable=SC2086
  kill -KILL $all 2> /dev/null
  for _ in $(seq 50); do
    left=
    for p in $all; do
      { read -r s < "/proc/$p/stat"; } 2> /dev/null || continue
      s=${s##*) }
      [ "${s%% *}" = Z ] || left="$left $p"
    done
    [ -n "$left" ] || return 0
    sleep 0.1
  done
  echo "gpu-check: processes$left outlived SIGKILL by 5 s" >&2
}

# part NAME FUNCTION: runs FUNCTION (a shell function, exported) under NAME's budget, shrunk to what
# is left of TOTAL, its output into OUTDIR/running.log as it comes (then $LOGS/NAME.log), then asks
# figures_NAME (when defined) for its figures from the log.
part() {
  local name=$1 fn=$2 budget left now t0 rc status secs figs note='' cut=0
  case "$SELECTED" in *" $name "*) ;; *) return ;; esac
  budget=${BUDGET[$name]}
  [ "$EMULATED" = 0 ] || budget=${EMU_BUDGET[$name]}
  if [ "$PREFLIGHT_FAILED" = 1 ]; then
    record "$name" not_run 0 "$budget" "" "preflight failed: nothing else runs"
    return
  fi
  now=$(date +%s)
  left=$((TOTAL - (now - START)))
  [ "$budget" -le "$left" ] || { budget=$left; cut=1; }
  if [ "$budget" -lt 5 ]; then
    record "$name" cut 0 "${budget#-}" "" "not started: under 5 s left of the total (${TOTAL} s)"
    return
  fi
  echo "gpu-check: $name (budget ${budget} s)"
  RUNNING=$name
  write_summary
  t0=$(date +%s.%N)
  bash -c "$fn" > "$OUTDIR/running.log" 2>&1 &
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
  RUNNING=
  cp "$OUTDIR/running.log" "$LOGS/$name.log"
  : > "$OUTDIR/running.log"
  [ "$timed_out" = 0 ] || rc=124
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  case $rc in
    0) status=pass ;;
    77) status=skip; note=$(grep -v '^[[:space:]]*$' "$LOGS/$name.log" | tail -1) ;;
    124 | 137)
      if [ "$cut" = 1 ]; then status="cut"; note="cut by the total (${TOTAL} s) after ${budget} s"
      else status=timeout; note="ran out of its ${budget} s budget"; fi ;;
    *) status=fail; note="exit status $rc: $(grep -v '^[[:space:]]*$' "$LOGS/$name.log" | tail -1)" ;;
  esac
  # tests that skipped (no usable device, a missing model) are named in the note; a test that
  # skipped for want of a CUDA device fails the part: the check proved nothing of the GPU
  local skipped nodev
  skipped=$(grep '\[SKIP\]' "$LOGS/$name.log" | grep -v 'Test is disabled' | sed 's/^\[SKIP\] //; s/: .*//' | tr '\n' ' ')
  nodev=$(grep '\[SKIP\]' "$LOGS/$name.log" | grep -c 'no CUDA device')
  [ -z "$skipped" ] || note="${note:+$note; }skipped: $skipped"
  if [ "$nodev" -gt 0 ] && [ "$status" = pass ]; then
    status=fail
    note="$nodev test(s) skipped with \"no CUDA device\"; $note"
  fi
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
  local san
  san=$(sanitizer_path) && "$san" --version | tail -1
  if command -v cuobjdump > /dev/null && [ "$EMULATED" = 0 ]; then
    echo "== the module's SASS and PTX (cuobjdump)"
    cuobjdump --list-elf --list-ptx "$BUILD/backends/cuda/libtriforce-cuda.so" | sed 's/.*\.\(sm_[0-9a-z]*\)\..*/SASS \1/; s/.*\.\(compute_[0-9a-z]*\)\..*/PTX \1/' | sort | uniq -c
  fi
  echo "== CUDA libraries (ldconfig, /usr/local/cuda*, Python environments' nvidia/*/lib; LD_LIBRARY_PATH for the module)"
  cat "$WORK/cuda-libs.txt"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "== what travelled: the working tree, $(mib "$(cd "$ROOT" && travel_bytes "$BUILD")") MiB (with the carried build, at most 64)"
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
  "$BUILD/cli/offload-run" info --system | tee "$WORK/info.txt"
  local rc=${PIPESTATUS[0]} why='' gpus
  # "gpus  none: WHY" or "gpus  N (status)": the library's own view of the devices
  gpus=$(awk '$1 == "gpus" { $1 = ""; sub(/^ +/, ""); print; exit }' "$WORK/info.txt")
  [ "$missing" = 0 ] || why="a library was not found (ldd above)"
  [ "$rc" = 0 ] || why="${why:+$why; }offload-run info --system failed"
  [ "$gpu_ok" = 1 ] || why="${why:+$why; }no GPU: nvidia-smi lists none"
  case "$gpus" in
    none:* | "") why="${why:+$why; }no usable CUDA device: ${gpus:-offload-run info printed no gpus line}" ;;
  esac
  [ -z "$why" ] || { echo "preflight: $why"; return 1; }
}
figures_preflight() {
  local smi cuda libs
  smi=$(grep -A1 '^name, driver_version' "$1" | tail -1)
  cuda=$(grep -m1 '^backends:' "$1" | sed 's/^backends: //')
  libs=$(grep -E '^lib[a-zA-Z]+\.so[.0-9]*: ' "$WORK/cuda-libs.txt" | paste -sd ';' -)
  printf '"gpu": "%s", "backends": "%s", "gpus": "%s", "cuda_libs": "%s", "nproc": %s' "$(json_str "${smi:-none}")" \
    "$(json_str "$cuda")" "$(json_str "$(awk '$1 == "gpus" { $1 = ""; sub(/^ +/, ""); print; exit }' "$1")")" \
    "$(json_str "$libs")" "$(sed -n '/^== machine/,/^==/p' "$1" | sed -n 3p)"
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
SAN_SUBSET='cuda_backend/@(matmul_float_weights|matmul_quantized_weights|get_rows_every_type|gather_rows_words_and_bytes|chunk_mean_bit_exact|convert_bit_exact|rmsnorm_every_weight_type|swiglu_and_add|family_ops|softmax_with_temperature_and_masked_entries|top_k_ties_nan_and_signed_zero|top_k_radix_select_long_rows|attention_gqa_spans|attention_spans_of_their_own_types|attention_causal_mask_and_nothing_visible|uploads_past_the_slots_without_synchronize|transfer_stream_and_events|graph_replays_with_device_state)'
RACE_SUBSET='cuda_backend/@(matmul_float_weights|rmsnorm_every_weight_type|softmax_with_temperature_and_masked_entries|top_k_ties_nan_and_signed_zero|top_k_radix_select_long_rows|attention_gqa_spans|chunk_mean_bit_exact)'
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

# compute-sanitizer: on the PATH, else in a CUDA toolkit's folders.
sanitizer_path() {
  local c
  for c in "$(command -v compute-sanitizer 2> /dev/null)" /usr/local/cuda/bin/compute-sanitizer \
    /usr/local/cuda*/bin/compute-sanitizer /usr/local/cuda*/compute-sanitizer/compute-sanitizer; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
  done
  return 1
}
# The sanitizer's words when it refuses the device or cannot attach (no summary line was printed).
SAN_REFUSED='not supported|unsupported|Unable to|Internal Sanitizer Error|No attachable process|Debugger interface|Target application terminated before first instrumented API call|insufficient permissions|Error: .*[Dd]evice'
p_sanitizer() {  # TOOL SUBSET
  if [ "$EMULATED" = 1 ]; then
    echo "compute-sanitizer: skipped on the emulated GPU"
    exit 77
  fi
  local san tool=$1 subset=$2 rc
  san=$(sanitizer_path) || { echo "compute-sanitizer: not found (PATH, /usr/local/cuda*)"; exit 77; }
  # memcheck covers every kernel, cuBLAS's too (a buffer too small for a GEMM is ours to find);
  # synccheck and racecheck only ours (each named k_*: cuBLAS's kernels would take most of the time)
  local args=(--tool "$tool" --target-processes all --launch-timeout 60 --error-exitcode 1 --print-limit 50)
  [ "$tool" = memcheck ] && args+=(--leak-check full)
  local filter=()
  [ "$tool" = memcheck ] || filter=(--kernel-name kns=k_)
  # four test processes at once (Criterion's workers), each followed by the sanitizer
  "$san" "${args[@]}" "${filter[@]}" "$BUILD/tests/test-cuda-backend" --verbose --jobs 4 --filter "$subset" 2>&1 |
    tee "$WORK/san-$tool.log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ] && [ "${#filter[@]}" -gt 0 ] && grep -qiE 'unrecognized option|unknown option|invalid option' "$WORK/san-$tool.log"; then
    echo "== this compute-sanitizer takes no --kernel-name: every kernel checked"
    "$san" "${args[@]}" "$BUILD/tests/test-cuda-backend" --verbose --jobs 4 --filter "$subset" 2>&1 | tee "$WORK/san-$tool.log"
    rc=${PIPESTATUS[0]}
  fi
  if [ "$rc" != 0 ] && ! grep -qE 'ERROR SUMMARY|RACECHECK SUMMARY|Synthesis: Tested' "$WORK/san-$tool.log"; then
    local why
    why=$(grep -m1 -E "$SAN_REFUSED" "$WORK/san-$tool.log")
    if [ -n "$why" ]; then
      echo "compute-sanitizer refused the device: $why"
      exit 77
    fi
  fi
  return "$rc"
}
p_memcheck() { p_sanitizer memcheck "$SAN_SUBSET"; }
p_racecheck() { p_sanitizer racecheck "$RACE_SUBSET"; }
p_synccheck() { p_sanitizer synccheck "$RACE_SUBSET"; }
sanitizer_figures() {
  criterion_figures "$1"
  awk '/ERROR SUMMARY: [0-9]+ error/ { for (i = 1; i < NF; i++) if ($i == "SUMMARY:") e += $(i + 1) }
       /RACECHECK SUMMARY: [0-9]+ hazard/ { for (i = 1; i < NF; i++) if ($i == "SUMMARY:") h += $(i + 1) }
       END { printf ", \"sanitizer_errors\": %d, \"hazards\": %d", e, h }' "$1"
}
figures_memcheck() { sanitizer_figures "$1"; }
figures_racecheck() { sanitizer_figures "$1"; }
figures_synccheck() { sanitizer_figures "$1"; }

# hang (emulated runs, named in GPU_CHECK_PARTS only): a tree of processes that never ends, one of
# them in a session of its own, as Criterion's workers are; their pids go to OUTDIR/hang.pids so
# that the caller can check that the kill left none.
p_hang() {
  sleep 3600 &
  echo $! > "$OUTDIR/hang.pids"
  setsid sleep 3600 &
  echo $! >> "$OUTDIR/hang.pids"
  bash -c 'sleep 3600 & echo $! >> "$0"; wait' "$OUTDIR/hang.pids" &
  echo "hang: $(wc -l < "$OUTDIR/hang.pids") sleeping processes, never ending"
  wait
}

# bench-decode: the GPU, then the CPU on the same shapes (the CPU with fewer passes and without
# the 128K-key attention, for time). The emulated run takes the draft step of the tiny shape.
decode_args() {
  if [ "$EMULATED" = 1 ]; then
    echo "--shapes tiny --ctx 64 --attn 256 --passes 1 --draft tiny --draft-fill 320 --draft-steps 4"
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
  p_offload_sim offload_args p_preflight p_hang json_str sanitizer_path travel_bytes mib
export PROGRAMS SAN_REFUSED OUTDIR

# ---- the run ----

N_GPUS=0
if command -v nvidia-smi > /dev/null && [ "$EMULATED" = 0 ]; then
  nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -1 > "$WORK/gpu-name"
  N_GPUS=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')
elif [ "$EMULATED" = 1 ]; then
  echo "cudaemu (the emulated GPU, tests/cudaemu)" > "$WORK/gpu-name"
  N_GPUS=2
fi
SIM_PROFILE=$(sim_profile)
export N_GPUS SIM_PROFILE

PREFLIGHT_FAILED=0
part preflight p_preflight
# fail fast: without a usable device every other part would skip its way to "pass" on the window
awk -F'\t' '$1 == "preflight" && $2 != "pass" { f = 1 } END { exit !f }' "$PARTS" && PREFLIGHT_FAILED=1
for name in $PART_ORDER hang; do
  [ "$name" = preflight ] || part "$name" "p_$name"
done
rm -f "$OUTDIR/running.log"
write_summary

failed=$(awk -F'\t' '$2 == "fail" || $2 == "timeout" || $2 == "not_run"' "$PARTS" | wc -l)
cut=$(awk -F'\t' '$2 == "cut"' "$PARTS" | wc -l)
again=$(awk -F'\t' '$2 != "pass" && $2 != "skip" && $1 != "preflight" { printf "%s%s", s, $1; s = "," }' "$PARTS")
echo "gpu-check: $(wc -l < "$PARTS") parts, $failed failed, timed out or not run, $cut cut; summary in $OUTDIR/summary.md"
[ -z "$again" ] || [ "$PREFLIGHT_FAILED" = 1 ] || echo "gpu-check: follow-up: GPU_CHECK_PARTS=$again"
[ "$failed" = 0 ] || exit 1
[ "$cut" = 0 ] || exit 3
exit 0
