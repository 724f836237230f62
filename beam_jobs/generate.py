"""`dpsynth generate`: synthetic train/valid splits from a (DP-tuned) model, as a Beam fan-out.

    dpsynth generate --model DIR --num-examples N [--valid-examples M] --out DIR \
        [--temperature 1.0] [--top-k 0] [--min-p 0] [--num-decodes 1] [--max-len 512] \
        [--batch-size 16|auto [--memory-limit BYTES] [--memory-headroom 0.1]] \
        [--guidance W [--guidance-contrast others|null]] \
        [--label-distribution uniform|dp-histogram --label-source D_TRAIN --label-epsilon E] \
        [--format jsonl,parquet,tfrecord] [--train D_TRAIN [--audit-dir DIR]] [Beam flags...]

Unknown flags are Beam pipeline options (`--runner`, `--direct_running_mode=multi_processing`,
`--direct_num_workers=N`, ...). See `dpsynth.generate.job` and docs/generate.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from dpsynth import binding, errors, logs, outdir
from dpsynth.data import dead_letters, read_config
from dpsynth.dedup import DEFAULT_MIN_TOKENS
from dpsynth.generate.job import DpLabelHistogram, GenerateConfig, generate
from dpsynth.generate.sampler_config import SamplingOptions
from dpsynth.train import resources


# The fields of GenerateConfig bound through `binding` (declared there, help included); the others have
# flags of their own form below, or none.
_BOUND = ("num_examples", "valid_examples", "seed", "max_len", "batch_size", "examples_per_shard", "allow_non_private",
          "cores_per_worker", "memory_limit", "memory_headroom")
_NOT_BOUND = tuple(f.name for f in dataclasses.fields(GenerateConfig) if f.name not in _BOUND)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dpsynth generate", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="checkpoint directory (DP-tuned: has privacy_report.json)")
    p.add_argument("--out", required=True, help="output directory")
    binding.add_flags(p, SamplingOptions)  # --temperature, --top-k, --min-p, ...: declared by SamplerConfig
    binding.add_flags(p, GenerateConfig, skip=_NOT_BOUND, overrides={  # --num-examples, --seed, --batch-size, ...
        "num_examples": {"required": True},
        "batch_size": {"type": binding.int_or_auto, "metavar": "N|auto"},
        "memory_limit": {"type": resources.bytes_flag, "metavar": "BYTES"},
    })
    p.add_argument("--labels", default=None, help="comma-separated labels (default: the model's label set)")
    p.add_argument("--label-distribution", choices=("uniform", "dp-histogram"), default="uniform",
                   help="uniform (no privacy cost) or a DP label histogram of --label-source (default: %(default)s)")
    p.add_argument("--label-source", default=None, help="D_train file(s) for the DP label histogram")
    read_config.add_flags(p, "encoding", "max_dead_letters",
                          notes={"encoding": "of --label-source",
                                 "max_dead_letters": "here: --label-source; OUT.private/dead_letters.jsonl"})
    p.add_argument("--label-noise-multiplier", type=float, default=None, help="sigma of the histogram (sensitivity 1)")
    p.add_argument("--label-epsilon", type=float, default=None, help="calibrate sigma for this epsilon (alone)")
    p.add_argument("--label-delta", type=float, default=None, help="delta for --label-epsilon (default: the model's)")
    p.add_argument("--allow-large-delta", action="store_true",
                   help="accept a --label-delta above 1/N (N = --label-source records), which protects nobody")
    p.add_argument("--format", default="jsonl",
                   help="comma-separated: jsonl (always), parquet, tfrecord (default: %(default)s)")
    p.add_argument("--train", default=None, help="opt-in memorisation audit against D_train (NOT DP; owner-only, "
                   "written to --audit-dir, never into --out)")
    p.add_argument("--audit-dir", default=None, help="owner-only directory (0700) of the memorisation audit, "
                   "outside --out (default: OUT.private beside --out)")
    p.add_argument("--min-shared-tokens", type=int, default=DEFAULT_MIN_TOKENS,
                   help="memorisation threshold in tokens (default: %(default)s)")
    logs.add_flags(p)
    return p


def run(argv=None, test_pipeline=None) -> dict:
    """Parses flags and runs the job; returns the output manifest.

    `test_pipeline`: the test hook of `dpsynth.beam.pipeline.run_pipeline`.
    """
    ap = build_parser()
    args, beam_args = ap.parse_known_args(argv)
    labels = tuple(l.strip() for l in args.labels.split(",") if l.strip()) if args.labels else None
    formats = tuple(f.strip() for f in args.format.split(",") if f.strip())
    if "jsonl" not in formats:
        formats = ("jsonl",) + formats
    histogram = None
    if args.label_distribution == "dp-histogram":
        histogram = DpLabelHistogram(source=args.label_source, noise_multiplier=args.label_noise_multiplier,
                                     epsilon=args.label_epsilon, delta=args.label_delta,
                                     allow_large_delta=args.allow_large_delta, encoding=args.encoding,
                                     dead_letters=dead_letters.Policy.of(args.max_dead_letters,
                                                                         dead_letters.default_path(args.out),
                                                                         prefix="dpsynth generate: "))
    config = GenerateConfig(model_dir=args.model, out_dir=args.out, sampling=binding.from_args(SamplingOptions, args),
                            labels=labels, formats=formats, **{name: getattr(args, name) for name in _BOUND})
    private = dead_letters.default_path(args.out)  # (and the default --audit-dir): OUT.private beside OUT
    # The run record holds --batch-size as given ("auto" or N; generation_config.json holds the batch it
    # resolved to); the memory budget of auto stays out of it (a rerun keeps its recorded batch), so a
    # default run's record is as before.
    with outdir.claim(args.out, kind=outdir.CORPUS, command="generate", config=vars(args), parser=ap,
                      ignore=("format", "train", "min_shared_tokens", "memory_limit", "memory_headroom"),
                      writable=(("--audit-dir", args.audit_dir or os.path.dirname(private)),),
                      siblings=(("private state", os.path.dirname(private)), ("--audit-dir", args.audit_dir))):
        return generate(config, beam_args=beam_args, test_pipeline=test_pipeline, label_histogram=histogram,
                        train_path=args.train, audit_dir=args.audit_dir, min_shared_tokens=args.min_shared_tokens)


@errors.command("generate")
def main(argv=None) -> int:
    args, _ = build_parser().parse_known_args(argv)  # --verbose first: Beam's modules log at import
    logs.configure(fmt="%(message)s", verbose=args.verbose)
    manifest = run(argv)
    counts = ", ".join(f"{s}={v['num_examples']}" for s, v in manifest["splits"].items())
    print(f"dpsynth generate: wrote {counts} ({'private' if manifest['private'] else 'NOT PRIVATE'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
