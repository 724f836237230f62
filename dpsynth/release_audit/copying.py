"""Copying audit of a synthetic corpus: how close each synthetic example sits to D_train.

Measure: the closeness of a text x to a set of records R is the longest token sequence x
shares with any record of R (`dpsynth.dedup.match.longest_shared_with`, the dedup's suffix
arrays; no sequence crosses a record end). It is the distance-to-closest-record (DCR) of
the audit, in tokens, larger meaning closer.

Reported (`copying_audit`):
  * against all of D_train: the distribution of each synthetic example's longest shared
    sequence, and how many share >= each threshold (50 and 20 tokens by default: 50 is the
    dedup's k);
  * the held-out comparison: D_train is subsampled (seeded) to |D_test| records, so both
    reference sets are equally large and drawn from the same distribution. A generator that
    never saw its training records is then as close to the subsample as to D_test: for each
    synthetic example, P(closer to D_train) = P(closer to D_test). `share_closer_to_train`
    counts ties as halves (0.5 = no memorisation) and a one-sided sign test over the untied
    examples gives `p_value`. The same test over the examples whose closer match is longer
    than what half of the held-out real records share with D_train (`beyond_common_phrases`)
    separates copying from phrase statistics (`verdict`): significant there (p < `significance`)
    is "memorising"; significant only over all lengths means the generator learned common
    phrases of its training sample (DP bounds each record's influence, not the sample's), and
    says so; neither is "no evidence of memorisation";
  * the same measure for the held-out real records (D_test against all of D_train): how close
    real text that was not trained on sits to D_train, the scale to read the synthetic
    distribution against.

Everything here reads D_train, is NOT differentially private and goes to owner-only output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.stats

from dpsynth.dedup import DEFAULT_MIN_TOKENS
from dpsynth.dedup.match import longest_shared_with
from dpsynth.dp.audit import DEFAULT_SIGNIFICANCE  # one level for every verdict of the audit

DEFAULT_THRESHOLDS = (DEFAULT_MIN_TOKENS, 20)
HISTOGRAM_EDGES = (0, 1, 2, 4, 8, 12, 16, 20, 32, 50, 64, 128, 256)
MEMORISING, NO_EVIDENCE = "memorising", "no evidence of memorisation"
SHORT_ONLY = "closer to D_train in common-phrase lengths only (sample statistics, no record-specific copying found)"


def distribution(longest: np.ndarray) -> dict[str, Any]:
    """Quantiles, mean and a histogram (`[lo,hi)` bins of HISTOGRAM_EDGES) of shared lengths."""
    a = np.asarray(longest, np.int64)
    if a.size == 0:
        return {"count": 0}
    edges = list(HISTOGRAM_EDGES) + [max(int(a.max()) + 1, HISTOGRAM_EDGES[-1] + 1)]
    counts, _ = np.histogram(a, bins=edges)
    hist = {f"[{lo},{hi})" if i < len(edges) - 2 else f"[{lo},inf)": int(c)
            for i, (lo, hi, c) in enumerate(zip(edges[:-1], edges[1:], counts))}
    return {"count": int(a.size), "mean": float(a.mean()), "min": int(a.min()),
            **{f"p{q}": float(np.percentile(a, q)) for q in (5, 25, 50, 75, 95, 99)},
            "max": int(a.max()), "histogram": hist}


def closer_test(to_train: np.ndarray, to_test: np.ndarray, *, min_length: int = 1) -> dict[str, Any]:
    """Sign test of "closer to D_train than to D_test" over paired closeness values.

    Args:
      to_train, to_test: per synthetic example, its longest shared sequence with the
        size-matched D_train subsample and with D_test.
      min_length: only the examples whose closer match has >= this many tokens count.

    Returns:
      `min_length`, `num_examples` counted, counts (closer to train / to test / ties),
      `share_closer_to_train` (ties as halves; 0.5 when none counts) and the one-sided
      binomial `p_value` of "closer to train" among the untied examples.
    """
    a, b = np.asarray(to_train, np.int64), np.asarray(to_test, np.int64)
    if a.shape != b.shape:
        raise ValueError(f"paired closeness arrays differ in shape: {a.shape} vs {b.shape}")
    keep = np.maximum(a, b) >= min_length
    a, b = a[keep], b[keep]
    wins, losses = int(np.sum(a > b)), int(np.sum(a < b))
    ties = int(a.size - wins - losses)
    share = (wins + 0.5 * ties) / a.size if a.size else 0.5
    p = float(scipy.stats.binom.sf(wins - 1, wins + losses, 0.5)) if wins + losses else 1.0
    return {"min_length": int(min_length), "num_examples": int(a.size), "closer_to_train": wins,
            "closer_to_test": losses, "ties": ties, "share_closer_to_train": float(share), "p_value": p}


def verdict(to_train: np.ndarray, to_test: np.ndarray, phrase_length: int,
            significance: float = DEFAULT_SIGNIFICANCE) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(verdict, the test over all examples, the test beyond common phrases).

    `phrase_length`: matches of at least this many tokens are longer than what half of the
    held-out real records share with D_train, i.e. longer than the phrases anyone writes.
    A corpus significantly closer to D_train at such lengths is `MEMORISING`; one closer only
    over all lengths has learned D_train's sample statistics (common phrases of that sample;
    a DP model may, as it bounds each record's influence, not the sample's) and gets
    `SHORT_ONLY`; otherwise `NO_EVIDENCE`.
    """
    overall = closer_test(to_train, to_test)
    beyond = closer_test(to_train, to_test, min_length=max(1, int(phrase_length)))
    if beyond["p_value"] < significance:
        return MEMORISING, overall, beyond
    return (SHORT_ONLY if overall["p_value"] < significance else NO_EVIDENCE), overall, beyond


