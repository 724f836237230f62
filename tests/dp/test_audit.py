"""Canary audit statistics, and the audit procedure over a caller-supplied train/loss function."""

import math

import numpy as np
import pytest

from dpsynth.dp import audit


def test_exposure_against_brute_force():
    rng = np.random.default_rng(0)
    ins, outs = rng.normal(size=10), rng.normal(size=30)
    exp = audit.exposures(ins, outs)
    for s, e in zip(ins, exp):
        rank = 1 + sum(o > s for o in outs)
        assert e == pytest.approx(math.log2(31) - math.log2(rank))
    # Chance exposure is the mean over a uniform rank, matched by simulation.
    sims = [audit.exposures(rng.normal(size=1), rng.normal(size=30)).mean() for _ in range(4000)]
    assert np.mean(sims) == pytest.approx(audit.chance_exposure(30), abs=0.06)


def _fake_train(memorise: bool, seen: list):
    """A fake trainer: its loss is low on texts it was trained on (memorise) or random noise."""

    def train(records):
        seen.extend(records)
        trained = {r["text"] for r in records}
        rng = np.random.default_rng(0)
        return lambda texts: np.array([(0.0 if memorise and t in trained else 5.0) + rng.normal() for t in texts])

    return train


@pytest.mark.parametrize("memorise", [True, False])
def test_canary_audit_detects_memorisation_through_the_loss_function(memorise):
    canaries = [f"canary text {i}" for i in range(40)]
    records = [{"id": "a", "text": "ordinary", "label": "x"}]
    seen = []
    res = audit.canary_audit(records, canaries, _fake_train(memorise, seen), label="x", epsilon=1.0, repeats=2)
    inserted = [r for r in seen if r["id"].startswith("canary-")]
    assert len(inserted) == 40 and {r["text"] for r in inserted} == set(canaries[:20])  # first half, x repeats
    assert all(r["label"] == "x" for r in inserted)
    assert res.num_canaries == 20 and res.repeats == 2
    if memorise:
        assert res.auroc > 0.99 and res.mean_exposure > res.chance_exposure + 2
    else:
        assert 0.2 < res.auroc < 0.8 and res.mean_exposure < res.chance_exposure + 1.5


def test_canary_audit_needs_an_even_number_of_canaries():
    with pytest.raises(ValueError, match="even"):
        audit.canary_audit([], ["a", "b", "c"], _fake_train(False, []), label="x", epsilon=1.0)


def _hull_auroc(ins, outs):
    """Area under the upper convex hull of the ROC points of every threshold (brute force)."""
    ts = sorted(set(ins) | set(outs)) + [np.inf]
    pts = sorted({(float(np.mean(outs >= t)), float(np.mean(ins >= t))) for t in ts} | {(0.0, 0.0), (1.0, 1.0)})
    hull = []
    for p in pts:
        while len(hull) >= 2 and ((hull[-1][0] - hull[-2][0]) * (p[1] - hull[-2][1])
                                  - (hull[-1][1] - hull[-2][1]) * (p[0] - hull[-2][0])) >= 0:
            hull.pop()
        hull.append(p)
    return sum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in zip(hull, hull[1:]))


def test_canary_statistics_against_references():
    from scipy import stats as st

    rng = np.random.default_rng(2)
    ins, outs = rng.normal(1.0, 1.0, 25), rng.normal(0.0, 1.0, 30)
    got = audit.canary_statistics(ins, outs, delta=1e-5)
    # The auditor's AUROC allows randomising between two thresholds: the area under the ROC
    # curve's upper convex hull (>= the Mann-Whitney AUROC of single thresholds).
    assert got["auroc"] == pytest.approx(_hull_auroc(ins, outs), abs=1e-12)
    assert got["auroc"] >= np.mean([(i > o) + 0.5 * (i == o) for i in ins for o in outs]) - 1e-12
    assert got["mean_exposure"] == pytest.approx(audit.exposures(ins, outs).mean())
    assert got["chance_exposure"] == pytest.approx(audit.chance_exposure(30))
    assert (got["num_inserted"], got["num_held_out"]) == (25, 30)

    # Perfect separation of k vs k: the ROC frontier has 3 points (Bonferroni over 3 thresholds).
    for k in (8, 32):
        sep = audit.canary_statistics(np.arange(k) + 100.0, np.arange(k) * 1.0, delta=1e-9)
        s = 0.05 / 3
        u = st.beta.ppf(1 - s / 2, 1, k)  # Clopper-Pearson upper bound of 0 of k (FNR and FPR alike)
        assert sep["epsilon_lb_clopper_pearson"] == pytest.approx(np.log(1 - u - 1e-9) - np.log(u), rel=1e-6)
        # One run (Steinke et al.): k guesses all right; P(Binomial(k, q) = k) = q^k = s at the bound.
        q = s ** (1 / k)
        assert sep["epsilon_lb_one_run"] == pytest.approx(np.log(q / (1 - q)), abs=1e-4)
        assert sep["auroc"] == 1.0
    # No separation: every bound is 0.
    same = audit.canary_statistics(np.arange(20.0), np.arange(20.0), delta=1e-5)
    assert same["epsilon_lb_clopper_pearson"] == 0.0 and same["epsilon_lb_one_run"] == 0.0
    assert same["auroc"] == pytest.approx(0.5)


