#!/usr/bin/env python3
"""Independent reference forward pass of a Llama HF checkpoint, in numpy float64.

Written to follow transformers' LlamaForCausalLM (modeling_llama.py and modeling_rope_utils.py as
of transformers 5): rotate_half rope on the HF row layout, rope init for default, linear, dynamic
(NTK), yarn and llama3 scaling, grouped-query attention by repeating each KV head over its group
of query heads, RMSNorm, SiLU-gated MLP, causal softmax attention, tied embeddings. Everything is
computed in float64 from the stored weights (HF computes in the checkpoint dtype with f32 norms,
softmax and rope tables); the result is the exact function the weights define, which a runtime
computing in f32 should approach within its rounding.

usage:
  llama_ref.py --model DIR --tokens 1,2,3 [--out logits.bin] [--greedy N]
  llama_ref.py --model DIR --text "the cat" ...   (tokenized with DIR/tokenizer.json)

--out writes float32 little-endian logits of shape (n_tokens, n_vocab), one row per position.
--greedy N prints N greedily generated ids after the prompt, comma-separated, decoding one token
at a time with a KV cache (as transformers' generate does). --kv-quant q8_0|q4_0 makes that cache
(and the prompt pass's) hold GGML-quantized rows, quantized by the gguf package: the model of a
quantized KV cache. --kv-mixed S,W models kv_type mixed: every row in q4_0 (as --kv-quant q4_0) and
also in f16; a query at position p reads the f16 rows of positions below S (the sinks) and from
p - W on (the recent window, itself included), the q4_0 rows between, whatever pass it is in.
--kv-mixed S,W,N also keeps up to N heavy hitters per layer and KV head in f16 (heavy_attention).
--batch B runs the prompt in passes of B tokens (as a runtime's n_batch), which changes nothing but
the order of the work.

Also importable: Llama(dir).forward(tokens, start_pos, cache) for tests, or
Llama(cfg=config_dict, weights=arrays) for weights converted in memory.
"""
import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

# ---- weights ----

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}


def _read_safetensors(path):
    """name -> float64 array. Parses the format directly (numpy has no bfloat16)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        dt = info["dtype"]
        if dt not in _ST_DTYPES:
            raise ValueError(f"{path}: {name}: dtype {dt} not supported")
        arr = np.frombuffer(data[b:e], dtype=np.dtype(_ST_DTYPES[dt]).newbyteorder("<"))
        if dt == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = arr.astype(np.float64).reshape(info["shape"])
    return out


def load_weights(model_dir):
    d = Path(model_dir)
    index = d / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    w = {}
    for f in files:
        w.update(_read_safetensors(d / f))
    return w


# ---- rope (modeling_rope_utils) ----

def _default_inv_freq(base, dim):
    return 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)


def rope_parameters(cfg):
    """(rope_type, params dict) from a config's rope_scaling / rope_parameters."""
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    rope_type = rs.get("rope_type", rs.get("type")) or "default"
    return rope_type, rs


