#!/usr/bin/env bash
# cuda12-compile.sh [BUILD_DIR] - compiles every unit of the CUDA module (backends/cuda/*.cu) with a CUDA
# 12.4 nvcc, every nvcc and host-compiler warning an error, for the architectures meson builds
# that this nvcc knows (SASS sm_80 sm_86 sm_89 sm_90, PTX compute_80 compute_90). CUDA 13 binaries
# need an R580+ driver; most RTX 4090s in the field run R535-R570, which only CUDA 12 builds serve,
# so the sources must keep compiling with it (docs/cuda.md, "CUDA 12").
#
# No CUDA 12 toolkit is installed: the script assembles one into a cache folder the first time
# and reuses it afterwards ($CUDA12_CACHE, default ~/.cache/triforce-cuda12; about 100 MB):
#   - nvcc, cicc, cudafe++, fatbinary, ptxas, cuobjdump and libdevice from Debian 13's
#     nvidia-cuda-toolkit 12.4.131 (non-free, 87 MB), fetched with apt-get download through a
#     private apt configuration in the cache (the system's sources and packages are not touched);
#   - the headers from PyPI wheels, pinned by hash: nvidia-cuda-runtime-cu12 12.4.127 (cuda_runtime.h
#     and friends, 0.9 MB), nvidia-cuda-nvcc-cu12 12.4.131 (crt/ headers, 22 MB), nvidia-cublas-cu12
#     12.4.5.8 (cublas_v2.h; a 363 MB wheel of which 0.6 MB of headers are kept).
# Downloads are deleted once the toolkit is assembled. BUILD_DIR is a configured meson build of
# the project without -Dcudaemu (its tri-config.h; default build-test). Objects go to
# BUILD_DIR/cuda12/. Runs as root or a normal user (apt-get download needs no root). Exit 1 on any
# error or warning, or when an object lacks SASS for sm_89 or PTX for compute_80.
# CUDA12_ARCHS="89" compiles fewer architectures (a quicker local check); CUDA12_JOBS (default
# nproc) units at once.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-test}
CACHE=${CUDA12_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/triforce-cuda12}
JOBS=${CUDA12_JOBS:-$(nproc)}
PY=python3
[ -x .venv/bin/python3 ] && PY=.venv/bin/python3

# What is fetched. Change them together: the crt/ headers must be those of this nvcc.
DEB_SUITE=trixie
DEB_PKG=nvidia-cuda-toolkit
DEB_VER=12.4.131~12.4.1-2
DEB_SHA256=cd5fe85aee38d108b315f408a688641478f2402622a10c677478eb7a6c4e5319
WHEELS="nvidia-cuda-runtime-cu12==12.4.127 \
  --hash=sha256:64403288fa2136ee8e467cdc9c9427e0434110899d07c779f25b5c068934faa5
nvidia-cuda-nvcc-cu12==12.4.131 \
  --hash=sha256:e4c9a35435c3b0e36c6397c5696334c9ea6650e524736cbd1c5d345ea099bb04
nvidia-cublas-cu12==12.4.5.8 \
  --hash=sha256:2fc8da60df463fdefa81e323eef2e36489e1c94335b5358bcb38360adf75ac9b"
PINS="$DEB_PKG=$DEB_VER $(echo "$WHEELS" | grep -o '^[a-z0-9-]*==[0-9.]*' | tr '\n' ' ')"
TK=$CACHE/toolkit-12.4.131

die() { echo "cuda12-compile: $*" >&2; exit 1; }

[ -f "$BUILD/tri-config.h" ] || die "$BUILD/tri-config.h not found: give a configured meson build dir of the project"
grep -q '^#define TRI_CUDA_EMULATED 0' "$BUILD/tri-config.h" ||
  die "$BUILD is a -Dcudaemu=true build: give a build dir configured without it"

