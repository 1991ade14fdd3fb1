#!/usr/bin/env bash
# Installs the system packages the runtime needs on Debian 12 (as root, or through sudo).
# CUDA is optional: the CUDA backend is built when nvcc and cuBLAS are found (/usr/local/cuda).
set -euo pipefail

pkgs=(
  build-essential pkg-config meson ninja-build
  libjson-c-dev libhwloc-dev liburing-dev libfaiss-dev
  libmicrohttpd-dev  # the HTTP server of offload-run serve (optional: without it, no server)
  libcriterion-dev
  libedit-dev  # line editing in offload-run chat (optional: -Dlibedit)
  clang libclang-rt-14-dev
  python3 python3-venv python3-pip unzip
  python3-torch  # torch 1.13 for transformers in suite conformance (the venv sees it: --system-site-packages)
  bible-kjv bible-kjv-text  # public-domain text: suite smollm2 and benchmarks/bench-kv-quality
  jargon-text  # public-domain text: suite needle's Jargon File case and benchmarks/bench-table1
  # the GTK 4 example app (examples/chat-gtk) and its test under Xvfb, read back by OCR: suite
  # example-app (about 30 MB to download, 150 MB installed, under a minute)
  libgtk-4-dev xvfb xauth fonts-dejavu-core tesseract-ocr tesseract-ocr-eng
  # headless Chromium: suite server drives the chat page at / in it (about 70 MB, a minute)
  chromium
)
[ "$(id -u)" = 0 ] && sudo= || sudo=sudo
export DEBIAN_FRONTEND=noninteractive
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
