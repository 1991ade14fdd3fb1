#!/usr/bin/env bash
# test-package.sh BUILD_DIR APP_C GEN_MODEL plain|sanitized [CHAT_C]
#
# Installs the build into a temporary DESTDIR, then checks what an application developer gets:
#   1. triforce.pc, triforce.h and libtriforce.so (with its versioned soname) are installed;
#   2. `cc app.c $(pkg-config --cflags --libs triforce)` builds against the installed copy (and
#      nothing in the source or build tree), and the program runs and generates;
#   3. the library exports exactly the functions triforce.h declares, all tri_, none tri__;
#   4. it needs no CUDA library (the CUDA backend is a module loaded at run time);
#   5. where GTK 4 is installed, the example chat window (CHAT_C) builds against the installed copy
#      too: it uses nothing but the public API.
# Exit 77 (skipped) in a sanitizer build.
set -euo pipefail
build=$1 app_c=$2 gen=$3 kind=$4 chat_c=${5:-}
if [ "$kind" = sanitized ]; then
  echo "SKIP: a sanitizer build's library needs the sanitizer runtime in every program that links it"
  exit 77
fi
for tool in cc pkg-config nm readelf; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool not found"; exit 1; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tri-package.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# ---- 1. install ----
meson install -C "$build" --destdir "$tmp/root" --no-rebuild --quiet >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "meson install"; }
pc=$(find "$tmp/root" -name triforce.pc -path '*/pkgconfig/*' | head -1)
[ -n "$pc" ] || fail "no triforce.pc installed"
header=$(find "$tmp/root" -name triforce.h | head -1)
[ -n "$header" ] || fail "no triforce.h installed"
lib=$(find "$tmp/root" -name 'libtriforce.so.*.*.*' -type f | head -1)
[ -n "$lib" ] || fail "no libtriforce.so.X.Y.Z installed"
libdir=$(dirname "$lib")
echo "installed: ${pc#"$tmp/root"}, ${header#"$tmp/root"}, ${lib#"$tmp/root"}"
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ -n "$soname" ] || fail "$lib has no soname"
[ -L "$libdir/$soname" ] || fail "no $soname link beside the library"
[ -L "$libdir/libtriforce.so" ] || fail "no libtriforce.so development link"
echo "soname: $soname"

# ---- 2. a client built with pkg-config against the installed copy ----
export PKG_CONFIG_LIBDIR=$(dirname "$pc")  # ours only
export PKG_CONFIG_SYSROOT_DIR=$tmp/root     # the .pc names the prefix; the files are under DESTDIR
flags=$(pkg-config --cflags --libs triforce) || fail "pkg-config --cflags --libs triforce"
echo "pkg-config: $flags"
cp "$app_c" "$tmp/app.c"
(cd "$tmp" && cc -std=c11 -Wall -Wextra -Werror app.c $flags -o app) || fail "cc app.c \$(pkg-config ...)"
export LD_LIBRARY_PATH=$libdir
# (ldd's output read whole first: grep -q leaving a pipe early may kill ldd with SIGPIPE, which
# pipefail then reports as a failure)
deps=$(ldd "$tmp/app")
grep -q "libtriforce.so.* => $libdir/" <<<"$deps" || { echo "$deps"; fail "app does not load the installed library"; }
"$gen" --seed 3 --layers 2 --vocab 300 --out-gguf "$tmp/m.gguf" >/dev/null || fail "tri-gen-model"
out=$("$tmp/app" "$tmp/m.gguf" "hello" 12) || { echo "$out"; fail "the client failed"; }
cat -v <<<"$out"
version=$(sed -n 's/^#define TRI_VERSION_STRING "\(.*\)"/\1/p' "$header")
grep -qx "version $version" <<<"$out" || fail "tri_version() is not the header's $version"
grep -qx "generated 12 stop length" <<<"$out" || fail "the client did not generate 12 tokens"

# ---- 3. exports: exactly the header's functions ----
nm -D --defined-only "$lib" | awk '{print $NF}' | sed 's/@.*//' | sort -u >"$tmp/exported"
grep -o 'TRI_API[^;]*(' "$header" | grep -o 'tri_[a-z0-9_]*[[:space:]]*($' | tr -d ' (' | sort -u >"$tmp/declared"
n_exp=$(wc -l <"$tmp/exported")
others=$(grep -v '^tri_[a-z0-9]' "$tmp/exported" || true)
[ -z "$others" ] || { echo "$others" | head -20; fail "$(echo "$others" | wc -l) exported symbols are not tri_ (of $n_exp)"; }
internal=$(grep '^tri__' "$tmp/exported" || true)
[ -z "$internal" ] || { echo "$internal" | head; fail "internal tri__ symbols exported"; }
missing=$(comm -13 "$tmp/exported" "$tmp/declared")
[ -z "$missing" ] || { echo "$missing"; fail "declared in triforce.h but not exported"; }
extra=$(comm -23 "$tmp/exported" "$tmp/declared")
[ -z "$extra" ] || { echo "$extra"; fail "exported but not declared in triforce.h"; }
echo "exports: $n_exp symbols, all tri_, exactly the $(wc -l <"$tmp/declared") functions triforce.h declares"

# ---- 4. no CUDA library needed ----
needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
echo "needs: $needed"
if grep -Eq 'libcuda|libcudart|libcublas|libnvidia' <<<"$needed"; then fail "the library links a CUDA library"; fi

# ---- 5. the example application against the installed copy ----
if [ -n "$chat_c" ] && env -u PKG_CONFIG_LIBDIR -u PKG_CONFIG_SYSROOT_DIR pkg-config --exists gtk4; then
  gtk=$(env -u PKG_CONFIG_LIBDIR -u PKG_CONFIG_SYSROOT_DIR pkg-config --cflags --libs gtk4)
  # shellcheck disable=SC2086
  cc -std=c11 -Wall -Wextra -Werror "$chat_c" $flags $gtk -o "$tmp/triforce-chat" ||
    fail "examples/chat-gtk does not build against the installed library"
  "$tmp/triforce-chat" --help >/dev/null || fail "triforce-chat --help"
  echo "examples/chat-gtk builds against the installed library"
else
  echo "examples/chat-gtk: GTK 4 not installed, not built"
fi
echo "PASS"
