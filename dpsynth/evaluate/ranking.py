"""Hyperparameter-ranking study: does synthetic-valid accuracy rank trials like real-test accuracy?

For a sweep of T trials with scores on synthetic valid (the selection signal available to a
user of the synthetic data) and on real test (the truth), report Spearman's rho and Kendall's
tau (scipy), the rank-biased overlap (Webber et al. 2010, extrapolated RBO_ext) with p chosen so
that 85% of the weight lies on the top 25% of the ranking, and the mean and standard deviation
of the real-test scores of the top-25% trials by the selection signal (and of any further
real-test scores of the trials, e.g. balanced accuracy and macro-F1). The same numbers with
real-valid as the signal are the upper bound a user with real validation data would get.

Ties are broken by trial order (stable sort), so the ranking is deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import optimize, stats

TOP_FRACTION = 0.25
TOP_WEIGHT = 0.85


def rbo_top_weight(p: float, depth: int) -> float:
    """Weight RBO puts on the top `depth` ranks (Webber et al. 2010, eq. 21)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    d = int(depth)
    if d < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    tail = sum(p**i / i for i in range(1, d))
    return 1.0 - p ** (d - 1) + (1.0 - p) / p * d * (math.log(1.0 / (1.0 - p)) - tail)


def rbo_p_for(num_items: int, top_fraction: float = TOP_FRACTION, top_weight: float = TOP_WEIGHT) -> float:
    """The persistence p such that `top_weight` of RBO's weight is on the top `top_fraction` ranks.

    The depth is `ceil(top_fraction * num_items)`; p is found by Brent's method (the top weight
    decreases monotonically in p).
    """
    if num_items < 1 or not 0 < top_fraction <= 1 or not 0 < top_weight < 1:
        raise ValueError(f"invalid num_items={num_items}, top_fraction={top_fraction}, top_weight={top_weight}")
    depth = max(1, math.ceil(top_fraction * num_items))
    lo, hi = 1e-9, 1 - 1e-9
    f = lambda p: rbo_top_weight(p, depth) - top_weight  # noqa: E731
    if f(lo) < 0:  # even p -> 0 (all weight on rank 1) is below the target: cannot happen for depth >= 1
        return lo
    return float(optimize.brentq(f, lo, hi, xtol=1e-12))


def ranking(scores: Sequence[float]) -> list[int]:
    """Trial indices by decreasing score, ties by index."""
    scores = np.asarray(scores, dtype=np.float64)
    return [int(i) for i in np.argsort(-scores, kind="stable")]


def rbo(s: Sequence, t: Sequence, p: float) -> float:
    """Extrapolated rank-biased overlap RBO_ext of two rankings (lists of items, best first)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if len(s) != len(t) or not s:
        raise ValueError("rankings must be non-empty and of equal length")
    k = len(s)
    seen_s, seen_t, overlap, total = set(), set(), 0, 0.0
    for d in range(1, k + 1):
        a, b = s[d - 1], t[d - 1]
        if a == b:
            overlap += 1
        else:
            overlap += (a in seen_t) + (b in seen_s)
        seen_s.add(a)
        seen_t.add(b)
        total += overlap / d * p**d
    return float((1 - p) / p * total + (overlap / k) * p**k)


def _top_stats(signal: np.ndarray, truth: np.ndarray, top_fraction: float) -> tuple[float, float]:
    n_top = max(1, math.ceil(top_fraction * len(signal)))
    top = np.argsort(-signal, kind="stable")[:n_top]
    return float(truth[top].mean()), float(truth[top].std())


def _study(signal: np.ndarray, truth: np.ndarray, p: float, top_fraction: float,
           extra: Mapping[str, np.ndarray]) -> dict[str, float]:
    out = {"rbo": rbo(ranking(signal), ranking(truth), p)}
    if np.ptp(signal) == 0 or np.ptp(truth) == 0:  # correlation undefined for constant scores
        out["spearman"], out["kendall"] = float("nan"), float("nan")
    else:
        out["spearman"] = float(stats.spearmanr(signal, truth).statistic)
        out["kendall"] = float(stats.kendalltau(signal, truth).statistic)
    out["top_mean"], out["top_std"] = _top_stats(signal, truth, top_fraction)
    for name, values in extra.items():
        out[f"top_{name}_mean"], out[f"top_{name}_std"] = _top_stats(signal, values, top_fraction)
    return out


def ranking_study(synthetic_valid: Sequence[float], real_test: Sequence[float],
                  real_valid: Sequence[float] | None = None, top_fraction: float = TOP_FRACTION,
                  top_weight: float = TOP_WEIGHT,
                  real_test_scores: Mapping[str, Sequence[float]] | None = None) -> dict[str, float]:
    """Ranking metrics of a sweep; keys `spearman, kendall, rbo, top_mean, top_std, rbo_p`, and
    the same with an `upper_` prefix (real valid as the signal) when `real_valid` is given.
    Correlations of constant scores are NaN (undefined), never a made-up number.

    `real_test_scores` ({name: per-trial real-test score}, e.g. "balanced_accuracy") adds
    `top_<name>_mean` / `top_<name>_std` (and their `upper_` versions): the same top-25% trials
    (still chosen by the signal, i.e. by accuracy), scored by that measure.
    """
    sv, rt = np.asarray(synthetic_valid, np.float64), np.asarray(real_test, np.float64)
    if sv.shape != rt.shape or sv.ndim != 1 or len(sv) < 2:
        raise ValueError(f"need >= 2 trials with both scores, got shapes {sv.shape} and {rt.shape}")
    extra = {name: np.asarray(v, np.float64) for name, v in (real_test_scores or {}).items()}
    for name, v in extra.items():
        if v.shape != rt.shape:
            raise ValueError(f"real_test_scores[{name!r}] has shape {v.shape}, expected {rt.shape}")
    p = rbo_p_for(len(sv), top_fraction, top_weight)
    out = {"num_trials": len(sv), "rbo_p": p, **_study(sv, rt, p, top_fraction, extra)}
    if real_valid is not None:
        rv = np.asarray(real_valid, np.float64)
        if rv.shape != rt.shape:
            raise ValueError(f"real_valid has shape {rv.shape}, expected {rt.shape}")
        out.update({f"upper_{k}": v for k, v in _study(rv, rt, p, top_fraction, extra).items()})
    return out
