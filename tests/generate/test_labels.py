"""Label assignment, the DP label histogram and its calibration."""

import json

import dp_accounting
import numpy as np
import pytest

from dpsynth.generate import labels as L


@pytest.mark.parametrize("n", [0, 1, 7, 100, 1001])
@pytest.mark.parametrize("weights", [(0.5, 0.5), (0.2, 0.3, 0.5), (1 / 3, 1 / 3, 1 / 3), (0.9, 0.1, 0.0)])
def test_label_counts_exact_largest_remainder(n, weights):
    dist = L.LabelDistribution(labels=tuple("abc"[: len(weights)]), weights=weights)
    counts = L.label_counts(n, dist)
    assert sum(counts.values()) == n
    for (label, c), w in zip(counts.items(), weights):
        assert abs(c - n * w) < 1.0 + 1e-9  # within one of the exact share
    assigned = L.assign_labels(n, dist, seed=3)
    assert {l: assigned.count(l) for l in dist.labels} == counts
    assert assigned == L.assign_labels(n, dist, seed=3)  # deterministic


def test_assignment_is_shuffled():
    dist = L.uniform(["x", "y"])
    a = L.assign_labels(200, dist, seed=1)
    assert a != sorted(a) and a != L.assign_labels(200, dist, seed=2)


def test_dp_histogram_noise_and_postprocessing():
    data = ["a"] * 700 + ["b"] * 300
    sigma = 5.0
    noisy = np.array([L.dp_label_histogram(data, ["a", "b", "c"], noise_multiplier=sigma, seed=s).noisy_counts
                      for s in range(400)])
    assert np.all(noisy >= 0)  # clipped at 0
    # Unclipped coordinates: mean = true count, std = sigma.
    for j, true in enumerate([700, 300]):
        assert abs(noisy[:, j].mean() - true) < 4 * sigma / np.sqrt(400)
        assert abs(noisy[:, j].std() - sigma) < 0.15 * sigma
    # The empty label's count is max(N(0, sigma^2), 0): zero about half of the time.
    assert 0.4 < np.mean(noisy[:, 2] == 0) < 0.6
    dist = L.dp_label_histogram(data, ["a", "b", "c"], noise_multiplier=sigma, seed=0)
    assert dist.source == "dp_histogram" and abs(sum(dist.weights) - 1) < 1e-9
    assert dist.weights[0] == pytest.approx(dist.noisy_counts[0] / sum(dist.noisy_counts))


def test_dp_histogram_rejects_unknown_labels_and_bad_sigma():
    with pytest.raises(L.LabelError, match="outside the label set"):
        L.dp_label_histogram(["a", "zz"], ["a", "b"], noise_multiplier=1.0)
    with pytest.raises(L.LabelError, match="noise multiplier"):
        L.dp_label_histogram(["a"], ["a", "b"], noise_multiplier=0.0)


def test_calibration_hits_target_epsilon():
    sigma = L.calibrate_histogram_noise(0.5, 1e-5, accountant="pld")
    acc = dp_accounting.pld.PLDAccountant()
    acc.compose(L.histogram_event(sigma))
    eps = acc.get_epsilon(1e-5)
    assert eps <= 0.5 + 1e-6 and eps > 0.45
    # RDP is a looser bound than PLD: it needs at least as much noise for the same target.
    assert L.calibrate_histogram_noise(0.5, 1e-5, accountant="rdp") >= sigma * (1 - 1e-3)


def test_check_labels_and_distribution():
    assert L.check_labels(["a"], ["a", "b"], "x") == ("a",)
    with pytest.raises(L.LabelError, match="unknown label"):
        L.check_labels(["q"], ["a", "b"], "--labels")
    with pytest.raises(L.LabelError, match="duplicate"):
        L.check_labels(["a", "a"], None, "--labels")
    with pytest.raises(L.LabelError, match="sum to 1"):
        L.LabelDistribution(labels=("a", "b"), weights=(0.5, 0.6))


def test_json_round_trip_and_validation():
    from dpsynth.generate.labels import LabelDistribution, LabelError, dp_label_histogram

    dist = dp_label_histogram(["a"] * 30 + ["b"] * 10, ["a", "b"], noise_multiplier=2.0, seed=0)
    assert LabelDistribution.from_json(json.loads(json.dumps(dist.to_json()))) == dist
    with pytest.raises(LabelError, match="sum to 1"):
        LabelDistribution.from_json({**dist.to_json(), "weights": [0.9, 0.9]})