def test_auroc_permutation_test_against_exact_enumeration():
    """4 vs 4 canaries: the permutation p-value and chance level against all 70 relabellings."""
    import itertools

    rng = np.random.default_rng(5)
    pooled = rng.normal(size=8)
    exact = np.array([_hull_auroc(pooled[list(c)], np.delete(pooled, list(c)))
                      for c in itertools.combinations(range(8), 4)])
    for ins_idx in ([0, 1, 2, 3], [int(i) for i in np.argsort(pooled)[-4:]], [0, 2, 5, 7]):
        ins, outs = pooled[ins_idx], np.delete(pooled, ins_idx)
        got = audit.canary_statistics(ins, outs, delta=1e-5)
        p_exact = np.mean(exact >= _hull_auroc(ins, outs) - 1e-12)
        n = audit.AUROC_PERMUTATIONS
        assert abs(got["auroc_p_value"] - p_exact) <= 4 * np.sqrt(p_exact * (1 - p_exact) / n) + 2 / (n + 1)
        assert np.quantile(exact, 0.4) <= got["auroc_chance"] <= np.quantile(exact, 0.6)
    # The hull AUROC exceeds 0.5 at chance on few canaries: the reason the report prints its chance level.
    assert np.median(exact) > 0.55


def test_auroc_p_value_holds_its_level_and_sees_a_leak():
    """Exchangeable scores (no membership effect): P(p <= 0.1) <= 0.1 up to sampling error over
    300 audits; inserted canaries scoring 2 SD higher: p at its minimum, 1 / (1 + relabellings)."""
    rng = np.random.default_rng(11)
    ps = np.array([audit.canary_statistics(rng.normal(size=10), rng.normal(size=10), delta=1e-5,
                                           permutations=99)["auroc_p_value"] for _ in range(300)])
    assert np.mean(ps <= 0.1) <= 0.1 + 3 * np.sqrt(0.1 * 0.9 / 300)
    assert np.mean(ps <= 0.5) >= 0.5 - 3 * np.sqrt(0.25 / 300)  # (not a test that never rejects)
    leak = audit.canary_statistics(rng.normal(2.0, 1.0, 32), rng.normal(0.0, 1.0, 32), delta=1e-5)
    assert leak["auroc_p_value"] < 0.01
    sep = audit.canary_statistics(np.arange(32) + 100.0, np.arange(32) * 1.0, delta=1e-5)
    assert sep["auroc_p_value"] == pytest.approx(1 / (1 + audit.AUROC_PERMUTATIONS))
    same = audit.canary_statistics(np.arange(20.0), np.arange(20.0), delta=1e-5)
    assert same["auroc_p_value"] > 0.9


def test_canary_statistics_bounds_stay_below_epsilon_for_a_dp_mechanism():
    """Scores from randomized response at epsilon = 1 (an eps-DP release of each canary's bit):
    the lower bounds exceed 1 with probability <= 5% each, so over 20 draws at most a few may,
    while they do see the leak (well above 0)."""
    rng = np.random.default_rng(5)
    eps, k, over, bounds = 1.0, 200, 0, []
    for _ in range(20):
        keep = rng.random(2 * k) < np.exp(eps) / (1 + np.exp(eps))
        truth = np.r_[np.ones(k), np.zeros(k)]
        scores = np.where(keep, truth, 1 - truth) + 1e-3 * rng.random(2 * k)
        got = audit.canary_statistics(scores[:k], scores[k:], delta=1e-6, permutations=19)
        over += got["epsilon_lb_clopper_pearson"] > eps or got["epsilon_lb_one_run"] > eps
        bounds.append(got["epsilon_lb_one_run"])
    assert over <= 3 and np.mean(bounds) > 0.3


def test_canary_statistics_refuses_bad_scores():
    with pytest.raises(ValueError, match=">= 1 inserted"):
        audit.canary_statistics([], [1.0], delta=1e-5)
    with pytest.raises(ValueError, match="finite"):
        audit.canary_statistics([np.nan], [1.0], delta=1e-5)
    with pytest.raises(ValueError, match="permutations"):
        audit.canary_statistics([1.0], [1.0], delta=1e-5, permutations=0)
