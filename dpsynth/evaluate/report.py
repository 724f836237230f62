"""Metrics of many synthetic corpora in one table, plus an HTML report with plots.

`evaluate(...)` scores each corpus (`score_corpus`), computes the baselines once (real data,
epsilon = inf, and DP-on-real at the requested epsilons, `score_baselines`) and writes
`OUT/metrics.json`, `OUT/metrics.csv` and `OUT/report.html` with PNG plots under `OUT/plots/`:
accuracy against epsilon per mode and classifier with the DP-on-real line, length histograms,
bigram frontiers, the rank-correlation scatter, and a privacy / contamination card per corpus.
Each DP-on-real baseline writes its privacy report (ledger, epsilons, side channels; the
`dpsynth.dp.report` format) to `OUT/baselines/dp_on_real-<classifier>-eps<epsilon>/`, and its
row in `metrics.json` and the HTML report carries the spent epsilon and the side channels.

Every classifier result (synthetic corpora, both baselines, each sweep trial) carries accuracy,
balanced accuracy and macro-F1 on the real test set (`dpsynth.evaluate.scores`); `metrics.json`
also holds the majority-class predictor's scores ("majority") and one verdict per corpus and
classifier ("verdicts", `dpsynth.evaluate.verdict`: does it beat DP-on-real at its epsilon?),
which the HTML report shows first and the plain summaries end with.

A corpus that cannot be scored (different label sets, no valid rows, too few examples for the
MAUVE buckets, ...) gets a row with `status = "error"` and the reason; corpora without a
privacy report are marked NON-PRIVATE. No metric is ever silently filled in.
"""

from __future__ import annotations

import csv
import dataclasses
import html
import logging
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dpsynth import fileio
from dpsynth.dp import selection
from dpsynth.evaluate import classifiers as cls_lib
from dpsynth.evaluate import corpora, embed, mauve, ngrams, ranking, registry, scores, verdict
from dpsynth.evaluate import train_classifier as tc
from dpsynth.evaluate import trainer as tr
from dpsynth.evaluate import wordcnn as wordcnn_lib
from dpsynth.evaluate.backbone import Backbone
from dpsynth.evaluate.verdict import nominal_epsilon

logger = logging.getLogger("dpsynth.evaluate")

METRICS_JSON, METRICS_CSV, REPORT_HTML, PLOTS_DIR = "metrics.json", "metrics.csv", "report.html", "plots"
LENGTH_CLIP_PERCENTILE = 99.0  # length histograms end here (a few very long reviews would set the range)
EXAMPLES_PER_LABEL = 3  # synthetic examples per label shown in the report (never real text)
EXAMPLE_CHARS = 300


def epsilon_axis(values) -> tuple[dict[float, int], list[str]]:
    """Categorical x positions for the nominal epsilons (finite ones sorted, then inf) and tick labels."""
    finite = sorted({float(v) for v in values if math.isfinite(float(v))})
    ticks = [f"{v:g}" for v in finite]
    pos = {v: i for i, v in enumerate(finite)}
    if any(not math.isfinite(float(v)) for v in values):
        pos[math.inf] = len(finite)
        ticks.append("inf\n(non-private)")
    return pos, ticks


