"""The attacker's n-gram LM against an independent reference: normalisation and the recursion."""

import math

import numpy as np
import pytest

from dpsynth.release_audit.ngram import NgramLM

DOCS = [np.array(d) for d in ([1, 2, 3, 1, 2, 4], [2, 3, 1], [0, 1, 2, 3], [])]


def _reference(docs, vocab, order, discount, history, w):
    """The interpolated absolute-discounting recursion written out over explicit n-gram lists."""
    start = vocab
    grams = []
    for d in docs:
        p = [start] * (order - 1) + list(d)
        grams += [tuple(p[i - order + 1 : i + 1]) for i in range(order - 1, len(p))]
    h = ([start] * (order - 1) + list(history))[-(order - 1):] if order > 1 else []
    prob = 1.0 / vocab
    for j in range(order):
        ctx = tuple(h[len(h) - j :]) if j else ()
        follow = [g[-1] for g in grams if g[order - 1 - j : order - 1] == ctx]
        if follow:
            c = follow.count(w)
            prob = max(c - discount, 0) / len(follow) + discount * len(set(follow)) / len(follow) * prob
    return prob


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_probabilities_match_the_reference_and_sum_to_one(order):
    vocab = 6
    lm = NgramLM(DOCS, vocab, order=order, discount=0.6)
    for history in ([], [1], [1, 2], [3, 1], [5, 5, 5], [2, 3, 1, 2]):
        probs = [lm.prob(history, w) for w in range(vocab)]
        assert sum(probs) == pytest.approx(1.0, abs=1e-12)
        for w in range(vocab):
            assert probs[w] == pytest.approx(_reference(DOCS, vocab, order, 0.6, history, w), rel=1e-12)


def test_score_is_the_mean_log_probability_and_rewards_seen_sequences():
    rng = np.random.default_rng(0)
    corpus = [rng.integers(0, 50, 30) for _ in range(20)]
    seen, unseen = corpus[3][5:17], rng.integers(0, 50, 12)
    lm = NgramLM(corpus, 50)
    s = lm.score([seen, unseen, np.zeros(0, np.int64)])
    assert s[0] == pytest.approx(sum(math.log(lm.prob(list(seen[:i]), w)) for i, w in enumerate(seen)) / 12)
    assert s[0] > s[1] + 1.0 and s[2] == 0.0


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="token ids"):
        NgramLM([np.array([0, 7])], 5)
    with pytest.raises(ValueError, match="order"):
        NgramLM([], 5, order=0)
    with pytest.raises(ValueError, match="discount"):
        NgramLM([], 5, discount=1.0)
