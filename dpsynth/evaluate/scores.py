"""Classification scores of a downstream classifier on a labelled set, from its predictions.

Three numbers, computed here and nowhere else (every trial, baseline, report column and summary
reads them from `classification_scores`):

- accuracy: the share of correct predictions (`correct / n`, exactly as before this module).
- balanced accuracy: the mean per-class recall over the classes present in the true labels
  (scikit-learn's `balanced_accuracy_score`). Chance, and the majority-class predictor, score
  1 / K on a set with K classes, whatever the class balance: on a 73%-positive test set
  accuracy 0.73 can mean "no signal", balanced accuracy 0.5 says so.
- macro-F1: the unweighted mean over classes of F1 = 2 TP / (2 TP + FP + FN), over the classes
  that occur in the true or the predicted labels (scikit-learn's `f1_score(average="macro")`;
  such a class never has a zero denominator).

Labels are integer class ids (`classifiers.LabelMap.encode`); the scores are checked against
scikit-learn on random predictions (tests/evaluate/test_scores.py).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

import numpy as np

# The score names, in table order; a test set's column is "<test name>_<score>".
METRICS = ("accuracy", "balanced_accuracy", "macro_f1")


@dataclasses.dataclass(frozen=True)
class ClassificationScores:
    """Accuracy, balanced accuracy and macro-F1 of one classifier on one labelled set."""

    accuracy: float
    balanced_accuracy: float
    macro_f1: float

    def as_dict(self) -> dict[str, float]:
        """{score name: value} in `METRICS` order."""
        return {m: getattr(self, m) for m in METRICS}


def _as_labels(y) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"labels must be one-dimensional, got shape {y.shape}")
    if y.dtype.kind not in "iu" and y.size:
        raise ValueError(f"labels must be integer class ids, got dtype {y.dtype}")
    return y.astype(np.int64)


def accuracy(y_true, y_pred) -> float:
    """The share of correct predictions, `correct / n` (integer count, one division)."""
    t, p = _as_labels(y_true), _as_labels(y_pred)
    if t.shape != p.shape or t.size == 0:
        raise ValueError(f"need as many predictions as labels (> 0), got {p.shape} and {t.shape}")
    return int((t == p).sum()) / len(t)


def classification_scores(y_true, y_pred) -> ClassificationScores:
    """Accuracy, balanced accuracy and macro-F1 of predictions `y_pred` for labels `y_true`.

    Args:
      y_true: integer class ids [N] (N > 0).
      y_pred: predicted class ids [N].

    Returns:
      `ClassificationScores`; balanced accuracy over the classes present in `y_true`, macro-F1
      over the classes present in `y_true` or `y_pred`.
    """
    acc = accuracy(y_true, y_pred)
    t, p = _as_labels(y_true), _as_labels(y_pred)
    classes = np.union1d(t, p)
    # Confusion counts per class of the union: true positives, true counts, predicted counts.
    ti, pi = np.searchsorted(classes, t), np.searchsorted(classes, p)
    k = len(classes)
    tp = np.bincount(ti[t == p], minlength=k).astype(np.float64)
    support = np.bincount(ti, minlength=k).astype(np.float64)
    predicted = np.bincount(pi, minlength=k).astype(np.float64)
    present = support > 0
    balanced = float(np.mean(tp[present] / support[present]))
    # 2TP + FP + FN = support + predicted > 0 for every class of the union.
    f1 = 2.0 * tp / (support + predicted)
    return ClassificationScores(acc, balanced, float(np.mean(f1)))


@dataclasses.dataclass(frozen=True)
class Majority:
    """The majority-class predictor on a labelled set: always answer `label` (the most frequent,
    ties to the first in sorted order). Its balanced accuracy is 1 / num_classes."""

    label: str
    num_classes: int
    n: int
    scores: ClassificationScores

    def as_dict(self) -> dict:
        return {"label": self.label, "num_classes": self.num_classes, "n_test": self.n, **self.scores.as_dict()}


def majority(labels: Sequence) -> Majority:
    """The majority-class predictor's scores on `labels` (label names, any hashable)."""
    names = [str(x) for x in labels]
    if not names:
        raise ValueError("no labels: the majority class is undefined")
    counts = Counter(names)
    top, _ = max(sorted(counts.items()), key=lambda kv: kv[1])
    classes = sorted(counts)
    ids = np.searchsorted(np.asarray(classes), np.asarray(names))
    pred = np.full(len(names), classes.index(top))
    return Majority(top, len(classes), len(names), classification_scores(ids, pred))
