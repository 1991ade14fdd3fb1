#!/usr/bin/env python3
"""Checks the library's layers by symbols: for each layer's static library in a build directory
(libtri_<layer>.a, meson.build's layer list), which other layers' symbols it uses. Fails when a
layer uses a symbol of a layer above it, or when two layers use each other's symbols; the include
paths already make an upward #include fail to compile (docs/architecture.md, "Layers").

Usage: scripts/check-layers.py BUILD_DIR   (prints each layer's edges; exit 1 on a violation)"""
import os
import subprocess
import sys

# Lowest first, as meson.build builds them.
LAYERS = ["core", "offload", "format", "text", "cpu", "cuda", "kv", "model", "plan", "sim", "engine"]


def symbols(archive):
    """(defined, undefined) global symbol names of the archive's objects."""
    out = subprocess.run(["nm", "-g", "--defined-only", archive], capture_output=True, text=True, check=True).stdout
    defined = {l.split()[-1] for l in out.splitlines() if len(l.split()) == 3}
    out = subprocess.run(["nm", "-g", "--undefined-only", archive], capture_output=True, text=True,
                         check=True).stdout
    undefined = {l.split()[-1] for l in out.splitlines() if l.strip() and ":" not in l}
    return defined, undefined


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    build = sys.argv[1]
    owner, uses = {}, {}
    for layer in LAYERS:
        path = os.path.join(build, "libtri_%s.a" % layer)
        if not os.path.exists(path):
            sys.exit("check-layers: %s: no such library (configure and build %s first)" % (path, build))
        defined, undefined = symbols(path)
        for s in defined:
            owner.setdefault(s, layer)
        uses[layer] = undefined
    rank = {l: i for i, l in enumerate(LAYERS)}
    edges = {}
    for layer in LAYERS:
        for s in uses[layer]:
            o = owner.get(s)
            if o and o != layer:
                edges.setdefault((layer, o), []).append(s)
    bad = 0
    for (a, b), syms in sorted(edges.items(), key=lambda e: (rank[e[0][0]], rank[e[0][1]])):
        up = rank[b] > rank[a]
        mutual = (b, a) in edges
        flag = "UPWARD " if up else ("MUTUAL " if mutual else "")
        print("%-7s%s -> %s: %d symbols%s" % (flag, a, b, len(syms),
                                              (" (" + ", ".join(sorted(syms)[:6]) + ")") if flag else ""))
        bad += bool(up or mutual)
    print("layers %d, edges %d, violations %d" % (len(LAYERS), len(edges), bad))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
