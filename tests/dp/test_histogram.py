"""The label-histogram Gaussian mechanism: noise scale, sensitivity-1 accounting, bad input."""

import dp_accounting
import numpy as np
import pytest
from scipy.stats import norm

from dpsynth.dp import accounting, histogram


def test_noise_std_matches_sigma_and_counts_are_unbiased():
    labels = ["a", "b", "c"]
    data = ["a"] * 500 + ["b"] * 300 + ["c"] * 200
    sigma = 7.0
    draws = np.stack([histogram.noisy_label_counts(data, labels, noise_multiplier=sigma, seed=s) for s in range(3000)])
    np.testing.assert_allclose(draws.mean(0), [500, 300, 200], atol=4 * sigma / np.sqrt(3000) * 1.5)
    np.testing.assert_allclose(draws.std(0), sigma, rtol=0.06)


def test_clipped_at_zero():
    out = histogram.noisy_label_counts(["a"], ["a", "b"], noise_multiplier=50.0, seed=1)
    assert (out >= 0).all()


def test_event_is_gaussian_with_sensitivity_one_and_calibration_hits_target():
    sigma = histogram.calibrate_histogram_noise(1.0, 1e-5)
    eps = accounting.epsilon_of_events([histogram.histogram_event(sigma)], 1e-5, accountant="pld")
    assert eps <= 1.0 + 1e-3 and eps > 0.95
    # Independent check: the exact delta(eps) of the Gaussian mechanism with sensitivity 1
    # (Balle & Wang 2018): Phi(1/(2s) - eps s) - e^eps Phi(-1/(2s) - eps s).
    delta = norm.cdf(0.5 / sigma - eps * sigma) - np.exp(eps) * norm.cdf(-0.5 / sigma - eps * sigma)
    assert delta == pytest.approx(1e-5, rel=0.05)
    assert isinstance(histogram.histogram_event(sigma), dp_accounting.GaussianDpEvent)


def test_bad_input():
    with pytest.raises(ValueError, match="outside the label set"):
        histogram.noisy_label_counts(["a", "zz"], ["a", "b"], noise_multiplier=1.0)
    with pytest.raises(ValueError, match="must be > 0"):
        histogram.noisy_label_counts(["a"], ["a"], noise_multiplier=0.0)
