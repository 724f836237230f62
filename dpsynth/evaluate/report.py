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

Modules: `scoring` (`EvaluateConfig`, `Scorer`: metrics rows), `tables` (`metrics.json`,
`metrics.csv`, plain-text summaries), `plots` (PNGs), `html_report` (`report.html`); this
module runs them in-process (`evaluate`) and writes every output (`write_report`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from dpsynth.evaluate import verdict
from dpsynth.evaluate.html_report import write_html
from dpsynth.evaluate.plots import make_plots
from dpsynth.evaluate.scoring import EvaluateConfig, RealData, Scorer, majority_of
from dpsynth.evaluate.tables import write_baseline_reports, write_tables


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


def evaluate(synthetic_dirs: Sequence[str], real: RealData, out_dir: str, config: EvaluateConfig = EvaluateConfig()
             ) -> dict[str, Any]:
    """Scores every corpus in-process and writes the report (the Beam job does the same fanned out).

    Returns {"rows", "baselines", "paths", "majority" (the majority-class predictor's scores)}.
    """
    from dpsynth.progress import Progress

    if not synthetic_dirs:
        raise ValueError("no synthetic corpus given")
    scorer = Scorer(real, config, reuse_identical=True)  # (a DP selection's output: its winner's scores)
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
