#!/usr/bin/env python3
"""roofline.py [--rev REV] [--json FILE] [--sass DIR] BUILD_DIR - predicted memory-bandwidth fraction per kernel.

A static prediction of how much of a GPU's memory bandwidth the memory-bound kernels of cuda/
(the matvec of decode and the decode attention) can reach, without a GPU:

1. Compiles backends/cuda/kernels-matvec.cu and kernels-attention.cu (of the working tree, or of
   git revision REV with --rev; cuda/ in revisions before the layers' folders) for sm_90 (H100) and sm_89 (RTX 4090) with ptxas's resource report and line
   information, and disassembles the SASS (cuobjdump / nvdisasm: the CUDA toolkit's, or PyPI's
   nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm, scripts/requirements-test.txt).
2. Per kernel, finds its streaming loops: the innermost loops (a backward branch) holding a load
   from global memory (LDG, or LD through a generic pointer) issued by one of the functions that
   read weights or KV rows (STREAM_FUNCS, by the line information). In each it walks the loop body
   once in order and measures the bytes per thread in flight: the loads of data (not of pointers
   or indices: a load whose first use is an address or a comparison) issued and not yet used when
   an instruction first uses the result of one of them, at its largest. Loads retire in order.
3. Occupancy from ptxas's registers and shared memory and the launch shape (threads per block,
   dynamic shared memory), blocks per wave = SMs x blocks per SM.
4. Little's law: a wave of a blocks of t threads with b bytes per thread in flight moves
   a t b / latency bytes per second, at most the bandwidth. The kernel's bytes are spread evenly
   over its blocks, wave by wave (the last wave partial); the predicted fraction is the kernel's
   bytes over (time x bandwidth). A kernel with several streaming phases (attention: keys, then
   values) takes each phase at its own rate, an equal share of the bytes each.

The figures and the assumptions (latencies are not in NVIDIA's specifications: see DEVICES) are
in docs/cuda.md, "Roofline"; they are a prediction, which the bench parts of scripts/gpu-check.sh
measure against on a GPU. Not modelled: L1/LSU throughput (uncoalesced loads that touch many
cache lines per instruction, which hit L1 after the first), the latency of instruction issue
between loads, launch overhead, L2 hits. Loads of activations that hit L1 count as loads in
flight, so a kernel that re-reads them from global memory is predicted optimistically.

Prints the kernels' resources, then one row per shape and device; --json writes the rows.
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Figures used, per device. Bandwidth and SM count: NVIDIA's datasheets (H100 SXM5: 3.35 TB/s HBM3,
# 132 SMs; GeForce RTX 4090: 1008 GB/s GDDR6X, 128 SMs, Ada whitepaper). Threads, blocks,
# registers and shared memory per SM: the CUDA C++ Programming Guide's table of compute
# capabilities (9.0: 2048 threads, 32 blocks, 228 KB; 8.9: 1536 threads, 24 blocks, 100 KB;
# 64K registers; 1 KB of shared memory reserved per block). DRAM latency under load is not in
# NVIDIA's specifications: 650 ns for the H100 and 600 ns for the 4090 are assumptions, near
# published microbenchmarks of loaded latency (a GPU run calibrates them).
DEVICES = [
    {'name': 'h100-sxm', 'arch': '90', 'sms': 132, 'gbps': 3350.0, 'latency_ns': 650.0, 'threads': 2048,
     'blocks': 32, 'regs': 65536, 'smem': 228 * 1024, 'smem_reserved': 1024, 'clock_ghz': 1.98},
    {'name': 'rtx4090', 'arch': '89', 'sms': 128, 'gbps': 1008.0, 'latency_ns': 600.0, 'threads': 1536,
     'blocks': 24, 'regs': 65536, 'smem': 100 * 1024, 'smem_reserved': 1024, 'clock_ghz': 2.52},
]

# Functions whose loads read the streamed bytes (weights, KV rows), in the current and older sources.
STREAM_FUNCS = ['kv_elem', 'kv_load16', 'load_block', 'load8', 'float_elem', 'tri_dev_q_code', 'tri_dev_q_group',
                'stream_load', 'stream_load16']
# Bytes between the addresses of neighbouring lanes, per function (of the sources since the matvec
# of main before this script; the rest are coalesced: stride = the load's width). Declared from the
# sources, not read from the SASS: the old quantized matvec gives a lane a whole block (stride one
# block) and reads its 32 activations (stride 128 bytes).
LANE_STRIDE = {
    'load_block': lambda t, w: ELEM_BYTES[t] * 32,
    'load32': lambda t, w: 128,
    'tri_dev_q_code': lambda t, w: ELEM_BYTES[t] * 32,
    'tri_dev_q_group': lambda t, w: ELEM_BYTES[t] * 32,
}

DTYPES = {'f32': 0, 'f16': 1, 'bf16': 2, 'q8_0': 3, 'q4_0': 4, 'q4_1': 5, 'q5_0': 6, 'q5_1': 7, 'q2_k': 10,
          'q3_k': 11, 'q4_k': 12, 'q5_k': 13, 'q6_k': 14}
# bytes per element of each weight type (block bytes / block elements)
ELEM_BYTES = {'f32': 4, 'f16': 2, 'bf16': 2, 'q8_0': 34 / 32, 'q4_0': 18 / 32, 'q4_1': 20 / 32, 'q5_0': 22 / 32,
              'q5_1': 24 / 32, 'q2_k': 84 / 256, 'q3_k': 110 / 256, 'q4_k': 144 / 256, 'q5_k': 176 / 256,
              'q6_k': 210 / 256}
KV_KIND = {'f32': 0, 'f16': 1, 'q8_0': 2, 'q4_0': 3}


# ---- sources and compilation ----

def sources(rev, tmp):
    """Root of the sources to compile: the working tree, or REV extracted into tmp."""
    if not rev:
        return ROOT
    out = os.path.join(tmp, 'src')
    os.makedirs(out)
    arch = subprocess.run(['git', '-C', ROOT, 'archive', rev], capture_output=True, check=True)
    subprocess.run(['tar', '-x', '-C', out], input=arch.stdout, check=True)
    return out


def cuda_dir(src):
    """The CUDA backend's folder: backends/cuda, or cuda/ in revisions before the layers' folders."""
    d = os.path.join(src, 'backends', 'cuda')
    return d if os.path.isdir(d) else os.path.join(src, 'cuda')


def include_dirs(src, build):
    dirs = {build}
    for d, _, files in os.walk(src):
        if any(f.endswith(('.h', '.cuh')) for f in files) and '/tests' not in d and '/.git' not in d:
            dirs.add(d)
    return ['-I' + d for d in sorted(dirs)]


def tool(name):
    """A CUDA binary tool: on PATH, in the toolkit, or in a Python environment's nvidia packages."""
    found = shutil.which(name)
    if found:
        return found
    cands = ['/usr/local/cuda/bin/' + name]
    for base in [os.path.join(ROOT, '.venv'), sys.prefix]:
        for d, _, files in os.walk(os.path.join(base, 'lib')):
            if name in files and d.endswith('/bin') and '/nvidia/' in d:
                cands.append(os.path.join(d, name))
    for c in cands:
        if os.path.exists(c):
            return c
    return None


