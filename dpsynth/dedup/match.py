"""Finding and cutting every >= k token sequence a public shard shares with sensitive data.

Algorithm (exact; the sensitive set is sorted once, each shard costs O(n log m)): the
sensitive documents, each followed by its own separator, are suffix-sorted once per index
(`dpsynth.dedup.sensitive_sa`). For a public shard, every position i gets its matching
statistic ms[i]: the length of the longest prefix of its document's suffix at i that occurs
inside one sensitive document (separators never match, so no match crosses a document end
on either side). A public position i with ms[i] >= k starts a shared sequence of length ms[i]
(maximal to the right); the union of [i, i + ms[i]) over those positions is exactly the set
of public tokens covered by some shared sequence of >= k tokens, i.e. overlapping and
touching matches merged. Those ranges are cut. Symmetrically, each sensitive document gets
its longest sequence shared with the shard.

Ranges are half-open `[a, b)` token offsets within their public document.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from dpsynth.data.token_shards import TokenShard
from dpsynth.dedup import DEFAULT_MIN_TOKENS
from dpsynth.dedup.index import SensitiveIndex, check_token_arrays
from dpsynth.dedup.suffix_array import check_threads

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ShardStats:
    """Counts of one public shard (or, merged, of a whole corpus). Ids and counts only.

    Attributes:
      shards: number of shards merged in.
      documents, documents_touched, documents_emptied: public documents in total, with at
        least one cut range, and non-empty ones left empty by the cuts.
      tokens, tokens_removed: public tokens before cleaning and cut.
      sensitive_shared: global sensitive document index -> longest sequence (tokens) it
        shares with the public data, for documents sharing >= min_tokens.
      dataset_longest: per sensitive dataset (index order), the longest shared sequence of
        any length.
    """

    shards: int = 1
    documents: int = 0
    documents_touched: int = 0
    documents_emptied: int = 0
    tokens: int = 0
    tokens_removed: int = 0
    sensitive_shared: dict[int, int] = dataclasses.field(default_factory=dict)
    dataset_longest: tuple[int, ...] = ()

    def merge(self, other: "ShardStats") -> "ShardStats":
        """Sums the counts and takes the maximum of the shared lengths."""
        shared = dict(self.sensitive_shared)
        for doc, length in other.sensitive_shared.items():
            shared[doc] = max(shared.get(doc, 0), length)
        a, b = self.dataset_longest, other.dataset_longest
        width = max(len(a), len(b))
        a, b = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
        return ShardStats(
            shards=self.shards + other.shards,
            documents=self.documents + other.documents,
            documents_touched=self.documents_touched + other.documents_touched,
            documents_emptied=self.documents_emptied + other.documents_emptied,
            tokens=self.tokens + other.tokens,
            tokens_removed=self.tokens_removed + other.tokens_removed,
            sensitive_shared=dict(sorted(shared.items())),
            dataset_longest=tuple(max(x, y) for x, y in zip(a, b)),
        )

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["sensitive_shared"] = {str(k): v for k, v in sorted(self.sensitive_shared.items())}
        d["dataset_longest"] = list(self.dataset_longest)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ShardStats":
        d = dict(d)
        d["sensitive_shared"] = {int(k): int(v) for k, v in d["sensitive_shared"].items()}
        d["dataset_longest"] = tuple(int(x) for x in d["dataset_longest"])
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class ShardResult:
    """The cleaned shard and what was cut.

    Attributes:
      cleaned: the shard with every range removed (same name, document order, metadata and
        token dtype; emptied documents stay, with zero tokens).
      ranges: per document, the merged half-open [a, b) ranges cut (offsets in the original
        document), sorted and disjoint, non-touching.
      stats: counts, and the sensitive documents found.
    """

    cleaned: TokenShard
    ranges: list[list[tuple[int, int]]]
    stats: ShardStats

    @property
    def pieces(self) -> list[list[tuple[int, int]]]:
        """Per document, the kept pieces as half-open [a, b) offsets within the CLEANED
        document (so text can be written with a break between pieces); empty pieces omitted."""
        out = []
        lengths = np.diff(self.cleaned.offsets).tolist()
        for j, cut in enumerate(self.ranges):
            if not cut:
                out.append([(0, lengths[j])] if lengths[j] else [])
                continue
            pieces, removed, start = [], 0, 0
            for a, b in cut:
                if a > start:
                    pieces.append((start - removed, a - removed))
                removed += b - a
                start = b
            if start - removed < lengths[j]:
                pieces.append((start - removed, lengths[j]))
            out.append(pieces)
        return out


def _check_public(shard: TokenShard) -> tuple[np.ndarray, np.ndarray]:
    return check_token_arrays(shard, f"public shard {shard.name!r}")


def matching_statistics(
    index: SensitiveIndex, tokens: np.ndarray, offsets: np.ndarray, threads: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Exact matching statistics between documents and the sensitive index.

    The sensitive suffix array is built once per index (`SensitiveIndex.sorted_suffixes`) and
    each call only locates the documents' suffixes in it (`SensitiveSuffixArray.match`);
    with threads >= 2 the documents are split between native threads (identical results).

    Args:
      index: the sensitive index.
      tokens, offsets: documents as one concatenated token array and int64 offsets (n + 1).
      threads: threads to use.

    Returns:
      (ms, sensitive_longest): ms[i] (int32 or int64, one per token) is the length of the longest
      prefix of tokens[i:doc_end] that occurs inside some sensitive document;
      sensitive_longest[d] is the longest sequence sensitive document d shares with the
      given documents.
    """
    threads = check_threads(threads)
    return index.sorted_suffixes(threads).match(tokens, offsets, threads)


