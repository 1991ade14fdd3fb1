#!/usr/bin/env python3
"""Reference figures for a real Llama GGUF (SmolLM2-135M-Instruct), independent of our C code.

The GGUF is read with the gguf package and every tensor dequantized with gguf.quants.dequantize;
the Q and K rows are put back from llama.cpp's adjacent-pair order into the HF order (the inverse
of convert_hf_to_gguf.py's permute), and llama_ref.Llama (numpy, following transformers'
LlamaForCausalLM) runs the model in float64. The text is tokenized by an HF `tokenizers` BPE built
from the GGUF's vocabulary and merges with SmolLM2's pre-tokenizer (tokenizer.json: Digits with
individual_digits, then ByteLevel without prefix space; no normalizer) and its control tokens as
special added tokens.

usage:
  smollm2_ref.py --gguf MODEL --text FILE --out DIR [--n-eval 256] [--greedy 16]
  smollm2_ref.py --gguf MODEL --decode 1,2,3      (prints the text of the ids)

--out writes DIR/smollm2.txt, line by line (all numbers in decimal):
  n_eval N            then N lines "eval POS ID LOGPROB TOP1 MARGIN": the evaluated ids (<|endoftext|>
                      then the first N - 1 tokens of the text); LOGPROB = ln p(id at POS + 1 | ids
                      up to POS) ("nan" on the last line); TOP1 = the argmax at POS (lowest id on
                      ties); MARGIN = its logit minus the runner-up's
  ppl X               exp(-mean LOGPROB) over the N - 1 predictions
  n_prompt K          then "prompt ID,ID,..." of the chat prompt
  n_greedy G          then G lines "greedy ID MARGIN": greedy continuation, one token per step with a
                      KV cache, stopping after the end-of-sequence token or G tokens
  text TEXT           the continuation decoded, newlines as \\n
and beside it:
  DIR/logits.f32      the reference logits of the N evaluated ids, float32 (N, n_vocab)
  DIR/hf/             the dequantized model as an HF checkpoint: config.json and model.safetensors
                      in f32 (540 MB for SmolLM2-135M), Q/K rows in HF order
The files are rewritten only when the model file (size, mtime), the text, the options or the two
scripts change: DIR/smollm2.key holds the key of the current ones.
"""
import argparse
import fcntl
import hashlib
import json
import math
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"

# ---- GGUF -> HF ----

