"""The evaluation report's HTML page, `OUT/report.html` (plots referenced under `plots/`).

Sections, in order: the verdicts (`verdict_html`: the majority-class rates and one line per
corpus and classifier: does it beat DP-on-real?), the metrics table (`SUMMARY_COLUMNS` plus
each classifier's columns; error rows and NON-PRIVATE rows marked), the baselines, the plots
(each <img> records whether it loaded), the first SYNTHETIC examples per label (never real
text) and a privacy / contamination card per corpus.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from dpsynth import fileio
from dpsynth.evaluate import ngrams, verdict

REPORT_HTML = "report.html"


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
    fileio.write_text(path, "\n".join(parts))
    return path
