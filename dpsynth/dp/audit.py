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
    0.5 is chance;
  * exposure (Carlini et al. 2019) of each inserted canary against the held-out set:
    log2(k + 1) - log2(rank), rank = 1 + number of held-out canaries scoring higher; a
    canary indistinguishable from held-out ones has expected exposure
    `chance_exposure(k)` (rank uniform on 1..k+1);
  * the auditor's Clopper-Pearson epsilon lower bound (95% confidence, Bonferroni over
    thresholds; it treats the canaries as independent trials, so read it as indicative).

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


@dataclasses.dataclass
class AuditResult:
    """Numbers only (no canary text)."""

    epsilon: float
    num_canaries: int
    repeats: int
    auroc: float
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
    auditor = auditing.CanaryScoreAuditor(in_scores, out_scores)
    exp = exposures(in_scores, out_scores)
    delta = delta if delta is not None else 1.0 / len(augmented)
    eps_lb = float(auditor.epsilon_clopper_pearson(0.05, delta))
    return AuditResult(epsilon=epsilon, num_canaries=k, repeats=repeats,
                       auroc=float(auditor.attack_auroc()), mean_exposure=float(exp.mean()),
                       chance_exposure=chance_exposure(k), max_exposure=float(exp.max()),
                       epsilon_lower_bound=eps_lb)
