"""Poisson sampling: batch-size distribution, per-step stream independence, padding."""

import numpy as np
import pytest
from scipy import stats

from dpsynth.dp import sampling


def test_batch_size_is_binomial():
    n, q = 500, 0.1
    sizes = np.array([sampling.poisson_batch(n, q, seed=7, step=t).size for t in range(2000)])
    # Chi-square goodness of fit on binned counts against Binomial(n, q).
    edges = np.array([0, 40, 44, 47, 50, 53, 56, 60, n + 1])
    observed = np.histogram(sizes, bins=edges)[0]
    cdf = stats.binom.cdf(edges - 1, n, q)
    expected = np.diff(cdf) * sizes.size
    _, p = stats.chisquare(observed, expected)
    assert p > 1e-3, (observed, expected)
    assert abs(sizes.mean() - n * q) < 4 * np.sqrt(n * q * (1 - q) / sizes.size)


def test_each_example_included_with_probability_q_independently():
    n, q, steps = 40, 0.3, 3000
    inc = np.zeros((steps, n), bool)
    for t in range(steps):
        inc[t, sampling.poisson_batch(n, q, seed=1, step=t)] = True
    freq = inc.mean(0)
    assert np.all(np.abs(freq - q) < 5 * np.sqrt(q * (1 - q) / steps))
    # Pairwise inclusion is independent: P(i and j) ~ q^2.
    joint = (inc[:, 0] & inc[:, 1]).mean()
    assert abs(joint - q * q) < 5 * np.sqrt(q * q * (1 - q * q) / steps)
    # Consecutive steps are independent: no correlation between step t and t+1 inclusions.
    r = np.corrcoef(inc[:-1].ravel(), inc[1:].ravel())[0, 1]
    assert abs(r) < 0.02


def test_streams_are_pure_functions_of_seed_and_step():
    a = sampling.poisson_batch(1000, 0.2, seed=3, step=17)
    b = sampling.poisson_batch(1000, 0.2, seed=3, step=17)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, sampling.poisson_batch(1000, 0.2, seed=3, step=18))
    assert not np.array_equal(a, sampling.poisson_batch(1000, 0.2, seed=4, step=17))
    # Different steps draw different raw streams (never reused).
    x = sampling.step_generator(3, 0).random(8)
    y = sampling.step_generator(3, 1).random(8)
    assert not np.allclose(x, y)


def test_cap_truncates():
    sizes = [sampling.poisson_batch(100, 0.5, seed=0, step=t, max_batch_size=45).size for t in range(200)]
    assert max(sizes) == 45


def test_padding_to_fixed_microbatches():
    idx = np.arange(10)
    mbs = sampling.pad_microbatches(idx, 4)
    assert [m.shape for m in mbs] == [(4,)] * 3
    assert sorted(np.concatenate(mbs)[np.concatenate(mbs) >= 0].tolist()) == list(range(10))
    assert (np.concatenate(mbs) < 0).sum() == 2
    empty = sampling.pad_microbatches(np.zeros(0, np.int64), 4)
    assert len(empty) == 1 and (empty[0] == -1).all()
    data = {"tokens": np.arange(30).reshape(10, 3)}
    g = sampling.gather(data, mbs[-1])
    assert g["mask"].tolist() == [1, 1, 0, 0] and g["tokens"].shape == (4, 3)


def test_sampler_validates():
    with pytest.raises(ValueError, match="empty"):
        sampling.PoissonSampler(0, 1, 4, 0)
    s = sampling.PoissonSampler(100, 10, 4, 0)
    assert s.q == 0.1 and all(m.shape == (4,) for m in s.microbatches(5))
