"""dedup_shard against brute force: every shared k-gram window, cut and merged."""

import numpy as np
import pytest

from dpsynth.dedup.index import SensitiveIndex
from dpsynth.dedup.match import (
    ShardStats,
    count_shared,
    dedup_shard,
    longest_shared,
    matching_statistics,
    shared_lengths,
)
from dpsynth.data.token_shards import TokenShard
from tests.dedup import brute_longest_shared


def make_shard(name, docs, dtype=np.uint16):
    offsets = np.zeros(len(docs) + 1, np.int64)
    np.cumsum([len(d) for d in docs], out=offsets[1:])
    tokens = np.concatenate([np.asarray(d, dtype) for d in docs]) if docs else np.zeros(0, dtype)
    return TokenShard(name, tokens.astype(dtype), offsets, [{"id": f"{name}-{i}"} for i in range(len(docs))])


def kgrams(doc, k):
    return {tuple(doc[i : i + k]) for i in range(len(doc) - k + 1)}


def longest_common_substring(x, y):
    best, prev = 0, [0] * (len(y) + 1)
    for a in x:
        cur = [0] * (len(y) + 1)
        for j, b in enumerate(y):
            if a == b:
                cur[j + 1] = prev[j] + 1
                best = max(best, cur[j + 1])
        prev = cur
    return best


def brute_force(sensitive, public, k):
    """Cut mask per public doc = union of length-k windows occurring in a sensitive doc."""
    s_grams = set().union(*(kgrams(d, k) for d in sensitive)) if sensitive else set()
    p_grams = set().union(*(kgrams(d, k) for d in public)) if public else set()
    masks = []
    for doc in public:
        m = [False] * len(doc)
        for i in range(len(doc) - k + 1):
            if tuple(doc[i : i + k]) in s_grams:
                m[i : i + k] = [True] * k
        masks.append(m)
    shared_docs = [d for d, doc in enumerate(sensitive) if kgrams(doc, k) & p_grams]
    longest = [max([longest_common_substring(s, p) for p in public] + [0]) for s in sensitive]
    return masks, shared_docs, longest


def runs(mask):
    out, i = [], 0
    while i < len(mask):
        if mask[i]:
            j = i
            while j < len(mask) and mask[j]:
                j += 1
            out.append((i, j))
            i = j
        else:
            i += 1
    return out


def check_against_brute_force(sensitive_sets, public, k, threads=1):
    index = SensitiveIndex.build([(name, make_shard(name, docs)) for name, docs in sensitive_sets])
    all_sensitive = [list(d) for _, docs in sensitive_sets for d in docs]
    shard = make_shard("pub", public)
    res = dedup_shard(index, shard, min_tokens=k, threads=threads)
    masks, shared_docs, longest = brute_force(all_sensitive, [list(d) for d in public], k)
    for j, doc in enumerate(public):
        assert res.ranges[j] == runs(masks[j]), (j, k)
        kept = [t for t, cut in zip(doc, masks[j]) if not cut]
        assert res.cleaned.document(j).tolist() == kept
        pieces = res.pieces[j]
        assert [x for a, b in pieces for x in res.cleaned.document(j)[a:b].tolist()] == kept
        assert all(b > a for a, b in pieces)
        # Pieces are the complement of the ranges, mapped into cleaned coordinates.
        assert len(pieces) == len(runs([not c for c in masks[j]]))
    assert res.cleaned.docs == shard.docs and res.cleaned.tokens.dtype == shard.tokens.dtype
    st = res.stats
    assert st.tokens == sum(len(d) for d in public)
    assert st.tokens_removed == sum(sum(m) for m in masks)
    assert st.documents == len(public)
    assert st.documents_touched == sum(any(m) for m in masks)
    assert st.documents_emptied == sum(1 for m in masks if m and all(m))
    assert sorted(st.sensitive_shared) == shared_docs
    for d in shared_docs:
        assert st.sensitive_shared[d] == longest[d]
    first = 0
    for i, (_, docs) in enumerate(sensitive_sets):
        assert st.dataset_longest[i] == max(longest[first : first + len(docs)], default=0)
        first += len(docs)
    return res


