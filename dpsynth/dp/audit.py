"""Empirical privacy audit with canaries (a sanity check of the guarantee, not a proof).

Procedure (`canary_audit`): draw 2k random canary texts (`make_canaries`: random token
sequences of the model's own vocabulary, rare by construction), insert the first k into
D_train (each `repeats` times), train with the caller's `train` function, then score every
canary by minus its per-example loss under the trained model (the caller's loss function,
e.g. the mean negative log-probability of its tokens after the label prompt). Inserted
canaries that were memorised score higher than the k held-out ones.

This module knows nothing of models or training: the caller passes a function that trains on
the augmented records and returns a loss function over texts
(`dpsynth.train.audit.canary_audit` does so for the DP tuner).

Statistics:
  * AUROC of "inserted vs held-out" by score (`jax_privacy.auditing.CanaryScoreAuditor`):
    the area under the ROC curve's upper convex hull, so above 0.5 even at chance on few
    canaries (about 0.58 for 32 vs 32). `auroc_null` gives its distribution when membership
    leaves no trace, by relabelling the pooled scores at random: its median is the report's
    chance level and the share of relabellings at least as high the one-sided permutation
    p-value (exact in level, as the canaries are i.i.d. and the inserted half is fixed before
    they are drawn, so under that null the scores are exchangeable);
  * exposure (Carlini et al. 2019) of each inserted canary against the held-out set:
    log2(k + 1) - log2(rank), rank = 1 + number of held-out canaries scoring higher; a
    canary indistinguishable from held-out ones has expected exposure
    `chance_exposure(k)` (rank uniform on 1..k+1);
  * the auditor's Clopper-Pearson epsilon lower bound (95% confidence, Bonferroni over
    thresholds; it treats the canaries as independent trials, so read it as indicative);
  * the one-run lower bound (`CanaryScoreAuditor.epsilon_one_run`, Steinke et al. 2023,
    "Privacy Auditing with One (1) Training Run"): valid for one training run when each
    canary's inclusion is an independent fair coin. The canaries here are i.i.d. random
    texts and which half is inserted is fixed before they are drawn, so that holds.

`canary_statistics` computes all of these from two score arrays (it is also the scorer of the
release audit, `dpsynth.release_audit.canaries`, which scores canaries under an LM trained on
the synthetic corpus instead of under the model).

At small epsilon the AUROC stays near 0.5 and the exposure near chance; without DP (and
with repeats) the model memorises the canaries and both rise (tests/train/test_finetune.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np
from jax_privacy import auditing

# Trains on the given records; returns the per-text loss function of the trained model.
TrainFn = Callable[[list[dict]], Callable[[Sequence[str]], np.ndarray]]


def make_canaries(tokenizer, n: int, *, length: int = 12, seed: int = 0) -> list[str]:
    """`n` random canary texts: `length` uniformly random non-special vocabulary pieces each."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ids = rng.integers(4, tokenizer.vocab_size, length)
        out.append(tokenizer.decode(ids.tolist()))
    return out


def chance_exposure(k: int) -> float:
    """Expected exposure when the rank is uniform on 1..k+1 (no memorisation)."""
    ranks = np.arange(1, k + 2)
    return float(np.mean(math.log2(k + 1) - np.log2(ranks)))


def exposures(in_scores: np.ndarray, out_scores: np.ndarray) -> np.ndarray:
    """Exposure of each inserted canary against the held-out canaries (higher score = more likely)."""
    out_scores = np.asarray(out_scores)
    ranks = 1 + np.array([(out_scores > s).sum() for s in np.asarray(in_scores)])
    return math.log2(out_scores.size + 1) - np.log2(ranks)


DEFAULT_SIGNIFICANCE = 0.05  # the epsilon lower bounds hold with probability 95%
AUROC_PERMUTATIONS = 2000  # relabellings of the AUROC's permutation test (seeded: reports are reproducible)


def auroc_null(in_scores, out_scores, *, permutations: int = AUROC_PERMUTATIONS, seed: int = 0) -> np.ndarray:
    """The auditor's AUROC over `permutations` random relabellings of the pooled scores (as many
    labelled inserted as there are inserted scores): its distribution at these sizes when the
    scores do not depend on membership."""
    if permutations < 1:
        raise ValueError(f"the AUROC's permutation test needs permutations >= 1, got {permutations}")
    pooled = np.concatenate([np.asarray(in_scores, np.float64), np.asarray(out_scores, np.float64)])
    k, rng = int(np.size(in_scores)), np.random.default_rng(seed)
    out = np.empty(int(permutations))
    for i in range(out.size):
        p = rng.permutation(pooled)
        out[i] = auditing.CanaryScoreAuditor(p[:k], p[k:]).attack_auroc()
    return out


