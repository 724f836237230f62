"""The sensitive suffix array, sorted once, against brute force and the joint-sort reference."""

import dataclasses

import numpy as np
import pytest

from dpsynth.dedup.sensitive_sa import SensitiveSuffixArray, with_separators
from dpsynth.dedup.suffix_array import cross_match, lcp_array, suffix_array


def concat(docs, dtype=np.uint16):
    offsets = np.zeros(len(docs) + 1, np.int64)
    np.cumsum([len(d) for d in docs], out=offsets[1:])
    tokens = np.concatenate([np.asarray(d, np.int64) for d in docs]) if docs else np.zeros(0, np.int64)
    return tokens.astype(dtype), offsets


def build(docs, dtype=np.uint16, threads=1):
    tokens, offsets = concat(docs, dtype)
    bound = int(tokens.max()) + 1 if tokens.size else 1
    return SensitiveSuffixArray.build(tokens, offsets, bound, threads)


def brute(sens, pub):
    """ms per public token and longest shared per sensitive document, by direct comparison."""
    def lcp(x, i, y, j):
        h = 0
        while i + h < len(x) and j + h < len(y) and x[i + h] == y[j + h]:
            h += 1
        return h

    ms = [max([lcp(p, i, s, j) for s in sens for j in range(len(s))], default=0) for p in pub for i in range(len(p))]
    longest = [max([lcp(p, i, s, j) for p in pub for i in range(len(p)) for j in range(len(s))], default=0)
               for s in sens]
    return ms, longest


def joint(sens, pub):
    """The previous algorithm: sensitive and public sorted together, two sweeps (cross_match)."""
    st, so = concat(sens, np.uint32)
    pt, po = concat(pub, np.uint32)
    bound = int(max(st.max(initial=0), pt.max(initial=0))) + 1
    s = with_separators(st, so, bound)
    p = with_separators(pt, po, bound + len(sens))
    text = np.concatenate([s, p])
    sa = suffix_array(text)
    ms = cross_match(sa, lcp_array(text, sa), s.size)
    p_ms = np.delete(ms[s.size:], po[1:] + np.arange(len(pub)))
    s_longest = np.maximum.reduceat(ms[: s.size], so[:-1] + np.arange(len(sens))) if sens else np.zeros(0)
    return p_ms, s_longest


def random_docs(rng, count, sigma, max_len):
    return [list(rng.integers(0, sigma, int(rng.integers(0, max_len + 1)))) for _ in range(count)]


def plant(rng, sens, pub, k):
    """Copies of sensitive pieces of length k - 1, k, k + 1 or whole documents at public
    document starts and ends, and pieces that only match across a document boundary."""
    for _ in range(int(rng.integers(1, 5))):
        src = sens[int(rng.integers(len(sens)))]
        dst = pub[int(rng.integers(len(pub)))]
        if not src:
            continue
        length = max(1, min(len(src), int(rng.choice([k - 1, k, k + 1, len(src)]))))
        a = int(rng.integers(0, len(src) - length + 1))
        piece = src[a : a + length]
        where = rng.choice(["start", "end", "split"])
        if where == "start":
            dst[:0] = piece
        elif where == "end":
            dst.extend(piece)
        else:  # the end of one sensitive document followed by the start of the next
            nxt = sens[int(rng.integers(len(sens)))]
            dst.extend(src[-k:] + nxt[:k])


@pytest.mark.parametrize("sigma", [2, 3, 7, 60])
def test_random_inputs_match_brute_force_and_joint_sort(sigma):
    rng = np.random.default_rng(sigma)
    k = 5
    for _ in range(25):
        sens = random_docs(rng, int(rng.integers(1, 6)), sigma, 20)
        pub = random_docs(rng, int(rng.integers(1, 6)), sigma, 25)
        plant(rng, sens, pub, k)
        index = build(sens)
        tokens, offsets = concat(pub)
        ms, longest = index.match(tokens, offsets)
        want_ms, want_longest = brute(sens, pub)
        assert ms.tolist() == want_ms
        assert longest.tolist() == want_longest
        j_ms, j_longest = joint(sens, pub)
        assert ms.tolist() == j_ms.tolist() and longest.tolist() == j_longest.tolist()


