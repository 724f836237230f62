"""Which label each synthetic example is conditioned on (its prompt: `dpsynth.train.prompts`).

Two label distributions:
  * uniform over the label set (default): uses nothing from the private data, so it costs no
    privacy;
  * proportional to a DP label histogram: the Gaussian mechanism on the per-label counts of
    D_train, implemented in `dpsynth.dp.histogram` (only `dpsynth.dp` adds noise). Its cost
    is a `GaussianDpEvent` that must be composed with the tuning ledger; the raw counts are
    never used or stored.

Formal guarantee (DP label histogram): under add-or-remove-one adjacency, one example changes
exactly one label count by 1, so the count vector has L2 sensitivity 1. Releasing
`counts + N(0, sigma^2 I)` is the Gaussian mechanism with noise multiplier `sigma`, i.e. the
`dp_accounting.GaussianDpEvent(sigma)`; clipping negatives to 0 and normalising are
post-processing. The noise comes from the OS entropy pool unless a seed is given (tests only).

Label assignment is exact and deterministic: with weights p and n examples, label l gets
`floor(n p_l)` examples plus one of the remaining `n - sum floor(n p)` in order of largest
fractional part (largest-remainder rounding), and the resulting list is shuffled with a
seeded generator, so shards see a mixed, reproducible sequence of labels.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dpsynth.errors import DpsynthError


class LabelError(DpsynthError, ValueError):
    """Unknown labels, empty label sets or a bad label distribution."""


@dataclasses.dataclass(frozen=True)
class LabelDistribution:
    """The distribution synthetic labels are drawn in proportion to.

    Attributes:
      labels: the label names, in a fixed order.
      weights: one probability per label (sums to 1).
      source: "uniform" or "dp_histogram".
      noise_multiplier: sigma of the Gaussian mechanism (sensitivity 1); None for uniform.
      noisy_counts: the released noisy counts (post-processed: clipped at 0); None for uniform.
      run: the draw's run id (`dpsynth.dp.ledger.new_run_id`): every corpus generated with this
        draw composes the same ledger entry, counted once by a selection among them; None for
        uniform (and for draws saved before run ids: each use is then counted as a new release).
    """

    labels: tuple[str, ...]
    weights: tuple[float, ...]
    source: str = "uniform"
    noise_multiplier: float | None = None
    noisy_counts: tuple[float, ...] | None = None
    run: str | None = None

    def __post_init__(self):
        if not self.labels:
            raise LabelError("the label set is empty")
        if len(set(self.labels)) != len(self.labels):
            raise LabelError(f"duplicate labels in {list(self.labels)}")
        if len(self.weights) != len(self.labels):
            raise LabelError(f"{len(self.labels)} labels but {len(self.weights)} weights")
        if any(w < 0 or not math.isfinite(w) for w in self.weights) or abs(sum(self.weights) - 1.0) > 1e-6:
            raise LabelError(f"label weights must be >= 0 and sum to 1, got {list(self.weights)}")
        if self.source not in ("uniform", "dp_histogram"):
            raise LabelError(f"unknown label distribution source {self.source!r}")

    @property
    def private_cost(self) -> bool:
        return self.source == "dp_histogram"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "LabelDistribution":
        """The inverse of `to_json` (JSON lists back to tuples); validates like the constructor."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def uniform(labels: Sequence[str]) -> LabelDistribution:
    """Uniform over `labels` (no privacy cost)."""
    labels = tuple(str(l) for l in labels)
    return LabelDistribution(labels=labels, weights=tuple(1.0 / len(labels) for _ in labels) if labels else ())


def check_labels(requested: Sequence[str], known: Sequence[str] | None, where: str) -> tuple[str, ...]:
    """Returns `requested` as a tuple; raises `LabelError` naming any label not in `known`."""
    requested = tuple(str(l) for l in requested)
    if not requested:
        raise LabelError(f"{where}: no labels given")
    if len(set(requested)) != len(requested):
        raise LabelError(f"{where}: duplicate labels in {list(requested)}")
    if known is not None:
        unknown = [l for l in requested if l not in set(known)]
        if unknown:
            raise LabelError(f"{where}: unknown label(s) {unknown}; the model was tuned on labels {list(known)}")
    return requested