def rope_inv_freq(cfg, seq_len=None):
    """(inv_freq (head_dim/2,) float64, attention_scaling) for a sequence of seq_len positions.

    seq_len only matters for dynamic NTK, whose base grows once the sequence passes
    max_position_embeddings (transformers' dynamic_rope_update, evaluated per forward call).
    """
    rope_type, rs = rope_parameters(cfg)
    base = cfg.get("rope_theta") or rs.get("rope_theta") or 10000.0
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    dim = int(head_dim * (rs.get("partial_rotary_factor") or cfg.get("partial_rotary_factor") or 1.0))
    max_pos = cfg["max_position_embeddings"]

    if rope_type == "default":
        return _default_inv_freq(base, dim), 1.0
    if rope_type == "linear":
        return _default_inv_freq(base, dim) / rs["factor"], 1.0
    if rope_type == "dynamic":
        # transformers scales from max_position_embeddings and ignores original_max_position_embeddings
        # (in rope_scaling or top level): _compute_dynamic_ntk_parameters reads
        # config.max_position_embeddings, and so does the rotary embedding's original_max_seq_len
        factor = rs["factor"]
        s = max(seq_len or max_pos, max_pos)
        if s > max_pos:
            base = base * ((factor * s / max_pos) - (factor - 1)) ** (dim / (dim - 2))
        return _default_inv_freq(base, dim), 1.0
    if rope_type == "yarn":
        factor = rs.get("factor")
        orig = rs.get("original_max_position_embeddings") or max_pos
        if factor is None:
            factor = max_pos / orig

        def get_mscale(scale, mscale=1.0):
            return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

        attn = rs.get("attention_factor")
        if attn is None:
            if rs.get("mscale") and rs.get("mscale_all_dim"):
                attn = get_mscale(factor, rs["mscale"]) / get_mscale(factor, rs["mscale_all_dim"])
            else:
                attn = get_mscale(factor)
        beta_fast = rs.get("beta_fast") or 32
        beta_slow = rs.get("beta_slow") or 1

        def correction_dim(n_rot):
            # the dimension whose wavelength makes n_rot turns over the original context
            return dim * math.log(orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if rs.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extrap = 1 - ramp  # 1: keep the original frequency (high frequencies), 0: interpolate
        pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
        inv = (1.0 / (factor * pos_freqs)) * (1 - extrap) + (1.0 / pos_freqs) * extrap
        return inv, attn
    if rope_type == "llama3":
        inv = _default_inv_freq(base, dim)
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        return np.where(medium, smoothed, scaled), 1.0
    raise ValueError(f"rope type {rope_type!r} not supported")


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def apply_rope(x, positions, inv_freq, scaling):
    """x: (n_heads, T, head_dim); positions: (T,). HF layout: element i pairs with i + head_dim/2."""
    freqs = np.outer(positions.astype(np.float64), inv_freq)  # (T, head_dim/2)
    emb = np.concatenate([freqs, freqs], axis=-1)             # (T, head_dim)
    cos, sin = np.cos(emb) * scaling, np.sin(emb) * scaling
    return x * cos + rotate_half(x) * sin


# ---- the model ----

class Llama:
    def __init__(self, model_dir=None, *, cfg=None, weights=None, kv_quant=None, kv_quant_order="hf",
                 kv_mixed=None):
        """From an HF directory, or from a config.json dict and HF-named float64 arrays (rows in the
        HF layout) already in memory, e.g. converted from another format. kv_quant "q8_0" or "q4_0":
        every key (after rope) and value row entering the cache is rounded to float32, quantized
        in blocks of 32 of its head_dim and dequantized by gguf.quants (a quantized KV cache).
        Blocks follow the order a runtime stores a key's elements in: kv_quant_order "hf" (rope's
        halves, as here) or "gguf" (llama.cpp's permuted rows: rope pairs adjacent, so element 2i
        is HF's i and 2i + 1 is i + head_dim / 2); with head_dim over 32 the two differ."""
        self.kv_quant = kv_quant
        self.kv_mixed = kv_mixed  # (sinks, window): full rows rounded to f16 there, kv_quant elsewhere
        if kv_mixed:
            self.kv_quant = "q4_0"
        self.kv_quant_order = kv_quant_order
        if model_dir is not None:
            cfg = json.loads((Path(model_dir) / "config.json").read_text())
            weights = load_weights(model_dir)
        if cfg is None or weights is None:
            raise ValueError("give model_dir, or both cfg and weights")
        self.cfg = cfg
        c = self.cfg
        self.n_layer = c["num_hidden_layers"]
        self.n_head = c["num_attention_heads"]
        self.n_head_kv = c.get("num_key_value_heads") or self.n_head
        self.head_dim = c.get("head_dim") or c["hidden_size"] // self.n_head
        self.eps = c["rms_norm_eps"]
        self.w = weights
        self.embed = self.w["model.embed_tokens.weight"]  # (n_vocab, n_embd)
        tied = c.get("tie_word_embeddings", False)
        self.lm_head = self.embed if tied or "lm_head.weight" not in self.w else self.w["lm_head.weight"]
        if c.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {c['hidden_act']} not supported")
        if c.get("attention_bias") or c.get("mlp_bias"):
            raise ValueError("attention/mlp biases not supported")

    def new_cache(self):
        """Per layer [K, V], each (n_head_kv, positions so far, head_dim), keys after rope."""
        z = np.zeros((self.n_head_kv, 0, self.head_dim))
        return [[z, z] for _ in range(self.n_layer)]

    def round_kv(self, x, pairs=False):
        """x (heads, T, head_dim) through the cache type self.kv_quant (gguf.quants' blocks), its
        elements in GGUF's adjacent-pair order while quantized if pairs."""
        from gguf import GGMLQuantizationType as QT
        from gguf.quants import dequantize, quantize
        qt = {"q8_0": QT.Q8_0, "q4_0": QT.Q4_0}[self.kv_quant]
        if x.shape[-1] % 32:
            raise ValueError(f"kv_quant {self.kv_quant}: head_dim {x.shape[-1]} is not whole blocks of 32")
        hd = x.shape[-1]
        if pairs:  # (.., halves, hd / 2) -> (.., hd / 2, halves): HF i and i + hd / 2 side by side
            x = x.reshape(x.shape[:-1] + (2, hd // 2)).swapaxes(-1, -2).reshape(x.shape)
        blocks = quantize(np.ascontiguousarray(x, dtype=np.float32), qt)
        y = dequantize(blocks, qt).reshape(x.shape).astype(np.float64)
        if pairs:
            y = y.reshape(x.shape[:-1] + (hd // 2, 2)).swapaxes(-1, -2).reshape(x.shape)
        return y

    def rms_norm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def forward(self, tokens, start_pos=0, cache=None):
        """Logits (T, n_vocab) float64 of tokens at positions start_pos.., appending to cache."""
        if cache is None:
            cache = self.new_cache()
        if self.kv_mixed and len(cache[0]) == 2:  # the f16 rows beside the quantized ones
            for c in cache:
                c.extend([c[0], c[1]])
        tokens = np.asarray(tokens, dtype=np.int64)
        T = len(tokens)
        pos = np.arange(start_pos, start_pos + T)
        inv_freq, rope_scale = rope_inv_freq(self.cfg, int(pos.max()) + 1)
        hd, nh, nkv = self.head_dim, self.n_head, self.n_head_kv
        x = self.embed[tokens]  # (T, n_embd)
        # query t (position start_pos + t) sees key positions <= start_pos + t
        mask = np.arange(start_pos + T)[None, :] > pos[:, None]  # (T, S)
        for l in range(self.n_layer):
            p = f"model.layers.{l}."
            h = self.rms_norm(x, self.w[p + "input_layernorm.weight"])
            q = (h @ self.w[p + "self_attn.q_proj.weight"].T).reshape(T, nh, hd).transpose(1, 0, 2)
            k = (h @ self.w[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, hd).transpose(1, 0, 2)
            v = (h @ self.w[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, hd).transpose(1, 0, 2)
            q = apply_rope(q, pos, inv_freq, rope_scale)
            k = apply_rope(k, pos, inv_freq, rope_scale)
            if self.kv_mixed:
                f16 = lambda a: a.astype(np.float32).astype(np.float16).astype(np.float64)
                cache[l][2] = np.concatenate([cache[l][2], f16(k)], axis=1)
                cache[l][3] = np.concatenate([cache[l][3], f16(v)], axis=1)
            if self.kv_quant:
                k, v = self.round_kv(k, self.kv_quant_order == "gguf"), self.round_kv(v)
            cache[l][0] = np.concatenate([cache[l][0], k], axis=1)
            cache[l][1] = np.concatenate([cache[l][1], v], axis=1)
            Kc, Vc = cache[l][0], cache[l][1]
            # repeat_kv: KV head j serves query heads j * n_rep .. (j + 1) * n_rep - 1
            rep = lambda a: np.repeat(a, nh // nkv, axis=0)  # (nkv, S, hd) -> (nh, S, hd)
            s = q @ rep(Kc).transpose(0, 2, 1) / math.sqrt(hd)    # (nh, T, S)
            if self.kv_mixed:  # query t reads f16 rows of the sinks and from its position - W on
                sinks, window = self.kv_mixed[:2]
                kp = np.arange(Kc.shape[1])
                full = (kp[None, :] < sinks) | (kp[None, :] >= pos[:, None] - window)  # (T, S)
                s = np.where(full[None], q @ rep(cache[l][2]).transpose(0, 2, 1) / math.sqrt(hd), s)
            if self.kv_mixed and len(self.kv_mixed) > 2 and self.kv_mixed[2] > 0:
                a = self.heavy_attention(cache[l], q, pos, mask)
                a = a.transpose(1, 0, 2).reshape(T, nh * hd)
                x = x + a @ self.w[p + "self_attn.o_proj.weight"].T
                h = self.rms_norm(x, self.w[p + "post_attention_layernorm.weight"])
                g = h @ self.w[p + "mlp.gate_proj.weight"].T
                u = h @ self.w[p + "mlp.up_proj.weight"].T
                x = x + (g / (1 + np.exp(-g)) * u) @ self.w[p + "mlp.down_proj.weight"].T
                continue
            s = np.where(mask[None], -np.inf, s)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            if self.kv_mixed:
                a = np.where(full[None], 0, s) @ rep(Vc) + np.where(full[None], s, 0) @ rep(cache[l][3])
            else:
                a = s @ rep(Vc)
            a = a.transpose(1, 0, 2).reshape(T, nh * hd)
            x = x + a @ self.w[p + "self_attn.o_proj.weight"].T
            h = self.rms_norm(x, self.w[p + "post_attention_layernorm.weight"])
            g = h @ self.w[p + "mlp.gate_proj.weight"].T
            u = h @ self.w[p + "mlp.up_proj.weight"].T
            x = x + (g / (1 + np.exp(-g)) * u) @ self.w[p + "mlp.down_proj.weight"].T
        x = self.rms_norm(x, self.w["model.norm.weight"])
        return x @ self.lm_head.T

    def heavy_attention(self, c, q, pos, mask):
        """kv_mixed (S, W, N): the attention (nh, T, hd) of queries q (nh, T, hd) at positions pos, one
        after the other, over the layer's cache c = [Kq, Vq, Kf, Vf, state]. Per KV head, up to N
        positions past the window stay in f16 too (MiKV's heavy hitters): when a query at p moves the
        window's start to lo = max(p - W, S), each position j that leaves it (ascending) joins the
        head's pool while it has room, else replaces the pool's lowest score (the first slot of the
        lowest) when its own score is higher; a position that leaves the pool, or never joins it,
        reads q4_0 from then on. A position's score is the attention it received so far (H2O),
        summed over the queries and the KV head's query heads."""
        sinks, window, heavy = self.kv_mixed
        nh, nkv, hd = self.n_head, self.n_head_kv, self.head_dim
        g = nh // nkv
        Kq, Vq, Kf, Vf = c[0], c[1], c[2], c[3]
        S = Kq.shape[1]
        if len(c) == 4:
            c.append({"score": np.zeros((nkv, 0)), "pool": [[] for _ in range(nkv)], "lo_done": sinks})
        st = c[4]
        if st["score"].shape[1] < S:
            st["score"] = np.concatenate([st["score"], np.zeros((nkv, S - st["score"].shape[1]))], axis=1)
        score, pool = st["score"], st["pool"]
        out = np.zeros((nh, len(pos), hd))
        kp = np.arange(S)
        for t, p in enumerate(pos):
            lo = max(int(p) - window, sinks)
            for j in range(st["lo_done"], lo):
                for h in range(nkv):
                    if len(pool[h]) < heavy:
                        pool[h].append(j)
                        continue
                    low = min(range(heavy), key=lambda a: (score[h, pool[h][a]], a))
                    if score[h, j] > score[h, pool[h][low]]:
                        pool[h][low] = j
            st["lo_done"] = max(st["lo_done"], lo)
            for h in range(nkv):
                full = (kp < sinks) | (kp >= lo)
                full[pool[h]] = True
                K = np.where(full[:, None], Kf[h], Kq[h])  # (S, hd)
                V = np.where(full[:, None], Vf[h], Vq[h])
                sc = q[h * g:(h + 1) * g, t] @ K.T / math.sqrt(hd)  # (g, S)
                sc = np.where(mask[t][None], -np.inf, sc)
                sc = np.exp(sc - sc.max(axis=-1, keepdims=True))
                sc /= sc.sum(axis=-1, keepdims=True)
                out[h * g:(h + 1) * g, t] = sc @ V
                score[h] += sc.sum(axis=0)
        return out

    def prefill(self, prompt, cache, batch=0):
        """Logits of the prompt in passes of batch tokens (0: one pass)."""
        batch = batch or len(prompt)
        return np.concatenate([self.forward(prompt[i:i + batch], i, cache) for i in range(0, len(prompt), batch)])

    def greedy(self, prompt, n, batch=0):
        """n greedy ids after prompt: the prompt's passes, then one token per pass with the cache."""
        cache = self.new_cache()
        logits = self.prefill(prompt, cache, batch)
        out = []
        pos = len(prompt)
        for _ in range(n):
            t = int(np.argmax(logits[-1]))
            out.append(t)
            logits = self.forward([t], pos, cache)
            pos += 1
        return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="HF directory: config.json + safetensors")
    ap.add_argument("--tokens", help="comma-separated prompt ids")
    ap.add_argument("--text", help="prompt text, tokenized with the model's tokenizer.json")
    ap.add_argument("--out", help="write float32 (n_tokens, n_vocab) logits here")
    ap.add_argument("--greedy", type=int, default=0, help="print this many greedy ids")
    ap.add_argument("--kv-quant", choices=["q8_0", "q4_0"],
                    help="quantize the cache's key and value rows (gguf.quants) as a q8_0 / q4_0 KV cache")
    ap.add_argument("--kv-quant-order", choices=["hf", "gguf"], default="hf",
                    help="element order of a key while quantized: HF's halves or GGUF's adjacent pairs")
    ap.add_argument("--kv-mixed", help="S,W: kv_type mixed, f16 sinks and window of W before each pass, q4_0 rows")
    ap.add_argument("--batch", type=int, default=0, help="the prompt in passes of this many tokens")
    a = ap.parse_args(argv)
    if (a.tokens is None) == (a.text is None):
        ap.error("give exactly one of --tokens and --text")
    if a.tokens is not None:
        prompt = [int(t) for t in a.tokens.split(",") if t.strip()]
    else:
        from tokenizers import Tokenizer
        prompt = Tokenizer.from_file(str(Path(a.model) / "tokenizer.json")).encode(a.text).ids
    if not prompt:
        ap.error("empty prompt")
    mixed = tuple(int(x) for x in a.kv_mixed.split(",")) if a.kv_mixed else None  # S,W or S,W,N
    m = Llama(a.model, kv_quant=a.kv_quant, kv_quant_order=a.kv_quant_order, kv_mixed=mixed)
    vocab = m.embed.shape[0]
    if min(prompt) < 0 or max(prompt) >= vocab:
        ap.error(f"token ids must be in [0, {vocab})")
    if a.out:
        m.prefill(prompt, m.new_cache(), a.batch).astype("<f4").tofile(a.out)
    if a.greedy:
        print(",".join(str(t) for t in m.greedy(prompt, a.greedy, a.batch)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
