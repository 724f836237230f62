"""Empirical privacy audit with canaries (a sanity check of the guarantee, not a proof).

Procedure (`canary_audit`): draw 2k random canary texts (random token sequences of the
model's own vocabulary: rare by construction), insert the first k into D_train (each
`repeats` times), DP-tune, then score every canary by its log-likelihood under the tuned
model (mean log-probability of its tokens after the label prompt). Inserted canaries that
were memorised score higher than the k held-out ones.

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
with repeats) the model memorises the canaries and both rise (tests/dp/test_audit.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax_privacy import auditing

from dpsynth.dp import tune as tune_lib
from dpsynth.dp.examples import encode_examples
from dpsynth.dp.sampling import gather


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


def score_texts(model_dir: str, texts: Sequence[str], label: str, *, template: str | None = None,
                max_tokens: int = 64, batch_size: int = 32) -> np.ndarray:
    """Mean log-probability per target token of each text (after the label prompt) under a model dir."""
    from dpsynth.dp.examples import ExampleConfig
    from dpsynth.models import Transformer
    from dpsynth.train.checkpoint import load_model
    from dpsynth.train.lm import make_lm_loss

    loaded = load_model(model_dir)
    template = template or loaded.manifest.get("prompt_template") or tune_lib.DEFAULT_TEMPLATE
    records = [{"id": str(i), "text": t, "label": label} for i, t in enumerate(texts)]
    enc = encode_examples(records, loaded.tokenizer, [label], ExampleConfig(template=template, max_tokens=max_tokens))
    loss_fn = make_lm_loss(Transformer(loaded.config), z_loss=0.0)
    fn = jax.jit(lambda v, b: loss_fn(v, {}, b, None)[0])
    arrays = enc.arrays()
    scores = []
    for lo in range(0, len(enc), batch_size):
        idx = np.arange(lo, lo + batch_size)
        idx = np.where(idx < len(enc), idx, -1)
        b = gather(arrays, idx)
        scores.append(np.asarray(fn(loaded.variables, b))[idx >= 0])
    return -np.concatenate(scores)


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
    base_dir: str,
    train_records: Sequence[dict],
    out_dir: str,
    config: tune_lib.TuneConfig,
    *,
    num_canaries: int = 16,
    repeats: int = 4,
    canary_length: int = 12,
    seed: int = 0,
    labels: Sequence[str] | None = None,
) -> AuditResult:
    """Inserts `num_canaries` canaries (x `repeats`) into D_train, tunes, and measures exposure."""
    from dpsynth.train.checkpoint import load_model

    tokenizer = load_model(base_dir).tokenizer
    labels = list(labels) if labels is not None else sorted({str(r["label"]) for r in train_records})
    canaries = make_canaries(tokenizer, 2 * num_canaries, length=canary_length, seed=seed)
    inserted, held_out = canaries[:num_canaries], canaries[num_canaries:]
    label = labels[0]
    augmented = list(train_records) + [
        {"id": f"canary-{i}-{r}", "text": text, "label": label} for i, text in enumerate(inserted) for r in range(repeats)
    ]
    tune_lib.dp_tune(base_dir, augmented, [], out_dir, config, labels=labels, progress_interval=30.0)
    scores = score_texts(out_dir, inserted + held_out, label, template=config.template, max_tokens=config.max_tokens)
    in_scores, out_scores = scores[:num_canaries], scores[num_canaries:]
    auditor = auditing.CanaryScoreAuditor(in_scores, out_scores)
    exp = exposures(in_scores, out_scores)
    delta = config.delta if config.delta is not None else 1.0 / len(augmented)
    eps_lb = float(auditor.epsilon_clopper_pearson(0.05, delta))
    return AuditResult(epsilon=config.epsilon, num_canaries=num_canaries, repeats=repeats,
                       auroc=float(auditor.attack_auroc()), mean_exposure=float(exp.mean()),
                       chance_exposure=chance_exposure(num_canaries), max_exposure=float(exp.max()),
                       epsilon_lower_bound=eps_lb)
