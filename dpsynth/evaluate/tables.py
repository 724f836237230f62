"""The evaluation's tables: `metrics.json`, `metrics.csv`, the baselines' privacy reports, and the
plain-text summaries read back from them.

`metrics.json` (format "dpsynth.metrics", version 1): {"format", "format_version", "corpora":
one row per corpus, "baselines": one row per baseline, and when given "majority" (the
majority-class predictor's scores) and "verdicts" (one per corpus and classifier,
`dpsynth.evaluate.verdict`)}; infinite numbers are written as "inf" / "-inf", NaN as null.
`metrics.csv` has one row per corpus, the union of the rows' keys as columns. Each DP-on-real
baseline's privacy report goes to `baselines/<baseline>-<classifier>-eps<epsilon>/`
(`baseline_dir`). `summary_table`, `plain_summary` and `report_summary` are the text a user
reads on the terminal.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dpsynth import fileio
from dpsynth.evaluate import registry, scores, verdict
from dpsynth.evaluate.verdict import nominal_epsilon

METRICS_JSON, METRICS_CSV = "metrics.json", "metrics.csv"


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
    with fileio.open_atomic(cpath, newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        for r in rows:
            w.writerow({k: _json_value(r.get(k)) for k in columns})
    return jpath, cpath


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