def clipped_edges(p: Sequence[float], q: Sequence[float], bins: int,
                  percentile: float = LENGTH_CLIP_PERCENTILE) -> tuple[np.ndarray, float]:
    """Histogram edges over [the shortest text, the `percentile` of both samples]; returns (edges, the clip value)."""
    both = np.concatenate([np.asarray(p, float), np.asarray(q, float)])
    hi = float(np.percentile(both, percentile)) if both.size else 1.0
    lo = float(both.min()) if both.size else 0.0
    hi = max(hi, lo + 1.0)
    return np.linspace(lo, hi, bins + 1), hi


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvaluateConfig:
    """What to compute.

    Attributes:
      classifiers: downstream classifiers (`registry.names()`: "wordcnn", "backbone"); empty = none.
      model_dir: pretrained LM for the backbone classifier and the default MAUVE embedder.
      embedder: "auto" ("lm:<model_dir>" when model_dir is set, else "hashing"), or a spec for
        `embed.make_embedder`.
      mauve: MAUVE settings; mauve_seeds / mauve_subsample: repeats (mean and std).
      wordcnn: WordCNN sizes; backbone_max_len / pooling / freeze_backbone: backbone settings.
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
      wordcnn_vocabulary: the WordCNN's vocabulary (`train_classifier.VOCABULARIES`); "auto":
        each corpus's own training set for synthetic data and the real-data baseline, the
        public pieces of model_dir's tokenizer (hashed words without model_dir) for DP-on-real.
      real_baseline: train on real train (epsilon = inf) as the upper baseline.
      perplexity: score the real test set under each corpus's generator (when loadable).
      length_bins: bins of the character-length histograms.
    """

    classifiers: tuple[str, ...] = ("wordcnn",)
    model_dir: str | None = None
    embedder: str = "auto"
    mauve: mauve.MauveConfig = mauve.MauveConfig()
    mauve_seeds: tuple[int, ...] = (0, 1, 2)
    mauve_subsample: int | None = None
    wordcnn: cls_lib.WordCNNConfig = cls_lib.WordCNNConfig()
    backbone_max_len: int = 128
    pooling: str = "mean"
    freeze_backbone: bool = False
    sweep: tc.SweepConfig = tc.SweepConfig()
    backbone_sweep: tc.SweepConfig | None = None
    dp_epsilons: tuple[float, ...] = ()
    dp_expected_batch_size: int = 64
    dp_epochs: float = 5.0
    dp_microbatch_size: int = 16
    dp_delta: float | None = None
    dp_accountant: str = "rdp"
    dp_sweep_accounting: str = "composed"
    wordcnn_vocabulary: str = "auto"
    real_baseline: bool = True
    perplexity: bool = True
    length_bins: int = 50

    def __post_init__(self):
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
        if self.wordcnn_vocabulary not in wordcnn_lib.VOCABULARIES:
            raise ValueError(f"wordcnn_vocabulary must be one of {wordcnn_lib.VOCABULARIES}, got "
                             f"{self.wordcnn_vocabulary!r}")

    def embedder_spec(self) -> str:
        if self.embedder != "auto":
            return self.embedder
        return f"lm:{self.model_dir}" if self.model_dir else "hashing"

    def sweep_for(self, kind: str) -> tc.SweepConfig:
        """The sweep of classifier `kind`: `backbone_sweep` for one that fine-tunes the pretrained LM."""
        return self.backbone_sweep if registry.get(kind).uses_backbone and self.backbone_sweep is not None else self.sweep

    def dp_config(self, epsilon: float, num_train: int) -> tr.DPConfig:
        """The DP-on-real settings at `epsilon` for a training set of `num_train` examples."""
        return tr.DPConfig.for_dataset(num_train, epsilon=epsilon, expected_batch_size=self.dp_expected_batch_size,
                                       microbatch_size=self.dp_microbatch_size, epochs=self.dp_epochs,
                                       delta=self.dp_delta, accountant=self.dp_accountant,
                                       sweep_accounting=self.dp_sweep_accounting)

    def spec(self, kind: str) -> tc.ClassifierSpec:
        return tc.ClassifierSpec(kind=kind, wordcnn=self.wordcnn, model_dir=self.model_dir, pooling=self.pooling,
                                 max_len=self.backbone_max_len, freeze_backbone=self.freeze_backbone,
                                 vocabulary=self.wordcnn_vocabulary)


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

    def __init__(self, real: RealData, config: EvaluateConfig):
        self.real, self.config = real, config
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

    # -------------------------------------------------------------------- one corpus
    def score_corpus(self, path: str) -> tuple[dict, dict]:
        """(row, plot data) of one corpus; errors become a marked row, never an exception."""
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
                                                 "temperature", "top_k", "num_decodes", "invalid_rows")}
        plot["generation_report"] = _summary(corpus.generation_report)
        plot["examples"] = synthetic_examples(corpus.train)
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
                dp = self.config.dp_config(eps, len(train))
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


# ----------------------------------------------------------------------------- writing


def _json_value(v):
    if isinstance(v, float) and not math.isfinite(v):
        return "inf" if v > 0 else ("-inf" if v < 0 else None)
    if isinstance(v, (np.floating, np.integer)):
        return _json_value(v.item())
    return v


BASELINES_DIR = "baselines"


def write_baseline_reports(baselines: Sequence[dict], out_dir: str) -> list[dict]:
    """Writes each DP-on-real row's privacy report to `OUT/baselines/<name>/`; returns the rows
    with the embedded report replaced by the relative path of its `privacy_report.json`."""
    from dpsynth.dp import report as report_lib

    out = []
    for b in baselines:
        b = dict(b)
        rep = b.get("privacy_report")
        if isinstance(rep, dict):
            json_path, _ = report_lib.write_report(os.path.join(out_dir, baseline_dir(b)), rep)
            b["privacy_report"] = os.path.relpath(json_path, out_dir)
        out.append(b)
    return out


def baseline_dir(row: Mapping[str, Any]) -> str:
    """`baselines/<baseline>-<classifier>-eps<epsilon>`: where a baseline row's privacy report goes (relative)."""
    eps = row["epsilon"]
    return os.path.join(BASELINES_DIR, f"{row['baseline']}-{row['classifier']}-eps{'inf' if math.isinf(eps) else f'{eps:g}'}")