def planted_corpus(rng, k, sigma):
    """Random sensitive/public docs with planted copies at starts, ends, overlapping, k-1/k."""
    sens = [list(rng.integers(0, sigma, int(rng.integers(0, 4 * k)))) for _ in range(int(rng.integers(1, 6)))]
    if rng.random() < 0.5:
        sens.append([7] * (2 * k))  # a run of one token
    pub = [list(rng.integers(0, sigma, int(rng.integers(0, 5 * k)))) for _ in range(int(rng.integers(1, 7)))]
    for _ in range(int(rng.integers(0, 6))):
        src = sens[int(rng.integers(len(sens)))]
        if not src:
            continue
        length = int(rng.choice([k - 1, k, k + 1, int(rng.integers(1, 3 * k))]))
        length = max(1, min(length, len(src)))
        a = int(rng.integers(0, len(src) - length + 1))
        piece = src[a : a + length]
        dst = pub[int(rng.integers(len(pub)))]
        where = rng.choice(["start", "end", "middle", "overlap"])
        if where == "start":
            dst[:0] = piece
        elif where == "end":
            dst.extend(piece)
        elif where == "middle":
            p = int(rng.integers(0, len(dst) + 1))
            dst[p:p] = piece
        else:  # overlapping / nested: a shifted copy of the same source next to the first
            shift = int(rng.integers(0, max(1, length)))
            b = min(len(src), a + shift + length)
            dst.extend(piece + src[a + shift : b])
    return sens, pub


@pytest.mark.parametrize("k", [4, 5, 8])
@pytest.mark.parametrize("sigma", [2, 4, 30])
def test_random_planted_corpora_match_brute_force(k, sigma):
    rng = np.random.default_rng(1000 * k + sigma)
    removed = touched = 0
    for _ in range(12):
        sens, pub = planted_corpus(rng, k, sigma)
        half = len(sens) // 2
        res = check_against_brute_force([("a", sens[:half]), ("b", sens[half:])], pub, k)
        removed += res.stats.tokens_removed
        touched += res.stats.tokens > res.stats.tokens_removed > 0
    assert removed > 0 and touched > 0  # the planted overlaps were found somewhere


def test_k50_planted_and_threads_agree():
    rng = np.random.default_rng(50)
    for _ in range(3):
        sens, pub = planted_corpus(rng, 50, 500)
        r1 = check_against_brute_force([("train", sens)], pub, 50, threads=1)
        r2 = dedup_shard(
            SensitiveIndex.build([("train", make_shard("train", sens))]), make_shard("pub", pub), 50, threads=2
        )
        assert r1.ranges == r2.ranges and r1.stats == r2.stats


def test_exact_k_minus_one_is_kept_and_k_is_cut():
    k = 6
    secret = [10, 11, 12, 13, 14, 15, 16, 17]
    sens = [secret]
    pub = [[1] + secret[: k - 1] + [2], [3] + secret[2 : 2 + k] + [4]]
    res = check_against_brute_force([("s", sens)], pub, k)
    assert res.ranges == [[], [(1, 1 + k)]]


def test_matches_never_cross_document_boundaries():
    k = 6
    x, y = [20, 21, 22, 23], [24, 25, 26, 27]
    # Public: x ends doc 0, y starts doc 1; sensitive holds x+y contiguously.
    res = check_against_brute_force([("s", [x + y])], [[1, 2] + x, y + [3]], k)
    assert res.ranges == [[], []]
    # Sensitive: x ends doc 0, y starts doc 1; public holds x+y contiguously.
    res = check_against_brute_force([("s", [[9] + x, y + [9]])], [[5] + x + y + [5]], k)
    assert res.ranges == [[]]


def test_runs_of_one_token_and_touching_matches_merge():
    k = 5
    sens = [[7] * 12, [30, 31, 32, 33, 34]]
    pub = [[7] * 4 + [1] + [7] * 5 + [30, 31, 32, 33, 34] + [2], [7] * 20]
    res = check_against_brute_force([("s", sens)], pub, k)
    assert res.ranges[0] == [(5, 15)]  # touching [5,10) and [10,15) merge
    assert res.ranges[1] == [(0, 20)]
    assert res.stats.documents_emptied == 1
    assert res.pieces[1] == [] and res.cleaned.document(1).size == 0


def test_empty_inputs():
    idx = SensitiveIndex.build([("s", make_shard("s", []))])
    res = dedup_shard(idx, make_shard("p", [[1, 2, 3], []]), min_tokens=2)
    assert res.ranges == [[], []] and res.stats.tokens_removed == 0
    assert res.stats.dataset_longest == (0,)
    idx = SensitiveIndex.build([("s", make_shard("s", [[1, 2, 3]]))])
    res = dedup_shard(idx, make_shard("p", []), min_tokens=2)
    assert res.cleaned.num_documents == 0 and res.stats.documents == 0
    with pytest.raises(ValueError):
        dedup_shard(idx, make_shard("p", [[1]]), min_tokens=0)


