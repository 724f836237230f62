"""Copying audit: counts against brute force, and the held-out verdict on memorising / fresh corpora."""

import numpy as np
import pytest

from dpsynth.release_audit import copying
from tests.dedup import brute_longest_shared


def _docs(rng, n, lo=20, hi=60, vocab=40):
    return [rng.integers(0, vocab, size=int(rng.integers(lo, hi))) for _ in range(n)]


def test_counts_and_distribution_against_brute_force():
    rng = np.random.default_rng(1)
    train, test = _docs(rng, 30), _docs(rng, 10)
    synth = _docs(rng, 12, 5, 30)
    synth += [train[2][:55], np.concatenate([rng.integers(0, 40, 3), train[7][4:28]])]  # >= 50 and >= 20 copies
    out = copying.copying_audit(synth, train, test, thresholds=(50, 20))
    ref = [brute_longest_shared(s, train) for s in synth]
    assert out["longest_shared_with_train"] == max(ref)
    assert out["sharing_at_least"] == {"50": sum(r >= 50 for r in ref), "20": sum(r >= 20 for r in ref)}
    assert out["sharing_at_least"]["50"] >= 1 and out["sharing_at_least"]["20"] >= 2
    d = out["synthetic_to_train"]
    assert d["count"] == len(synth) and d["max"] == max(ref) and d["p50"] == pytest.approx(np.percentile(ref, 50))
    assert sum(d["histogram"].values()) == len(synth)
    assert out["test_to_train"]["max"] == max(brute_longest_shared(t, train) for t in test)
    held = out["held_out_comparison"]
    assert held["reference_size"] == 10
    assert held["closer_to_train"] + held["closer_to_test"] + held["ties"] == len(synth)


def test_closer_test_counts_and_sign_test():
    got = copying.closer_test(np.array([5, 5, 3, 1]), np.array([1, 5, 2, 4]))
    assert (got["closer_to_train"], got["closer_to_test"], got["ties"]) == (2, 1, 1)
    assert got["share_closer_to_train"] == pytest.approx(2.5 / 4)
    assert got["p_value"] == pytest.approx(0.5)  # P(Binomial(3, 1/2) >= 2)
    long = copying.closer_test(np.array([5, 5, 3, 1]), np.array([1, 5, 2, 4]), min_length=4)
    assert (long["num_examples"], long["closer_to_train"], long["closer_to_test"], long["ties"]) == (3, 1, 1, 1)


def test_verdict_separates_copying_from_phrase_statistics():
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 2, 60)
    short = copying.verdict(np.full(60, 5) + noise, np.full(60, 4), phrase_length=8)  # closer, in short phrases
    assert short[0] == copying.SHORT_ONLY and short[1]["p_value"] < 1e-6 and short[2]["num_examples"] == 0
    long = copying.verdict(np.r_[np.full(20, 12), np.full(40, 4)], np.full(60, 4), phrase_length=8)
    assert long[0] == copying.MEMORISING and long[2]["closer_to_train"] == 20
    same = copying.verdict(np.full(60, 5), np.full(60, 5), phrase_length=8)
    assert same[0] == copying.NO_EVIDENCE


def test_verdict_separates_a_memorising_corpus_from_a_fresh_one():
    """Train and test drawn from one distribution; a corpus of train excerpts is memorising, a
    corpus from the same distribution that saw neither is not (over several seeds)."""
    rng = np.random.default_rng(7)
    for seed in range(4):
        train, test = _docs(rng, 120, vocab=12), _docs(rng, 40, vocab=12)
        fresh = _docs(rng, 80, vocab=12)
        copies = [train[int(i)][3:3 + 15] for i in rng.integers(0, 120, 80)]
        assert copying.copying_audit(fresh, train, test, seed=seed)["held_out_comparison"]["verdict"] == copying.NO_EVIDENCE
        mem = copying.copying_audit(copies, train, test, seed=seed)["held_out_comparison"]
        assert mem["verdict"] == copying.MEMORISING and mem["share_closer_to_train"] > 0.6


def test_empty_inputs_are_refused():
    with pytest.raises(ValueError, match="needs synthetic, train and test"):
        copying.copying_audit([], [np.array([1])], [np.array([1])])
