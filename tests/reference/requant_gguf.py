#!/usr/bin/env python3
"""Requantizes a GGUF model into llama.cpp's Q4_K_M mix (test data for the K-quant loader), or with
--mix iq4_xs into IQ4_XS.

usage: requant_gguf.py [--mix q4_k_m|iq4_xs] IN.gguf OUT.gguf

Every tensor of IN is dequantized with the gguf package, then written to OUT as:
  - 1-D tensors (norms): F32;
  - attn_v and ffn_down of the layers llama.cpp gives more bits (the first and last eighth, and
    every third layer between): Q6_K; the embedding / output matrix: Q6_K; other matrices: Q4_K;
  - where a row is not a whole number of 256-element super-blocks, llama.cpp's fallbacks:
    Q4_K -> Q5_0, Q6_K -> Q8_0.
Metadata (tokenizer included) is copied, general.file_type set to 15 (MOSTLY_Q4_K_M).

--mix iq4_xs: every matrix IQ4_XS, or IQ4_NL (llama.cpp's fallback) where a row is not a whole
number of super-blocks; 1-D tensors F32; general.file_type 30 (MOSTLY_IQ4_XS). Simpler than
llama.cpp's IQ4_XS rules (which give a few tensors more bits): here every matrix takes the type,
to exercise it. The quantizer is written here from the gguf package's dequantizer: per block of 32
the scale that takes the element of largest magnitude to the level -127, the 8 block scales of a
super-block rounded to 6 bits (-32..31) against its f16 scale, each code the nearest of the 16
levels (IQ4_NL: the f16 block scale itself).

The Q4_K and Q6_K quantizers are written here with numpy (the gguf package has none): per group,
a min/max (Q4_K) or absolute-max (Q6_K) scale, the group scales quantized against the super-block
scale, codes rounded to nearest. Simpler than llama.cpp's searches, so a little less accurate:
it is test data; what is tested is that the runtime reads and computes these blocks right. Q5_0
and Q8_0 use gguf.quants.quantize. Each tensor's round trip (gguf's dequantize of what we wrote)
is checked against its input before writing.
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType as QT, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize

QK_K = 256


def f16(a):
    return np.asarray(a, dtype=np.float32).astype(np.float16)


def quant_q4_k(x):
    """x (n, 256) f32 -> (n, 144) uint8 Q4_K blocks."""
    n = x.shape[0]
    g = x.reshape(n, 8, 32)
    lo = np.minimum(g.min(axis=2), 0.0)                      # value = scale * q - minimum
    hi = g.max(axis=2)
    scale = (hi - lo) / 15.0
    mins = -lo
    d = f16(scale.max(axis=1) / 63.0)
    dmin = f16(mins.max(axis=1) / 63.0)
    df, dmf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    with np.errstate(divide='ignore', invalid='ignore'):
        sc = np.where(df > 0, np.rint(scale / df), 0).clip(0, 63).astype(np.uint8)
        mn = np.where(dmf > 0, np.rint(mins / dmf), 0).clip(0, 63).astype(np.uint8)
        eff_s = (df * sc)[:, :, None]
        eff_m = (dmf * mn)[:, :, None]
        q = np.where(eff_s > 0, np.rint((g + eff_m) / eff_s), 0).clip(0, 15).astype(np.uint8)
    out = np.zeros((n, 144), dtype=np.uint8)
    out[:, 0:2] = d.view(np.uint8).reshape(n, 2)
    out[:, 2:4] = dmin.view(np.uint8).reshape(n, 2)
    s = np.zeros((n, 12), dtype=np.uint8)
    s[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    s[:, 4:8] = mn[:, 0:4] | ((mn[:, 4:8] >> 4) << 6)
    s[:, 8:12] = (sc[:, 4:8] & 15) | ((mn[:, 4:8] & 15) << 4)
    out[:, 4:16] = s
    # element 64 j + l: low nibble of qs[32 j + l]; 64 j + 32 + l: its high nibble
    q = q.reshape(n, 4, 2, 32)
    out[:, 16:144] = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(n, 128)
    return out


def quant_q6_k(x):
    """x (n, 256) f32 -> (n, 210) uint8 Q6_K blocks."""
    n = x.shape[0]
    g = x.reshape(n, 16, 16)
    scale = np.abs(g).max(axis=2) / 31.0                     # value = d * sc * (q - 32), q - 32 in -32..31
    d = f16(scale.max(axis=1) / 127.0)
    df = d.astype(np.float32)[:, None]
    with np.errstate(divide='ignore', invalid='ignore'):
        sc = np.where(df > 0, np.rint(scale / df), 0).clip(0, 127).astype(np.int8)
        eff = (df * sc)[:, :, None]
        q = (np.where(eff > 0, np.rint(g / eff), 0).clip(-32, 31) + 32).astype(np.uint8).reshape(n, 256)
    out = np.zeros((n, 210), dtype=np.uint8)
    ql = np.zeros((n, 128), dtype=np.uint8)
    qh = np.zeros((n, 64), dtype=np.uint8)
    for h in range(2):
        for j in range(4):
            v = q[:, 128 * h + 32 * j:128 * h + 32 * j + 32]
            o = 64 * h + 32 * (j % 2)
            ql[:, o:o + 32] |= (v & 15) << (4 * (j // 2))
            qh[:, 32 * h:32 * h + 32] |= (v >> 4) << (2 * j)
    out[:, 0:128] = ql
    out[:, 128:192] = qh
    out[:, 192:208] = sc.view(np.uint8)
    out[:, 208:210] = d.view(np.uint8).reshape(n, 2)
    return out


IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)


def nearest_level(v, scale):
    """Codes 0..15 of v (..., 32) with per-block scales (..., 1): the level nearest v / scale."""
    levels = scale[..., None] * IQ4_LEVELS                       # (..., 1, 16)
    return np.abs(v[..., None] - levels).argmin(axis=-1).astype(np.uint8)


def pack_nibbles(codes):
    """(..., 32) codes -> (..., 16) bytes: element i in the low nibble of byte i, i + 16 in the high."""
    return codes[..., :16] | (codes[..., 16:] << 4)


def block_scale(g):
    """Per block of 32 (last axis), the scale that takes the element of largest magnitude to -127."""
    i = np.abs(g).argmax(axis=-1)
    return np.take_along_axis(g, i[..., None], axis=-1)[..., 0] / -127.0


def quant_iq4_xs(x):
    """x (n, 256) f32 -> (n, 136) uint8 IQ4_XS blocks."""
    n = x.shape[0]
    g = x.reshape(n, 8, 32)
    scale = block_scale(g)
    d = f16(np.abs(scale).max(axis=1) / 31.0)
    df = d.astype(np.float32)[:, None]
    with np.errstate(divide='ignore', invalid='ignore'):
        ls = np.where(df > 0, np.rint(scale / df), 0).clip(-32, 31).astype(np.int32) + 32   # 0..63
    eff = (df * (ls - 32).astype(np.float32))[:, :, None]
    codes = nearest_level(g, eff)
    out = np.zeros((n, 136), dtype=np.uint8)
    out[:, 0:2] = d.view(np.uint8).reshape(n, 2)
    sh = np.zeros(n, dtype=np.uint16)
    for j in range(8):
        sh |= ((ls[:, j] >> 4) << (2 * j)).astype(np.uint16)
    out[:, 2:4] = sh.view(np.uint8).reshape(n, 2)
    lo = (ls & 15).astype(np.uint8)
    out[:, 4:8] = lo[:, 0::2] | (lo[:, 1::2] << 4)
    out[:, 8:136] = pack_nibbles(codes).reshape(n, 128)
    return out


def quant_iq4_nl(x):
    """x (n, 32) f32 -> (n, 18) uint8 IQ4_NL blocks."""
    n = x.shape[0]
    d = f16(block_scale(x))
    codes = nearest_level(x, d.astype(np.float32)[:, None])
    out = np.zeros((n, 18), dtype=np.uint8)
    out[:, 0:2] = d.view(np.uint8).reshape(n, 2)
    out[:, 2:18] = pack_nibbles(codes)
    return out


def encode(x, qt):
    """x (rows, cols) f32 -> (rows, row bytes) uint8 of type qt."""
    rows, cols = x.shape
    if qt == QT.Q4_K:
        return quant_q4_k(x.reshape(-1, QK_K)).reshape(rows, -1)
    if qt == QT.Q6_K:
        return quant_q6_k(x.reshape(-1, QK_K)).reshape(rows, -1)
    if qt in (QT.IQ4_XS, QT.IQ4_NL):
        # a chunk of rows at a time: the nearest-level search holds 16 floats per weight
        fn, bs, bb = (quant_iq4_xs, QK_K, 136) if qt == QT.IQ4_XS else (quant_iq4_nl, 32, 18)
        step = max(1, (1 << 20) // cols)
        parts = [fn(x[r:r + step].reshape(-1, bs)).reshape(-1, cols // bs * bb) for r in range(0, rows, step)]
        return np.concatenate(parts)
    return quantize(x, qt)


def more_bits(layer, n_layer):
    # llama.cpp's use_more_bits: the first and last eighth of the layers, and every third between
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


def choose(name, cols, n_layer, mix):
    if mix == 'iq4_xs':
        return QT.IQ4_XS if cols % QK_K == 0 else QT.IQ4_NL
    want = QT.Q4_K
    if name in ('token_embd.weight', 'output.weight'):
        want = QT.Q6_K
    elif name.endswith('attn_v.weight') or name.endswith('ffn_down.weight'):
        layer = int(name.split('.')[1])
        if more_bits(layer, n_layer):
            want = QT.Q6_K
    if cols % QK_K:
        want = {QT.Q4_K: QT.Q5_0, QT.Q6_K: QT.Q8_0}[want]
    return want


def field_value(field):
    t = field.types[0]
    if t == GGUFValueType.ARRAY:
        sub = field.types[1] if len(field.types) > 1 else None
        if sub == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode('utf-8') for i in field.data], sub
        return [field.parts[i].tolist()[0] for i in field.data], sub
    if t == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode('utf-8'), None
    return field.parts[field.data[0]].tolist()[0], None


def main():
    args = sys.argv[1:]
    mix = 'q4_k_m'
    if len(args) == 4 and args[0] == '--mix' and args[1] in ('q4_k_m', 'iq4_xs'):
        mix, args = args[1], args[2:]
    if len(args) != 2:
        sys.exit('usage: requant_gguf.py [--mix q4_k_m|iq4_xs] IN.gguf OUT.gguf')
    src, dst = args
    r = GGUFReader(src)
    arch = bytes(r.fields['general.architecture'].parts[r.fields['general.architecture'].data[0]]).decode()
    n_layer = int(r.fields[f'{arch}.block_count'].parts[r.fields[f'{arch}.block_count'].data[0]][0])
    w = GGUFWriter(dst, arch)
    for name, field in r.fields.items():
        if name.startswith('GGUF.') or name == 'general.architecture':
            continue
        val, sub = field_value(field)
        if name == 'general.file_type':
            val = 15 if mix == 'q4_k_m' else 30  # LLAMA_FTYPE_MOSTLY_Q4_K_M, _IQ4_XS
        w.add_key_value(name, val, field.types[0], sub_type=sub)
    counts = {}
    for t in r.tensors:
        shape = [int(v) for v in reversed(t.shape.tolist())]  # numpy order: (rows, cols)
        x = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        if x.ndim == 1:
            w.add_tensor(t.name, x)
            counts['f32'] = counts.get('f32', 0) + 1
            continue
        qt = choose(t.name, shape[-1], n_layer, mix)
        data = encode(x, qt)
        back = dequantize(data, qt).reshape(shape)
        rel = np.sqrt(np.mean((back - x) ** 2) / max(np.mean(x ** 2), 1e-30))
        limit = {QT.Q4_K: 0.15, QT.Q5_0: 0.08, QT.Q6_K: 0.05, QT.Q8_0: 0.01, QT.IQ4_XS: 0.15,
                 QT.IQ4_NL: 0.15}[qt]
        assert rel < limit, f'{t.name}: {qt.name} round trip relative RMS error {rel:.3f} >= {limit}'
        w.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=qt)
        counts[qt.name] = counts.get(qt.name, 0) + 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(' '.join(f'{k} {v}' for k, v in sorted(counts.items())))


if __name__ == '__main__':
    main()