# llama.cpp tensor names -> transformers' (per block: blk.N.<key> -> model.layers.N.<value>)
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
_BLOCK = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
          "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
          "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj"}


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def unpermute(w, n_head):
    """Inverse of convert_hf_to_gguf's permute: there each head's rows, viewed as (2, head_dim / 2),
    were transposed to (head_dim / 2, 2), so that rotated pairs sit next to each other."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_gguf_as_hf(r, path):
    """(config.json dict, {HF name: float64 array}) for a llama GGUF opened as GGUFReader r."""
    import numpy as np
    from gguf.quants import dequantize

    arch = _field(r, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch!r}, expected llama")
    a = lambda k, d=None: _field(r, f"llama.{k}", d)  # noqa: E731
    if _field(r, "llama.rope.scaling.type") not in (None, "none"):
        raise ValueError(f"{path}: rope scaling is not handled here")
    n_embd, n_head = a("embedding_length"), a("attention.head_count")
    n_head_kv = a("attention.head_count_kv", n_head)
    names = {t.name for t in r.tensors}
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "vocab_size": len(r.fields["tokenizer.ggml.tokens"].data),
        "hidden_size": n_embd, "intermediate_size": a("feed_forward_length"),
        "num_hidden_layers": a("block_count"), "num_attention_heads": n_head,
        "num_key_value_heads": n_head_kv, "head_dim": a("attention.key_length", n_embd // n_head),
        "max_position_embeddings": a("context_length"), "rms_norm_eps": a("attention.layer_norm_rms_epsilon"),
        "rope_theta": a("rope.freq_base", 10000.0), "tie_word_embeddings": "output.weight" not in names,
    }
    w = {}
    for t in r.tensors:
        x = dequantize(t.data, t.tensor_type).astype(np.float64)
        x = x.reshape([int(d) for d in reversed(t.shape)])  # ggml lists dimensions innermost first
        if t.name in _GLOBAL:
            name = _GLOBAL[t.name]
        else:
            blk, i, key, _ = t.name.split(".")
            if blk != "blk" or key not in _BLOCK:
                raise ValueError(f"{path}: unexpected tensor {t.name}")
            name = f"model.layers.{i}.{_BLOCK[key]}.weight"
            if key == "attn_q":
                x = unpermute(x, n_head)
            elif key == "attn_k":
                x = unpermute(x, n_head_kv)
        w[name] = x
    return cfg, w


# ---- tokenizer ----

def load_tokenizer(r, path):
    """(tokenizer, eos id): an HF tokenizers.Tokenizer equal to SmolLM2's tokenizer.json, from the
    vocabulary of the GGUF opened as GGUFReader r."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    if _field(r, "tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"{path}: tokenizer.ggml.model is not gpt2 (byte-level BPE)")
    tokens = _field(r, "tokenizer.ggml.tokens")
    types = _field(r, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ")) for m in _field(r, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    # llama.cpp's token type 3 (CONTROL) marks tokenizer.json's special added tokens
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    eos = _field(r, "tokenizer.ggml.eos_token_id")
    return tok, eos


# ---- the figures ----

def compute(gguf_path, text, n_eval, n_greedy, hf_dir=None, logits_path=None):
    import numpy as np
    from gguf import GGUFReader
    sys.path.insert(0, str(HERE))
    from llama_ref import Llama

    reader = GGUFReader(gguf_path)
    tok, eos = load_tokenizer(reader, gguf_path)
    endoftext = tok.token_to_id("<|endoftext|>")
    text_ids = tok.encode(text).ids
    if len(text_ids) < n_eval - 1:
        raise ValueError(f"the text has {len(text_ids)} tokens, fewer than {n_eval - 1}")
    if tok.decode(text_ids) != text:
        raise ValueError("the text does not survive an encode/decode round trip")
    ids = [endoftext] + text_ids[:n_eval - 1]
    cfg, w = load_gguf_as_hf(reader, gguf_path)
    m = Llama(cfg=cfg, weights=w)
    if hf_dir is not None:
        # the dequantized model as an HF checkpoint in f32 (exact: Q4_1, Q8_0 and f32 values all fit)
        from safetensors.numpy import save_file
        hf_dir.mkdir(parents=True, exist_ok=True)
        (hf_dir / "config.json").write_text(json.dumps(dict(cfg, torch_dtype="float32"), indent=1))
        save_file({k: v.astype(np.float32) for k, v in w.items()
                   if not (cfg["tie_word_embeddings"] and k == "lm_head.weight")},
                  str(hf_dir / "model.safetensors"))

    def top2(row):
        i = int(np.argmax(row))
        rest = np.delete(row, i)
        return i, float(row[i] - rest.max())

    logits = m.forward(ids)  # (n_eval, n_vocab) float64
    if logits_path is not None:
        logits.astype("<f4").tofile(logits_path)
    lse = logits.max(axis=1) + np.log(np.exp(logits - logits.max(axis=1, keepdims=True)).sum(axis=1))
    lines = [f"n_eval {n_eval}"]
    lp_sum = 0.0
    for p in range(n_eval):
        lp = float(logits[p, ids[p + 1]] - lse[p]) if p + 1 < n_eval else float("nan")
        if p + 1 < n_eval:
            lp_sum += lp
        t1, margin = top2(logits[p])
        lines.append(f"eval {p} {ids[p]} {lp:.9g} {t1} {margin:.6g}")
    lines.append(f"ppl {math.exp(-lp_sum / (n_eval - 1)):.9g}")

    prompt = tok.encode(PROMPT).ids
    lines += [f"n_prompt {len(prompt)}", "prompt " + ",".join(map(str, prompt))]
    cache = m.new_cache()
    row = m.forward(prompt, 0, cache)[-1]
    out = []
    while len(out) < n_greedy:
        t, margin = top2(row)
        out.append((t, margin))
        if t == eos:
            break
        row = m.forward([t], len(prompt) + len(out) - 1, cache)[-1]
    lines.append(f"n_greedy {len(out)}")
    lines += [f"greedy {t} {mg:.6g}" for t, mg in out]
    lines.append("text " + tok.decode([t for t, _ in out], skip_special_tokens=False).replace("\n", "\\n"))
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--text", help="UTF-8 text file to score")
    ap.add_argument("--out", help="directory for smollm2.txt")
    ap.add_argument("--n-eval", type=int, default=256)
    ap.add_argument("--greedy", type=int, default=16)
    ap.add_argument("--decode", help="comma-separated ids: print their text and exit")
    a = ap.parse_args(argv)
    if a.decode is not None:
        from gguf import GGUFReader
        tok, _ = load_tokenizer(GGUFReader(a.gguf), a.gguf)
        ids = [int(t) for t in a.decode.split(",") if t.strip()]
        print(tok.decode(ids, skip_special_tokens=False))
        return 0
    if not a.text or not a.out:
        ap.error("--text and --out are required unless --decode is given")
    text = Path(a.text).read_text(encoding="utf-8")
    st = os.stat(a.gguf)
    h = hashlib.sha256()
    for part in (os.path.abspath(a.gguf), str(st.st_size), str(st.st_mtime_ns), text, str(a.n_eval),
                 str(a.greedy), (HERE / "smollm2_ref.py").read_text(), (HERE / "llama_ref.py").read_text()):
        h.update(part.encode() + b"\0")
    key = h.hexdigest()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    key_file, res_file = out / "smollm2.key", out / "smollm2.txt"
    # test processes run in parallel: the first computes, the others wait for its cache
    with open(out / "smollm2.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        files = (res_file, out / "logits.f32", out / "hf" / "model.safetensors")
        if key_file.exists() and all(f.exists() for f in files) and key_file.read_text().strip() == key:
            return 0
        key_file.unlink(missing_ok=True)
        result = compute(a.gguf, text, a.n_eval, a.greedy, out / "hf", out / "logits.f32")
        tmp = res_file.with_suffix(".tmp")
        tmp.write_text(result, encoding="utf-8")
        tmp.replace(res_file)
        key_file.write_text(key + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
