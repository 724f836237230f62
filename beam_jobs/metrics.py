"""`dpsynth evaluate`: metrics and an HTML report over one or many synthetic corpora (Beam).

    dpsynth evaluate --synthetic DIR [DIR ...] | --synthetic-root ROOT \
        --real-train PATH --real-test PATH [--real-valid PATH] --out DIR \
        [--classifiers wordcnn,backbone] [--model CKPT] [--dp-epsilons 1,3,8] [beam flags]

Writes OUT/metrics.json, OUT/metrics.csv, OUT/report.html and OUT/plots/*.png, and each DP-on-real
baseline's privacy report under OUT/baselines/, then prints the plain summary (accuracy, balanced
accuracy and macro-F1 beside the majority class and the baselines; a verdict per corpus: does it
beat DP-on-real at its epsilon?). Any standard Beam
flag (`--runner`, `--direct_num_workers`, ...) is passed through; the default runner is local.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dpsynth import errors, logs, outdir
from dpsynth.data import dead_letters, read_config

if TYPE_CHECKING:
    from dpsynth.evaluate.scoring import EvaluateConfig

# `--cnn small`: WordCNN sizes for a CPU demo (`--cnn paper`: the paper's `WordCNNConfig()`).
SMALL_CNN_SIZES = {"vocab_words": 10_000, "embed_dim": 64, "filters": 64, "hidden": 64, "max_len": 128}


def _floats(s: str) -> tuple[float, ...]:
    return tuple(float(x) for x in s.split(",") if x.strip())


# `EvaluateConfig` fields that are flags as they are (the others are shaped by the flags above them:
# --classifiers a comma list, --grid small | wide, --cnn paper | small, --mauve-seeds a count, ...).
BOUND = ("model_dir", "embedder", "mauve_subsample", "dp_delta", "dp_accountant", "dp_sweep_accounting",
         "dp_select_epsilon", "dp_valid_split")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dpsynth evaluate", description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--synthetic", nargs="+", help="synthetic corpus directories (train.jsonl, valid.jsonl)")
    src.add_argument("--synthetic-root", help="evaluate every directory under ROOT that has a train.jsonl")
    ap.add_argument("--real-train", required=True, help="real training split (JSONL/CSV/Parquet with text,label)")
    ap.add_argument("--real-test", required=True, help="real test split")
    ap.add_argument("--real-valid", help="real validation split (ranking upper bound, baseline selection)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--classifiers", default="wordcnn",
                    help="comma list of wordcnn,backbone, or 'none' (default: %(default)s)")
    ap.add_argument("--dp-epsilons", default="", type=_floats, help="DP-on-real baselines, e.g. 1,3,8")
    # The settings that are `EvaluateConfig` fields as they are: flags, defaults, choices and help from it.
    from dpsynth import binding
    from dpsynth.evaluate.scoring import EvaluateConfig

    binding.add_flags(ap, EvaluateConfig, skip=tuple(f.name for f in dataclasses.fields(EvaluateConfig)
                                                     if f.name not in BOUND),
                      overrides={"model_dir": {"flags": ("--model",)},
                                 "dp_sweep_accounting": {"flags": ("--sweep-accounting",)}})
    ap.add_argument("--grid", default="small", choices=("small", "wide"),
                    help="lr x weight-decay grid (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=3, help="seeds per point of the classifiers' grid (default: %(default)s)")
    ap.add_argument("--max-epochs", type=int, default=10, help="epochs per classifier training (default: %(default)s)")
    ap.add_argument("--cnn", default="paper", choices=("paper", "small"),
                    help="WordCNN sizes (small: CPU demo; default: %(default)s)")
    ap.add_argument("--mauve-max-buckets", type=int, default=500,
                    help="MAUVE's largest number of buckets (default: %(default)s)")
    ap.add_argument("--mauve-seeds", type=int, default=3, help="MAUVE's clustering seeds (default: %(default)s)")
    ap.add_argument("--no-perplexity", action="store_true")
    ap.add_argument("--no-real-baseline", action="store_true")
    from dpsynth.evaluate import registry

    registry.add_setting_flags(ap)  # --wordcnn-vocabulary, --backbone-pooling, ...: declared by each family
    read_config.add_flags(ap, "encoding", "max_dead_letters",
                          notes={"encoding": "of the real splits",
                                 "max_dead_letters": "here: per real split; OUT.private/dead_letters.jsonl"})
    logs.add_flags(ap)
    return ap


def config_from_flags(*, classifiers: str = "wordcnn", dp_epsilons: Sequence[float] = (), grid: str = "small",
                      repeats: int = 3, max_epochs: int = 10, cnn: str = "paper", mauve_max_buckets: int = 500,
                      mauve_seeds: int = 3, perplexity: bool = True, real_baseline: bool = True,
                      classifier_options=None, **bound) -> EvaluateConfig:
    """An `EvaluateConfig` from the flags' values (`--classifiers` a comma list or "none", `--grid`
    small | wide, `--cnn` paper | small, `--mauve-seeds` a count, `classifier_options` the families'
    own settings, `dpsynth.evaluate.registry.options_from_args`; `bound`: the `BOUND` fields as they
    are, e.g. model_dir, dp_select_epsilon)."""
    from dpsynth.evaluate import classifiers as cls_lib
    from dpsynth.evaluate import mauve
    from dpsynth.evaluate import train_classifier as tc
    from dpsynth.evaluate import trainer as tr
    from dpsynth.evaluate.scoring import EvaluateConfig

    kinds = () if classifiers.strip() in ("", "none") else tuple(c.strip() for c in classifiers.split(",") if c.strip())
    lrs, wds = (tc.WIDE_LR_GRID, tc.WIDE_WD_GRID) if grid == "wide" else (tc.SMALL_LR_GRID, tc.SMALL_WD_GRID)
    unknown = set(bound) - set(BOUND)
    if unknown:
        raise TypeError(f"config_from_flags: unknown settings {sorted(unknown)}")
    return EvaluateConfig(
        classifiers=kinds, dp_epsilons=tuple(dp_epsilons), **bound,
        wordcnn=cls_lib.WordCNNConfig(**SMALL_CNN_SIZES) if cnn == "small" else cls_lib.WordCNNConfig(),
        mauve=mauve.MauveConfig(max_buckets=mauve_max_buckets), mauve_seeds=tuple(range(mauve_seeds)),
        perplexity=perplexity, real_baseline=real_baseline, classifier_options=dict(classifier_options or {}),
        sweep=tc.SweepConfig(learning_rates=lrs, weight_decays=wds, repeats=repeats,
                             train=tr.TrainConfig(max_epochs=max_epochs)))


def run(argv=None, test_pipeline=None) -> dict:
    """Parses flags, builds the config and runs the job; returns {"out": DIR, "corpora": N, "summary": text}
    (the plain summary of the written report, `tables.report_summary`).

    `test_pipeline`: the test hook of `dpsynth.beam.pipeline.run_pipeline`.
    """
    from dpsynth.evaluate import corpora, pipeline, registry, tables

    args, beam_args = parser().parse_known_args(argv)
    config = config_from_flags(
        classifiers=args.classifiers, dp_epsilons=args.dp_epsilons, grid=args.grid, repeats=args.repeats,
        max_epochs=args.max_epochs, cnn=args.cnn, mauve_max_buckets=args.mauve_max_buckets, mauve_seeds=args.mauve_seeds,
        perplexity=not args.no_perplexity, real_baseline=not args.no_real_baseline,
        classifier_options=registry.options_from_args(args), **{name: getattr(args, name) for name in BOUND})
    # Rejected records of the real splits: counted, explained, listed owner-only; past the limit: refused.
    policy = dead_letters.Policy.of(args.max_dead_letters, dead_letters.default_path(args.out),
                                    prefix="dpsynth evaluate: ")
    dead_letters.read_checked([(f"real {s} (--real-{s})", p) for s, p in
                               (("train", args.real_train), ("test", args.real_test), ("valid", args.real_valid)) if p],
                              policy, encoding=args.encoding)
    dirs = args.synthetic or corpora.find_corpora(args.synthetic_root)
    pipeline.run_job(dirs, (args.real_train, args.real_test, args.real_valid), args.out, config,
                     beam_args=beam_args, test_pipeline=test_pipeline, max_dead_letters=policy.limit,
                     encoding=args.encoding)
    labels = [str(r["label"]) for r in corpora.read_real(args.real_test, "real test", max_dead_letters=policy.limit,
                                                         encoding=args.encoding)]
    return {"out": args.out, "corpora": len(dirs), "summary": tables.report_summary(args.out, labels)}


@errors.command("evaluate", also=(ValueError, FileNotFoundError))
def main(argv=None) -> int:
    ap = parser()
    args, _ = ap.parse_known_args(argv)  # --verbose first: Beam's modules log at import
    logs.configure(fmt="%(levelname)s %(name)s: %(message)s", verbose=args.verbose)
    with outdir.claim(args.out, kind=outdir.EVALUATION, command="evaluate", config=vars(args), parser=ap,
                      siblings=(("--out (its dead letters)", os.path.dirname(dead_letters.default_path(args.out))),)):
        out = run(argv)
    print(out["summary"])
    print(f"report: {out['out']}/report.html ({out['corpora']} corpora; metrics.json, metrics.csv)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