def compile_unit(nvcc, src, unit, arch, incs, tmp, keep=None):
    """(ptxas report {mangled: {regs, smem}}, SASS text with line information) of unit for sm_arch."""
    if keep:  # reuse what an earlier run compiled from the same source text
        import hashlib
        text = open(os.path.join(cuda_dir(src), unit), 'rb').read()
        for h in sorted(os.listdir(cuda_dir(src))):
            if h.endswith('.cuh'):
                text += open(os.path.join(cuda_dir(src), h), 'rb').read()
        key = os.path.join(keep, '%s-%s-%s.json' % (unit, arch, hashlib.sha1(text).hexdigest()[:16]))
        if os.path.exists(key):
            d = json.load(open(key))
            return d['res'], d['sass']
        res, sass = compile_unit(nvcc, src, unit, arch, incs, tmp)
        os.makedirs(keep, exist_ok=True)
        json.dump({'res': res, 'sass': sass}, open(key, 'w'))
        return res, sass
    cubin = os.path.join(tmp, '%s-%s.cubin' % (unit, arch))
    cmd = [nvcc, '-cubin', '-std=c++17', '-O3', '-DNDEBUG', '-lineinfo', '--resource-usage',
           '-gencode=arch=compute_%s,code=sm_%s' % (arch, arch), os.path.join(cuda_dir(src), unit), '-o', cubin] + incs
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit('roofline: nvcc failed on %s sm_%s:\n%s' % (unit, arch, r.stderr))
    res, cur = {}, None
    for line in r.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)' for 'sm_(\d+)'", line)
        if m:
            cur = res.setdefault(m.group(1), {'regs': 0, 'smem': 0})
            continue
        if cur is None:
            continue
        m = re.search(r'Used (\d+) registers', line)
        if m:
            cur['regs'] = int(m.group(1))
        m = re.search(r'(\d+) bytes smem', line)
        if m:
            cur['smem'] = int(m.group(1))
    nvdisasm = tool('nvdisasm')
    sass = subprocess.run([nvdisasm, '-g', '-c', cubin], capture_output=True, text=True, check=True).stdout
    return res, sass


