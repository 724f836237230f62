import collections
import importlib

import numpy as np
import pytest

from dpsynth.evaluate import ngrams, text

ref = importlib.import_module("mauve.compute_mauve")

REAL = ["The food was great, really great!", "Terrible coffee; never again.", "Great tea and great price."]
SYNTH = ["The tea was great.", "Never again, terrible service!", "Price was fine"]


def test_counts_match_brute_force():
    counts = ngrams.ngram_counts(REAL, 2)
    brute = collections.Counter()
    for t in REAL:
        w = t.lower().replace(",", " ").replace("!", " ").replace(";", " ").replace(".", " ").split()
        brute.update(f"{a} {b}" for a, b in zip(w, w[1:]))
    assert counts == brute
    assert ngrams.ngram_counts(REAL, 1)["great"] == 4


def test_scores_match_reference_frontier_on_same_histograms():
    cmp = ngrams.compare_texts(SYNTH, REAL, length_bins=5)
    p, q, keys = ngrams.aligned(ngrams.ngram_counts(SYNTH, 1), ngrams.ngram_counts(REAL, 1))
    assert set(keys) == set(text.words(" ".join(SYNTH + REAL)))
    curve = ref.get_divergence_curve_for_multinomials(p / p.sum(), q / q.sum(), np.linspace(1e-6, 1 - 1e-6, 25), 5)
    np.testing.assert_allclose(cmp.results["unigram"].curve, curve)
    assert cmp.results["unigram"].frontier_integral == pytest.approx(ref.get_fronter_integral(p / p.sum(), q / q.sum()))
    pl, ql, edges = ngrams.length_histograms(SYNTH, REAL, 5)
    assert pl.sum() == len(SYNTH) and ql.sum() == len(REAL) and len(edges) == 6
    d = cmp.as_dict()
    assert set(d) >= {"unigram_mauve", "bigram_mauve_star", "length_frontier_integral"}


def test_identical_sets_score_one_and_bad_rows_raise():
    cmp = ngrams.compare_texts(REAL, list(reversed(REAL)))
    for kind in ngrams.KINDS:
        assert cmp.results[kind].mauve == pytest.approx(1.0)
    with pytest.raises(ValueError, match="record 1 is empty"):
        ngrams.compare_texts(["ok text", "  "], REAL)
    with pytest.raises(ValueError, match="no texts"):
        ngrams.compare_texts([], REAL)


def test_diversity_against_brute_force():
    texts = ["a b a b", "a b a b", "c d", "e"]
    d = ngrams.diversity(texts)
    words = [w for t in texts for w in t.split()]
    bigrams = [f"{x} {y}" for t in texts for x, y in zip(t.split(), t.split()[1:])]
    assert d["distinct_1"] == pytest.approx(len(set(words)) / len(words))
    assert d["distinct_2"] == pytest.approx(len(set(bigrams)) / len(bigrams))
    assert d["duplicate_rate"] == pytest.approx(1 / 4)
    assert ngrams.diversity([]) == {"distinct_1": 0.0, "distinct_2": 0.0, "duplicate_rate": 0.0}
    assert set(d) == set(ngrams.DIVERSITY_FIELDS)
