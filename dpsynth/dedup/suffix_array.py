"""Suffix arrays, LCP arrays and cross-set matching over token arrays (wraps `dpsynth._native`).

The native code (`native/sais.cc`, `native/lcp.cc`) is our own SA-IS (linear time) over
integer alphabets. This module owns the policy the native side does not check:

* tokens: 1-D `uint16`, `uint32` or non-negative `int32` (viewed as `uint32`); other integer
  dtypes are converted when every value fits `uint32`, anything else is refused;
* contiguity: non-contiguous inputs are copied to a C-contiguous array;
* index width: `int32` suffix/LCP arrays while `n < 2**31 - 1`, else `int64`;
* alphabet: the native code keeps one bucket counter per symbol, so an alphabet much larger
  than the text (e.g. a few `uint32` ids near 2**32) is first mapped to dense ranks, which
  preserves the order and therefore the suffix array.

Conventions: `sa[r]` is the start of the r-th smallest suffix (a proper prefix sorts first);
`lcp[0] == 0` and `lcp[r]` is the longest common prefix of suffixes `sa[r - 1]` and `sa[r]`.
"""

from __future__ import annotations

import os

import numpy as np

# Largest length that still uses int32 indices (the native code reserves -1 and -2).
INT32_MAX_LENGTH = 2**31 - 2
# Alphabets up to this many symbols (or up to twice the text length) are used as they are;
# larger ones are mapped to dense ranks first (the native code keeps ~3 counters per symbol).
DENSE_ALPHABET_LIMIT = 1 << 17

_SUPPORTED = (np.dtype(np.uint16), np.dtype(np.uint32))


def _native():
    try:
        from dpsynth import _native
    except ImportError as e:  # pragma: no cover - depends on the build
        raise ImportError(
            "dpsynth._native is not built: run `python setup.py build_ext --inplace` "
            "(or `make build`) in the dpsynth checkout"
        ) from e
    return _native


def index_dtype(n: int) -> np.dtype:
    """The index dtype used for a text of `n` tokens: int32 below 2**31 - 1, else int64."""
    return np.dtype(np.int32) if n <= INT32_MAX_LENGTH else np.dtype(np.int64)


def check_threads(threads: int | None) -> int:
    """Validates a thread count (None = all CPUs) and returns it as an int >= 1."""
    if threads is None:
        return max(1, os.cpu_count() or 1)
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    return int(threads)


def as_token_array(tokens) -> np.ndarray:
    """Returns `tokens` as a 1-D C-contiguous uint16 or uint32 array (checked, never truncated)."""
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {arr.shape}")
    if arr.dtype in _SUPPORTED:
        return np.ascontiguousarray(arr)
    if arr.size == 0:
        return np.zeros(0, np.uint16)
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"tokens must be an integer array, got dtype {arr.dtype}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi > np.iinfo(np.uint32).max:
        raise ValueError(f"token ids must lie in [0, 2**32 - 1], got range [{lo}, {hi}]")
    if arr.dtype == np.dtype(np.int32):
        return np.ascontiguousarray(arr).view(np.uint32)  # non-negative: same order, no copy
    return np.ascontiguousarray(arr.astype(np.uint16 if hi <= 0xFFFF else np.uint32))


def _dense(tokens: np.ndarray) -> tuple[np.ndarray, int]:
    """(text, alphabet size) for the native code, remapping sparse huge alphabets to ranks."""
    n = tokens.size
    if n == 0:
        return tokens, 1
    alphabet = int(tokens.max()) + 1
    if alphabet <= max(DENSE_ALPHABET_LIMIT, 2 * n):
        return tokens, alphabet
    uniq, ranks = np.unique(tokens, return_inverse=True)
    return ranks.astype(np.uint32).reshape(-1), int(uniq.size)


def suffix_array(tokens, threads: int = 1, *, index_dtype_override=None) -> np.ndarray:
    """The suffix array of `tokens` (SA-IS, linear time; the GIL is released).

    Args:
      tokens: 1-D integer array of token ids in [0, 2**32 - 1] (uint16/uint32/int32 ...).
      threads: threads to use (results are identical for any count).
      index_dtype_override: force np.int64 indices on short inputs (for tests).

    Returns:
      int32 array (int64 when len(tokens) >= 2**31 - 1) with the suffix start positions in
      lexicographic order of the suffixes.
    """
    threads = check_threads(threads)
    text, alphabet = _dense(as_token_array(tokens))
    idx = np.dtype(index_dtype_override) if index_dtype_override is not None else index_dtype(text.size)
    if idx not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise ValueError(f"index dtype must be int32 or int64, got {idx}")
    if idx == np.dtype(np.int32) and text.size > INT32_MAX_LENGTH:
        raise ValueError(f"{text.size} tokens need int64 indices")
    out = np.empty(text.size, dtype=idx)
    _native().suffix_array(text, out, alphabet, threads)
    return out


def _check_sa(text: np.ndarray, sa) -> np.ndarray:
    sa = np.asarray(sa)
    if sa.ndim != 1 or sa.size != text.size:
        raise ValueError(f"suffix array has shape {sa.shape}, expected ({text.size},)")
    if sa.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise TypeError(f"suffix array must be int32 or int64, got {sa.dtype}")
    return np.ascontiguousarray(sa)


def lcp_array(tokens, sa, threads: int = 1) -> np.ndarray:
    """The LCP array of `tokens` given its suffix array `sa` (Kasai; same dtype as `sa`).

    `sa` must be the suffix array of `tokens` (as returned by `suffix_array`). Its entries are
    range-checked (so the native code stays memory-safe), not verified to be sorted.
    """
    threads = check_threads(threads)
    text = as_token_array(tokens)
    sa = _check_sa(text, sa)
    if sa.size and (int(sa.min()) < 0 or int(sa.max()) >= sa.size):
        raise ValueError("suffix array entries are out of range")
    out = np.empty_like(sa)
    _native().lcp_array(text, sa, out, threads)
    return out


def cross_match(sa, lcp, split: int) -> np.ndarray:
    """Matching statistics between two parts of one text, from its suffix and LCP arrays.

    With set A = positions [0, split) and set B = [split, n): `out[p]` is the length of the
    longest common prefix of suffix p with any suffix starting in the other set. When the
    text separates documents by unique separator tokens, no match crosses a document end.
    """
    sa = np.ascontiguousarray(sa)
    lcp = np.ascontiguousarray(lcp)
    if sa.shape != lcp.shape or sa.dtype != lcp.dtype or sa.ndim != 1:
        raise ValueError("sa and lcp must be 1-D arrays of one shape and dtype")
    if sa.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise TypeError(f"sa must be int32 or int64, got {sa.dtype}")
    if not 0 <= split <= sa.size:
        raise ValueError(f"split {split} is outside [0, {sa.size}]")
    if sa.size and (int(sa.min()) < 0 or int(sa.max()) >= sa.size):
        raise ValueError("suffix array entries are out of range")
    out = np.empty_like(sa)
    _native().cross_match(sa, lcp, out, int(split))
    return out