def test_k_minus_one_and_k_at_document_boundaries():
    k = 6
    secret = [10, 11, 12, 13, 14, 15, 16, 17]
    other = [20, 21, 22, 23]
    index = build([secret, other])
    pub = [secret[: k - 1], secret[-k:], [1] + secret[2 : 2 + k], secret[-3:] + other[:3]]
    ms, longest = index.match(*concat(pub))
    starts = concat(pub)[1][:-1]
    assert ms[starts[0]] == k - 1 and ms[starts[1]] == k and ms[starts[2] + 1] == k
    assert ms[starts[3]] == 3  # never across the sensitive document boundary
    assert longest.tolist() == [k, 3]


def test_repetitive_documents_and_tokens_missing_from_the_sensitive_set():
    index = build([[7] * 50, [3, 4, 5]])
    pub = [[7] * 400, [9, 3, 4, 5, 9, 65000, 3, 4], [65000] * 3, []]
    ms, longest = index.match(*concat(pub))
    np.testing.assert_array_equal(ms[:400], np.minimum(50, np.arange(400, 0, -1)))
    assert ms[400:408].tolist() == [0, 3, 2, 1, 0, 0, 2, 1]
    assert ms[408:].tolist() == [0, 0, 0]
    assert longest.tolist() == [50, 3]


def test_sparse_huge_ids_are_ranked_and_public_ids_outside_never_match():
    big = 2**31
    sens = [[big + 5, big + 1, 2, big + 5]]
    index = build(sens, np.uint32)
    assert index.vocab is not None and index.bound == 3
    pub = [[big + 5, big + 1, 2, 1, big + 5, big + 6]]
    ms, longest = index.match(*concat(pub, np.uint32))
    assert ms.tolist() == [3, 2, 1, 0, 1, 0] and longest.tolist() == [3]


def test_empty_sides():
    index = build([])
    ms, longest = index.match(*concat([[1, 2], []]))
    assert ms.tolist() == [0, 0] and longest.size == 0
    index = build([[1, 2, 3], []])
    ms, longest = index.match(*concat([]))
    assert ms.size == 0 and longest.tolist() == [0, 0]


def test_threads_identical_on_a_split_input():
    rng = np.random.default_rng(3)
    sens = random_docs(rng, 30, 6, 60)
    pub = random_docs(rng, 900, 6, 200)
    plant(rng, sens, pub, 8)
    tokens, offsets = concat(pub)
    assert tokens.size >= 1 << 16  # the native code splits documents between threads from here
    index = build(sens, threads=2)
    one = index.match(tokens, offsets, threads=1)
    j_ms, j_longest = joint(sens, pub)
    np.testing.assert_array_equal(one[0], j_ms)
    np.testing.assert_array_equal(one[1], j_longest)
    for threads in (2, 5):
        many = index.match(tokens, offsets, threads=threads)
        np.testing.assert_array_equal(many[0], one[0])
        np.testing.assert_array_equal(many[1], one[1])


def test_int64_indices_match_int32():
    """The int64 index path (texts of 2**31 tokens or more) on a small input: the same tables
    widened give the same results, with one thread and several."""
    rng = np.random.default_rng(5)
    sens = random_docs(rng, 40, 5, 80)
    pub = random_docs(rng, 900, 5, 200)
    plant(rng, sens, pub, 8)
    tokens, offsets = concat(pub)
    narrow = build(sens)
    assert narrow.sa.dtype == np.int32 and narrow.ckpt.dtype == np.int32
    wide = dataclasses.replace(narrow, **{f: getattr(narrow, f).astype(np.int64) for f in ("sa", "lcp", "occ_pos", "ckpt")})
    want = narrow.match(tokens, offsets)
    for threads in (1, 3):
        ms, longest = wide.match(tokens, offsets, threads=threads)
        assert ms.dtype == np.int64
        np.testing.assert_array_equal(ms, want[0])
        np.testing.assert_array_equal(longest, want[1])


def test_bad_offsets_are_refused():
    index = build([[1, 2, 3]])
    with pytest.raises(ValueError, match="offsets"):
        index.match(np.array([1, 2], np.uint16), np.array([0, 3]))
    with pytest.raises(ValueError, match="decrease"):
        index.match(np.array([1, 2], np.uint16), np.array([0, 2, 1, 2]))
    with pytest.raises(ValueError, match="token ids"):
        index.match(np.array([1, -2]), np.array([0, 2]))
