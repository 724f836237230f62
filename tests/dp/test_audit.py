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
