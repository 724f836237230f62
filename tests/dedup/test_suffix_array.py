"""Native SA-IS suffix arrays and LCP arrays against pure-Python references."""

import numpy as np
import pytest

from dpsynth.dedup import suffix_array as sa_mod
from dpsynth.dedup.suffix_array import cross_match, index_dtype, lcp_array, suffix_array


def ref_sa(tokens):
    t = [int(x) for x in tokens]
    return sorted(range(len(t)), key=lambda i: t[i:])


def ref_lcp(tokens, sa):
    t = [int(x) for x in tokens]
    out = []
    for r, p in enumerate(sa):
        if r == 0:
            out.append(0)
            continue
        q, h = sa[r - 1], 0
        while p + h < len(t) and q + h < len(t) and t[p + h] == t[q + h]:
            h += 1
        out.append(h)
    return out


def random_inputs(seed, count, max_len=80):
    """Random texts over varied alphabets, with all-equal and periodic cases mixed in."""
    rng = np.random.default_rng(seed)
    for k in range(count):
        n = int(rng.integers(0, max_len))
        sigma = int(rng.choice([1, 2, 3, 4, 7, 50, 1000, 65536]))
        t = rng.integers(0, sigma, n)
        kind = k % 5
        if kind == 1 and n:
            t[:] = t[0]  # all equal
        elif kind == 2 and n > 3:
            t = np.resize(t[: int(rng.integers(1, 5))], n)  # periodic
        elif kind == 3 and n > 6:
            t[n // 2 :] = t[: n - n // 2]  # a repeated half
        yield t


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.int32])
@pytest.mark.parametrize("idx", [np.int32, np.int64])
def test_matches_sorted_suffixes(dtype, idx):
    for t in random_inputs(seed=np.dtype(dtype).num * 10 + np.dtype(idx).itemsize, count=250):
        t = t.astype(dtype)
        sa = suffix_array(t, index_dtype_override=idx)
        assert sa.dtype == idx
        expect = ref_sa(t)
        assert sa.tolist() == expect, t.tolist()
        lcp = lcp_array(t, sa)
        assert lcp.dtype == idx
        assert lcp.tolist() == ref_lcp(t, expect)


@pytest.mark.parametrize("n", [0, 1, 2])
def test_tiny_lengths(n):
    t = np.arange(n, dtype=np.uint16)[::-1].copy()
    assert suffix_array(t).tolist() == ref_sa(t)
    assert lcp_array(t, suffix_array(t)).tolist() == ref_lcp(t, ref_sa(t))


@pytest.mark.parametrize(
    "dtype,largest",
    [(np.uint16, 65535), (np.uint32, 100_000), (np.uint32, 2**32 - 1), (np.uint32, 2**20 + 7)],
)
def test_largest_token_ids(dtype, largest):
    rng = np.random.default_rng(largest % 97)
    for _ in range(40):
        n = int(rng.integers(1, 60))
        pool = np.array([0, 1, largest - 1, largest], dtype=np.uint64)
        t = rng.choice(pool, n).astype(dtype)
        assert suffix_array(t).tolist() == ref_sa(t), t.tolist()


def test_multithread_equals_single_thread_on_large_inputs():
    rng = np.random.default_rng(7)
    cases = [
        (rng.zipf(1.3, 300_000) % 30_000).astype(np.uint16),  # text-like, many buckets
        rng.integers(0, 3, 250_000).astype(np.uint16),  # small alphabet, deep recursion
        np.tile(rng.integers(0, 50, 997), 300).astype(np.uint32),  # periodic, long LCPs
        np.zeros(200_000, dtype=np.uint16),  # all equal
    ]
    for t in cases:
        sa1 = suffix_array(t, threads=1)
        sa2 = suffix_array(t, threads=2)
        sa3 = suffix_array(t, threads=3)
        np.testing.assert_array_equal(sa1, sa2)
        np.testing.assert_array_equal(sa1, sa3)
        np.testing.assert_array_equal(sa1, suffix_array(t, threads=2, index_dtype_override=np.int64))
        assert np.array_equal(np.sort(sa1), np.arange(t.size))
        # Sortedness via the LCP: the first differing token increases between neighbours.
        lcp = lcp_array(t, sa1, threads=2)
        np.testing.assert_array_equal(lcp, lcp_array(t, sa1, threads=1))
        prev, cur, h = sa1[:-1], sa1[1:], lcp[1:]
        end_prev = prev + h >= t.size
        assert not np.any((cur + h >= t.size) & ~end_prev)  # a shorter suffix never follows
        ok = ~end_prev & (cur + h < t.size)
        assert np.all(t[(prev + h)[ok]] < t[(cur + h)[ok]])


def test_input_checks():
    with pytest.raises(ValueError):
        suffix_array(np.array([1, -1], dtype=np.int32))
    with pytest.raises(ValueError):
        suffix_array(np.zeros((2, 2), dtype=np.uint16))
    with pytest.raises(TypeError):
        suffix_array(np.zeros(3, dtype=np.float32))
    with pytest.raises(ValueError):
        suffix_array(np.zeros(3, dtype=np.uint16), threads=0)
    with pytest.raises(ValueError):
        lcp_array(np.zeros(3, dtype=np.uint16), np.array([0, 1, 5], dtype=np.int32))
    # Non-contiguous input is copied, not misread.
    t = np.arange(20, dtype=np.uint16)[::-2]
    assert suffix_array(t).tolist() == ref_sa(t)


def test_index_width_policy():
    assert index_dtype(0) == np.int32
    assert index_dtype(sa_mod.INT32_MAX_LENGTH) == np.int32
    assert index_dtype(2**31) == np.int64


def test_cross_match_is_longest_match_in_other_set():
    rng = np.random.default_rng(3)
    for _ in range(150):
        n = int(rng.integers(1, 40))
        t = rng.integers(0, 3, n).astype(np.uint16)
        split = int(rng.integers(0, n + 1))
        sa = suffix_array(t)
        out = cross_match(sa, lcp_array(t, sa), split)
        tl = t.tolist()
        for p in range(n):
            others = range(split, n) if p < split else range(0, split)
            best = 0
            for q in others:
                h = 0
                while p + h < n and q + h < n and tl[p + h] == tl[q + h]:
                    h += 1
                best = max(best, h)
            assert out[p] == best