# ---- SASS ----

INS = re.compile(r'/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;')


def parse_sass(text):
    """{function: [(address, opcode, operands, (file, line))]} from nvdisasm -g output."""
    funcs, cur, where, labels = {}, None, None, {}
    for line in text.splitlines():
        m = re.match(r'\s*\.text\.(\S+):', line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            where = None
            continue
        m = re.search(r'//## File "([^"]+)", line (\d+)', line)
        if m:
            where = (os.path.basename(m.group(1)), int(m.group(2)))
            continue
        m = re.match(r'\s*(\.L_x_\d+):', line)
        if m and cur is not None:
            labels[m.group(1)] = None  # resolved by the next instruction
            pending = m.group(1)
            labels[pending] = ('next', len(cur), id(cur))
            continue
        m = INS.search(line)
        if m and cur is not None:
            body = re.sub(r'^@!?U?P[T\d]+\s+', '', m.group(2))
            parts = body.split(None, 1)
            cur.append((int(m.group(1), 16), parts[0], parts[1] if len(parts) > 1 else '', where))
    return funcs, labels


def regs_of(text):
    out = set()
    for m in re.finditer(r'\bR(\d+)(\.64)?\b', text):
        r = int(m.group(1))
        out.add(r)
        if m.group(2):
            out.add(r + 1)
    return out


def load_info(op, rest):
    """(bytes, destination registers) of a global or generic load, else None."""
    base = op.split('.')[0]
    if base not in ('LDG', 'LD'):
        return None
    width = (16 if '.128' in op else 8 if '.64' in op else 2 if ('.U16' in op or '.S16' in op) else
             1 if ('.U8' in op or '.S8' in op) else 4)
    m = re.match(r'R(\d+)', rest)
    if not m:
        return None
    d = int(m.group(1))
    return width, set(range(d, d + max(1, width // 4)))


def all_loops(ins, labels):
    """(first, last) instruction indices of every loop: a branch back to an earlier address."""
    addr_index = {a: i for i, (a, _, _, _) in enumerate(ins)}
    out = []
    for i, (a, op, rest, _) in enumerate(ins):
        if not op.startswith('BRA'):
            continue
        t = None
        m = re.search(r'0x([0-9a-f]+)', rest)
        if m:
            t = int(m.group(1), 16)
        m = re.search(r'`\((\.L_x_\d+)\)', rest)
        if m and m.group(1) in labels and labels[m.group(1)] and labels[m.group(1)][2] == id(ins):
            j = labels[m.group(1)][1]
            t = ins[j][0] if j < len(ins) else None
        if t is not None and t <= a and t in addr_index:
            out.append((addr_index[t], i))
    return out


def inner_loops(ins, labels):
    """The innermost loops."""
    out = all_loops(ins, labels)
    return [l for l in out if not any(o != l and o[0] >= l[0] and o[1] <= l[1] for o in out)]


def stream_lines(src):
    """{(file, line): function} of the bodies of the functions of the CUDA backend's *.cu and *.cuh."""
    out = {}
    d = cuda_dir(src)
    for f in os.listdir(d):
        if not f.endswith(('.cu', '.cuh')):
            continue
        lines = open(os.path.join(d, f)).read().split('\n')
        for i, l in enumerate(lines):
            l = re.sub(r'__launch_bounds__\s*\([^)]*\)', '', l)
            m = re.match(r'(?:template\s*<[^>]*>\s*)?(?:static\s+)?(?:__\w+__\s+)+(?:__launch_bounds__\s*\([^)]*\)\s*)?'
                         r'[\w:<>, *]*?\b(\w+)\s*\(', l.strip())
            if not m or l.rstrip().endswith(';'):
                continue
            depth, started = 0, False
            for j in range(i, len(lines)):
                out[(f, j + 1)] = m.group(1)
                depth += lines[j].count('{') - lines[j].count('}')
                started = started or '{' in lines[j]
                if started and depth <= 0:
                    break
    return out


def analyse_loop(body, funcs, inner=(), trips=1):
    """A loop body's global data loads: (bytes per thread in flight of the streamed data, [(function,
    bytes, streamed, times per iteration)] of every data load of an iteration). Loads inside the
    inner loops (index ranges of body) count trips times per iteration."""
    loads = {}
    for i, (_, op, rest, where) in enumerate(body):
        li = load_info(op, rest)
        if li:
            fn = funcs.get(where)
            loads[i] = li + (fn, fn in STREAM_FUNCS)
    # a function with 16-byte loads here: its narrower loads are its unaligned path, not taken with
    # aligned operands
    wide = {loads[i][2] for i in loads if loads[i][0] == 16}
    loads = {i: l for i, l in loads.items() if l[0] == 16 or l[2] not in wide}
    data = {}
    for i, (w, rs, fn, st) in loads.items():
        data[i] = True
        for j in range(i + 1, len(body)):
            _, op2, rest2, _ = body[j]
            if regs_of(rest2) & rs:
                addr = ''.join(re.findall(r'\[[^\]]*\]', rest2))
                if regs_of(addr) & rs or op2.startswith(('ISETP', 'LEA')):
                    data[i] = False
                break
    pend, best = [], 0
    for i, (_, op, rest, _) in enumerate(body):
        used = regs_of(rest)
        hit = [k for k, (j, rs, w) in enumerate(pend) if rs & used]
        if hit:
            best = max(best, sum(w for j, rs, w in pend if data[j] and loads[j][3]))
            pend = pend[max(hit) + 1:]
        if i in loads:
            pend.append((i, loads[i][1], loads[i][0]))
    if pend:
        best = max(best, sum(w for j, rs, w in pend if data[j] and loads[j][3]))
    mult = lambda i: trips if any(lo <= i <= hi for lo, hi in inner) else 1
    return best, [(loads[i][2], loads[i][0], loads[i][3], mult(i)) for i in sorted(loads) if data[i]]


def kernel_loops(ins, labels, funcs, trips=1):
    """[(bytes in flight, loads)] of the streaming loops of a kernel: the loops that hold a streamed
    load and no inner loop that holds one (an inner loop without, e.g. a staged step's decoding, is
    walked with the rest, its loads counted trips times for the L1)."""
    def streams(lo, hi):
        return any(load_info(op, rest) and funcs.get(w) in STREAM_FUNCS for _, op, rest, w in ins[lo:hi + 1])
    loops = [l for l in all_loops(ins, labels) if streams(*l)]
    out = []
    for lo, hi in loops:
        if any(o != (lo, hi) and o[0] >= lo and o[1] <= hi for o in loops):
            continue
        inner = [(a - lo, b - lo) for a, b in all_loops(ins, labels) if (a, b) != (lo, hi) and a >= lo and b <= hi]
        b, loads = analyse_loop(ins[lo:hi + 1], funcs, inner, trips)
        if any(l[2] for l in loads):
            out.append((b, loads))
    return out


def all_data_loops(ins, labels, funcs):
    out = []
    for lo, hi in inner_loops(ins, labels):
        b, loads = analyse_loop(ins[lo:hi + 1], funcs)
        if loads:
            out.append((sum(l[1] for l in loads), loads))  # no streamed loads: every data load counts
    return out


def l1_cap(dev, loads, ty):
    """Share of the bandwidth the L1 can feed at one 128-byte line (wavefront) per clock per SM,
    for a loop of these loads: lines a warp's load touches = the span of its 32 lanes' addresses
    over 128 bytes, with lane strides of LANE_STRIDE (the rest coalesced)."""
    streamed = sum(w * n for _, w, st, n in loads if st) * 32
    if not streamed:
        return 1.0
    lines = 0
    for fn, w, st, n in loads:
        stride = LANE_STRIDE.get(fn, lambda t, w: w)(ty, w)
        lines += n * max(1, math.ceil((31 * stride + w) / 128))
    return min(1.0, streamed / lines * dev['clock_ghz'] * 1e9 * dev['sms'] / (dev['gbps'] * 1e9))


# ---- the model ----

def blocks_per_sm(dev, threads, regs, smem):
    warps = (threads + 31) // 32
    regs_warp = (regs * 32 + 255) // 256 * 256
    by_regs = (dev['regs'] // regs_warp) // warps if regs_warp else dev['blocks']
    by_smem = dev['smem'] // (smem + dev['smem_reserved'])
    return max(0, min(dev['blocks'], dev['threads'] // threads, by_regs, by_smem))


def kernel_time(dev, grid, threads, in_flight, nbytes, per_sm):
    """Seconds to move nbytes with grid blocks of threads, in_flight bytes per thread (per phase:
    a list, each phase an equal share of the bytes)."""
    wave = dev['sms'] * per_sm
    bw = dev['gbps'] * 1e9
    lat = dev['latency_ns'] * 1e-9
    per_block = nbytes / grid
    t = 0.0
    left = grid
    while left > 0:
        a = min(left, wave)
        for b, cap in in_flight:
            rate = min(bw * cap * min(1.0, a / dev['sms']), a * threads * b / lat) if b > 0 else 1e-30
            t += a * per_block / len(in_flight) / rate
        left -= a
    return t


def matvec_shapes(src_text):
    """Launch geometry of the matvec in this source: (threads per block, rows per block)."""
    warps = int(re.search(r'#define\s+WARPS\s+(\d+)', src_text).group(1))
    m = re.search(r'#define\s+MATVEC_ROWS_PER_WARP\s+(\d+)', src_text)
    return warps * 32, warps * (int(m.group(1)) if m else 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('build')
    ap.add_argument('--rev', help='git revision whose cuda/ to analyse (default: the working tree)')
    ap.add_argument('--json', help='write the rows here')
    ap.add_argument('--keep', help='folder to keep compiled SASS in and reuse it from (keyed by the sources)')
    args = ap.parse_args()
    nvcc = os.environ.get('NVCC') or shutil.which('nvcc') or '/usr/local/cuda/bin/nvcc'
    if not os.path.exists(nvcc) or not tool('nvdisasm'):
        print('roofline: no nvcc or nvdisasm (pip install nvidia-cuda-nvdisasm): skipped')
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        src = sources(args.rev, tmp)
        incs = include_dirs(src, os.path.abspath(args.build))
        lines = stream_lines(src)
        mv_text = open(os.path.join(cuda_dir(src), 'kernels-matvec.cu')).read()
        attn_text = open(os.path.join(cuda_dir(src), 'kernels-attention.cu')).read()
        mv_threads, mv_rows = matvec_shapes(mv_text)
        m = re.search(r'#define\s+STEP_ELEMS\s+(\d+)', mv_text)
        trips = int(m.group(1)) // 128 if m else 1  # a staged step's decoding: 4 elements a lane
        attn_threads = int(re.search(r'#define\s+ATTN_THREADS\s+(\d+)', attn_text).group(1))
        kern = {}  # (arch, demangled prefix) -> {regs, smem, loops, any}
        for dev in DEVICES:
            arch = dev['arch']
            for unit in ('kernels-matvec.cu', 'kernels-attention.cu'):
                res, sass = compile_unit(nvcc, src, unit, arch, incs, tmp, args.keep)
                funcs, labels = parse_sass(sass)
                names = list(funcs)
                dem = subprocess.run(['c++filt'], input='\n'.join(names), capture_output=True, text=True,
                                     check=True).stdout.split('\n')
                for mangled, pretty in zip(names, dem):
                    ins = funcs[mangled]
                    kern[(arch, pretty)] = {'regs': res.get(mangled, {}).get('regs', 0),
                                            'smem': res.get(mangled, {}).get('smem', 0),
                                            'loops': kernel_loops(ins, labels, lines, trips if 'staged' in pretty else 1),
                                            'any': all_data_loops(ins, labels, lines)}

        def find(arch, prefix):
            for (a, p), v in kern.items():
                if a == arch and p.startswith(prefix):
                    return p, v
            return None, None

        print('roofline: sources %s; predicted fraction of memory bandwidth per kernel and shape' % (
        args.rev or 'working tree'))
        for (a, p), v in sorted(kern.items()):
            if a != '90':
                continue
            print('  sm_%s %-58s regs %3d smem %5d  streaming loops (bytes in flight / per iteration): %s' % (
                a, p[:58], v['regs'], v['smem'], ' '.join('%d/%d' % (l[0], sum(x[1] * x[3] for x in l[1] if x[2])) for l in v['loops']) or '-'))

        # ---- matvec: Llama2-7B's decode shapes, m = 1 ----
        mv_shapes = [('wq 4096x4096', 4096, 4096), ('w_gate 11008x4096', 11008, 4096), ('w_down 4096x11008', 4096, 11008),
                     ('output 32000x4096', 32000, 4096)]
        for ty in ['f32', 'f16', 'bf16', 'q8_0', 'q4_0', 'q4_1', 'q5_0', 'q5_1', 'q4_k', 'q6_k']:
            for label, n, k in mv_shapes:
                for dev in DEVICES:
                    p, v = find(dev['arch'], 'void k_matvec_staged<%d, 1>' % DTYPES[ty])  # W 16-byte aligned
                    if not v:
                        p, v = find(dev['arch'], 'void k_matvec<%d, 1>' % DTYPES[ty])
                    if not v or not v['loops']:
                        continue
                    best = max(v['loops'], key=lambda l: l[0])  # the fastest path (aligned rows)
                    b, cap = best[0], l1_cap(dev, best[1], ty)
                    grid = (n + mv_rows - 1) // mv_rows
                    per_sm = blocks_per_sm(dev, mv_threads, v['regs'], v['smem'])
                    nbytes = n * k * ELEM_BYTES[ty]
                    t = kernel_time(dev, grid, mv_threads, [(b, cap)], nbytes, per_sm)
                    rows.append({'kernel': 'matvec', 'type': ty, 'shape': label, 'm': 1, 'device': dev['name'],
                                 'bytes_in_flight': b, 'l1_cap': cap, 'threads': mv_threads, 'grid': grid, 'blocks_per_sm': per_sm,
                                 'wave': per_sm * dev['sms'], 'regs': v['regs'],
                                 'fraction': nbytes / (t * dev['gbps'] * 1e9)})

        # ---- decode attention: Llama2-7B (32 heads, 32 KV heads) and Llama-3-8B (32 / 8), head_dim 128 ----
        for kvt in ['f16', 'q8_0', 'q4_0']:
            for model, n_head, n_kv in [('llama2-7b', 32, 32), ('llama3-8b', 32, 8)]:
                for keys in [4096, 32768, 131072]:
                    for m in [1, 17]:
                        for dev in DEVICES:
                            r = attention_row(dev, kvt, model, n_head, n_kv, 128, keys, m, attn_threads,
                                              lambda pre: find(dev['arch'], pre))
                            if r:
                                rows.append(r)
    print('%-6s %-5s %-18s %3s %-9s %6s %5s %6s %6s %4s %4s %8s' % ('kernel', 'type', 'shape', 'm', 'device', 'inflt',
                                                                      'L1cap', 'grid', 'wave', 'regs', 'thr', 'fraction'))
    for r in rows:
        print('%-6s %-5s %-18s %3d %-9s %5dB %5.2f %6d %6d %4d %4d %8.2f' % (
            r['kernel'], r['type'], r['shape'], r['m'], r['device'], r['bytes_in_flight'], r['l1_cap'], r['grid'],
            r['wave'], r['regs'], r['threads'], r['fraction']))
    print('roofline: fraction = predicted share of the memory bandwidth (Little\'s law: bytes in flight per thread '
          'from the SASS x resident threads / latency; %s)' % '; '.join(
              '%s %.0f GB/s, %d SMs, %.0f ns' % (d['name'], d['gbps'], d['sms'], d['latency_ns']) for d in DEVICES))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'rev': args.rev or 'working tree', 'devices': DEVICES, 'rows': rows}, f, indent=1)
    return 0


def attention_row(dev, kvt, model, n_head, n_kv, hd, keys, m, threads, find):
    """Predicted fraction of decode attention over keys x n_kv rows of kvt, m queries: its partial
    kernel over the chunks and the combine over the partials, as cuda-backend.cu launches them: one
    block per (chunk, query), chunks of 256 keys halved while the grid would not fill the GPU twice
    (down to 16), every query's block reading its chunk's rows. The fraction is of the ideal: the
    keys and values read once for all the queries, over the predicted time."""
    g = n_head // n_kv
    p, v = find('void k_attn_partial<%d>' % KV_KIND[kvt])
    pc, vc = find('k_attn_combine')
    if not v or not v['loops'] or not vc:
        return None
    row_bytes = hd * ELEM_BYTES[kvt]
    kv_bytes = 2 * keys * n_kv * row_bytes  # keys and values, read once: the ideal
    C = 256
    while True:
        n_chunks = n_kv * ((keys + C - 1) // C)
        if C <= 16 or n_chunks * m >= 2 * dev['sms']:
            break
        C //= 2
    grid, reads = n_chunks * m, m  # every query's block reads its chunk's rows again
    smem_dyn = 4 * g * hd + 4 * g * C + 17 * C
    per_sm = blocks_per_sm(dev, threads, v['regs'], v['smem'] + smem_dyn)
    phases = [(l[0], l1_cap(dev, l[1], kvt)) for l in v['loops']]
    t1 = kernel_time(dev, grid, threads, phases, kv_bytes * reads, per_sm)
    # combine: reads the partials (n_chunks x m x g x (hd + 2) floats)
    part = 4.0 * n_chunks * m * g * (hd + 2)
    cgrid, cthreads = m * n_head, threads
    cb = max([l[0] for l in vc['any']] or [4])
    cper = blocks_per_sm(dev, cthreads, vc['regs'], vc['smem'])
    t2 = kernel_time(dev, cgrid, cthreads, [(cb, 1.0)], part, cper)
    return {'kernel': 'attn', 'type': kvt, 'shape': '%s %dK' % (model, keys // 1024), 'm': m, 'device': dev['name'],
            'bytes_in_flight': min(b for b, _ in phases), 'l1_cap': min(c for _, c in phases), 'threads': threads, 'grid': grid, 'blocks_per_sm': per_sm,
            'wave': per_sm * dev['sms'], 'regs': v['regs'], 'chunk': C, 'combine_grid': cgrid,
            'combine_fraction_of_time': t2 / (t1 + t2), 'fraction': kv_bytes / ((t1 + t2) * dev['gbps'] * 1e9)}


if __name__ == '__main__':
    sys.exit(main())