# ---- the toolkit, assembled once ----
setup_toolkit() {
  local tmp
  mkdir -p "$CACHE"
  rm -rf "$CACHE"/setup.*  # what a run killed midway left
  tmp=$(mktemp -d "$CACHE/setup.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  echo "cuda12-compile: assembling the CUDA 12.4 toolkit in $TK (first run only)"

  # apt: Debian 13's non-free index in a folder of our own, nothing of the system's apt state used
  local apt=$tmp/apt
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/prefs.d"
  : > "$apt/status"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian" \
    "$DEB_SUITE non-free" > "$apt/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o "Dir::State::status=$apt/status"
    -o Dir::Etc::Preferences=/dev/null -o "Dir::Etc::PreferencesParts=$apt/prefs.d"
    -o APT::Architecture=amd64 -o APT::Architectures::=amd64 -o APT::Sandbox::User=root -qq)
  apt-get "${opts[@]}" update || die "apt-get update of Debian $DEB_SUITE non-free failed"
  (cd "$tmp" && apt-get "${opts[@]}" download "$DEB_PKG=$DEB_VER") ||
    die "apt-get download $DEB_PKG=$DEB_VER from Debian $DEB_SUITE failed (gone from the archive? update the pins)"
  echo "$DEB_SHA256  $(ls "$tmp"/"$DEB_PKG"_*.deb)" | sha256sum -c --quiet - || die "$DEB_PKG: checksum differs"
  dpkg-deb -x "$tmp"/"$DEB_PKG"_*.deb "$tmp/deb"

  # pip: the wheels, by hash, no dependencies, nothing installed
  echo "$WHEELS" > "$tmp/wheels.txt"
  "$PY" -m pip download -q --no-deps --no-cache-dir --require-hashes --only-binary=:all: \
    --platform manylinux2014_x86_64 -r "$tmp/wheels.txt" -d "$tmp/whl" ||
    die "pip download of the CUDA 12 wheels failed"
  local w
  for w in "$tmp"/whl/*.whl; do
    unzip -q -o "$w" 'nvidia/*/include/*' -d "$tmp/whl"
    rm -f "$w"
  done

  # the toolkit's usual shape: bin/ (nvcc finds nvcc.profile beside itself), nvvm/, include/
  local t=$tmp/toolkit d=$tmp/deb/usr
  mkdir -p "$t/bin" "$t/nvvm/bin" "$t/nvvm/libdevice" "$t/include"
  cp "$d/lib/nvidia-cuda-toolkit/bin/nvcc" "$d/bin/cudafe++" "$d/bin/fatbinary" "$d/bin/ptxas" "$d/bin/bin2c" \
    "$d/bin/cuobjdump" "$t/bin/"
  cp -r "$d/lib/nvidia-cuda-toolkit/bin/crt" "$t/bin/"
  cp "$d/lib/nvidia-cuda-toolkit/bin/cicc" "$t/nvvm/bin/"
  cp "$d/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc" "$t/nvvm/libdevice/"
  cp -r "$tmp"/whl/nvidia/cuda_runtime/include/. "$tmp"/whl/nvidia/cuda_nvcc/include/. \
    "$tmp"/whl/nvidia/cublas/include/. "$t/include/"
  rm -f "$t/include/__init__.py"
  cat > "$t/bin/nvcc.profile" <<'EOF'
TOP                = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
PATH              += $(TOP)/nvvm/bin:$(_HERE_):
INCLUDES          += "-I$(TOP)/include" $(_SPACE_)
LIBRARIES          =+ $(_SPACE_) "-L$(TOP)/lib64"
CUDAFE_FLAGS      +=
PTXAS_FLAGS       +=
EOF
  echo "$PINS" > "$t/PINS"
  "$t/bin/nvcc" --version | grep -q 'release 12\.4' || die "the assembled nvcc does not run or is not 12.4"
  rm -rf "$TK"
  mv "$t" "$TK"
  rm -rf "$tmp"
  trap - EXIT
}

if [ "$(cat "$TK/PINS" 2>/dev/null)" != "$PINS" ]; then
  t0=$(date +%s)
  setup_toolkit
  echo "cuda12-compile: toolkit ready in $(($(date +%s) - t0)) s ($(du -sh "$TK" | cut -f1))"
fi
NVCC=$TK/bin/nvcc
echo "cuda12-compile: $("$NVCC" --version | grep release), host compiler $(g++ -dumpfullversion)"

# ---- the module's units, with the flags backends/cuda/meson.build gives them ----
# Architectures as there: SASS for each of ours this nvcc knows, PTX of the oldest and the newest.
avail=$("$NVCC" --list-gpu-arch)
gencode=()
sass=()
oldest=
newest=
for sm in ${CUDA12_ARCHS:-80 86 89 90 120}; do
  grep -qx "compute_$sm" <<< "$avail" || continue
  gencode+=("-gencode=arch=compute_$sm,code=sm_$sm")
  sass+=("sm_$sm")
  oldest=${oldest:-$sm}
  newest=$sm
done
grep -qx compute_80 <<< "$avail" || die "this nvcc cannot build compute_80"
if [ -z "$oldest" ] || [ "$oldest" -gt 80 ]; then oldest=80; fi  # PTX of compute_80 always
gencode+=("-gencode=arch=compute_$oldest,code=compute_$oldest")
ptx="compute_$oldest"
if [ -n "$newest" ] && [ "$newest" != "$oldest" ]; then
  gencode+=("-gencode=arch=compute_$newest,code=compute_$newest")
  ptx+=" compute_$newest"
fi
targets="SASS ${sass[*]}, PTX $ptx"
echo "cuda12-compile: $targets"

inc=(-I"$BUILD")
for d in . include core offload format text backends/cpu backends/cuda kv model plan backends/sim engine; do
  inc+=(-I"$d")
done
# -DNDEBUG -O3: the release build; -Werror=cross-execution-space-call,...: meson's werror=true;
# the rest is cuda_args of backends/cuda/meson.build.
# shellcheck disable=SC2054  # the commas belong to nvcc's options
flags=(-DNDEBUG -O3 -Xcompiler=-fPIC -Xcompiler=-Wall,-Winvalid-pch,-Wextra
  -Werror=cross-execution-space-call,deprecated-declarations,reorder
  "${gencode[@]}" "-DTRI_CUDA_TARGETS=\"$targets\"" -Xcompiler=-fvisibility=hidden
  -Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter,-Werror)

out=$BUILD/cuda12
rm -rf "$out"
mkdir -p "$out"
units=$(sed -n "s/^module_units = \[\(.*\)\]/\1/p" backends/cuda/meson.build | tr -d "',")
[ -n "$units" ] || die "no module_units line in backends/cuda/meson.build"
for f in backends/cuda/*.cu; do
  u=$(basename "$f" .cu)
  [[ " $units " == *" $u "* ]] || die "backends/cuda/$u.cu is not in module_units of backends/cuda/meson.build"
done

compile() {  # compile UNIT: nvcc, then the object must carry sm_89 SASS and compute_80 PTX
  local u=$1 t0 t1 rc=0 listing
  t0=$(date +%s.%N)
  "$NVCC" "${flags[@]}" "${inc[@]}" -c "backends/cuda/$u.cu" -o "$out/$u.o" > "$out/$u.log" 2>&1 || rc=$?
  t1=$(date +%s.%N)
  if [ "$rc" = 0 ] && [ -s "$out/$u.log" ]; then rc=1; fi  # anything printed is a warning
  if [ "$rc" = 0 ] && grep -q '__global__' "backends/cuda/$u.cu"; then
    listing=$("$TK/bin/cuobjdump" --list-elf --list-ptx "$out/$u.o" 2>&1)
    grep -q 'sm_89\.cubin' <<< "$listing" || { echo "no sm_89 SASS in $u.o" >> "$out/$u.log"; rc=1; }
    grep -q 'sm_80\.ptx' <<< "$listing" || { echo "no compute_80 PTX in $u.o" >> "$out/$u.log"; rc=1; }
  fi
  printf 'cuda12-compile: %-20s %-6s %5.1f s\n' "$u.cu" "$([ "$rc" = 0 ] && echo ok || echo FAILED)" \
    "$(awk "BEGIN { print $t1 - $t0 }")"
  [ "$rc" = 0 ] || sed 's/^/    /' "$out/$u.log"
  return "$rc"
}

# the heaviest first (kernels-matvec's templates take most of the time), JOBS at once
t0=$(date +%s)
order=$(for u in $units; do echo "$(wc -c < "backends/cuda/$u.cu") $u"; done | sort -rn | cut -d' ' -f2)
failed=0
running=0
for u in $order; do
  if [ "$running" -ge "$JOBS" ]; then
    wait -n || failed=$((failed + 1))
    running=$((running - 1))
  fi
  compile "$u" &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || failed=$((failed + 1))
  running=$((running - 1))
done
n=$(wc -w <<< "$units")
echo "cuda12-compile: $((n - failed)) of $n units compiled with CUDA 12.4 in $(($(date +%s) - t0)) s, $failed failed"
[ "$failed" = 0 ]
