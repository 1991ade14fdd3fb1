#!/usr/bin/env python3
"""Self-consistency checks of llama_ref.py on a model written by tri-gen-model.

usage: check_llama_ref.py HF_DIR [GGUF]

transformers itself is not available here (it needs PyTorch), so llama_ref.py is checked by
properties that any correct Llama forward pass has, and its rope tables against the formulas as
the YaRN paper and Meta's Llama 3.1 code state them:
  - the logits of a whole prompt equal those of decoding it one token at a time with a KV cache,
    and a prefix's logits equal the first rows of the whole prompt's (causality);
  - grouped-query attention equals multi-head attention with each KV head's weights repeated;
  - rope on the HF (rotate_half) layout equals rope on llama.cpp's adjacent-pair layout applied to
    the GGUF file's permuted Q/K weights (when GGUF is given);
  - rope frequencies: linear, dynamic NTK, YaRN and Llama 3.1 against their published formulas;
  - the logits are well conditioned (neither flat nor one-hot).
Exits 0 when all hold, 1 with a line per failure.
"""
import copy
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llama_ref  # noqa: E402

errors = []


def check(ok, msg):
    if not ok:
        errors.append(msg)


def close(a, b, tol=1e-9):
    return np.max(np.abs(np.asarray(a) - np.asarray(b))) <= tol * max(1.0, float(np.max(np.abs(b))))


def check_incremental(m, prompt):
    full = m.forward(prompt)
    cache = m.new_cache()
    rows = [m.forward([t], i, cache)[0] for i, t in enumerate(prompt)]
    check(close(np.stack(rows), full), "prompt logits differ from token-by-token decoding with the cache")
    # a prompt in two chunks, as a runtime prefills in pieces
    cache = m.new_cache()
    k = len(prompt) // 3
    two = np.concatenate([m.forward(prompt[:k], 0, cache), m.forward(prompt[k:], k, cache)])
    check(close(two, full), "prompt logits differ when prefilled in two chunks")
    check(close(m.forward(prompt[:5]), full[:5]), "a prefix's logits differ from the first rows (not causal)")
    return full


def check_gqa(m, prompt, full):
    if m.n_head_kv == m.n_head:
        return
    mha = copy.copy(m)
    mha.w = dict(m.w)
    rep, hd = m.n_head // m.n_head_kv, m.head_dim
    for l in range(m.n_layer):
        for n in ("k_proj", "v_proj"):
            key = f"model.layers.{l}.self_attn.{n}.weight"
            w = m.w[key].reshape(m.n_head_kv, hd, -1)
            mha.w[key] = np.repeat(w, rep, axis=0).reshape(m.n_head * hd, -1)
    mha.n_head_kv = m.n_head
    check(close(mha.forward(prompt), full), "GQA logits differ from MHA with repeated KV weights")