def copying_audit(synthetic: Sequence[np.ndarray], train: Sequence[np.ndarray], test: Sequence[np.ndarray], *,
                  thresholds: Sequence[int] = DEFAULT_THRESHOLDS, seed: int = 0,
                  significance: float = DEFAULT_SIGNIFICANCE, threads: int = 1) -> dict[str, Any]:
    """The copying audit over tokenized synthetic examples, D_train and D_test (numbers only, no text).

    Args:
      synthetic, train, test: token-id arrays, one per example (the same tokenizer).
      thresholds: report how many synthetic examples share >= each of these many tokens.
      seed: seed of the size-matched D_train subsample.
      significance: level of the sign test's verdict.
      threads: native threads of the matching.
    """
    if not len(synthetic) or not len(train) or not len(test):
        raise ValueError(f"the copying audit needs synthetic, train and test examples, got "
                         f"{len(synthetic)}, {len(train)} and {len(test)}")
    thresholds = sorted({int(t) for t in thresholds}, reverse=True)
    if thresholds[-1] < 1:
        raise ValueError(f"thresholds must be >= 1 token, got {thresholds}")
    longest = longest_shared_with(train, synthetic, threads)
    n = min(len(train), len(test))
    pick = np.sort(np.random.default_rng(seed).choice(len(train), size=n, replace=False))
    to_train = longest_shared_with([train[i] for i in pick], synthetic, threads)
    test_pick = np.sort(np.random.default_rng(seed + 1).choice(len(test), size=n, replace=False))
    to_test = longest_shared_with([test[i] for i in test_pick], synthetic, threads)
    real_to_train = longest_shared_with(train, test, threads)
    phrase_length = int(np.percentile(real_to_train, 50)) + 1
    found, overall, beyond = verdict(to_train, to_test, phrase_length, significance)
    return {
        "num_synthetic": len(synthetic), "num_train": len(train), "num_test": len(test),
        "longest_shared_with_train": int(longest.max()),
        "sharing_at_least": {str(t): int(np.sum(longest >= t)) for t in thresholds},
        "synthetic_to_train": distribution(longest),
        "held_out_comparison": {
            "reference_size": n, "seed": int(seed),
            "synthetic_to_train_subsample": distribution(to_train),
            "synthetic_to_test": distribution(to_test),
            **overall, "beyond_common_phrases": beyond, "significance": float(significance), "verdict": found,
        },
        "test_to_train": distribution(real_to_train),
    }
