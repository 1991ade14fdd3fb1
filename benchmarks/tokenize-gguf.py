#!/usr/bin/env python3
"""Tokenizes a text file with the byte-level BPE vocabulary stored in a GGUF model (SmolLM2 and
other GPT-2 style tokenizers) and writes the ids as little-endian int32, which bench-spec,
bench-kv-quality and bench-stream read (as they read scripts/tokenize-gguf.py's text ids;
docs/benchmarks-log.md, "Token ids of the texts").

usage: tokenize-gguf.py MODEL.gguf TEXT OUT.ids [--max N]

Built from the GGUF's tokenizer.ggml.tokens and .merges with HF tokenizers (ByteLevel
pre-tokenizer with digits split one by one): close to the model's own tokenizer, which is all a
benchmark prompt needs.
"""
import argparse
import sys

import numpy as np
from gguf import GGUFReader
from tokenizers import Tokenizer, models, pre_tokenizers


def field_strings(reader, key):
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("out")
    ap.add_argument("--max", type=int, default=0, help="keep at most this many ids")
    a = ap.parse_args()
    r = GGUFReader(a.model)
    tokens = field_strings(r, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in field_strings(r, "tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    ids = tok.encode(open(a.text, encoding="utf-8").read()).ids
    if a.max:
        ids = ids[: a.max]
    np.asarray(ids, dtype="<i4").tofile(a.out)
    print(f"{len(ids)} tokens -> {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
