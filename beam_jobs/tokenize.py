"""`dpsynth tokenize`: tokenize a corpus (public or sensitive) into sharded token files.

    python -m beam_jobs.tokenize --input data/public --tokenizer tok.model --out runs/tok/public
    python -m beam_jobs.tokenize --kind sensitive --input reviews.csv --text-column review \
        --label-column score --tokenizer tok.model --out runs/tok/reviews \
        --runner DataflowRunner --project P --region R --temp_location gs://B/tmp --setup_file ./setup.py

Unknown flags are Beam pipeline options (`--runner`, `--direct_num_workers`, ...).
Output format: `dpsynth/data/token_shards.py`; bad records go to `OUT/dead_letters.jsonl` (refused past
--max-dead-letters); a sensitive corpus is owner-only (OUT 0700, files 0600).
"""

from __future__ import annotations

import argparse
import os
import sys

from dpsynth import errors, logs, outdir, owner_only
from dpsynth.beam import jobs
from dpsynth.data import read_config


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dpsynth tokenize", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True, metavar="PATH",
                   help="files, directories, globs (gs:// ok), a tfds:NAME (sensitive), one corpus")
    p.add_argument("--tokenizer", required=True, metavar="MODEL", help="SentencePiece model from `dpsynth tokenizer train`")
    p.add_argument("--out", required=True, metavar="DIR", help="output token corpus directory")
    p.add_argument("--kind", choices=("public", "sensitive"), default="public",
                   help="sensitive = labeled dataset (default: %(default)s)")
    p.add_argument("--name", default=None, help="corpus name in the manifest (default: input stem)")
    read_config.add_flags(p, "text_column", "label_column", "max_document_bytes", "encoding", "max_dead_letters",
                          "num_shards", "shard_mb", "tfds_data_dir",
                          notes={"label_column": "'' for unlabeled sensitive text",
                                 "max_dead_letters": "here: OUT/dead_letters.jsonl"})
    logs.add_flags(p)
    return p


def run(argv=None, test_pipeline=None) -> dict:
    """Parses flags and runs the job; returns the written manifest.

    `test_pipeline`: the test hook of `dpsynth.beam.pipeline.run_pipeline`.
    """
    args, beam_args = build_parser().parse_known_args(argv)
    return jobs.tokenize(
        args.input,
        kind=args.kind,
        name=args.name,
        tokenizer_path=args.tokenizer,
        out_dir=args.out,
        text_column=args.text_column,
        label_column=args.label_column or None,
        num_shards=args.num_shards,
        shard_bytes=read_config.ReadConfig(shard_mb=args.shard_mb).shard_bytes,
        max_document_bytes=args.max_document_bytes,
        tfds_data_dir=args.tfds_data_dir,
        encoding=args.encoding,
        max_dead_letters=args.max_dead_letters,
        beam_args=beam_args,
        test_pipeline=test_pipeline,
    )


@errors.command("tokenize", also=(ValueError, FileNotFoundError))
def main(argv=None) -> int:
    ap = build_parser()
    args, _ = ap.parse_known_args(argv)  # --verbose first: Beam's modules log at import
    logs.configure(fmt="%(message)s", verbose=args.verbose)
    if args.kind == "sensitive" and not outdir.is_url(args.out) and not os.path.exists(args.out):
        owner_only.make_private_dir(args.out)  # 0700 before the claim writes its run record there
    with outdir.claim(args.out, kind=outdir.TOKENS, command="tokenize", config=vars(args), parser=ap):
        run(argv)  # (its summary line counts the dead letters, by reason; OUT/dead_letters.jsonl lists them)
    return 0


if __name__ == "__main__":
    sys.exit(main())
