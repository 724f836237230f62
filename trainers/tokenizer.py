"""`dpsynth tokenizer train`: a SentencePiece model trained on PUBLIC text only.

    dpsynth tokenizer train --corpus data/public --vocab-size 8000 --out runs/tok.model

A tokenizer trained on sensitive text can leak it through its vocabulary, so this command
reads public corpora (`.txt`, `.jsonl`, `.parquet`, directories, globs) and nothing else.
"""

from __future__ import annotations

import argparse
import sys

from dpsynth import errors, logs
from dpsynth.data import read_config
from dpsynth.data.tokenizer_training import DEFAULT_SAMPLE_BYTES, train_public_tokenizer


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dpsynth tokenizer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True)
    t = sub.add_parser("train", help="train on a sample of a public corpus", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--corpus", nargs="+", required=True, metavar="PATH", help="public corpus files/dirs/globs")
    t.add_argument("--vocab-size", type=int, required=True, metavar="N")
    t.add_argument("--out", required=True, metavar="MODEL", help="where to write the .model file")
    t.add_argument("--max-sample-mb", type=float, default=DEFAULT_SAMPLE_BYTES / 2**20, metavar="MB",
                   help="sample at most this many MiB of lines (peak ~0.3 GB + ~25x this, docs/data.md)")
    t.add_argument("--max-sentences", type=int, default=1_000_000, help="and at most this many lines")
    t.add_argument("--model-type", choices=("unigram", "bpe"), default="unigram")
    t.add_argument("--seed", type=int, default=0)
    read_config.add_flags(t, "text_column", "encoding")
    logs.add_flags(t)
    return p


@errors.command("tokenizer")
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(fmt="%(message)s", verbose=args.verbose)
    train_public_tokenizer(
        args.corpus, vocab_size=args.vocab_size, out=args.out, text_column=args.text_column,
        max_sentences=args.max_sentences, max_sample_bytes=max(1, int(args.max_sample_mb * 2**20)),
        model_type=args.model_type, seed=args.seed, encoding=args.encoding,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