def histogram_event(noise_multiplier: float):
    """The `DpEvent` of one release of the label histogram (see `dpsynth.dp.histogram`)."""
    from dpsynth.dp import histogram

    try:
        return histogram.histogram_event(noise_multiplier)
    except ValueError as e:
        raise LabelError(str(e)) from e


def calibrate_histogram_noise(epsilon: float, delta: float, accountant: str = "pld") -> float:
    """The smallest sigma for which the histogram release alone is (epsilon, delta)-DP."""
    from dpsynth.dp import histogram

    return histogram.calibrate_histogram_noise(epsilon, delta, accountant)


def dp_label_histogram(
    example_labels: Sequence[str],
    labels: Sequence[str],
    *,
    noise_multiplier: float,
    seed: int | None = None,
) -> LabelDistribution:
    """A label distribution from the Gaussian mechanism on the label counts of D_train.

    The noise is added by `dpsynth.dp.histogram.noisy_label_counts` (only `dpsynth.dp` adds
    noise); this function only post-processes the released counts into weights.

    Args:
      example_labels: the label of every training example (private; only counted).
      labels: the label set (an example with another label is an error).
      noise_multiplier: sigma (> 0); noise N(0, sigma^2) per count (sensitivity 1).
      seed: noise seed for tests only; None draws from the OS entropy pool.

    Returns:
      A `LabelDistribution` with source "dp_histogram"; if every noisy count is <= 0 the
      weights are uniform (post-processing).
    """
    from dpsynth.dp import histogram
    from dpsynth.dp.ledger import new_run_id

    labels = tuple(str(l) for l in labels)
    try:
        noisy = histogram.noisy_label_counts(example_labels, labels, noise_multiplier=noise_multiplier, seed=seed)
    except ValueError as e:
        raise LabelError(str(e)) from e
    total = noisy.sum()
    weights = noisy / total if total > 0 else np.full(len(labels), 1.0 / len(labels))
    return LabelDistribution(
        labels=labels,
        weights=tuple(float(w) for w in weights),
        source="dp_histogram",
        noise_multiplier=float(noise_multiplier),
        noisy_counts=tuple(float(c) for c in noisy),
        run=new_run_id(),
    )


def label_counts(n: int, distribution: LabelDistribution) -> dict[str, int]:
    """Exact counts per label for `n` examples (largest-remainder rounding; ties by order)."""
    if n < 0:
        raise LabelError(f"number of examples must be >= 0, got {n}")
    w = np.asarray(distribution.weights, np.float64)
    exact = n * w
    base = np.floor(exact + 1e-9).astype(np.int64)
    rest = n - int(base.sum())
    order = sorted(range(len(w)), key=lambda i: (-(exact[i] - base[i]), i))
    for i in order[:rest]:
        base[i] += 1
    return {l: int(c) for l, c in zip(distribution.labels, base)}


def assign_labels(n: int, distribution: LabelDistribution, seed: int) -> list[str]:
    """The label of each of `n` examples: exact counts (`label_counts`), shuffled by `seed`."""
    counts = label_counts(n, distribution)
    ids = np.concatenate([np.full(c, i, np.int32) for i, c in enumerate(counts.values())] or [np.zeros(0, np.int32)])
    np.random.default_rng(seed).shuffle(ids)
    return [distribution.labels[i] for i in ids]


def label_balance(labels: Sequence[str], expected: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Counts and fractions per label (and the expected fractions when given)."""
    counts = Counter(labels)
    n = max(len(labels), 1)
    out: dict[str, Any] = {"counts": dict(sorted(counts.items())), "fractions": {k: v / n for k, v in sorted(counts.items())}}
    if expected is not None:
        out["expected_fractions"] = dict(expected)
    return out
