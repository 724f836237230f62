"""Does a synthetic corpus beat DP-on-real? One plain verdict per corpus and classifier.

The question a user of dpsynth asks first: at the epsilon this corpus was generated for, does a
classifier trained on it beat the same classifier trained with DP directly on the real data? A
verdict compares, on the real test set, the synthetic corpus's classifier with the DP-on-real
baseline at the corpus's nominal epsilon (`nominal_epsilon`: its target, so 2.9995 meets
the baseline at 3) and with the real-data classifier, on accuracy AND balanced accuracy. The
corpus "beats DP-on-real" only when it is ahead on both; on a skewed test set accuracy alone can
be won by answering the majority class. Where no DP-on-real baseline exists at that epsilon (or
the corpus is non-private), the verdict says so instead of guessing.

The same rows feed the HTML report's top section, `metrics.json` ("verdicts") and the plain
summaries (`dpsynth evaluate`, `make demo`). Inputs are metrics rows in memory or as read back
from `metrics.json` (infinite epsilon written as "inf").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

# Verdict statuses.
BEATS, DOES_NOT_BEAT, NO_DP_BASELINE, NOT_SCORED = "beats", "does_not_beat", "no_dp_on_real", "not_scored"


def as_float(v) -> float | None:
    """A number from a metrics value ("inf" strings included); None when absent or not a number."""
    if v is None or isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def nominal_epsilon(row: Mapping[str, Any]) -> float:
    """The epsilon a corpus was asked for (`target_epsilon`), else its realised one; inf if non-private."""
    for key in ("target_epsilon", "epsilon"):
        v = as_float(row.get(key))
        if v is not None:
            return v
    return math.inf


def find_baseline(baselines: Sequence[Mapping[str, Any]], which: str, classifier: str,
                  epsilon: float | None = None) -> Mapping[str, Any] | None:
    """The first baseline row of kind `which` ("real" | "dp_on_real") for `classifier` (at `epsilon`)."""
    for b in baselines:
        if b.get("baseline") == which and b.get("classifier") == classifier and (
                epsilon is None or as_float(b.get("epsilon")) == epsilon):
            return b
    return None


def eps_text(eps: float) -> str:
    return "inf" if math.isinf(eps) else f"{eps:g}"


def _pair(acc: float | None, bal: float | None, *, label: bool) -> str:
    if acc is None:
        return "-"
    if bal is None:
        return f"{acc:.3f} (balanced -)" if label else f"{acc:.3f} (-)"
    return f"{acc:.3f} (balanced {bal:.3f})" if label else f"{acc:.3f} ({bal:.3f})"


def _ahead(synthetic: float | None, dp: float | None) -> bool | None:
    if synthetic is None or dp is None:
        return None
    return synthetic > dp


def corpus_verdict(row: Mapping[str, Any], baselines: Sequence[Mapping[str, Any]], classifier: str) -> dict[str, Any]:
    """The verdict of one corpus row for `classifier`.

    Returns a dict: corpus, classifier, epsilon (nominal; None for a row that was not scored),
    mode, status (`BEATS`, `DOES_NOT_BEAT`, `NO_DP_BASELINE`, `NOT_SCORED`), beats_dp_on_real
    (True / False / None when there is nothing to compare with), {synthetic, dp_on_real,
    real}_{accuracy, balanced_accuracy} (None when absent) and line (the sentence shown).
    """
    name = str(row.get("corpus"))
    out: dict[str, Any] = {"corpus": name, "classifier": classifier, "epsilon": None, "mode": row.get("mode")}
    syn_acc = as_float(row.get(f"{classifier}_accuracy"))
    if row.get("status") != "ok" or syn_acc is None:
        reason = row.get("error") or (row.get("status") if row.get("status") != "ok" else f"no {classifier} classifier")
        return {**out, "status": NOT_SCORED, "beats_dp_on_real": None, "line": f"{name}: not scored ({reason})"}
    eps = nominal_epsilon(row)
    syn_bal = as_float(row.get(f"{classifier}_balanced_accuracy"))
    dp = find_baseline(baselines, "dp_on_real", classifier, eps) if math.isfinite(eps) else None
    real = find_baseline(baselines, "real", classifier)
    dp_acc, dp_bal = (as_float(dp.get("accuracy")), as_float(dp.get("balanced_accuracy"))) if dp else (None, None)
    real_acc, real_bal = (as_float(real.get("accuracy")), as_float(real.get("balanced_accuracy"))) if real else (None, None)
    out.update(epsilon=eps, synthetic_accuracy=syn_acc, synthetic_balanced_accuracy=syn_bal, dp_on_real_accuracy=dp_acc,
               dp_on_real_balanced_accuracy=dp_bal, real_accuracy=real_acc, real_balanced_accuracy=real_bal)
    head = f"{name}: eps {eps_text(eps)}" + (f", {row['mode']}" if row.get("mode") else "") + f", {classifier}"
    syn = f"synthetic {_pair(syn_acc, syn_bal, label=True)}"
    real_s = f" vs real {_pair(real_acc, real_bal, label=False)}" if real_acc is not None else " vs real (not run)"
    if dp_acc is None:
        why = "non-private corpus" if not math.isfinite(eps) else "not run"
        line = (f"{head}: {syn}{real_s}: no DP-on-real baseline at eps {eps_text(eps)} ({why}): "
                "cannot say whether it beats DP-on-real")
        return {**out, "status": NO_DP_BASELINE, "beats_dp_on_real": None, "line": line}
    on_acc, on_bal = _ahead(syn_acc, dp_acc), _ahead(syn_bal, dp_bal)
    beats = bool(on_acc) and on_bal is not False  # both when both are known
    if beats:
        tail = "beats DP-on-real" + (" (on accuracy; balanced accuracy not recorded)" if on_bal is None else "")
    elif on_acc and on_bal is False:
        tail = "does NOT beat DP-on-real (ahead on accuracy, not on balanced accuracy)"
    elif not on_acc and on_bal:
        tail = "does NOT beat DP-on-real (ahead on balanced accuracy, not on accuracy)"
    else:
        tail = "does NOT beat DP-on-real"
    line = f"{head}: {syn} vs DP-on-real {_pair(dp_acc, dp_bal, label=False)}{real_s}: {tail}"
    return {**out, "status": BEATS if beats else DOES_NOT_BEAT, "beats_dp_on_real": beats, "line": line}


def corpus_verdicts(rows: Sequence[Mapping[str, Any]], baselines: Sequence[Mapping[str, Any]],
                    classifiers: Sequence[str]) -> list[dict[str, Any]]:
    """`corpus_verdict` of every row (sorted by corpus) for every classifier, in that order."""
    return [corpus_verdict(r, baselines, k) for r in sorted(rows, key=lambda r: str(r.get("corpus")))
            for k in classifiers]


def majority_text(majority: Mapping[str, Any]) -> str:
    """One sentence on the majority-class predictor (`scores.Majority.as_dict()`)."""
    return (f"always answering the majority class '{majority['label']}': accuracy {majority['accuracy']:.3f}, "
            f"balanced accuracy {majority['balanced_accuracy']:.3f} (= 1/{majority['num_classes']} classes, chance), "
            f"macro-F1 {majority['macro_f1']:.3f}")
