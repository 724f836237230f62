"""Canary audit: exposure statistics, and DP vs non-DP memorisation of inserted canaries."""

import math

import numpy as np
import pytest

from dpsynth.dp import audit, tune
from tests.dp.conftest import make_records


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


def _run(tiny_base, tmp_path, epsilon, steps, canaries):
    base_dir, _ = tiny_base
    cfg = tune.TuneConfig(mode="full", epsilon=epsilon, batch_size=16, steps=steps, microbatch_size=16, max_tokens=32,
                          learning_rate=1e-2, checkpoint_every=10**6, seed=1)
    return audit.canary_audit(base_dir, make_records(48, 1), str(tmp_path / f"eps{epsilon}"), cfg,
                              num_canaries=canaries, repeats=1, canary_length=10, labels=["great", "other"])


def test_canaries_near_chance_with_dp_and_memorised_without(tiny_base, tmp_path):
    private = _run(tiny_base, tmp_path, 1.0, 40, 32)
    baseline = _run(tiny_base, tmp_path, math.inf, 40, 32)
    assert baseline.auroc > 0.95 and baseline.mean_exposure > private.chance_exposure + 2
    assert private.auroc < 0.8  # chance is 0.5; std ~0.07 for 32 vs 32 canaries
    assert private.mean_exposure < private.chance_exposure + 1.0
    assert private.epsilon_lower_bound <= 1.0


@pytest.mark.slow
def test_canary_audit_longer_runs(tiny_base, tmp_path):
    private = _run(tiny_base, tmp_path, 1.0, 300, 64)
    baseline = _run(tiny_base, tmp_path, math.inf, 300, 64)
    assert baseline.auroc > 0.98
    assert private.auroc < 0.7 and private.epsilon_lower_bound <= 1.0