def check_rope_layouts(m, gguf_path):
    from gguf import GGUFReader
    from gguf.quants import dequantize
    r = GGUFReader(gguf_path)
    t = {x.name: x for x in r.tensors}
    wq_g = dequantize(t["blk.0.attn_q.weight"].data, t["blk.0.attn_q.weight"].tensor_type).astype(np.float64)
    wq_h = m.w["model.layers.0.self_attn.q_proj.weight"]
    if t["blk.0.attn_q.weight"].tensor_type.name not in ("F32", "F16", "BF16"):
        wq_h = None  # quantized GGUF: HF holds rounded values, compare layouts on HF weights only
    rng = np.random.default_rng(3)
    h = rng.standard_normal(m.w["model.embed_tokens.weight"].shape[1])
    pos = np.array([0, 1, 7, 100])
    inv, scale = llama_ref.rope_inv_freq(m.cfg, 101)
    hd, nh = m.head_dim, m.n_head
    w_hf = m.w["model.layers.0.self_attn.q_proj.weight"]
    # the GGUF row order: each head's rows (2, hd/2) -> (hd/2, 2), as convert_hf_to_gguf permutes
    w_adj = w_hf.reshape(nh, 2, hd // 2, -1).swapaxes(1, 2).reshape(w_hf.shape)
    if wq_h is not None:
        check(np.array_equal(wq_g.reshape(w_adj.shape).astype(np.float32), w_adj.astype(np.float32)),
              "GGUF attn_q rows are not the permuted HF q_proj rows")
    q_half = llama_ref.apply_rope(np.broadcast_to((w_hf @ h).reshape(nh, 1, hd), (nh, len(pos), hd)), pos, inv, scale)
    # llama.cpp's rope (GGML_ROPE_TYPE_NORM): pair (2i, 2i + 1) rotated by angle pos * inv[i]
    x = (w_adj @ h).reshape(nh, 1, hd // 2, 2)
    ang = pos[:, None] * inv[None, :]
    c, s = np.cos(ang)[None, :, :] * scale, np.sin(ang)[None, :, :] * scale
    y0 = x[..., 0] * c - x[..., 1] * s
    y1 = x[..., 0] * s + x[..., 1] * c
    q_adj = np.stack([y0, y1], axis=-1).reshape(nh, len(pos), hd)
    back = q_adj.reshape(nh, len(pos), hd // 2, 2).swapaxes(2, 3).reshape(nh, len(pos), hd)
    check(close(back, q_half, 1e-12), "rotate_half rope on HF rows != adjacent-pair rope on GGUF rows")


def check_rope_formulas(cfg):
    rope_type, rs = llama_ref.rope_parameters(cfg)
    base = cfg["rope_theta"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    theta = np.array([base ** (-2 * i / hd) for i in range(hd // 2)])  # RoFormer's theta_i
    max_pos = cfg["max_position_embeddings"]
    inv, scale = llama_ref.rope_inv_freq(cfg, 10)
    if rope_type == "default":
        check(close(inv, theta, 1e-12) and scale == 1.0, "default rope frequencies")
    elif rope_type == "linear":
        check(close(inv, theta / rs["factor"], 1e-12), "linear rope: theta / factor")
    elif rope_type == "dynamic":
        check(close(inv, theta, 1e-12), "dynamic rope within max_position_embeddings must be the default"
              " (whatever original_max_position_embeddings says)")
        L = 3 * max_pos
        inv_l, _ = llama_ref.rope_inv_freq(cfg, L)
        a = rs["factor"]
        # NTK-aware: base' = base * (a L / L0 - (a - 1)) ^ (d / (d - 2))
        b2 = base * (a * L / max_pos - (a - 1)) ** (hd / (hd - 2))
        check(close(inv_l, [b2 ** (-2 * i / hd) for i in range(hd // 2)], 1e-12), "dynamic NTK base")
        check(inv_l[0] == 1.0 and inv_l[-1] < theta[-1], "dynamic NTK keeps the first and slows the last frequency")
    elif rope_type == "yarn":
        s, L = rs["factor"], rs["original_max_position_embeddings"]
        alpha, beta = rs.get("beta_slow", 1), rs.get("beta_fast", 32)
        # YaRN (arXiv 2309.00071, eq. 17-18): r(d) = L / lambda_d rotations over the original
        # context; r > beta keeps theta_d, r < alpha uses theta_d / s, a ramp between
        r = L * theta / (2 * math.pi)
        check(close(inv[r > beta], theta[r > beta], 1e-12), "yarn: high frequencies must be kept")
        check(close(inv[r < alpha], theta[r < alpha] / s, 1e-12), "yarn: low frequencies must be divided by s")
        mid = (r >= alpha) & (r <= beta)
        check(np.all(inv[mid] <= theta[mid] + 1e-15) and np.all(inv[mid] >= theta[mid] / s - 1e-15),
              "yarn: ramp frequencies must lie between theta / s and theta")
        check(np.all(np.diff(inv / theta) <= 1e-12), "yarn: interpolation must grow towards low frequencies")
        check(abs(scale - (0.1 * math.log(s) + 1)) < 1e-12, "yarn: attention factor 0.1 ln s + 1")
    elif rope_type == "llama3":
        # Meta's llama-models apply_scaling, one frequency at a time
        want = []
        old, lo, hi, f = rs["original_max_position_embeddings"], rs["low_freq_factor"], rs["high_freq_factor"], rs["factor"]
        for fr in theta:
            wl = 2 * math.pi / fr
            if wl < old / hi:
                want.append(fr)
            elif wl > old / lo:
                want.append(fr / f)
            else:
                sm = (old / wl - lo) / (hi - lo)
                want.append((1 - sm) * fr / f + sm * fr)
        check(close(inv, want, 1e-12), "llama3 frequencies differ from Meta's apply_scaling")


def check_conditioning(full):
    last = full[-1]
    p = np.exp(last - last.max())
    p /= p.sum()
    check(0.5 < float(last.std()) < 10, f"last logits std {last.std():.3f}: flat or saturated")
    check(float(p.max()) < 0.99, "the distribution is one-hot")
    check(len(set(np.argmax(full, axis=1).tolist())) > 1, "every position predicts the same token")


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    m = llama_ref.Llama(sys.argv[1])
    rng = np.random.default_rng(11)
    n = min(24, m.cfg["max_position_embeddings"])
    prompt = rng.integers(0, m.embed.shape[0], n).tolist()
    full = check_incremental(m, prompt)
    check_gqa(m, prompt, full)
    check_rope_formulas(m.cfg)
    check_conditioning(full)
    if len(sys.argv) > 2:
        check_rope_layouts(m, sys.argv[2])
    for e in errors:
        print("check_llama_ref: " + e, file=sys.stderr)
    if not errors:
        print(f"check_llama_ref: ok ({llama_ref.rope_parameters(m.cfg)[0]} rope, "
              f"{m.n_head}/{m.n_head_kv} heads, {n} tokens)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