def test_public_ids_above_sensitive_vocab_and_uint32_tokens():
    big = 2**20
    sens = [[big + 1, big + 2, big + 3, 5]]
    pub = [[big + 9, big + 1, big + 2, big + 3, 4]]
    idx = SensitiveIndex.build([("s", make_shard("s", sens, np.uint32))])
    res = dedup_shard(idx, make_shard("p", pub, np.uint32), min_tokens=3)
    assert res.ranges == [[(1, 4)]]


def test_matching_statistics_definition():
    rng = np.random.default_rng(9)
    sens = [list(rng.integers(0, 3, 15)) for _ in range(3)]
    pub = [list(rng.integers(0, 3, 12)) for _ in range(3)]
    idx = SensitiveIndex.build([("s", make_shard("s", sens))])
    shard = make_shard("p", pub)
    ms, _ = matching_statistics(idx, shard.tokens, shard.offsets)
    pos = 0
    for doc in pub:
        for i in range(len(doc)):
            best = 0
            for s in sens:
                for j in range(len(s)):
                    h = 0
                    while i + h < len(doc) and j + h < len(s) and doc[i + h] == s[j + h]:
                        h += 1
                    best = max(best, h)
            assert ms[pos] == best
            pos += 1


def test_count_and_longest_shared():
    rng = np.random.default_rng(4)
    sens = [list(rng.integers(0, 50, 60)) for _ in range(4)]
    idx = SensitiveIndex.build([("s", make_shard("s", sens))])
    gen = [list(rng.integers(0, 50, 30)) for _ in range(5)]
    gen[1][5:17] = sens[2][10:22]
    gen[3][0:9] = sens[0][40:49]
    expect = [max(longest_common_substring(g, s) for s in sens) for g in gen]
    np.testing.assert_array_equal(shared_lengths(idx, [np.array(g) for g in gen]), expect)
    assert longest_shared(idx, np.array(gen[1])) == expect[1] >= 12
    got = count_shared(idx, [np.array(g) for g in gen], min_tokens=9)
    assert got == (sum(e >= 9 for e in expect), max(expect))
    assert count_shared(idx, [], min_tokens=9) == (0, 0)


def test_stats_roundtrip_and_merge():
    a = ShardStats(1, 3, 1, 0, 100, 7, {2: 60, 5: 51}, (60, 0))
    b = ShardStats(1, 2, 2, 1, 50, 50, {2: 70}, (70, 3))
    m = a.merge(b)
    assert m == b.merge(a)
    assert m.sensitive_shared == {2: 70, 5: 51} and m.dataset_longest == (70, 3)
    assert m.tokens_removed == 57 and m.shards == 2
    assert ShardStats.from_dict(m.to_dict()) == m


def test_threads_equal_one_thread_on_a_shard_the_native_code_splits():
    rng = np.random.default_rng(11)
    sens = [list(rng.integers(0, 20, 30)) for _ in range(4)]
    pub = [list(rng.integers(0, 20, int(rng.integers(0, 240)))) for _ in range(800)]
    for j in range(0, 800, 3):
        s = sens[j % 4]
        pub[j][5:5] = s[2:20]
    index = SensitiveIndex.build([("s", make_shard("s", sens))])
    shard = make_shard("p", pub)
    assert shard.num_tokens >= 1 << 16  # large enough for the native code to use threads
    one = dedup_shard(index, shard, min_tokens=6, threads=1)
    for threads in (2, 3):
        many = dedup_shard(index, shard, min_tokens=6, threads=threads)
        assert many.ranges == one.ranges and many.pieces == one.pieces and many.stats == one.stats
        np.testing.assert_array_equal(many.cleaned.tokens, one.cleaned.tokens)
    assert one.stats.tokens_removed > 0
    np.testing.assert_array_equal(
        shared_lengths(index, [np.array(d) for d in pub], threads=3), shared_lengths(index, [np.array(d) for d in pub])
    )


def test_longest_shared_with_against_brute_force():
    from dpsynth.dedup.match import longest_shared_with

    rng = np.random.default_rng(3)
    refs = [rng.integers(0, 6, size=rng.integers(0, 25)) for _ in range(9)]
    docs = [rng.integers(0, 6, size=rng.integers(0, 20)) for _ in range(12)]
    refs[1] = rng.integers(0, 6, 24)
    docs.append(np.concatenate([rng.integers(0, 6, 3), refs[1], rng.integers(0, 6, 3)]))  # a planted copy
    got = longest_shared_with(refs, docs)
    assert got.dtype == np.int64 and got.tolist() == [brute_longest_shared(d, refs) for d in docs]
    # A sequence spanning two reference documents is not shared (no match crosses a document end).
    assert longest_shared_with([np.array([1, 2]), np.array([3, 4])], [np.array([1, 2, 3, 4])]).tolist() == [2]
