"""The sensitive suffix array, built once, and matching public documents against it.

`SensitiveSuffixArray.build(index)` suffix-sorts the sensitive documents once (each followed
by its own separator, so no match crosses a document end) and keeps what matching needs:

* `text`: the sensitive tokens as uint32, separator `B + d` after document d (B = the
  index's token bound), so the last symbol is a separator;
* `sa`, `lcp`: its suffix and LCP arrays (native SA-IS and Kasai);
* `first[c]`: the number of suffixes starting with a token < c (c in [0, B]);
* `occ_start`, `occ_pos`: for every token c, the ranks r whose suffix is preceded by c
  (`text[sa[r] - 1] == c`), increasing: the BWT as per-symbol position lists;
* `occ_shift`, `ckpt_start`, `ckpt`: per token, its rank space in blocks of
  `2**occ_shift[c]` ranks holding about `OCC_BLOCK` occurrences each, and where each block
  starts in `occ_pos` (so a rank query searches one small block, not the whole list).

`match(tokens, offsets)` then never sorts the sensitive set again. Per public document, right
to left, the rank of each suffix among the sensitive suffixes follows from the next one by
LF mapping, `rank(c X) = first[c] + #{r < rank(X): bwt[r] == c}` (one binary search in c's
list); the matching statistic of a suffix is its longest common prefix with its two
neighbours in sorted order, found with the comparisons started where the LCP of the two
neighbours and the previous position's match (`ms[i] >= ms[i - 1] - 1`) already guarantee
agreement, so comparisons are O(n) in total whatever the repetition. Sensitive-side maxima
come from two sweeps over the sensitive suffix array. Public documents are independent, so
native threads take whole documents.

Memory: about 17 bytes per sensitive token (int32 indices) for the lifetime of the object,
plus while matching 4 bytes per public token and 8 bytes per sensitive token per thread.
Time: O(n log m) for n public and m sensitive tokens.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dpsynth.dedup.suffix_array import DENSE_ALPHABET_LIMIT, _native, check_threads, lcp_array, suffix_array


# Occurrences per checkpoint block of a token's BWT position list (see `ckpt`): 8 rather
# than 16 measured ~5% less matching CPU (one search step fewer, as queries land in dense
# blocks), and with int32 checkpoints the table is no larger than int64 ones at 16.
OCC_BLOCK = 8


def with_separators(tokens: np.ndarray, offsets: np.ndarray, first_sep: int) -> np.ndarray:
    """Tokens (as uint32) with separator first_sep + d inserted after document d."""
    docs = offsets.size - 1
    seps = np.arange(first_sep, first_sep + docs, dtype=np.uint32)
    return np.insert(np.asarray(tokens).astype(np.uint32), offsets[1:], seps)


@dataclasses.dataclass(frozen=True, eq=False)
class SensitiveSuffixArray:
    """The sorted sensitive suffixes and the tables matching needs (see module docstring)."""

    text: np.ndarray
    sa: np.ndarray
    lcp: np.ndarray
    first: np.ndarray
    occ_start: np.ndarray
    occ_pos: np.ndarray
    bound: int
    offsets: np.ndarray  # the index's document offsets (without separators)
    occ_shift: np.ndarray
    ckpt_start: np.ndarray
    ckpt: np.ndarray
    vocab: np.ndarray | None = None  # sorted token ids when remapped to dense ranks, else None

    @property
    def num_documents(self) -> int:
        return self.offsets.size - 1

    @classmethod
    def build(cls, tokens: np.ndarray, offsets: np.ndarray, bound: int, threads: int = 1) -> "SensitiveSuffixArray":
        """Sorts documents tokens[offsets[d]:offsets[d + 1]] (ids < bound) once.

        Args:
          tokens, offsets: the sensitive documents, concatenated, and int64 offsets (D + 1).
          bound: 1 + the largest token id (separators start there).
          threads: native threads for the suffix and LCP arrays.
        """
        threads = check_threads(threads)
        offsets = np.asarray(offsets, np.int64)
        tokens = np.asarray(tokens)
        docs = offsets.size - 1
        vocab = None
        if bound > max(DENSE_ALPHABET_LIMIT, 2 * tokens.size):  # sparse huge ids: dense ranks
            vocab, tokens = np.unique(tokens, return_inverse=True)
            bound = max(1, int(vocab.size))
        if bound + docs > np.iinfo(np.uint32).max:
            raise ValueError("vocabulary plus sensitive document count exceeds the uint32 separator space")
        text = with_separators(tokens, offsets, bound)
        sa = suffix_array(text, threads=threads)
        lcp = lcp_array(text, sa, threads=threads)
        m = text.size
        first = np.zeros(bound + 1, np.int64)
        np.cumsum(np.bincount(text[text < bound], minlength=bound), out=first[1:])
        # BWT symbol of each rank; the rank of the suffix at 0 (no predecessor) gets a separator.
        bwt = np.empty(m, np.uint32)
        if m:
            prev = sa - 1  # sa's dtype; -1 only where sa == 0
            bwt[:] = text[prev]  # text[-1] is a separator, as wanted for prev == -1
            del prev
        is_tok = bwt < bound
        occ_start = np.zeros(bound + 1, np.int64)
        np.cumsum(np.bincount(bwt[is_tok], minlength=bound), out=occ_start[1:])
        occ_pos = np.flatnonzero(is_tok).astype(sa.dtype)
        del is_tok
        occ_pos = occ_pos[np.argsort(bwt[bwt < bound], kind="stable")]
        del bwt
        # Checkpoints: block size 2**shift >= m * OCC_BLOCK / count, per token.
        counts = np.diff(occ_start)
        ratio = (max(m, 1) * OCC_BLOCK) / np.maximum(counts, 1)
        occ_shift = np.ceil(np.log2(np.maximum(ratio, 1.0))).astype(np.uint8)
        blocks = (m >> occ_shift.astype(np.int64)) + 2
        ckpt_start = np.zeros(bound, np.int64)
        np.cumsum(blocks[:-1], out=ckpt_start[1:])
        symbols = np.repeat(np.arange(bound, dtype=np.uint32), counts)
        gid = ckpt_start[symbols] + (occ_pos >> occ_shift[symbols].astype(occ_pos.dtype))
        del symbols
        per_block = np.bincount(gid, minlength=int(blocks.sum()))
        del gid
        ckpt = np.zeros(per_block.size, sa.dtype)  # exclusive running count = index into occ_pos (< m)
        np.cumsum(per_block[:-1], out=ckpt[1:])
        return cls(text=text, sa=sa, lcp=lcp, first=first, occ_start=occ_start, occ_pos=occ_pos,
                   bound=int(bound), offsets=offsets, occ_shift=occ_shift, ckpt_start=ckpt_start, ckpt=ckpt,
                   vocab=vocab)

    def match(self, tokens: np.ndarray, offsets: np.ndarray, threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """Matching statistics of public documents against the sensitive documents.

        Args:
          tokens: public token ids (1-D non-negative integers; ids >= bound never match).
          offsets: int64 document offsets (E + 1 entries, from 0 to tokens.size).
          threads: native threads (documents are split between them; identical results).

        Returns:
          (ms, sensitive_longest): ms[i] is the longest prefix of tokens[i:doc_end] occurring
          inside one sensitive document (the dtype of `sa`); sensitive_longest[d] (int64) is
          the longest sequence sensitive document d shares with any public document.
        """
        threads = check_threads(threads)
        idx = self.sa.dtype
        tokens = np.asarray(tokens)
        if tokens.size and tokens.dtype not in (np.dtype(np.uint16), np.dtype(np.uint32)):
            if int(tokens.min()) < 0 or int(tokens.max()) > np.iinfo(np.uint32).max:
                raise ValueError("token ids must lie in [0, 2**32 - 1]")
        if tokens.dtype != np.dtype(np.uint16):
            tokens = tokens.astype(np.uint32, copy=False)
        tokens = np.ascontiguousarray(tokens)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        if offsets.ndim != 1 or offsets.size < 1 or offsets[0] != 0 or offsets[-1] != tokens.size:
            raise ValueError("offsets must start at 0 and end at the token count")
        if np.any(np.diff(offsets) < 0):
            raise ValueError("offsets decrease")
        if self.vocab is not None and tokens.size:  # ids the sensitive text lacks map to >= bound
            pos = np.minimum(np.searchsorted(self.vocab, tokens), self.vocab.size - 1)
            tokens = np.where(self.vocab[pos] == tokens, pos, self.bound).astype(np.uint32)
        m = self.text.size
        ms = np.zeros(tokens.size, idx)
        best_la = np.zeros(m + 1, idx)
        best_lb = np.zeros(m + 1, idx)
        _native().match_documents(self.text, self.sa, self.lcp, self.first, self.occ_start, self.occ_pos,
                                  self.occ_shift, self.ckpt_start, self.ckpt, self.bound, tokens, offsets, ms, best_la, best_lb, threads)
        s_ms = np.zeros(m, idx)
        _native().sensitive_sweep(self.sa, self.lcp, best_la, best_lb, s_ms)
        docs = self.num_documents
        if docs:
            starts = self.offsets[:-1] + np.arange(docs)  # document starts in the separated text
            s_longest = np.maximum.reduceat(s_ms, starts).astype(np.int64)
        else:
            s_longest = np.zeros(0, np.int64)
        return ms, s_longest
