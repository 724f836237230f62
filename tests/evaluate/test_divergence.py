import importlib

import numpy as np
import pytest
from scipy import stats

from dpsynth.evaluate import divergence

ref = importlib.import_module("mauve.compute_mauve")  # the reference (mauve-text), test-only


def _random_counts(rng, k):
    p = rng.integers(0, 6, k).astype(float)
    q = rng.integers(0, 6, k).astype(float)
    p[0] += 1
    q[-1] += 1
    return p, q


@pytest.mark.parametrize("k", [2, 3, 17, 400])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_curve_and_frontier_match_mauve_text(k, seed):
    p_counts, q_counts = _random_counts(np.random.default_rng(seed), k)
    p, q = p_counts / p_counts.sum(), q_counts / q_counts.sum()
    for num_points, c in ((25, 5.0), (10, 2.0)):
        weights = np.linspace(1e-6, 1 - 1e-6, num_points)
        np.testing.assert_allclose(divergence.divergence_curve(p, q, num_points, c),
                                   ref.get_divergence_curve_for_multinomials(p, q, weights, c), rtol=1e-12, atol=1e-14)
    assert divergence.frontier_integral(p, q) == pytest.approx(ref.get_fronter_integral(p, q), abs=1e-12)
    ps, qs = divergence.kt_smooth(p_counts), divergence.kt_smooth(q_counts)
    np.testing.assert_allclose(ps, (p_counts + 0.5) / (p_counts + 0.5).sum())
    res = divergence.compare_counts(p_counts, q_counts)
    curve = ref.get_divergence_curve_for_multinomials(p, q, np.linspace(1e-6, 1 - 1e-6, 25), 5)
    x, y = curve.T
    from sklearn.metrics import auc

    i, j = np.argsort(x), np.argsort(y)
    assert res.mauve == pytest.approx(0.5 * (auc(x[i], y[i]) + auc(y[j], x[j])), abs=1e-12)
    assert res.frontier_integral_star == pytest.approx(ref.get_fronter_integral(ps, qs), abs=1e-12)


def test_kl_matches_scipy_and_is_infinite_off_support():
    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.ones(9)), rng.dirichlet(np.ones(9))
    assert divergence.kl_divergence(p, q) == pytest.approx(stats.entropy(p, q), rel=1e-12)
    assert np.isinf(divergence.kl_divergence([0.5, 0.5], [1.0, 0.0]))
    assert divergence.kl_divergence([1.0, 0.0], [0.5, 0.5]) == pytest.approx(np.log(2))


def test_identical_and_disjoint_extremes():
    same = divergence.compare_counts(np.array([3.0, 1, 4]), np.array([6.0, 2, 8]))
    assert same.mauve == pytest.approx(1.0, abs=1e-9) and same.frontier_integral == pytest.approx(0.0, abs=1e-12)
    disjoint = divergence.compare_counts(np.array([5.0, 5, 0, 0]), np.array([0.0, 0, 5, 5]))
    assert disjoint.mauve < 0.05 and disjoint.frontier_integral == pytest.approx(1.0)
    assert disjoint.mauve_star > disjoint.mauve  # smoothing lifts disjoint supports


def test_bad_histograms_raise():
    with pytest.raises(ValueError):
        divergence.compare_counts(np.zeros(3), np.ones(3))
    with pytest.raises(ValueError):
        divergence.compare_counts(np.ones(3), np.ones(4))
    with pytest.raises(ValueError):
        divergence.compare_counts(np.array([1.0, -1.0, 2.0]), np.ones(3))
