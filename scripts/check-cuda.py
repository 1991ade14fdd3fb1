#!/usr/bin/env python3
"""check-cuda.py BUILD_DIR - static checks of backends/cuda/*.cu on every target architecture.

For each unit that holds kernels and each architecture the build targets (SASS sm_80, sm_86,
sm_89, sm_90, sm_120 where this nvcc supports them), compiles with every nvcc and host-compiler
warning an error and reads ptxas's resource report (--resource-usage). Fails when:
  - a kernel has no __launch_bounds__ (the bound is what the check below and ptxas rely on);
  - a kernel spills registers to local memory (spill stores or loads > 0);
  - registers x threads of a block exceed the 65,536 registers of an SM (registers are allocated
    per warp in units of 256, i.e. per thread rounded up to 8);
  - static + the largest dynamic shared memory exceed 48 KiB (what a launch gets without opt-in).
BUILD_DIR is a meson build of the project (its tri-config.h). Prints one line per kernel and
architecture, then a summary; exit 1 on any failure. Needs nvcc on PATH (or $NVCC).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARCHS = ['80', '86', '89', '90', '120']
REGS_PER_SM = 65536
SMEM_LIMIT = 48 * 1024


def defines(text):
    """Integer #defines of a unit, for evaluating __launch_bounds__ arguments."""
    out = {}
    for name, expr in re.findall(r'^#define\s+(\w+)\s+(.+?)\s*(?://.*)?$', text, re.M):
        out[name] = expr
    return out


def evaluate(expr, defs, depth=0):
    if depth > 10:
        raise ValueError(expr)
    expanded = re.sub(r'[A-Za-z_]\w*', lambda m: '(' + evaluate(defs[m.group(0)], defs, depth + 1) + ')'
                      if m.group(0) in defs else m.group(0), expr)
    if re.search(r'[A-Za-z_]', expanded):
        raise ValueError('cannot evaluate %r' % expr)
    return str(int(eval(expanded, {'__builtins__': {}})))


def kernels(text):
    """{kernel name: launch bound or None} of every __global__ function of a unit."""
    defs = defines(text)
    out = {}
    for m in re.finditer(r'__global__\s+void\s+(?:__launch_bounds__\s*\(([^()]*(?:\([^()]*\))?[^()]*)\)\s*)?(\w+)\s*\(',
                         text):
        bound = m.group(1)
        out[m.group(2)] = int(evaluate(bound.split(',')[0], defs)) if bound else None
    return out


def demangle(names):
    if not names:
        return {}
    r = subprocess.run(['c++filt'], input='\n'.join(names), capture_output=True, text=True, check=True)
    return dict(zip(names, r.stdout.split('\n')))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    build = os.path.abspath(sys.argv[1])
    nvcc = os.environ.get('NVCC') or shutil.which('nvcc') or '/usr/local/cuda/bin/nvcc'
    if not os.path.exists(nvcc):
        print('check-cuda: no nvcc: static checks of backends/cuda/ skipped')
        return 0
    inc = ['-I' + build] + ['-I' + os.path.join(ROOT, d) for d in ('include', 'core', 'offload', 'backends/cpu',
                                                                  'backends/cuda', 'kv')]
    archs = []
    for sm in ARCHS:
        probe = subprocess.run([nvcc, '--list-gpu-arch'], capture_output=True, text=True)
        if 'compute_' + sm in probe.stdout.split():
            archs.append(sm)
    failures, checked = [], 0
    # largest dynamic smem per launch (bytes)
    smem_dyn = {'k_attn_partial': None, 'k_top_k': 4096 * 8, 'k_top_k_select': 4096 * 8}
    with tempfile.TemporaryDirectory() as tmp:
        for unit in sorted(os.listdir(os.path.join(ROOT, 'backends', 'cuda'))):
            if not unit.endswith('.cu'):
                continue
            path = os.path.join(ROOT, 'backends', 'cuda', unit)
            text = open(path).read()
            ks = kernels(text)
            if not ks:
                continue
            for name, bound in sorted(ks.items()):
                if bound is None:
                    failures.append('%s: kernel %s has no __launch_bounds__' % (unit, name))
            for sm in archs:
                cmd = [nvcc, '-c', '-std=c++17', '--resource-usage', '-Werror', 'all-warnings',
                       '-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter,-Werror',
                       '-gencode=arch=compute_%s,code=sm_%s' % (sm, sm), path, '-o', os.path.join(tmp, 'x.o')] + inc
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    failures.append('%s sm_%s: nvcc failed:\n%s' % (unit, sm, r.stderr.strip()))
                    continue
                entries = []  # (mangled, regs, spill_st, spill_ld, smem)
                cur = None
                for line in r.stderr.splitlines():
                    m = re.search(r"Compiling entry function '(\w+)' for 'sm_(\d+)'", line)
                    if m:
                        cur = {'name': m.group(1), 'regs': 0, 'st': 0, 'ld': 0, 'smem': 0}
                        entries.append(cur)
                        continue
                    if cur is None:
                        continue
                    m = re.search(r'(\d+) bytes spill stores, (\d+) bytes spill loads', line)
                    if m:
                        cur['st'], cur['ld'] = int(m.group(1)), int(m.group(2))
                    m = re.search(r'Used (\d+) registers', line)
                    if m:
                        cur['regs'] = int(m.group(1))
                    m = re.search(r'(\d+) bytes smem', line)
                    if m:
                        cur['smem'] = int(m.group(1))
                names = demangle([e['name'] for e in entries])
                for e in entries:
                    pretty = names.get(e['name'], e['name'])
                    base = re.match(r'(?:void\s+)?(\w+)', pretty).group(1)
                    bound = ks.get(base)
                    checked += 1
                    regs_block = (e['regs'] + 7) // 8 * 8 * (bound or 1024)
                    dyn = smem_dyn.get(base) or 0
                    line = '%-6s %-60s regs %3d x %4s threads = %6d  spills %d/%d  smem %d' % (
                        'sm_' + sm, pretty[:60], e['regs'], bound or '?', regs_block, e['st'], e['ld'], e['smem'])
                    print(line)
                    if e['st'] or e['ld']:
                        failures.append('%s sm_%s: %s spills (%d bytes stored, %d loaded)' % (unit, sm, pretty,
                                                                                            e['st'], e['ld']))
                    if regs_block > REGS_PER_SM:
                        failures.append('%s sm_%s: %s needs %d registers per block, an SM has %d' % (
                            unit, sm, pretty, regs_block, REGS_PER_SM))
                    if e['smem'] + dyn > SMEM_LIMIT:
                        failures.append('%s sm_%s: %s uses %d bytes of shared memory, over %d' % (
                            unit, sm, pretty, e['smem'] + dyn, SMEM_LIMIT))
    print('check-cuda: %d kernel builds checked on %s, %d problem(s)' % (
        checked, ' '.join('sm_' + a for a in archs), len(failures)))
    for f in failures:
        print('check-cuda: FAIL: ' + f)
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
