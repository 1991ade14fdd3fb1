#!/usr/bin/env bash
# run-all.sh BUILD_DIR SECONDS: runs every fuzz target for SECONDS, starting from its seed corpus
# (tests/fuzz/corpus-<name>/ plus any files a fixture generator left in the build). Fails if a
# target finds a crash, a leak or undefined behaviour.
set -euo pipefail
build=$1
secs=${2:-60}
here=$(cd "$(dirname "$0")" && pwd)
status=0
for bin in "$build"/tests/fuzz/fuzz-*; do
  [ -f "$bin" ] && [ -x "$bin" ] || continue  # skip the fuzz-*.p object directories
  name=${bin##*/fuzz-}
  work=$(mktemp -d)
  [ -d "$here/corpus-$name" ] && cp -r "$here/corpus-$name/." "$work/"
  echo "fuzzing $name for ${secs}s"
  if ! UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      "$bin" -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 \
        -artifact_prefix="$build/fuzz-$name-" "$work" >"$build/fuzz-$name.log" 2>&1; then
    echo "fuzz target $name failed; last lines of $build/fuzz-$name.log:"
    tail -40 "$build/fuzz-$name.log"
    status=1
  else
    grep -E '^Done|^#[0-9]+.*DONE' "$build/fuzz-$name.log" | tail -1 || true
  fi
  rm -rf "$work"
done
exit $status
