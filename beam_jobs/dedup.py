r"""`dpsynth dedup`: cut every >= k-token sequence shared with sensitive data from a public corpus.

    dpsynth dedup --public data/public --sensitive imdb=data/imdb.csv yelp=data/yelp.jsonl \
        --tokenizer runs/tok.model --min-tokens 50 --out runs/dedup

Inputs are text (files, directories, globs, gs://), already tokenized corpora (directories
written by `dpsynth tokenize` with the same tokenizer), or `tfds:NAME` for sensitive data.
OUT gets only what may be published (the clean corpus and the report); the token corpora (the
public corpus before the cut among them) and the sensitive index go to the owner-only
--state-dir (the layout below; docs/formats.md). A sensitive record that cannot be read (a
dead letter) is refused unless --allow-unread-sensitive.
Unknown flags are Beam pipeline options (`--runner`, `--direct_running_mode`, ...).
"""

from __future__ import annotations

import argparse
import sys

from dpsynth import binding, errors, logs, outdir
from dpsynth.beam import dedup as bdedup
from dpsynth.beam import jobs
from dpsynth.data import dead_letters, read_config, readers
from dpsynth.dedup.config import DedupConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dpsynth dedup", description=f"{__doc__}\n{bdedup.layout_text()}",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--public", nargs="+", required=True, metavar="PATH", help="the public corpus")
    p.add_argument("--sensitive", nargs="+", required=True, metavar="[NAME=]PATH",
                   help="one entry per sensitive dataset (all its splits)")
    p.add_argument("--tokenizer", required=True, metavar="MODEL")
    p.add_argument("--out", required=True, metavar="DIR")
    binding.add_flags(p, DedupConfig, overrides={"min_tokens": {"metavar": "K"}})
    p.add_argument("--state-dir", default=None, help="the private state directory (the token corpora, the public "
                   "corpus before the cut among them, their dead letters, the sensitive index; created 0700, never "
                   "publish it); default: OUT.private next to --out")
    p.add_argument("--public-encoding", default=readers.DEFAULT_ENCODING, help="of the --public files (default utf-8)")
    read_config.add_flags(p, "text_column", "label_column", "max_document_bytes", "encoding", "max_dead_letters",
                          "num_shards", "shard_mb", "tfds_data_dir",
                          notes={"label_column": "'' for unlabeled sensitive text", "encoding": "of the --sensitive files",
                                 "num_shards": "of the public corpus",
                                 "max_dead_letters": "here: per corpus, in its token directory"})
    p.add_argument("--allow-unread-sensitive", action="store_true",
                   help="go on when a sensitive record cannot be read (refused by default: the dedup cannot cut a "
                        "public copy of it); the report then lists those records as not protected")
    logs.add_flags(p)
    return p


def run(argv=None, test_pipeline=None) -> dict:
    """Parses flags and runs the job; returns the contamination report.

    `test_pipeline`: the test hook of `dpsynth.beam.pipeline.run_pipeline` (the job runs one
    pipeline).
    """
    args, beam_args = build_parser().parse_known_args(argv)
    config = binding.from_args(DedupConfig, args)
    return jobs.dedup(
        args.public, args.sensitive, tokenizer_path=args.tokenizer, out_dir=args.out,
        min_tokens=config.min_tokens, text_column=args.text_column, label_column=args.label_column or None,
        num_shards=args.num_shards, shard_bytes=read_config.ReadConfig(shard_mb=args.shard_mb).shard_bytes,
        max_document_bytes=args.max_document_bytes, tfds_data_dir=args.tfds_data_dir,
        threads=config.threads, state_dir=args.state_dir, encoding=args.encoding,
        public_encoding=args.public_encoding,
        max_dead_letters=args.max_dead_letters, allow_unread_sensitive=args.allow_unread_sensitive,
        beam_args=beam_args, test_pipeline=test_pipeline,
    )


@errors.command("dedup", also=(ValueError, FileNotFoundError))
def main(argv=None) -> int:
    ap = build_parser()
    args, _ = ap.parse_known_args(argv)  # --verbose first: Beam's modules log at import
    logs.configure(fmt="%(message)s", verbose=args.verbose)
    binding.from_args(DedupConfig, args)  # a bad setting is refused before --out is claimed
    with outdir.claim(args.out, kind=outdir.DEDUP, command="dedup", config=vars(args), parser=ap,
                      siblings=(("--state-dir", args.state_dir or dead_letters.private_dir(args.out)),)):
        run(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
