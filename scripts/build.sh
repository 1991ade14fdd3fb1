#!/usr/bin/env bash
# Configures (or reconfigures) and builds the release build in build/. Extra arguments go to
# meson setup, e.g. -Dcuda=disabled.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -d build/meson-private ]; then
  meson setup build --reconfigure "$@" >/dev/null
else
  meson setup build "$@" >/dev/null
fi
ninja -C build
