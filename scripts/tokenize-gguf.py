#!/usr/bin/env python3
"""Tokenizes text with the byte-level BPE vocabulary of a GGUF file (SmolLM2, Llama-3), using
Hugging Face `tokenizers` built from the GGUF's tokenizer.ggml.tokens and .merges: an
implementation independent of the runtime. Prints one id per line. Digits are not split one by
one as SmolLM2's own tokenizer splits them (benchmarks/tokenize-gguf.py does): kept as it is so that
the figures made from its ids come again (docs/benchmarks-log.md, "Token ids of the texts").

usage: tokenize-gguf.py MODEL.gguf < text > ids
"""
import sys

from gguf import GGUFReader
from tokenizers import Tokenizer, decoders, models, pre_tokenizers


def field_strings(reader, name):
    f = reader.fields[name]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def main():
    reader = GGUFReader(sys.argv[1])
    tokens = field_strings(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in field_strings(reader, "tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    ids = tok.encode(sys.stdin.read()).ids
    sys.stdout.write("\n".join(str(i) for i in ids) + "\n")


if __name__ == "__main__":
    main()
