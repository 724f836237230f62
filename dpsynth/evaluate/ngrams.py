"""Unigram, bigram and character-length distributions of synthetic vs real text.

Each pair of distributions is scored with the same divergence frontier as MAUVE
(`divergence.compare_counts`): the histograms are over the union of the n-grams seen in either
set (words from `text.words`: lowercased, split on whitespace and punctuation), or over shared
character-length bins. `mauve` is the area under the divergence curve (1 = identical),
`mauve_star` the same with Krichevsky-Trofimov smoothing, `frontier_integral` the closed-form
frontier integral (0 = identical).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np

from dpsynth.evaluate import divergence
from dpsynth.evaluate import text as text_lib

KINDS = ("unigram", "bigram", "length")
DIVERSITY_FIELDS = ("distinct_1", "distinct_2", "duplicate_rate")


def ngram_counts(texts: Iterable[str], n: int) -> collections.Counter:
    """Counts of word n-grams (joined by a space) over all texts."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    counts: collections.Counter = collections.Counter()
    for t in texts:
        ws = text_lib.words(t)
        counts.update(ws if n == 1 else (" ".join(ws[i : i + n]) for i in range(len(ws) - n + 1)))
    return counts


def aligned(p: collections.Counter, q: collections.Counter) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Count vectors of p and q over the sorted union of their keys."""
    keys = sorted(set(p) | set(q))
    return (np.array([p.get(k, 0) for k in keys], dtype=np.float64),
            np.array([q.get(k, 0) for k in keys], dtype=np.float64), keys)


def length_histograms(p_texts: Sequence[str], q_texts: Sequence[str], num_bins: int = 50
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Character-length counts of both sets over shared equal-width bins of their union's range."""
    p_len = np.array([len(t) for t in p_texts], dtype=np.float64)
    q_len = np.array([len(t) for t in q_texts], dtype=np.float64)
    edges = np.histogram_bin_edges(np.concatenate([p_len, q_len]), bins=num_bins)
    return np.histogram(p_len, edges)[0].astype(np.float64), np.histogram(q_len, edges)[0].astype(np.float64), edges


@dataclasses.dataclass(frozen=True)
class NgramComparison:
    """Frontier scores per distribution kind, plus what the plots need."""

    results: dict[str, divergence.FrontierResult]
    length_edges: np.ndarray
    p_lengths: np.ndarray
    q_lengths: np.ndarray

    def as_dict(self) -> dict[str, float]:
        out = {}
        for kind, r in self.results.items():
            for k, v in r.scores().items():
                out[f"{kind}_{k}"] = v
        return out


def _check_texts(name: str, texts: Sequence[str]) -> None:
    if len(texts) == 0:
        raise ValueError(f"{name}: no texts")
    for i, t in enumerate(texts):
        if not isinstance(t, str) or not t.strip():
            raise ValueError(f"{name}: record {i} is empty or not text")


def compare_texts(p_texts: Sequence[str], q_texts: Sequence[str], length_bins: int = 50,
                  num_points: int = divergence.DEFAULT_NUM_POINTS,
                  scaling: float = divergence.DEFAULT_SCALING) -> NgramComparison:
    """Unigram, bigram and length distributions of P (synthetic) against Q (real)."""
    _check_texts("synthetic texts", p_texts)
    _check_texts("real texts", q_texts)
    results = {}
    for kind, n in (("unigram", 1), ("bigram", 2)):
        p, q, _ = aligned(ngram_counts(p_texts, n), ngram_counts(q_texts, n))
        if p.sum() == 0 or q.sum() == 0:
            raise ValueError(f"no {kind}s in the {'synthetic' if p.sum() == 0 else 'real'} texts")
        results[kind] = divergence.compare_counts(p, q, num_points, scaling)
    p_len, q_len, edges = length_histograms(p_texts, q_texts, length_bins)
    results["length"] = divergence.compare_counts(p_len, q_len, num_points, scaling)
    return NgramComparison(results, edges, np.array([len(t) for t in p_texts]), np.array([len(t) for t in q_texts]))


def diversity(texts: Sequence[str]) -> dict[str, float]:
    """How varied a corpus is: `distinct_n` = distinct word n-grams / all word n-grams (n = 1, 2;
    1 = no n-gram repeats, small = a corpus that keeps saying the same few things) and
    `duplicate_rate` = the fraction of texts that repeat an earlier text exactly. A collapsed
    corpus can classify well and still be useless; these make that visible."""
    out: dict[str, float] = {}
    for n in (1, 2):
        counts = ngram_counts(texts, n)
        total = sum(counts.values())
        out[f"distinct_{n}"] = len(counts) / total if total else 0.0
    out["duplicate_rate"] = (len(texts) - len(set(texts))) / len(texts) if texts else 0.0
    return out
