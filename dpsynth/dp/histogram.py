"""The Gaussian mechanism on a label histogram (used for DP label proportions in generation).

Formal guarantee: under add-or-remove-one adjacency one example changes exactly one label
count by 1, so the count vector has L2 sensitivity 1. Releasing `counts + N(0, sigma^2 I)`
is the Gaussian mechanism with noise multiplier sigma, whose privacy loss is exactly
`dp_accounting.GaussianDpEvent(sigma)` (`histogram_event`); clipping negatives to 0 and
normalising are post-processing. The noise comes from the OS entropy pool unless a seed is
given (tests only). Its cost must be composed with the tuning ledger
(`dpsynth.dp.report.compose_gaussian`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import dp_accounting
import numpy as np

from dpsynth.dp.accounting import (
    MAX_NOISE_MULTIPLIER,
    MIN_NOISE_MULTIPLIER,
    PrivacyConfigError,
    check_delta,
    check_epsilon,
    make_accountant,
)

# The label histogram's default noise multiplier: what `dpsynth select --label-source` draws when
# the model reserved no other sigma, and what `dpsynth dp-tune --reserve-label-noise-multiplier`
# suggests (`reserved_entry`). At sigma 30 a count is off by about 30 examples, negligible for
# a D_train of thousands of examples per label.
DEFAULT_NOISE_MULTIPLIER = 30.0
RESERVED_NAME = "reserved: a DP label histogram of D_train after the tuning"


def reserved_entry(noise_multiplier: float) -> dict:
    """The ledger entry a tuning run reserves for the later DP label histogram of D_train at sigma
    `noise_multiplier` (`dpsynth select --label-source`, the experiment's `labels` stage): one Gaussian
    mechanism of L2 sensitivity 1, as `dpsynth.dp.report.compose_gaussian` will record it.
    `dpsynth.dp.plan.plan_privacy(reserved=...)` calibrates the tuning's sigma on the run composed
    with it, so that the model and a histogram drawn at this sigma (or more) meet the target."""
    return {"mechanism": "gaussian", "name": RESERVED_NAME, "noise_multiplier": _check_sigma(noise_multiplier),
            "count": 1}


def _check_sigma(noise_multiplier: float) -> float:
    if not noise_multiplier > 0:
        raise PrivacyConfigError(f"the label histogram's noise multiplier must be > 0, got {noise_multiplier}")
    return float(noise_multiplier)


def histogram_event(noise_multiplier: float) -> dp_accounting.DpEvent:
    """The `DpEvent` of one release of the label histogram with noise multiplier sigma."""
    return dp_accounting.GaussianDpEvent(_check_sigma(noise_multiplier))


def calibrate_histogram_noise(epsilon: float, delta: float, accountant: str = "pld") -> float:
    """The smallest sigma for which the histogram release alone is (epsilon, delta)-DP."""
    check_epsilon(epsilon)
    check_delta(delta)
    return float(
        dp_accounting.calibrate_dp_mechanism(
            lambda: make_accountant(accountant),
            dp_accounting.GaussianDpEvent,
            float(epsilon),
            float(delta),
            dp_accounting.ExplicitBracketInterval(MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER),
            tol=1e-4,
        )
    )


def noisy_label_counts(
    example_labels: Sequence[str], labels: Sequence[str], *, noise_multiplier: float, seed: int | None = None
) -> np.ndarray:
    """Per-label counts of `example_labels` plus N(0, sigma^2), clipped at 0, in `labels` order.

    Raises:
      ValueError: an example carries a label outside `labels` (names the labels).
    """
    sigma = _check_sigma(noise_multiplier)
    labels = [str(l) for l in labels]
    counts = Counter(str(l) for l in example_labels)
    unknown = sorted(set(counts) - set(labels))
    if unknown:
        raise ValueError(f"training data has label(s) {unknown} outside the label set {labels}")
    raw = np.array([counts.get(l, 0) for l in labels], np.float64)
    noisy = np.maximum(raw + np.random.default_rng(seed).normal(0.0, sigma, size=raw.shape), 0.0)
    return noisy
