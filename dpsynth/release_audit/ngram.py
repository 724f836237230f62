"""A token n-gram language model: the attacker's model of the release audit.

The canary audit of a synthetic corpus (`dpsynth.release_audit.canaries`) scores each canary
by its likelihood under a small LM trained on the synthetic corpus only, as an adversary who
holds nothing but the release would (Meeus et al. 2024, "The Canary's Echo: Auditing Privacy
Risks of LLM-Generated Synthetic Text", found n-gram models trained on the synthetic text
the strongest such attack). It needs no accelerator and no training loop, and it sees
verbatim or partial copies of a random canary directly in its n-gram counts.

Model (interpolated absolute discounting, Ney et al. 1994): every document is preceded by
n - 1 start symbols (id `vocab_size`, never predicted); for a history h of j - 1 tokens,

    P_j(w | h) = max(c(h, w) - D, 0) / c(h) + D * N1+(h) / c(h) * P_{j-1}(w | h')

where h' drops the oldest token of h, c(h, w) counts h followed by w, c(h) = sum_w c(h, w),
N1+(h) counts the distinct w seen after h, and P_{j-1} is used as it is when c(h) = 0. The
base P_0(w) = 1 / vocab_size is uniform, so every order sums to 1 over the vocabulary.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence

import numpy as np

DEFAULT_ORDER = 3
DEFAULT_DISCOUNT = 0.75


class NgramLM:
    """Counts of a token corpus and the interpolated absolutely discounted probabilities over it."""

    def __init__(self, docs: Sequence[np.ndarray], vocab_size: int, *, order: int = DEFAULT_ORDER,
                 discount: float = DEFAULT_DISCOUNT):
        """Counts every j-gram (j = 1..order) of `docs` (token-id arrays, ids in [0, vocab_size))."""
        if order < 1:
            raise ValueError(f"order must be >= 1, got {order}")
        if not 0 < discount < 1:
            raise ValueError(f"discount must lie in (0, 1), got {discount}")
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        self.order, self.discount, self.vocab_size = order, float(discount), int(vocab_size)
        self.start = self.vocab_size  # the start symbol: outside the vocabulary, never predicted
        # counts[j][(h, w)] with len(h) == j; totals[j][h] = c(h); distinct[j][h] = N1+(h).
        self.counts = [collections.Counter() for _ in range(order)]
        self.totals = [collections.Counter() for _ in range(order)]
        self.distinct = [collections.Counter() for _ in range(order)]
        for doc in docs:
            ids = [int(t) for t in np.asarray(doc).reshape(-1)]
            if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):
                raise ValueError(f"token ids must lie in [0, {self.vocab_size}), got [{min(ids)}, {max(ids)}]")
            padded = [self.start] * (order - 1) + ids
            for i in range(order - 1, len(padded)):
                w = padded[i]
                for j in range(order):
                    self.counts[j][(tuple(padded[i - j : i]), w)] += 1
        for j in range(order):
            for (h, _), c in self.counts[j].items():
                self.totals[j][h] += c
                self.distinct[j][h] += 1

    def prob(self, history: Sequence[int], w: int) -> float:
        """P(w | the last order - 1 tokens of `history`, start symbols before it)."""
        h = ([self.start] * (self.order - 1) + [int(t) for t in history])[len(history):]
        p = 1.0 / self.vocab_size
        for j in range(self.order):
            hj = tuple(h[len(h) - j :]) if j else ()
            total = self.totals[j].get(hj, 0)
            if total:
                c = self.counts[j].get((hj, int(w)), 0)
                p = max(c - self.discount, 0.0) / total + self.discount * self.distinct[j][hj] / total * p
        return p

    def log_prob(self, doc: np.ndarray) -> float:
        """Natural log-probability of a whole document (its tokens, from the start symbols)."""
        ids = [int(t) for t in np.asarray(doc).reshape(-1)]
        return float(sum(math.log(self.prob(ids[:i], w)) for i, w in enumerate(ids)))

    def score(self, docs: Sequence[np.ndarray]) -> np.ndarray:
        """Mean log-probability per token of each document (higher = more likely; empty -> 0)."""
        return np.array([self.log_prob(d) / max(np.asarray(d).size, 1) for d in docs], np.float64)