def canary_statistics(in_scores, out_scores, *, delta: float, significance: float = DEFAULT_SIGNIFICANCE,
                      permutations: int = AUROC_PERMUTATIONS) -> dict[str, float | int]:
    """AUROC, exposure and the epsilon lower bounds of "inserted vs held-out" canary scores.

    Args:
        in_scores, out_scores: scores of the inserted and the held-out canaries (higher =
            judged more likely a member).
        delta: delta of the epsilon lower bounds (in (0, 1]).
        significance: the bounds hold with probability 1 - significance.
        permutations: relabellings of the AUROC's permutation test (`auroc_null`).

    Returns:
        A dict of numbers: `num_inserted`, `num_held_out`, `auroc`, `auroc_chance` (the
        median of `auroc_null`), `auroc_p_value` ((1 + relabellings with an AUROC at least as
        high) / (1 + relabellings)), `mean_exposure`, `max_exposure`, `chance_exposure`,
        `epsilon_lb_clopper_pearson`, `epsilon_lb_one_run`, `significance`, `delta`.
    """
    in_scores, out_scores = np.asarray(in_scores, np.float64), np.asarray(out_scores, np.float64)
    if in_scores.size < 1 or out_scores.size < 1:
        raise ValueError(f"canary statistics need >= 1 inserted and >= 1 held-out score, got "
                         f"{in_scores.size} and {out_scores.size}")
    if not (np.all(np.isfinite(in_scores)) and np.all(np.isfinite(out_scores))):
        raise ValueError("canary scores must be finite")
    auditor = auditing.CanaryScoreAuditor(in_scores, out_scores)
    exp = exposures(in_scores, out_scores)
    auroc = float(auditor.attack_auroc())
    null = auroc_null(in_scores, out_scores, permutations=permutations)
    return {
        "num_inserted": int(in_scores.size),
        "num_held_out": int(out_scores.size),
        "auroc": auroc,
        "auroc_chance": float(np.median(null)),
        "auroc_p_value": float((1 + np.sum(null >= auroc - 1e-12)) / (1 + null.size)),
        "mean_exposure": float(exp.mean()),
        "max_exposure": float(exp.max()),
        "chance_exposure": chance_exposure(int(out_scores.size)),
        "epsilon_lb_clopper_pearson": float(auditor.epsilon_clopper_pearson(significance, delta)),
        "epsilon_lb_one_run": float(auditor.epsilon_one_run(significance, delta)),
        "significance": float(significance),
        "delta": float(delta),
    }


@dataclasses.dataclass
class AuditResult:
    """Numbers only (no canary text)."""

    epsilon: float
    num_canaries: int
    repeats: int
    auroc: float
    auroc_chance: float
    auroc_p_value: float
    mean_exposure: float
    chance_exposure: float
    max_exposure: float
    epsilon_lower_bound: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def canary_audit(
    train_records: Sequence[dict],
    canaries: Sequence[str],
    train: TrainFn,
    *,
    label: str,
    epsilon: float,
    delta: float | None = None,
    repeats: int = 4,
) -> AuditResult:
    """Inserts the first half of `canaries` (x `repeats`, with `label`) into D_train, trains, measures exposure.

    Args:
        train_records: D_train ({"id", "text", "label"} records).
        canaries: 2k canary texts (`make_canaries`); the first k are inserted, the last k held out.
        train: trains on the augmented records and returns `loss(texts) -> per-text loss`
            (lower = more likely) of the trained model.
        label: label of the inserted canaries (and of their scoring prompt, in the caller's loss).
        epsilon: the run's target epsilon (recorded in the result).
        delta: delta of the epsilon lower bound (default 1 / |augmented D_train|).
        repeats: copies of each inserted canary.
    """
    if len(canaries) < 2 or len(canaries) % 2:
        raise ValueError(f"canary_audit needs an even number (>= 2) of canaries, got {len(canaries)}")
    k = len(canaries) // 2
    inserted, held_out = list(canaries[:k]), list(canaries[k:])
    augmented = list(train_records) + [
        {"id": f"canary-{i}-{r}", "text": text, "label": label} for i, text in enumerate(inserted) for r in range(repeats)
    ]
    loss = train(augmented)
    scores = -np.asarray(loss(inserted + held_out), np.float64)
    in_scores, out_scores = scores[:k], scores[k:]
    delta = delta if delta is not None else 1.0 / len(augmented)
    stats = canary_statistics(in_scores, out_scores, delta=delta)
    return AuditResult(epsilon=epsilon, num_canaries=k, repeats=repeats, auroc=stats["auroc"],
                       auroc_chance=stats["auroc_chance"], auroc_p_value=stats["auroc_p_value"],
                       mean_exposure=stats["mean_exposure"], chance_exposure=stats["chance_exposure"],
                       max_exposure=stats["max_exposure"], epsilon_lower_bound=stats["epsilon_lb_clopper_pearson"])
