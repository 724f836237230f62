"""Word tokenization and vocabularies shared by the WordCNN and the n-gram metrics.

The paper's WordCNN preprocessing: lowercase, split on whitespace and punctuation (punctuation
is a separator, not a token), and a vocabulary of the most frequent words of the classifier's
own training set.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Iterable, Sequence

import numpy as np

_WORD = re.compile(r"[^\W_]+")  # runs of letters/digits (any script); everything else splits

PAD, OOV = 0, 1  # reserved ids of every `Vocabulary`


def words(text: str) -> list[str]:
    """Lowercased words of `text`, split on whitespace and punctuation."""
    return _WORD.findall(text.lower())


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """Word -> id with 0 = padding and 1 = out-of-vocabulary; ids 2.. by decreasing frequency."""

    tokens: tuple[str, ...]

    @classmethod
    def build(cls, texts: Iterable[str], max_size: int = 30_000) -> "Vocabulary":
        """The `max_size` most frequent words of `texts` (ties broken alphabetically)."""
        if max_size < 1:
            raise ValueError(f"max_size must be >= 1, got {max_size}")
        counts = collections.Counter(w for t in texts for w in words(t))
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:max_size]
        return cls(tuple(w for w, _ in ranked))

    @property
    def size(self) -> int:
        """Number of ids including the two reserved ones."""
        return len(self.tokens) + 2

    def _index(self) -> dict[str, int]:
        index = self.__dict__.get("_idx")
        if index is None:
            index = {w: i + 2 for i, w in enumerate(self.tokens)}
            object.__setattr__(self, "_idx", index)
        return index

    def encode(self, text: str) -> list[int]:
        index = self._index()
        return [index.get(w, OOV) for w in words(text)]

    def encode_batch(self, texts: Sequence[str], max_len: int) -> np.ndarray:
        """int32 `[len(texts), max_len]`, truncated and padded with PAD."""
        out = np.zeros((len(texts), max_len), dtype=np.int32)
        for i, t in enumerate(texts):
            ids = self.encode(t)[:max_len]
            out[i, : len(ids)] = ids
        return out
