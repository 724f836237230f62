"""Scoring texts under a tuned model, and the canary audit of the DP tuner.

`score_texts` is the per-text loss under a model directory; `canary_audit` runs
`dpsynth.dp.audit.canary_audit` (the empirical epsilon lower bound) with
`dpsynth.train.finetune.dp_tune` as the training function and `score_texts` as the score.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from dpsynth.dp import sampling
from dpsynth.train.finetune import dp_tune
from dpsynth.train.prompts import ExampleConfig, encode_examples, template_of
from dpsynth.train.tune_config import TuneConfig


def score_texts(model_dir: str, texts: Sequence[str], label: str, *, template: str | None = None,
                max_tokens: int = 64, batch_size: int = 32) -> np.ndarray:
    """Per-text loss (mean negative log-probability per target token after the label prompt) under a model dir."""
    from dpsynth.models import Transformer
    from dpsynth.models.directory import load_model
    from dpsynth.train.lm import make_lm_loss

    loaded = load_model(model_dir)
    template = template or template_of(loaded.manifest)
    records = [{"id": str(i), "text": t, "label": label} for i, t in enumerate(texts)]
    enc = encode_examples(records, loaded.tokenizer, [label], ExampleConfig(template=template, max_tokens=max_tokens))
    loss_fn = make_lm_loss(Transformer(loaded.config), z_loss=0.0)
    fn = jax.jit(lambda v, b: loss_fn(v, {}, b, None)[0])
    arrays = enc.arrays()
    losses = []
    for lo in range(0, len(enc), batch_size):
        idx = np.arange(lo, lo + batch_size)
        idx = np.where(idx < len(enc), idx, -1)
        losses.append(np.asarray(fn(loaded.variables, sampling.gather(arrays, idx)))[idx >= 0])
    return np.concatenate(losses)


def canary_audit(
    base_dir: str,
    train_records: Sequence[dict],
    out_dir: str,
    config: TuneConfig,
    *,
    num_canaries: int = 16,
    repeats: int = 4,
    canary_length: int = 12,
    seed: int = 0,
    labels: Sequence[str] | None = None,
    **tune_kwargs,
):
    """`dpsynth.dp.audit.canary_audit` of the DP tuner: tunes on D_train + canaries into `out_dir`, scores them."""
    from dpsynth.dp import audit
    from dpsynth.models.directory import load_model

    tokenizer = load_model(base_dir).tokenizer
    labels = list(labels) if labels is not None else sorted({str(r["label"]) for r in train_records})
    canaries = audit.make_canaries(tokenizer, 2 * num_canaries, length=canary_length, seed=seed)

    def train(augmented: list[dict]):
        dp_tune(base_dir, augmented, [], out_dir, config, labels=labels, progress_interval=30.0, **tune_kwargs)
        return lambda texts: score_texts(out_dir, texts, labels[0], template=config.template,
                                         max_tokens=config.max_tokens)

    return audit.canary_audit(train_records, canaries, train, label=labels[0], epsilon=config.epsilon,
                              delta=config.delta, repeats=repeats)
