"""`dpsynth dedup`: cut every >= k-token sequence shared with sensitive data from a public corpus.

    dpsynth dedup --public data/public --sensitive imdb=data/imdb.csv yelp=data/yelp.jsonl \
        --tokenizer runs/tok.model --min-tokens 50 --out runs/dedup

Inputs are text (files, directories, globs, gs://), already tokenized corpora (directories
written by `dpsynth tokenize` with the same tokenizer), or `tfds:NAME` for sensitive data.
Writes OUT/clean/*.jsonl ({"id", "text"}), OUT/clean_tokens/ (token shards),
OUT/contamination.json, OUT/index (the sensitive suffix-array index) and OUT/tokens/.
Unknown flags are Beam pipeline options (`--runner`, `--direct_running_mode`, ...).
"""

from __future__ import annotations

import argparse
import sys

from dpsynth import errors, logs, outdir
from dpsynth.beam import jobs
from dpsynth.data.readers import DEFAULT_MAX_DOCUMENT_BYTES
from dpsynth.dedup import DEFAULT_MIN_TOKENS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dpsynth dedup", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--public", nargs="+", required=True, metavar="PATH", help="the public corpus")
    p.add_argument("--sensitive", nargs="+", required=True, metavar="[NAME=]PATH",
                   help="one entry per sensitive dataset (all its splits)")
    p.add_argument("--tokenizer", required=True, metavar="MODEL")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--min-tokens", type=int, default=DEFAULT_MIN_TOKENS, metavar="K", help="cut shared sequences of >= K tokens")
    p.add_argument("--text-column", default="text")
    p.add_argument("--label-column", default="label", help="'' for unlabeled sensitive text")
    p.add_argument("--num-shards", type=int, default=None, help="public shards (default: one per --shard-mb)")
    p.add_argument("--shard-mb", type=float, default=64.0)
    p.add_argument("--max-document-bytes", type=int, default=DEFAULT_MAX_DOCUMENT_BYTES)
    p.add_argument("--tfds-data-dir", default=None)
    p.add_argument("--threads", type=int, default=1, help="native threads per worker")
    logs.add_flags(p)
    return p


def run(argv=None, test_pipeline=None) -> dict:
    """Parses flags and runs the job; returns the contamination report.

    `test_pipeline`: the test hook of `dpsynth.beam.pipeline.run_pipeline` (the job runs one
    pipeline).
    """
    args, beam_args = build_parser().parse_known_args(argv)
    return jobs.dedup(
        args.public, args.sensitive, tokenizer_path=args.tokenizer, out_dir=args.out,
        min_tokens=args.min_tokens, text_column=args.text_column, label_column=args.label_column or None,
        num_shards=args.num_shards, shard_bytes=int(args.shard_mb * (1 << 20)),
        max_document_bytes=args.max_document_bytes, tfds_data_dir=args.tfds_data_dir,
        threads=args.threads, beam_args=beam_args, test_pipeline=test_pipeline,
    )


@errors.command("dedup", also=(ValueError, FileNotFoundError))
def main(argv=None) -> int:
    args, _ = build_parser().parse_known_args(argv)  # --verbose first: Beam's modules log at import
    logs.configure(fmt="%(message)s", verbose=args.verbose)
    with outdir.claim(args.out, kind=outdir.DEDUP, command="dedup", config=vars(args)):
        run(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
