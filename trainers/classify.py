"""`dpsynth classify`: train a downstream classifier (sweep x repeats) and test it on real data.

    dpsynth classify --train PATH --valid PATH --test PATH [--test-name real_test] \
        [--classifier wordcnn|backbone --model CKPT] [--epsilon E --clip-norms 0.5,1] --out metrics.json

Without `--epsilon` training is non-private (synthetic data, or the real-data baseline);
with it, DP-Adam on the training set (the DP-on-real baseline) at that epsilon: all trials of
the sweep together meet it (`--sweep-accounting composed`, default) or only the selected one
(`selected-only`, the paper's accounting), and `privacy_report.json` / `.md` are written next
to `--out` (or to `--privacy-report DIR`). The WordCNN vocabulary of a DP run comes from
`--model`'s tokenizer pieces, or hashed words without `--model` (`--vocabulary train`: from
the training set, a declared side channel). The test set is scored by accuracy, balanced
accuracy and macro-F1 (`test_mean` / `test_std`: accuracy; `test_scores_mean` / `_std`: all three).
"""

from __future__ import annotations

import argparse
import json
import sys

from dpsynth import binding, errors, logs, outdir
from dpsynth.data import dead_letters, read_config


def _floats(s: str) -> tuple[float, ...]:
    return tuple(float(x) for x in s.split(",") if x.strip())


def parser() -> argparse.ArgumentParser:
    from dpsynth.dp import selection
    from dpsynth.dp.accounting import ACCOUNTANTS
    from dpsynth.evaluate import registry
    from dpsynth.evaluate import train_classifier as tc

    ap = argparse.ArgumentParser(prog="dpsynth classify", description=__doc__.split("\n")[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--valid", required=True, help="selection set (synthetic valid for synthetic data)")
    ap.add_argument("--test", required=True, help="real test set")
    binding.add_flags(ap, tc.ClassifyConfig, overrides={
        "classifier": {"choices": registry.names()},
        "model": {"help": "pretrained LM checkpoint for --classifier backbone (its tokenizer: the DP WordCNN's "
                          "vocabulary)"},
        "cnn": {"choices": tc.CNN_SIZES},
        "learning_rates": {"type": _floats},
        "weight_decays": {"type": _floats},
        "epsilon": {"help": "DP-Adam at this epsilon (DP-on-real)"},
        "clip_norms": {"type": _floats},
        "accountant": {"choices": ACCOUNTANTS},
        "sweep_accounting": {"choices": selection.SWEEP_ACCOUNTINGS,
                             "help": "DP: all trials of the sweep together meet --epsilon (composed) or only the "
                                     "selected one"},
        "select_epsilon": {"help": "DP: choose the setting on --valid with DP at this epsilon (default: the non-DP "
                                   "choice, a declared side channel)"},
        "valid_split": {"choices": ("files", "hash", "positional"),
                        "help": "DP: how --valid was split from D (files/hash: the selection composes in parallel)"},
        "seed": {"help": "fix the DP sampling/noise seed (tests only: voids the guarantee for whoever knows it; "
                         "default: a secret seed)"},
    }, skip=("classifier_options",))
    registry.add_setting_flags(ap)  # --wordcnn-vocabulary, --backbone-pooling, ...: declared by each family
    ap.add_argument("--privacy-report", default=None, help="directory of the DP privacy report (default: that of --out)")
    ap.add_argument("--out", required=True, help="JSON file with the trials and the selected result")
    read_config.add_flags(ap, "encoding", "max_dead_letters",
                          notes={"max_dead_letters": "here: OUT.private/dead_letters.jsonl"})
    logs.add_flags(ap)
    return ap


def _config(args):
    """The `ClassifyConfig` of the parsed flags, the families' own settings included."""
    import dataclasses

    from dpsynth.evaluate import registry
    from dpsynth.evaluate import train_classifier as tc

    return dataclasses.replace(binding.from_args(tc.ClassifyConfig, args), classifier_options=registry.options_from_args(args))


@errors.command("classify", also=(ValueError, FileNotFoundError))
def main(argv=None) -> int:
    from dpsynth.evaluate import train_classifier as tc

    args = parser().parse_args(argv)
    logs.configure(fmt="%(levelname)s %(name)s: %(message)s", verbose=args.verbose)
    outdir.check_file_out(args.out, command="classify", privacy_dir=args.privacy_report)
    for path in (args.train, args.valid):  # a synthetic split: only from a finished corpus
        outdir.require_corpus_file(path)
    # Rejected records of the three files: counted, explained, listed owner-only; past the limit: refused.
    policy = dead_letters.Policy.of(args.max_dead_letters, dead_letters.default_path(args.out),
                                    prefix="dpsynth classify: ")
    dead_letters.read_checked([("train (--train)", args.train), ("valid (--valid)", args.valid),
                               ("test (--test)", args.test)], policy, encoding=args.encoding)
    result = tc.classify_files(args.train, args.valid, args.test, config=_config(args),
                               out=args.out, privacy_dir=args.privacy_report, max_dead_letters=policy.limit,
                               encoding=args.encoding)
    summary = {"selected": result.selected, "test_mean": result.test_mean, "test_std": result.test_std,
               "test_scores_mean": result.score_mean}
    if result.privacy is not None:
        summary["epsilon"] = result.privacy["epsilon"]
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
