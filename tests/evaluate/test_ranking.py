import itertools
import math

import numpy as np
import pytest

from dpsynth.evaluate import ranking


def _brute_top_weight(p, depth, horizon=20000):
    # RBO = (1-p) sum_d p^(d-1) |S:d & T:d| / d: an item agreeing at rank i adds 1/d for each
    # d >= i, so its weight is (1-p) sum_{d>=i} p^(d-1)/d. Sum over i <= depth.
    d = np.arange(1, horizon + 1, dtype=np.float64)
    per_depth = (1 - p) * p ** (d - 1) / d
    tail = np.cumsum(per_depth[::-1])[::-1]  # sum_{d>=i}
    return float(tail[:depth].sum())


@pytest.mark.parametrize("p,depth", [(0.5, 1), (0.7, 3), (0.9, 10), (0.95, 7)])
def test_top_weight_closed_form_matches_series(p, depth):
    assert ranking.rbo_top_weight(p, depth) == pytest.approx(_brute_top_weight(p, depth), abs=1e-9)


@pytest.mark.parametrize("n", [4, 8, 12, 40, 100])
def test_p_puts_85_percent_on_top_quarter(n):
    p = ranking.rbo_p_for(n)
    depth = math.ceil(n / 4)
    assert _brute_top_weight(p, depth) == pytest.approx(0.85, abs=1e-6)
    assert ranking.rbo_p_for(n, top_weight=0.9) < p  # more top-heavy -> smaller p


def _rbo_brute(s, t, p):
    k = len(s)
    agree = [len(set(s[:d]) & set(t[:d])) / d for d in range(1, k + 1)]
    return (1 - p) / p * sum(a * p ** d for d, a in zip(range(1, k + 1), agree)) + agree[-1] * p**k


def test_rbo_matches_definition_on_all_permutations():
    items = list("abcde")
    for perm in itertools.permutations(items):
        for p in (0.3, 0.8):
            assert ranking.rbo(items, list(perm), p) == pytest.approx(_rbo_brute(items, list(perm), p), abs=1e-12)
    assert ranking.rbo(items, items, 0.8) == pytest.approx(1.0)


def test_ranking_study_against_scipy_and_top_stats():
    from scipy import stats

    rng = np.random.default_rng(0)
    real_test = rng.uniform(0.5, 0.9, 16)
    synth_valid = real_test + rng.normal(0, 0.05, 16)
    real_valid = real_test + rng.normal(0, 0.01, 16)
    out = ranking.ranking_study(synth_valid, real_test, real_valid)
    assert out["spearman"] == pytest.approx(stats.spearmanr(synth_valid, real_test)[0])
    assert out["kendall"] == pytest.approx(stats.kendalltau(synth_valid, real_test)[0])
    top = np.argsort(-synth_valid)[:4]
    assert out["top_mean"] == pytest.approx(real_test[top].mean()) and out["top_std"] == pytest.approx(real_test[top].std())
    assert out["upper_top_mean"] >= out["top_mean"] - 1e-12 or out["upper_spearman"] >= out["spearman"]
    perfect = ranking.ranking_study(real_test, real_test)
    assert perfect["spearman"] == pytest.approx(1.0) and perfect["rbo"] == pytest.approx(1.0)
    assert perfect["top_mean"] == pytest.approx(np.sort(real_test)[-4:].mean())
    # Further real-test scores (balanced accuracy): the same top trials, chosen by the signal.
    balanced = rng.uniform(0.4, 0.8, 16)
    both = ranking.ranking_study(synth_valid, real_test, real_valid, real_test_scores={"balanced_accuracy": balanced})
    assert {k: v for k, v in both.items() if "balanced" not in k} == out  # nothing else changes
    assert both["top_balanced_accuracy_mean"] == pytest.approx(balanced[top].mean())
    assert both["top_balanced_accuracy_std"] == pytest.approx(balanced[top].std())
    upper_top = np.argsort(-real_valid, kind="stable")[:4]
    assert both["upper_top_balanced_accuracy_mean"] == pytest.approx(balanced[upper_top].mean())
    with pytest.raises(ValueError, match="balanced_accuracy"):
        ranking.ranking_study(synth_valid, real_test, real_test_scores={"balanced_accuracy": balanced[:3]})


def test_constant_scores_give_nan_not_a_number():
    out = ranking.ranking_study([0.5, 0.5, 0.5], [0.1, 0.2, 0.3])
    assert math.isnan(out["spearman"]) and math.isnan(out["kendall"])
    with pytest.raises(ValueError):
        ranking.ranking_study([0.5], [0.5])
