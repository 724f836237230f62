"""Scoring synthetic corpora and the baselines into metrics rows; `EvaluateConfig` says what to compute.

`Scorer` loads the heavy state once (embedder, real-test features, backbone). `score_corpus`
turns one synthetic corpus into a (row, plot data) pair: its privacy card, MAUVE, n-gram
frontiers and diversity, perplexity under its generator, and per classifier the real-test
accuracy, balanced accuracy and macro-F1 (`dpsynth.evaluate.scores`) with the ranking study
of its hyperparameter trials. `score_baselines` gives the real-data (epsilon = inf) and
DP-on-real rows. A corpus that cannot be scored gets a row with `status = "error"` and the
reason, never an exception. The rows are written by `dpsynth.evaluate.tables`; the plot data
is drawn by `dpsynth.evaluate.plots`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from dpsynth import binding
from dpsynth.dp import accounting, private_selection, selection
from dpsynth.evaluate import classifiers as cls_lib
from dpsynth.evaluate import corpora, embed, mauve, ngrams, ranking, registry, scores
from dpsynth.evaluate import train_classifier as tc
from dpsynth.evaluate import trainer as tr
from dpsynth.evaluate.backbone import Backbone

logger = logging.getLogger("dpsynth.evaluate")

EXAMPLES_PER_LABEL = 3  # synthetic examples per label shown in the report (never real text)
EXAMPLE_CHARS = 300


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvaluateConfig:
    """What to compute.

    Attributes:
      classifiers: downstream classifiers (`registry.names()`: "wordcnn", "backbone"); empty = none.
      model_dir: pretrained LM for the backbone classifier and the default MAUVE embedder.
      embedder: "auto" ("lm:<model_dir>" when model_dir is set, else "hashing"), or a spec for
        `embed.make_embedder`.
      mauve: MAUVE settings; mauve_seeds / mauve_subsample: repeats (mean and std).
      wordcnn: WordCNN sizes; backbone_max_len: the backbone classifier's input tokens (the
        families' other settings: classifier_options).
      sweep: lr x wd grid, repeats and per-run settings (also clip norms for DP-on-real).
      backbone_sweep: the own sweep of a classifier on the pretrained LM (the backbone classifier;
        `registry.ClassifierKind.uses_backbone`; None = `sweep`): fine-tuning the LM costs far
        more per run than a WordCNN, so it may want a smaller grid.
      dp_epsilons: DP-on-real baselines at these epsilons (empty = none).
      dp_expected_batch_size, dp_epochs: DP-on-real training; dp_microbatch_size: examples per
        per-example-gradient microbatch (memory: one gradient per example, e.g. 11.5M floats
        each for the paper's WordCNN).
      dp_delta, dp_accountant: DP-on-real delta (None = 1 / |real train|) and accountant.
      dp_sweep_accounting: "composed" (all trials of a DP-on-real sweep together meet the
        epsilon) or "selected-only" (the paper's: only the selected trial is accounted).
      dp_select_epsilon: choose each DP-on-real sweep's setting on the real D_valid with DP at this
        epsilon (`trainer.DPConfig.select_epsilon`); None: the non-DP choice (a declared side channel).
      dp_valid_split: how D_valid was split from D ("files", "hash" or "positional"; the fallback
        without a real valid split, the last 10% of train, is always "positional").
      real_baseline: train on real train (epsilon = inf) as the upper baseline.
      perplexity: score the real test set under each corpus's generator (when loadable).
      length_bins: bins of the character-length histograms.
      classifier_options: {family: {setting: value}}: the classifier families' own settings
        (`registry.ClassifierKind.settings`, e.g. `{wordcnn: {vocabulary: hashing}, backbone: {pooling:
        last, freeze: true, truncate: tail}}`; flags `--wordcnn-vocabulary`, `--backbone-pooling`, ...).
    """

    classifiers: tuple[str, ...] = ("wordcnn",)
    model_dir: str | None = binding.setting(None, help="pretrained LM checkpoint (the backbone classifier, the "
                                                       "default MAUVE embedder, the DP WordCNN's tokenizer vocabulary)")
    embedder: str = binding.setting("auto", help="MAUVE embedder: auto | hashing[:DIM] | lm:DIR | st:PATH")
    mauve: mauve.MauveConfig = mauve.MauveConfig()
    mauve_seeds: tuple[int, ...] = (0, 1, 2)
    mauve_subsample: int | None = binding.setting(None, help="MAUVE on this many examples per side (default all)")
    wordcnn: cls_lib.WordCNNConfig = cls_lib.WordCNNConfig()
    backbone_max_len: int = 128
    sweep: tc.SweepConfig = tc.SweepConfig()
    backbone_sweep: tc.SweepConfig | None = None
    dp_epsilons: tuple[float, ...] = ()
    dp_expected_batch_size: int = 64
    dp_epochs: float = 5.0
    dp_microbatch_size: int = 16
    dp_delta: float | None = binding.setting(None, help="DP-on-real delta (default 1/|real train|)")
    dp_accountant: str = binding.setting("rdp", choices=accounting.ACCOUNTANTS, help="DP-on-real accountant")
    dp_sweep_accounting: str = binding.setting(
        "composed", choices=selection.SWEEP_ACCOUNTINGS,
        help="DP-on-real: all trials of the sweep together meet each epsilon (composed) or only the selected one "
             "(selected-only, the paper's accounting; declared as a side channel)")
    dp_select_epsilon: float | None = binding.setting(
        None, help="DP-on-real: choose each sweep's setting on --real-valid with DP at this epsilon (exponential "
                   "mechanism; every trial then keeps its last epoch); default: the non-DP choice, a declared side "
                   "channel")
    dp_valid_split: str = binding.setting("files", choices=private_selection.SPLITS,
                                          help="how --real-valid was split from D: files or hash compose the DP "
                                               "selection in parallel with the training, positional sequentially")
    real_baseline: bool = True
    perplexity: bool = True
    length_bins: int = 50
    classifier_options: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        registry.check_options(self.classifier_options)
        for c in self.classifiers:
            if c not in registry.names():
                raise ValueError(f"unknown classifier {c!r} (known: {registry.names()})")
        for c in self.classifiers:
            if registry.get(c).needs_model_dir and not self.model_dir:
                raise ValueError(f"the {c} classifier needs model_dir")
        if any(not (e > 0 and math.isfinite(e)) for e in self.dp_epsilons):
            raise ValueError(f"dp_epsilons must be finite and > 0, got {self.dp_epsilons}")
        if self.dp_sweep_accounting not in selection.SWEEP_ACCOUNTINGS:
            raise ValueError(f"dp_sweep_accounting must be one of {selection.SWEEP_ACCOUNTINGS}, got "
                             f"{self.dp_sweep_accounting!r}")

    def embedder_spec(self) -> str:
        if self.embedder != "auto":
            return self.embedder
        return f"lm:{self.model_dir}" if self.model_dir else "hashing"

    def sweep_for(self, kind: str) -> tc.SweepConfig:
        """The sweep of classifier `kind`: `backbone_sweep` for one that fine-tunes the pretrained LM."""
        return self.backbone_sweep if registry.get(kind).uses_backbone and self.backbone_sweep is not None else self.sweep

    def dp_config(self, epsilon: float, num_train: int, valid_split: str | None = None) -> tr.DPConfig:
        """The DP-on-real settings at `epsilon` for a training set of `num_train` examples."""
        return tr.DPConfig.for_dataset(num_train, epsilon=epsilon, expected_batch_size=self.dp_expected_batch_size,
                                       microbatch_size=self.dp_microbatch_size, epochs=self.dp_epochs,
                                       delta=self.dp_delta, accountant=self.dp_accountant,
                                       sweep_accounting=self.dp_sweep_accounting,
                                       select_epsilon=self.dp_select_epsilon,
                                       valid_split=valid_split or self.dp_valid_split)

    def spec(self, kind: str) -> tc.ClassifierSpec:
        return tc.ClassifierSpec(kind=kind, wordcnn=self.wordcnn, model_dir=self.model_dir,
                                 max_len=self.backbone_max_len, options=self.classifier_options.get(kind, {}))


@dataclasses.dataclass
class RealData:
    """The real splits (valid optional: the ranking upper bound and DP-on-real selection)."""

    train: list[dict]
    test: list[dict]
    valid: list[dict] | None = None

    def labels(self) -> frozenset[str]:
        return corpora.label_set(self.test)


class Scorer:
    """Heavy state loaded once (embedder, real features, backbone): scores corpora and baselines."""

    def __init__(self, real: RealData, config: EvaluateConfig, *, reuse_identical: bool = False):
        """`reuse_identical`: score a corpus equal to an earlier one by its records and generator once
        (`score_corpus`); for an ordered, in-process loop, whose first copy is then well defined."""
        self.real, self.config, self.reuse_identical = real, config, reuse_identical
        for name, recs in (("real train", real.train), ("real test", real.test), ("real valid", real.valid)):
            if recs is not None:
                tc.check_records(name, recs)
        sets = {"real test": real.test, "real train": real.train}
        if real.valid is not None:
            sets["real valid"] = real.valid
        tc.check_label_sets(sets)
        self.embedder = embed.make_embedder(config.embedder_spec())
        self.real_features = self.embedder.embed([r["text"] for r in real.test])
        uses_backbone = any(registry.get(c).uses_backbone for c in config.classifiers)
        self.backbone = Backbone.load(config.model_dir) if uses_backbone else None
        self._generators: dict[str, Any] = {}
        self._scored: dict[str, tuple[str, dict, dict]] = {}  # content key -> (first corpus, its scores)

    # -------------------------------------------------------------------- one corpus
    def score_corpus(self, path: str) -> tuple[dict, dict]:
        """(row, plot data) of one corpus; errors become a marked row, never an exception.

        With `reuse_identical`, a corpus whose records and generator equal an already scored one's
        (a DP selection's output is a copy of its winner) takes that corpus's scores, which are a
        function of them, with its own privacy card, and names it in `scores_of`."""
        row: dict[str, Any] = {"corpus": os.path.basename(os.path.normpath(path)), "path": os.path.abspath(path)}
        plot: dict[str, Any] = {"corpus": row["corpus"]}
        try:
            corpus = corpora.read_corpus(path)
        except corpora.CorpusError as e:
            return {**row, "status": "error", "error": str(e), "private": None}, plot
        row.update(corpus.card())
        row.update({"n_train": len(corpus.train), "n_valid": len(corpus.valid), "invalid_rows": corpus.invalid_rows,
                    "contamination_card": "present" if row.get("contamination_sha256") else "missing"})
        plot["card"] = {k: row.get(k) for k in ("private", "epsilon", "delta", "accountant", "mode", "noise_multiplier",
                                                 "steps", "clip_norm", "contamination_sha256", "side_channels",
                                                 *corpora.sampling_card(row), "invalid_rows")}
        plot["generation_report"] = _summary(corpus.generation_report)
        plot["examples"] = synthetic_examples(corpus.train)
        key = _content_key(corpus) if self.reuse_identical else None
        if key in self._scored:
            first, scored_row, scored_plot = self._scored[key]
            return {**row, **scored_row, "scores_of": first}, {**plot, **scored_plot}
        card_row, card_plot = dict(row), dict(plot)
        try:
            synth_labels, real_labels = corpora.label_set(corpus.train + corpus.valid), self.real.labels()
            if synth_labels != real_labels:
                raise ValueError(f"label sets differ: synthetic {sorted(synth_labels)} vs real {sorted(real_labels)}")
            texts = [r["text"] for r in corpus.train]
            feats = self.embedder.embed(texts)
            summary = mauve.mauve_repeated(feats, self.real_features, self.config.mauve, self.config.mauve_seeds,
                                           self.config.mauve_subsample)
            row.update(summary.as_dict("mauve"))
            row["embedder"] = self.embedder.name
            grams = ngrams.compare_texts(texts, [r["text"] for r in self.real.test], self.config.length_bins)
            row.update(grams.as_dict())
            row.update(ngrams.diversity(texts))
            plot["lengths"] = (grams.p_lengths.tolist(), grams.q_lengths.tolist(), grams.length_edges.tolist())
            plot["bigram_curve"] = grams.results["bigram"].curve.tolist()
            if self.config.perplexity:
                row.update(self._perplexity(corpus))
            plot["trials"] = {}
            for kind in self.config.classifiers:
                tests = {"real_test": self.real.test, **({"real_valid": self.real.valid} if self.real.valid else {})}
                res = tc.classify(corpus.train, corpus.valid, tests, self.config.spec(kind), self.config.sweep_for(kind),
                                  backbone=self.backbone)
                row.update(_classifier_columns(kind, res))
                plot["trials"][kind] = res.trials
            row["status"] = "ok"
            if key is not None:
                self._scored[key] = (row["corpus"], {k: v for k, v in row.items() if k not in card_row},
                                     {k: v for k, v in plot.items() if k not in card_plot})
        except (ValueError, corpora.CorpusError) as e:
            row.update(status="error", error=str(e))
            logger.warning("corpus %s: %s", row["corpus"], e)
        except Exception as e:  # noqa: BLE001 - one broken corpus must not sink a batch of many
            row.update(status="error", error=f"{type(e).__name__}: {e}")
            logger.exception("corpus %s failed", row["corpus"])
        return row, plot

    def _perplexity(self, corpus: corpora.Corpus) -> dict[str, Any]:
        gen = (corpus.generation_config or {}).get("model_dir")
        if not gen or not os.path.isdir(gen):
            return {"perplexity": None, "perplexity_note": "generator not available"}
        if gen not in self._generators:
            from dpsynth.evaluate import lm

            self._generators = {gen: lm.LanguageModel.load(gen)}  # keep one generator in memory
        out = self._generators[gen].perplexity(self.real.test, sorted(self.real.labels()))
        return {"perplexity": out["perplexity"], "perplexity_tokens": out["target_tokens"]}

    # -------------------------------------------------------------------- baselines
    def score_baselines(self) -> list[dict]:
        """Real-data (epsilon = inf) and DP-on-real rows per classifier."""
        rows = []
        valid = self.real.valid
        if valid is None and (self.config.real_baseline or self.config.dp_epsilons):
            valid = self.real.train[-max(1, len(self.real.train) // 10):]  # documented fallback: last 10% of train
            train = self.real.train[: len(self.real.train) - len(valid)]
        else:
            train = self.real.train
        for kind in self.config.classifiers:
            if self.config.real_baseline:
                res = tc.classify(train, valid, {"real_test": self.real.test}, self.config.spec(kind), self.config.sweep_for(kind),
                                  backbone=self.backbone)
                rows.append({"baseline": "real", "classifier": kind, "epsilon": float("inf"),
                             "accuracy": res.test_mean["real_test"], "accuracy_std": res.test_std["real_test"],
                             **_score_columns(res), **{f"selected_{k}": v for k, v in res.selected.items()}})
            for eps in self.config.dp_epsilons:
                dp = self.config.dp_config(eps, len(train), None if self.real.valid is not None else "positional")
                res = tc.classify(train, valid, {"real_test": self.real.test}, self.config.spec(kind), self.config.sweep_for(kind),
                                  dp=dp, backbone=self.backbone)
                rows.append({"baseline": "dp_on_real", "classifier": kind, "epsilon": eps,
                             "accuracy": res.test_mean["real_test"], "accuracy_std": res.test_std["real_test"],
                             **_score_columns(res), **{f"selected_{k}": v for k, v in res.selected.items()},
                             **tc.privacy_summary(res.privacy), "privacy_report": res.privacy})
        return rows


def synthetic_examples(records: Sequence[Mapping[str, Any]], per_label: int = EXAMPLES_PER_LABEL,
                       max_chars: int = EXAMPLE_CHARS) -> dict[str, list[str]]:
    """The first `per_label` SYNTHETIC texts of each label, shortened (for the report; never real text)."""
    out: dict[str, list[str]] = {}
    for r in records:
        texts = out.setdefault(str(r["label"]), [])
        if len(texts) < per_label:
            t = " ".join(str(r["text"]).split())
            texts.append(t if len(t) <= max_chars else t[:max_chars] + " ...")
    return dict(sorted(out.items()))


def _content_key(corpus: corpora.Corpus) -> str:
    """What a corpus's scores are a function of: its records and its generator (perplexity)."""
    import hashlib
    import json

    h = hashlib.sha256(json.dumps((corpus.generation_config or {}).get("model_dir")).encode())
    for split in (corpus.train, corpus.valid):
        h.update(b"\x00split")
        for r in split:
            h.update(json.dumps(r, sort_keys=True).encode() + b"\n")
    return h.hexdigest()


def _summary(report: dict | None) -> dict | None:
    if not report:
        return None
    return {k: v for k, v in report.items() if isinstance(v, (int, float, str, bool)) or v is None}


# The real-test scores recorded beside accuracy (every classifier result; `scores.METRICS`).
EXTRA_SCORES = tuple(m for m in scores.METRICS if m != "accuracy")


def _score_columns(res: tc.SweepResult, prefix: str = "") -> dict[str, float]:
    """`<prefix>balanced_accuracy`, `..._std`, `<prefix>macro_f1`, `..._std` on the real test set
    (mean and std over the selected setting's repeats)."""
    return {k: v for m in EXTRA_SCORES for k, v in ((f"{prefix}{m}", res.score_mean["real_test"][m]),
                                                       (f"{prefix}{m}_std", res.score_std["real_test"][m]))}


def _classifier_columns(kind: str, res: tc.SweepResult) -> dict[str, Any]:
    out = {f"{kind}_accuracy": res.test_mean["real_test"], f"{kind}_accuracy_std": res.test_std["real_test"],
           **_score_columns(res, f"{kind}_"),
           f"{kind}_synthetic_valid_accuracy": res.valid_mean, f"{kind}_trials": len(res.trials)}
    if len(res.trials) >= 2:
        sv = [t["valid_accuracy"] for t in res.trials]
        rt = [t["real_test_accuracy"] for t in res.trials]
        rv = [t["real_valid_accuracy"] for t in res.trials] if "real_valid_accuracy" in res.trials[0] else None
        study = ranking.ranking_study(sv, rt, rv,
                                      real_test_scores={m: [t[f"real_test_{m}"] for t in res.trials] for m in EXTRA_SCORES})
        out.update({f"{kind}_rank_{k}": v for k, v in study.items() if k != "num_trials"})
    return out


def majority_of(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The majority-class predictor's scores on labelled records (the real test set):
    {"label", "num_classes", "n_test", "accuracy", "balanced_accuracy", "macro_f1"}."""
    return scores.majority([str(r["label"]) for r in records]).as_dict()


def load_real(real_train: str, real_test: str, real_valid: str | None = None, *, max_dead_letters=0,
              encoding: str | None = None) -> RealData:
    """The real splits (`corpora.read_real`: at most `max_dead_letters` rejected records each, read in `encoding`)."""
    def read(path, name):
        return corpora.read_real(path, name, max_dead_letters=max_dead_letters, encoding=encoding)

    return RealData(read(real_train, "real train"), read(real_test, "real test"),
                    read(real_valid, "real valid") if real_valid else None)
