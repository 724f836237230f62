"""`dpsynth tokenizer train`: a SentencePiece model trained on PUBLIC text only.

    dpsynth tokenizer train --corpus data/public --vocab-size 8000 --out runs/tok.model

A tokenizer trained on sensitive text can leak it through its vocabulary, so this command
reads public corpora (`.txt`, `.jsonl`, `.parquet`, directories, globs) and nothing else.
"""

from __future__ import annotations

import argparse
import sys

from dpsynth import binding, errors, logs
from dpsynth.data import read_config
from dpsynth.data.tokenizer_training import TokenizerConfig, train_public_tokenizer


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dpsynth tokenizer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True)
    t = sub.add_parser("train", help="train on a sample of a public corpus", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--corpus", nargs="+", required=True, metavar="PATH", help="public corpus files/dirs/globs")
    t.add_argument("--out", required=True, metavar="MODEL", help="where to write the .model file")
    binding.add_flags(t, TokenizerConfig, overrides={"vocab_size": {"required": True, "metavar": "N"},
                                                     "max_sample_mb": {"metavar": "MB"}})
    read_config.add_flags(t, "text_column", "encoding")
    logs.add_flags(t)
    return p


@errors.command("tokenizer")
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(fmt="%(message)s", verbose=args.verbose)
    try:
        config = binding.from_args(TokenizerConfig, args)
    except binding.SettingError as e:
        raise errors.DpsynthError(f"{binding.flag_name(e.field)}: {e.message}") from None
    train_public_tokenizer(args.corpus, out=args.out, config=config, text_column=args.text_column,
                           encoding=args.encoding)
    return 0


if __name__ == "__main__":
    sys.exit(main())