def _covered(ms: np.ndarray, min_tokens: int) -> np.ndarray:
    """Positions inside [i, i + ms[i]) for some i with ms[i] >= min_tokens."""
    if not ms.size:
        return np.zeros(0, bool)
    idx = np.arange(ms.size, dtype=ms.dtype)  # i + ms[i] <= ms.size: no overflow
    ends = np.where(ms >= min_tokens, idx + ms, 0)
    np.maximum.accumulate(ends, out=ends)
    return ends > idx


def _runs(mask: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Maximal runs of True in `mask`, split at document starts: (doc, start, end) global."""
    n = mask.size
    if n == 0:
        z = np.zeros(0, np.int64)
        return z, z, z
    boundary = np.zeros(n + 1, bool)
    boundary[offsets] = True  # a run may not continue across a document start
    m = mask.astype(np.int8)
    prev = np.concatenate([[0], m[:-1]])
    nxt = np.concatenate([m[1:], [0]])
    starts = np.flatnonzero(mask & ((prev == 0) | boundary[:-1]))
    ends = np.flatnonzero(mask & ((nxt == 0) | boundary[1:])) + 1
    docs = np.searchsorted(offsets, starts, side="right") - 1
    return docs, starts, ends


def _per_doc(num_docs: int, docs: np.ndarray, a: np.ndarray, b: np.ndarray) -> list[list[tuple[int, int]]]:
    out: list[list[tuple[int, int]]] = [[] for _ in range(num_docs)]
    for d, x, y in zip(docs.tolist(), a.tolist(), b.tolist()):
        out[d].append((x, y))
    return out


def dedup_shard(
    index: SensitiveIndex,
    shard: TokenShard,
    min_tokens: int = DEFAULT_MIN_TOKENS,
    threads: int = 1,
) -> ShardResult:
    """Cuts every token sequence of >= min_tokens that `shard` shares with the index.

    Args:
      index: all sensitive documents (`SensitiveIndex.build` / `.load`).
      shard: one public shard; documents are separated by its offsets.
      min_tokens: k, the shortest shared sequence to cut (>= 1).
      threads: threads (identical results for any count): the shard's documents are split
        between native threads (see `matching_statistics`).

    Returns:
      ShardResult with the cleaned shard, the merged [a, b) ranges per document, the kept
      pieces per cleaned document, and stats (counts and sensitive documents found).
    """
    if isinstance(min_tokens, bool) or not isinstance(min_tokens, (int, np.integer)) or min_tokens < 1:
        raise ValueError(f"min_tokens must be a positive integer, got {min_tokens!r}")
    threads = check_threads(threads)
    t0 = time.monotonic()
    tokens, offsets = _check_public(shard)
    num_docs = offsets.size - 1
    ms, s_longest = matching_statistics(index, tokens, offsets, threads)
    cut = _covered(ms, int(min_tokens))
    del ms  # the per-shard peak is this post-processing: free what is done with

    if cut.any():
        docs, a, b = _runs(cut, offsets)
        ranges = _per_doc(num_docs, docs, a - offsets[docs], b - offsets[docs])
        keep = ~cut
        kept_cum = np.zeros(tokens.size + 1, np.int32 if tokens.size < 2**31 else np.int64)
        np.cumsum(keep, out=kept_cum[1:])
        new_offsets = kept_cum[offsets].astype(np.int64)
        cleaned_tokens = tokens[keep]
    else:  # nothing cut (most shards): the shard as it is
        ranges, new_offsets, cleaned_tokens = [[] for _ in range(num_docs)], offsets, tokens
    cleaned = TokenShard(name=shard.name, tokens=cleaned_tokens, offsets=new_offsets, docs=list(shard.docs))

    lengths = np.diff(offsets)
    new_lengths = np.diff(new_offsets)
    shared = np.flatnonzero(s_longest >= min_tokens)
    dataset_longest = tuple(
        int(s_longest[d.first_doc : d.first_doc + d.num_examples].max(initial=0)) for d in index.datasets
    )
    stats = ShardStats(
        shards=1,
        documents=num_docs,
        documents_touched=int(np.count_nonzero(new_lengths < lengths)),
        documents_emptied=int(np.count_nonzero((lengths > 0) & (new_lengths == 0))),
        tokens=int(tokens.size),
        tokens_removed=int(np.count_nonzero(cut)),
        sensitive_shared={int(d): int(s_longest[d]) for d in shared},
        dataset_longest=dataset_longest,
    )
    elapsed = time.monotonic() - t0
    logger.info(
        "dedup %s: %d docs, %d tokens, %d removed in %d docs, %d sensitive docs shared; %.3g tokens/s",
        shard.name, stats.documents, stats.tokens, stats.tokens_removed, stats.documents_touched,
        len(stats.sensitive_shared), stats.tokens / max(elapsed, 1e-9),
    )
    return ShardResult(cleaned=cleaned, ranges=ranges, stats=stats)


def _as_documents(docs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    arrays = [np.asarray(d).reshape(-1) for d in docs]
    for i, arr in enumerate(arrays):
        if arr.size and (not np.issubdtype(arr.dtype, np.integer) or int(arr.min()) < 0):
            raise ValueError(f"document {i}: token ids must be non-negative integers")
    offsets = np.zeros(len(arrays) + 1, np.int64)
    np.cumsum([a.size for a in arrays], out=offsets[1:])
    tokens = np.concatenate(arrays).astype(np.int64) if arrays else np.zeros(0, np.int64)
    return tokens, offsets


def shared_lengths(index: SensitiveIndex, docs: Sequence[np.ndarray], threads: int = 1) -> np.ndarray:
    """Per document, the longest token sequence it shares with any sensitive document."""
    tokens, offsets = _as_documents(docs)
    ms, _ = matching_statistics(index, tokens, offsets, check_threads(threads))
    if not len(docs):
        return np.zeros(0, np.int64)
    starts = offsets[:-1]
    longest = np.zeros(len(docs), np.int64)
    nonempty = np.flatnonzero(np.diff(offsets) > 0)
    if nonempty.size:
        longest[nonempty] = np.maximum.reduceat(ms, starts[nonempty])
    return longest


class SharedCount(NamedTuple):
    """How many documents share a >= min_tokens sequence with sensitive data, and the longest."""

    num_docs_sharing: int
    longest: int


def count_shared(
    index: SensitiveIndex, docs: Sequence[np.ndarray], min_tokens: int = DEFAULT_MIN_TOKENS, threads: int = 1
) -> SharedCount:
    """Memorisation check for generated documents: one native pass over all of them."""
    longest = shared_lengths(index, docs, threads)
    return SharedCount(int(np.count_nonzero(longest >= min_tokens)), int(longest.max(initial=0)))


def longest_shared(index: SensitiveIndex, tokens: np.ndarray, threads: int = 1) -> int:
    """The longest token sequence of `tokens` that occurs in some sensitive document."""
    return int(shared_lengths(index, [tokens], threads)[0])


def longest_shared_with(reference: Sequence[np.ndarray], docs: Sequence[np.ndarray], threads: int = 1) -> np.ndarray:
    """Per document of `docs`, the longest token sequence it shares with any document of
    `reference` (both lists of token-id arrays): `shared_lengths` over a one-dataset index of
    `reference` (no match crosses a document end on either side)."""
    from dpsynth.data.token_shards import TokenShard
    from dpsynth.dedup.index import SensitiveIndex

    tokens, offsets = _as_documents(reference)
    shard = TokenShard("reference", tokens, offsets, [{"id": str(i)} for i in range(len(reference))])
    return np.asarray(shared_lengths(SensitiveIndex.build([("reference", shard)]), docs, threads), np.int64)
