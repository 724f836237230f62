"""Shared references of the dedup tests (and of the other tests that measure shared token runs)."""


def brute_longest_shared(doc, refs) -> int:
    """The longest run of tokens `doc` shares with any of `refs`, by trying every pair of starts."""
    best = 0
    for r in refs:
        for i in range(len(doc)):
            for j in range(len(r)):
                k = 0
                while i + k < len(doc) and j + k < len(r) and doc[i + k] == r[j + k]:
                    k += 1
                best = max(best, k)
    return best
