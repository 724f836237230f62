"""`generation_report.json` (duplicates, label balance, lengths) and the owner-only memorisation audit.

`generation_report` is computed from the synthetic data alone (DP post-processing), so it
travels with the data and says `"dp": true`; it never reads D_train.

`memorisation_audit` (opt-in: `--train PATH`) reads D_train: for every synthetic example it
finds the longest token sequence it shares with any training example (suffix arrays,
`dpsynth.dedup`), and counts the synthetic examples sharing at least `min_shared_tokens`
tokens with D_train. It is a post-hoc audit for the data owner and is NOT differentially
private, so it is never part of `generation_report.json` or of anything else in the
synthetic corpus directory: the job writes it to an owner-only file (0600, in a 0700
directory, `dpsynth.owner_only`) outside that directory.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dpsynth.dedup import DEFAULT_MIN_TOKENS

NOT_DP_NOTICE = (
    "The memorisation section reads D_train and is NOT differentially private: it is a post-hoc "
    "audit for the data owner and must not be shared alongside the synthetic data."
)


def duplicate_stats(texts: Sequence[str]) -> dict[str, Any]:
    """Exact duplicates within `texts`: examples equal to an earlier one, and their rate."""
    counts = Counter(texts)
    dup = sum(c - 1 for c in counts.values())
    n = len(texts)
    return {
        "num_examples": n,
        "num_unique": len(counts),
        "num_duplicates": dup,
        "duplicate_rate": dup / n if n else 0.0,
        "max_copies": max(counts.values()) if counts else 0,
    }


def length_stats(lengths: Sequence[int], finished: Sequence[bool], max_len: int | None = None) -> dict[str, Any]:
    """Distribution of generated lengths in tokens (EOS excluded)."""
    a = np.asarray(lengths, np.int64)
    if a.size == 0:
        return {"num_examples": 0}
    edges = [0, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    hist = {}
    for lo, hi in zip(edges[:-1], edges[1:]):
        c = int(((a >= lo) & (a < hi)).sum())
        if c:
            hist[f"[{lo},{hi})"] = c
    big = int((a >= edges[-1]).sum())
    if big:
        hist[f"[{edges[-1]},inf)"] = big
    out = {
        "num_examples": int(a.size),
        "min": int(a.min()),
        "mean": float(a.mean()),
        "p50": float(np.percentile(a, 50)),
        "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)),
        "max": int(a.max()),
        "empty": int((a == 0).sum()),
        "hit_max_len": int(np.sum(~np.asarray(finished, bool))),
        "histogram": hist,
    }
    if max_len is not None:
        out["max_len"] = int(max_len)
    return out


def memorisation_stats(
    train_docs: Sequence[np.ndarray], synth_docs: Sequence[np.ndarray], min_tokens: int = DEFAULT_MIN_TOKENS
) -> dict[str, Any]:
    """Longest token sequence each synthetic doc shares with any training doc (dpsynth.dedup).

    Returns:
      longest shared length overall, how many synthetic docs share >= `min_tokens` tokens,
      and a histogram of the per-document longest shared lengths.
    """
    from dpsynth.dedup.match import longest_shared_with

    longest = longest_shared_with([np.asarray(d, np.int64) for d in train_docs],
                                  [np.asarray(d, np.int64) for d in synth_docs])
    return {
        "min_shared_tokens": int(min_tokens),
        "longest_shared_tokens": int(longest.max()) if longest.size else 0,
        "num_sharing_at_least_min": int((longest >= min_tokens).sum()),
        "fraction_sharing_at_least_min": float((longest >= min_tokens).mean()) if longest.size else 0.0,
        "longest_shared_p50": float(np.percentile(longest, 50)) if longest.size else 0.0,
        "longest_shared_p99": float(np.percentile(longest, 99)) if longest.size else 0.0,
    }


def generation_report(
    records: Mapping[str, Sequence[Mapping[str, Any]]],
    label_distribution: Mapping[str, Any],
    *,
    max_len: int | None = None,
) -> dict[str, Any]:
    """The releasable report over shard records per split (`text`, `label`, `num_tokens`, `finished`).

    Computed from the synthetic records alone (no access to D_train): `"dp": true`.
    """
    from dpsynth.generate.labels import label_balance

    expected = dict(zip(label_distribution["labels"], label_distribution["weights"]))
    report: dict[str, Any] = {"splits": {}, "label_distribution": dict(label_distribution)}
    all_texts: list[str] = []
    for split, rows in records.items():
        texts = [r["text"] for r in rows]
        all_texts.extend(texts)
        report["splits"][split] = {
            "duplicates": duplicate_stats(texts),
            "label_balance": label_balance([r["label"] for r in rows], expected),
            "length_tokens": length_stats([r["num_tokens"] for r in rows], [r["finished"] for r in rows], max_len),
        }
    report["duplicates_all_splits"] = duplicate_stats(all_texts)
    report["dp"] = True
    return report


def memorisation_audit(
    records: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    tokenizer,
    train_path: str,
    min_shared_tokens: int = DEFAULT_MIN_TOKENS,
) -> dict[str, Any]:
    """The owner-only memorisation audit of the synthetic records against D_train (NOT DP).

    Returns the `memorisation_stats` of all splits together, with `dp: false` and a notice;
    the caller writes it to an owner-only path, never next to the synthetic data.
    """
    from dpsynth.data.readers import read_sensitive

    all_texts = [r["text"] for rows in records.values() for r in rows]
    train = read_sensitive(train_path)
    train_docs = tokenizer.encode_batch([r["text"] for r in train.records])
    synth_docs = tokenizer.encode_batch(all_texts) if all_texts else []
    mem = memorisation_stats(train_docs, synth_docs, min_shared_tokens)
    mem.update({"checked": True, "train_path": train_path, "num_train_examples": len(train_docs),
                "num_synthetic_examples": len(all_texts), "dp": False, "notice": NOT_DP_NOTICE})
    return mem