def write_tables(rows: Sequence[dict], baselines: Sequence[dict], out_dir: str, *, majority: Mapping | None = None,
                 verdicts: Sequence[Mapping] | None = None) -> tuple[str, str]:
    """`metrics.json` ({"corpora": rows, "baselines": ..., and when given "majority": the
    majority-class predictor's scores, "verdicts": one per corpus and classifier}) and
    `metrics.csv` (one row per corpus)."""
    os.makedirs(out_dir, exist_ok=True)
    jpath, cpath = os.path.join(out_dir, METRICS_JSON), os.path.join(out_dir, METRICS_CSV)
    clean = lambda r: {k: _json_value(v) for k, v in r.items()}  # noqa: E731
    doc = {"format": "dpsynth.metrics", "format_version": 1, "corpora": [clean(r) for r in rows],
           "baselines": [clean(b) for b in baselines]}
    if majority is not None:
        doc["majority"] = clean(majority)
    if verdicts is not None:
        doc["verdicts"] = [clean(v) for v in verdicts]
    fileio.write_json(jpath, doc, indent=1, newline=False)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with open(cpath, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        for r in rows:
            w.writerow({k: _json_value(r.get(k)) for k in columns})
    return jpath, cpath


def _fig_to_png(fig, path: str) -> str:
    import matplotlib.pyplot as plt

    fig.savefig(path, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path


def make_plots(rows: Sequence[dict], plots: Sequence[dict], baselines: Sequence[dict], out_dir: str,
               classifiers: Sequence[str]) -> list[tuple[str, str]]:
    """Writes the PNG plots; returns [(title, relative path)]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pdir = os.path.join(out_dir, PLOTS_DIR)
    os.makedirs(pdir, exist_ok=True)
    out = []
    ok = [r for r in rows if r.get("status") == "ok"]
    # Accuracy vs epsilon per mode and classifier, with the baselines, on the NOMINAL epsilon
    # grid (a corpus tuned for epsilon 3 that realised 2.9995 sits at 3, beside DP-on-real at 3).
    for kind in classifiers:
        fig, ax = plt.subplots(figsize=(6, 4))
        pos, ticks = epsilon_axis([nominal_epsilon(r) for r in ok]
                                  + [b["epsilon"] for b in baselines if b["baseline"] == "dp_on_real"])
        for mode in sorted({str(r.get("mode")) for r in ok}):
            pts = sorted((pos[nominal_epsilon(r)], r.get(f"{kind}_accuracy"), r.get(f"{kind}_accuracy_std") or 0)
                         for r in ok if str(r.get("mode")) == mode and r.get(f"{kind}_accuracy") is not None)
            if pts:
                x, y, s = zip(*pts)
                ax.errorbar(x, y, yerr=s, marker="o", capsize=3, label=f"synthetic ({mode})")
        dp = sorted((pos[float(b["epsilon"])], b["accuracy"], b["accuracy_std"]) for b in baselines
                    if b["classifier"] == kind and b["baseline"] == "dp_on_real")
        if dp:
            x, y, s = zip(*dp)
            ax.errorbar(x, y, yerr=s, marker="s", linestyle="--", color="k", capsize=3, label="DP-on-real")
        for b in baselines:
            if b["classifier"] == kind and b["baseline"] == "real":
                ax.axhline(b["accuracy"], color="g", linestyle=":", label="real data (eps = inf)")
        ax.set_xticks(range(len(ticks)))
        ax.set_xticklabels(ticks)
        ax.set_xlim(-0.5, max(len(ticks) - 0.5, 0.5))
        ax.set_xlabel("target epsilon (nominal grid; each corpus's realised epsilon is in the table)")
        ax.set_ylabel("real-test accuracy")
        ax.set_title(f"{kind}: accuracy vs epsilon")
        ax.legend(fontsize=7)
        out.append((f"{kind}: accuracy vs epsilon", os.path.relpath(_fig_to_png(fig, os.path.join(pdir, f"accuracy_{kind}.png")), out_dir)))
    for i, p in enumerate(plots):
        if "lengths" in p:
            pl, ql, _ = p["lengths"]
            edges, hi = clipped_edges(pl, ql, len(p["lengths"][2]) - 1 if len(p["lengths"][2]) > 1 else 50)
            over = sum(1 for v in list(pl) + list(ql) if v > hi)
            fig, ax = plt.subplots(figsize=(5, 3))
            ax.hist(np.clip(ql, 0, hi), bins=edges, alpha=0.5, density=True, label="real test")
            ax.hist(np.clip(pl, 0, hi), bins=edges, alpha=0.5, density=True, label="synthetic train")
            ax.set_xlabel(f"characters (axis clipped at the {LENGTH_CLIP_PERCENTILE:g}th percentile, {hi:.0f};"
                          f" {over} longer texts counted in the last bin)", fontsize=7)
            ax.set_title(f"{p['corpus']}: length")
            ax.legend(fontsize=7)
            out.append((f"{p['corpus']}: length histogram", os.path.relpath(_fig_to_png(fig, os.path.join(pdir, f"length_{i}.png")), out_dir)))
    curves = [p for p in plots if "bigram_curve" in p]
    if curves:
        fig, ax = plt.subplots(figsize=(5, 4))
        for p in curves:
            c = np.asarray(p["bigram_curve"])
            ax.plot(c[:, 0], c[:, 1], marker=".", label=p["corpus"])
        ax.set_xlabel("exp(-c KL(real || R))")
        ax.set_ylabel("exp(-c KL(synthetic || R))")
        ax.set_title("bigram divergence frontiers")
        ax.legend(fontsize=6)
        out.append(("bigram frontiers", os.path.relpath(_fig_to_png(fig, os.path.join(pdir, "bigram_frontiers.png")), out_dir)))
    for kind in classifiers:
        fig, ax = plt.subplots(figsize=(5, 4))
        any_pts = False
        for p in plots:
            trials = (p.get("trials") or {}).get(kind)
            if trials:
                ax.scatter([t["valid_accuracy"] for t in trials], [t["real_test_accuracy"] for t in trials], s=12,
                           label=p["corpus"])
                any_pts = True
        ax.set_xlabel("synthetic-valid accuracy")
        ax.set_ylabel("real-test accuracy")
        ax.set_title(f"{kind}: ranking of hyperparameter trials")
        if any_pts:
            ax.legend(fontsize=6)
        out.append((f"{kind}: rank-correlation scatter", os.path.relpath(_fig_to_png(fig, os.path.join(pdir, f"ranking_{kind}.png")), out_dir)))
    return out


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return "inf" if math.isinf(v) else f"{v:.4g}"
    return html.escape(str(v))


SUMMARY_COLUMNS = ("corpus", "status", "private", "mode", "target_epsilon", "epsilon", "n_train", "invalid_rows", "mauve", "mauve_std",
                   "mauve_star", "unigram_mauve", "bigram_mauve", "length_mauve", "perplexity", *ngrams.DIVERSITY_FIELDS)


def verdict_html(verdicts: Sequence[Mapping[str, Any]], majority: Mapping[str, Any] | None) -> str:
    """The report's top section: the majority-class rates and one verdict line per corpus and classifier."""
    parts = ["<section id='verdict'><h2>Verdict: does the synthetic data beat DP-on-real?</h2>",
             "<p>Per corpus, at its epsilon, on the real test set: accuracy (balanced accuracy) of the classifier "
             "trained on the synthetic data vs the same classifier trained with DP on the real data vs trained on "
             "the real data without privacy. A corpus beats DP-on-real only when it is ahead on both.</p>"]
    if majority is not None:
        parts.append(f"<p class='majority'>For scale: {html.escape(verdict.majority_text(majority))}.</p>")
    if verdicts:
        parts.append("<ul class='verdicts'>")
        for v in verdicts:
            parts.append(f"<li class='verdict {html.escape(v['status'])}' data-verdict='{html.escape(v['status'])}'>"
                         f"{html.escape(v['line'])}</li>")
        parts.append("</ul>")
    else:
        parts.append("<p>No classifier was trained: no verdict.</p>")
    parts.append("</section>")
    return "".join(parts)


def write_html(rows: Sequence[dict], plots: Sequence[dict], baselines: Sequence[dict], images: Sequence[tuple[str, str]],
               out_dir: str, classifiers: Sequence[str], *, majority: Mapping[str, Any] | None = None,
               verdicts: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The HTML report (images referenced under plots/; each <img> flags itself when loaded).

    The verdict section (`verdict_html`: majority-class rates, a verdict line per corpus) comes
    first, before the wide metrics table; `verdicts` default to `verdict.corpus_verdicts`.
    """
    if verdicts is None:
        verdicts = verdict.corpus_verdicts(rows, baselines, classifiers)
    cols = list(SUMMARY_COLUMNS) + [c for k in classifiers for c in (
        f"{k}_accuracy", f"{k}_accuracy_std", f"{k}_balanced_accuracy", f"{k}_macro_f1",
        f"{k}_rank_spearman", f"{k}_rank_kendall", f"{k}_rank_rbo")]
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>dpsynth evaluation report</title>",
             "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;font-size:12px}"
             "td,th{border:1px solid #ccc;padding:3px 6px}.error{background:#fdd}.nonprivate{background:#ffe9c6}"
             ".card{display:inline-block;border:1px solid #999;margin:6px;padding:6px;vertical-align:top;font-size:12px}"
             ".verdict.beats{color:#075e00}.verdict.does_not_beat{color:#9b0000}.verdicts li{margin:3px 0}</style>",
             "</head><body><h1>dpsynth evaluation report</h1>",
             verdict_html(verdicts, majority),
             "<p>P = synthetic train, Q = real test. MAUVE / MAUVE* (KT-smoothed): higher is closer. "
             "Rows marked <span class='nonprivate'>NON-PRIVATE</span> have no privacy report; rows marked "
             "<span class='error'>error</span> could not be scored (reason given).</p>",
             "<h2>Metrics</h2><table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in cols) + "<th>error</th></tr>"]
    for r in rows:
        klass = "error" if r.get("status") != "ok" else ("nonprivate" if not r.get("private") else "")
        cells = []
        for c in cols:
            v = r.get(c)
            if c == "private" and v is False:
                v = "NON-PRIVATE"
            cells.append(f"<td>{_fmt(v)}</td>")
        parts.append(f"<tr class='{klass}'>" + "".join(cells) + f"<td>{_fmt(r.get('error'))}</td></tr>")
    parts.append("</table>")
    if baselines or majority is not None:
        parts.append("<h2>Baselines</h2><p>DP-on-real: epsilon spent by the whole sweep (every accountant) at the "
                     "delta shown; its non-DP side channels and privacy report are listed per row. Balanced accuracy "
                     "is the mean recall over the real test set's classes (chance = 1 / classes).</p>"
                     "<table><tr><th>baseline</th><th>classifier</th><th>epsilon</th><th>accuracy</th><th>std</th>"
                     "<th>balanced accuracy</th><th>macro-F1</th>"
                     "<th>epsilon spent</th><th>delta</th><th>sweep accounting</th><th>vocabulary</th>"
                     "<th>side channels</th><th>privacy report</th></tr>")
        for b in baselines:
            spent = b.get("epsilon_spent") or {}
            spent_s = ", ".join(f"{k.upper()} {_fmt(v)}" for k, v in spent.items()) or "-"
            channels = "; ".join(f"<b>{html.escape(c['name'])}</b>: {html.escape(c['detail'])}"
                                 for c in b.get("side_channels") or []) or "-"
            rep = b.get("privacy_report")
            link = f"<a href='{html.escape(rep)}'>{html.escape(rep)}</a>" if isinstance(rep, str) else "-"
            parts.append(f"<tr><td>{_fmt(b['baseline'])}</td><td>{_fmt(b['classifier'])}</td><td>{_fmt(b['epsilon'])}</td>"
                         f"<td>{_fmt(b['accuracy'])}</td><td>{_fmt(b['accuracy_std'])}</td>"
                         f"<td>{_fmt(b.get('balanced_accuracy'))}</td><td>{_fmt(b.get('macro_f1'))}</td><td>{spent_s}</td>"
                         f"<td>{_fmt(b.get('delta'))}</td><td>{_fmt(b.get('sweep_accounting'))}</td>"
                         f"<td>{_fmt(b.get('vocabulary'))}</td><td>{channels}</td><td>{link}</td></tr>")
        if majority is not None:
            parts.append(f"<tr class='majority'><td>majority class '{html.escape(str(majority['label']))}'</td><td>-</td>"
                         f"<td>-</td><td>{_fmt(majority['accuracy'])}</td><td>-</td><td>{_fmt(majority['balanced_accuracy'])}</td>"
                         f"<td>{_fmt(majority['macro_f1'])}</td><td colspan='6'>always answers the most frequent label "
                         "of the real test set (no training)</td></tr>")
        parts.append("</table>")
    parts.append("<h2>Plots</h2>")
    for title, rel in images:
        parts.append(f"<figure><img class='plot' src='{html.escape(rel)}' alt='{html.escape(title)}' "
                     "onload=\"this.dataset.loaded='1'\" onerror=\"this.dataset.loaded='0'\">"
                     f"<figcaption>{html.escape(title)}</figcaption></figure>")
    shown = [p for p in plots if p.get("examples")]
    if shown:
        parts.append("<h2>Synthetic examples</h2><p>The first few SYNTHETIC training examples of each label per corpus "
                     "(DP output). No real text appears in this report: it travels with the data.</p>")
        for p in shown:
            parts.append(f"<h3>{html.escape(p['corpus'])}</h3><table class='examples'><tr><th>label</th><th>synthetic text</th></tr>")
            for label, texts in p["examples"].items():
                for t in texts:
                    parts.append(f"<tr><td>{html.escape(label)}</td><td>{html.escape(t)}</td></tr>")
            parts.append("</table>")
    parts.append("<h2>Privacy and contamination cards</h2>")
    for p in plots:
        card = p.get("card")
        if card is None:
            continue
        title = p["corpus"] + ("" if card.get("private") else " (NON-PRIVATE: no privacy report)")
        parts.append(f"<div class='card'><b>{html.escape(title)}</b><table>")
        for k, v in card.items():
            parts.append(f"<tr><td>{html.escape(k)}</td><td>{_fmt(v)}</td></tr>")
        for k, v in (p.get("generation_report") or {}).items():
            parts.append(f"<tr><td>generation: {html.escape(k)}</td><td>{_fmt(v)}</td></tr>")
        parts.append("</table></div>")
    parts.append("<script>window.addEventListener('load',function(){var im=document.querySelectorAll('img.plot');"
                 "var ok=0;im.forEach(function(i){if(i.complete&&i.naturalWidth>0)ok++;});"
                 "document.body.setAttribute('data-plots-total',im.length);document.body.setAttribute('data-plots-loaded',ok);});"
                 "</script></body></html>")
    path = os.path.join(out_dir, REPORT_HTML)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))
    return path


def write_report(rows: Sequence[dict], plots: Sequence[dict], baselines: Sequence[dict], out_dir: str,
                 classifiers: Sequence[str], majority: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Tables, plots and HTML; returns their paths.

    `majority` (`majority_of(real test records)`) adds the majority-class predictor's scores to
    `metrics.json` and the report; the verdicts (`verdict.corpus_verdicts`) always go in.
    """
    rows = sorted(rows, key=lambda r: r["corpus"])
    plots = sorted(plots, key=lambda p: p["corpus"])
    baselines = write_baseline_reports(baselines, out_dir)
    verdicts = verdict.corpus_verdicts(rows, baselines, classifiers)
    jpath, cpath = write_tables(rows, baselines, out_dir, majority=majority, verdicts=verdicts)
    images = make_plots(rows, plots, baselines, out_dir, classifiers)
    hpath = write_html(rows, plots, baselines, images, out_dir, classifiers, majority=majority, verdicts=verdicts)
    return {"metrics_json": jpath, "metrics_csv": cpath, "report_html": hpath,
            "plots": [os.path.join(out_dir, rel) for _, rel in images]}


def majority_of(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The majority-class predictor's scores on labelled records (the real test set):
    {"label", "num_classes", "n_test", "accuracy", "balanced_accuracy", "macro_f1"}."""
    return scores.majority([str(r["label"]) for r in records]).as_dict()


def load_real(real_train: str, real_test: str, real_valid: str | None = None, *, max_dead_letters=0) -> RealData:
    """The real splits (`corpora.read_real`: at most `max_dead_letters` rejected records each)."""
    def read(path, name):
        return corpora.read_real(path, name, max_dead_letters=max_dead_letters)

    return RealData(read(real_train, "real train"), read(real_test, "real test"),
                    read(real_valid, "real valid") if real_valid else None)


def evaluate(synthetic_dirs: Sequence[str], real: RealData, out_dir: str, config: EvaluateConfig = EvaluateConfig()
             ) -> dict[str, Any]:
    """Scores every corpus in-process and writes the report (the Beam job does the same fanned out).

    Returns {"rows", "baselines", "paths", "majority" (the majority-class predictor's scores)}.
    """
    from dpsynth.progress import Progress

    if not synthetic_dirs:
        raise ValueError("no synthetic corpus given")
    scorer = Scorer(real, config)
    rows, plots = [], []
    with Progress(total=len(synthetic_dirs), desc="evaluate", unit="corpus", interval=30.0) as progress:
        for d in synthetic_dirs:
            row, plot = scorer.score_corpus(d)
            rows.append(row)
            plots.append(plot)
            progress.update(1)
    baselines = scorer.score_baselines()
    majority = majority_of(real.test)
    paths = write_report(rows, plots, baselines, out_dir, config.classifiers, majority=majority)
    return {"rows": rows, "baselines": baselines, "paths": paths, "majority": majority}


SMALL_CNN = cls_lib.WordCNNConfig(vocab_words=10_000, embed_dim=64, filters=64, hidden=64, max_len=128)


def config_from_flags(*, classifiers: str = "wordcnn", model_dir: str | None = None, pooling: str = "mean",
                      embedder: str = "auto", dp_epsilons: Sequence[float] = (), grid: str = "small", repeats: int = 3,
                      max_epochs: int = 10, cnn: str = "paper", mauve_max_buckets: int = 500, mauve_seeds: int = 3,
                      mauve_subsample: int | None = None, perplexity: bool = True,
                      real_baseline: bool = True, dp_sweep_accounting: str = "composed",
                      wordcnn_vocabulary: str = "auto", dp_delta: float | None = None,
                      dp_accountant: str = "rdp") -> EvaluateConfig:
    """An `EvaluateConfig` from command-line style values (used by the CLI and the demo)."""
    kinds = () if classifiers.strip() in ("", "none") else tuple(c.strip() for c in classifiers.split(",") if c.strip())
    lrs, wds = (tc.WIDE_LR_GRID, tc.WIDE_WD_GRID) if grid == "wide" else (tc.SMALL_LR_GRID, tc.SMALL_WD_GRID)
    return EvaluateConfig(
        classifiers=kinds, model_dir=model_dir, pooling=pooling, embedder=embedder, dp_epsilons=tuple(dp_epsilons),
        wordcnn=SMALL_CNN if cnn == "small" else cls_lib.WordCNNConfig(),
        mauve=mauve.MauveConfig(max_buckets=mauve_max_buckets), mauve_seeds=tuple(range(mauve_seeds)),
        mauve_subsample=mauve_subsample, perplexity=perplexity, real_baseline=real_baseline,
        dp_sweep_accounting=dp_sweep_accounting, wordcnn_vocabulary=wordcnn_vocabulary, dp_delta=dp_delta,
        dp_accountant=dp_accountant,
        sweep=tc.SweepConfig(learning_rates=lrs, weight_decays=wds, repeats=repeats,
                             train=tr.TrainConfig(max_epochs=max_epochs)))


def _num(v) -> str:
    v = verdict.as_float(v)
    return "-" if v is None else f"{v:.3f}"


def summary_table(result: Mapping[str, Any], classifiers: Sequence[str]) -> str:
    """A plain-text table: synthetic vs real vs DP-on-real accuracy (+- std over repeats), balanced
    accuracy and macro-F1 on the real test set, MAUVE, perplexity; with `result["majority"]`
    (as `evaluate` returns it) a majority-class row."""
    lines = []
    head = (f"{'source':<28} {'eps':>6} " + " ".join(f"{k + ' acc':>16} {'bal.acc':>7} {'mac.F1':>7}" for k in classifiers)
            + f" {'MAUVE':>14} {'MAUVE*':>7} {'ppl':>8}")
    lines.append(head)
    lines.append("-" * len(head))

    def acc(mean, std):
        return f"{mean:.3f}+-{std:.3f}" if mean is not None else "-"

    def cells(get, fill):
        return " ".join(f"{acc(*get(k, 'accuracy')) if fill(k) else '':>16} {_num(get(k, 'balanced_accuracy')[0]) if fill(k) else '':>7} "
                        f"{_num(get(k, 'macro_f1')[0]) if fill(k) else '':>7}" for k in classifiers)

    for r in sorted(result["rows"], key=lambda r: r["corpus"]):
        eps = r.get("epsilon")
        eps_s = "-" if eps is None else ("inf" if math.isinf(eps) else f"{eps:g}")
        name = r["corpus"] + ("" if r.get("private") else " (non-private)")
        if r.get("status") != "ok":
            lines.append(f"{name[:28]:<28} {eps_s:>6} ERROR: {r.get('error', '')[:80]}")
            continue
        accs = cells(lambda k, m: (r.get(f"{k}_{m}"), r.get(f"{k}_{m}_std")), lambda k: True)
        ppl = r.get("perplexity")
        lines.append(f"{name[:28]:<28} {eps_s:>6} {accs} {r['mauve']:.3f}+-{r['mauve_std']:.3f} {r['mauve_star']:>7.3f} "
                     f"{(f'{ppl:.2f}' if ppl else '-'):>8}")
    for b in result["baselines"]:
        eps_s = "inf" if math.isinf(b["epsilon"]) else f"{b['epsilon']:g}"
        row = cells(lambda k, m: (b.get(m), b.get(f"{m}_std")), lambda k: k == b["classifier"])
        name = "real data" if b["baseline"] == "real" else f"DP-on-real ({b.get('sweep_accounting', '?')})"
        lines.append(f"{name:<28} {eps_s:>6} {row}")
    majority = result.get("majority")
    if majority:
        row = cells(lambda k, m: (majority[m], 0.0), lambda k: True)
        lines.append(f"{('majority class ' + repr(str(majority['label'])))[:28]:<28} {'-':>6} {row}")
    return "\n".join(lines)


def plain_summary(metrics: Mapping[str, Any], test_labels: Sequence[str], classifier: str = "wordcnn") -> str:
    """How useful each synthetic corpus is, in measured numbers a user can act on.

    For each corpus: its classifier's real-test accuracy beside the majority-class rate of the
    real test set, the real-data and DP-on-real classifiers at the same epsilon, the share of
    the real-data gain over the majority rate that the synthetic data recovers, and its balanced
    accuracy (chance: 1 / classes) and macro-F1. Ends with the verdict per corpus
    (`verdict.corpus_verdict`: does it beat DP-on-real at its epsilon, on accuracy and balanced
    accuracy?). Only numbers from `metrics` (a `metrics.json`) and the test labels' counts; no
    real text.
    """
    if not test_labels:
        return "no test labels: cannot compare with the majority class"
    maj = scores.majority(test_labels)
    top, majority, chance = maj.label, maj.scores.accuracy, maj.scores.balanced_accuracy
    baselines = metrics.get("baselines") or []

    def base(which, eps=None):
        return verdict.find_baseline(baselines, which, classifier, eps)

    real_row = base("real")
    real = float(real_row["accuracy"]) if real_row else None
    lines = [f"How good is the synthetic data? ({classifier} trained on it, accuracy on {maj.n} real test "
             f"examples)", f"  always answering the majority class '{top}': {majority:.3f} (balanced accuracy "
             f"{chance:.3f} = 1/{maj.num_classes} classes: chance; macro-F1 {maj.scores.macro_f1:.3f})"]
    if real is not None:
        lines.append(f"  trained on the real training data (no privacy): {real:.3f} (balanced accuracy "
                     f"{_num(real_row.get('balanced_accuracy'))}, macro-F1 {_num(real_row.get('macro_f1'))})")
    for row in metrics.get("corpora") or []:
        acc = row.get(f"{classifier}_accuracy")
        if row.get("status") != "ok" or acc is None:
            lines.append(f"  {row.get('corpus')}: not scored ({row.get('error', row.get('status'))})")
            continue
        acc = float(acc)
        eps = nominal_epsilon(row)
        dp_row = base("dp_on_real", eps) if math.isfinite(eps) else None
        dp = float(dp_row["accuracy"]) if dp_row else None
        text = f"  synthetic {row.get('corpus')} (epsilon {eps:g}): {acc:.3f}, {100 * (acc - majority):+.1f} points vs majority"
        if dp is not None:
            text += f", {100 * (acc - dp):+.1f} vs DP-on-real ({dp:.3f})"
        if real is not None and real > majority:
            text += f"; recovers {100 * (acc - majority) / (real - majority):.0f}% of the real data's gain over majority"
        if row.get("mauve") is not None:
            text += f"; MAUVE {float(row['mauve']):.3f} (1 = indistinguishable from real)"
        lines.append(text)
        bal = verdict.as_float(row.get(f"{classifier}_balanced_accuracy"))
        if bal is not None:
            lines.append(f"    balanced accuracy {bal:.3f} ({100 * (bal - chance):+.1f} points vs chance {chance:.3f}), "
                         f"macro-F1 {_num(row.get(f'{classifier}_macro_f1'))}")
        verdict_text = ("carries label signal a classifier can use" if acc >= majority + 0.05 else
                        "does NOT beat answering the majority class by 5 points: not yet useful for training")
        lines.append(f"    -> this synthetic data {verdict_text}")
    rows = metrics.get("corpora") or []
    if rows:
        lines.append(f"Verdict ({classifier}, accuracy (balanced accuracy) on the real test set: synthetic vs "
                     "DP-on-real vs real, at each corpus's epsilon):")
        lines += [f"  {v['line']}" for v in verdict.corpus_verdicts(rows, baselines, [classifier])]
    return "\n".join(lines)


def classifiers_in(metrics: Mapping[str, Any]) -> list[str]:
    """The classifiers with results in `metrics` (a `metrics.json`), in `registry.names()` order."""
    keys = {k for r in metrics.get("corpora") or [] for k in r} | {
        f"{b.get('classifier')}_accuracy" for b in metrics.get("baselines") or []}
    return [k for k in registry.names() if f"{k}_accuracy" in keys]


def report_summary(out_dir: str, test_labels: Sequence[str]) -> str:
    """`plain_summary` of the report in `out_dir` for every classifier it holds (`make demo`, `dpsynth evaluate`)."""
    import json

    path = os.path.join(out_dir, METRICS_JSON)
    if not os.path.exists(path):  # e.g. an evaluate stage cached by an older dpsynth
        return f"(no plain summary: {path} does not exist; rerun the evaluate stage to get one)"
    with open(path, encoding="utf-8") as f:
        metrics = json.load(f)
    kinds = classifiers_in(metrics)
    if not kinds:
        return "(no plain summary: no downstream classifier was trained)"
    return "\n\n".join(plain_summary(metrics, test_labels, k) for k in kinds)
