"""Language-model losses over the variable collections of `dpsynth.models.Transformer`.

`split_variables` turns model variables into the core's (trainable, frozen) pair by
collection name, so "full" training trains {"params"}, LoRA trains {"lora"} and prompt
tuning trains {"prompt"}; `make_lm_loss` is the per-example next-token loss (with z-loss)
that pretraining uses and that Prefix-LM tuning reuses through its token weights;
`make_label_contrast_loss` adds the label's cross-entropy under the model's own Bayes classifier
(`dp_tune --label-contrast`).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from dpsynth.dp import ghost


def split_variables(variables: dict, trainable: Sequence[str] = ("params",)) -> tuple[dict, dict]:
    """(trainable, frozen): the named collections, and every other collection."""
    missing = [c for c in trainable if c not in variables]
    if missing:
        raise ValueError(f"trainable collections {missing} not in the model variables {sorted(variables)}")
    params = {c: variables[c] for c in trainable}
    frozen = {c: v for c, v in variables.items() if c not in trainable}
    return params, frozen


def merge_variables(params: dict, frozen: dict) -> dict:
    """Inverse of `split_variables`."""
    return {**frozen, **params}


def cross_entropy_with_z_loss(logits: jax.Array, targets: jax.Array, z_loss: float = 1e-4):
    """Per-token cross-entropy and z-loss `z_loss * log(Z)^2` (both float32, shape of targets)."""
    logits = logits.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return log_z - target_logit, z_loss * jnp.square(log_z)


def make_lm_loss(model, z_loss: float = 1e-4):
    """A core loss_fn for next-token prediction.

    The batch holds "inputs", "targets" int32 [B, T], "weights" float [B, T] (0 on padding and
    on tokens that must not be trained on, e.g. a Prefix-LM prefix), optional "segment_ids"
    and "positions" [B, T], and "mask" [B]. Each example's loss is the weighted mean over its
    tokens of (cross-entropy + z-loss). Aux sums: "ce_sum" (for perplexity), "tokens".
    """

    def loss_fn(params, frozen, batch, key):
        del key  # the model is deterministic (no dropout)
        logits = model.apply(merge_variables(params, frozen), batch["inputs"],
                             segment_ids=batch.get("segment_ids"), positions=batch.get("positions"))
        ce, z = cross_entropy_with_z_loss(logits, batch["targets"], z_loss)
        w = batch["weights"].astype(jnp.float32)
        tokens = jnp.sum(w, axis=-1)
        per_example = jnp.sum((ce + z) * w, axis=-1) / jnp.maximum(tokens, 1.0)
        return per_example, {"ce_sum": jnp.sum(ce * w, axis=-1), "tokens": tokens}

    return loss_fn


def make_label_contrast_loss(model, weight: float, z_loss: float = 0.0):
    """A core loss_fn: the Prefix-LM loss of each example plus `weight` times the cross-entropy of its
    label under the model's own Bayes classifier (uniform prior over the K labels).

    The batch holds, besides "mask" [B], the example under every label prompt: "contrast_inputs",
    "contrast_targets" int32 and "contrast_weights" float [B, K, T] (Prefix-LM rows, weight 0 on the
    prompt, `dpsynth.train.tune_data`), and "contrast_label" int32 [B], the index of its own label.
    With s_k = sum_t w_kt log p(x_t | prompt_k, x_<t), the text's log-likelihood under label k:

        loss = LM(row of the own label) + weight * (logsumexp_k s_k - s_label)

    where LM is `make_lm_loss`'s per-token mean. The second term is -log p(label | x) of the
    classifier `p(y | x) ∝ p(x | y)` that label-guided sampling also uses: it rewards what tells
    the labels apart. A batch without the contrast rows (D_valid's loss) gets the Prefix-LM loss
    alone, so validation losses stay comparable across runs. Aux as `make_lm_loss`'s (own label's
    row) plus "contrast" (the second term, unweighted).

    K is the batch's: the same loss serves both forms of the contrast (`TuneConfig.label_contrast_form`).
    The full form feeds all K labels' rows. The sampled form (`dpsynth.train.tune_data.gather_train`)
    feeds 2: the own label y and one other k' drawn uniformly from the K - 1 others, where the
    term above is logsumexp(s_y, s_k') - s_y = softplus(s_k' - s_y). With d_k = s_k - s_y, the full
    term is log(1 + sum_k exp d_k) and, since prod_k (1 + a_k) >= 1 + sum_k a_k for a_k >= 0,

        E_k'[softplus(d_k')] <= max_k softplus(d_k) <= full term <= sum_k softplus(d_k) = (K - 1) E_k'[softplus(d_k')]

    with equality at K = 2 (one other label: the two forms are the same term). Either way the term is
    part of the example's own loss, so per-example clipping bounds its whole gradient by C.

    Row layout: the model runs on `contrast_inputs.reshape(B * K, T)`, so example i owns the contiguous
    rows i * K .. i * K + K - 1; the function declares it (`ghost.example_major_rows`), which ghost
    clipping needs to regroup its per-row pieces per example. Keep the reshape example-major.
    """
    lm_loss = make_lm_loss(model, z_loss)

    def loss_fn(params, frozen, batch, key):
        if "contrast_inputs" not in batch:
            return lm_loss(params, frozen, batch, key)
        b, k, t = batch["contrast_inputs"].shape
        logits = model.apply(merge_variables(params, frozen), batch["contrast_inputs"].reshape(b * k, t))
        ce, z = cross_entropy_with_z_loss(logits, batch["contrast_targets"].reshape(b * k, t), z_loss)
        ce, z = ce.reshape(b, k, t), z.reshape(b, k, t)
        w = batch["contrast_weights"].astype(jnp.float32)
        own = jax.nn.one_hot(batch["contrast_label"], k, dtype=jnp.float32)  # [B, K]
        log_lik = -jnp.sum(ce * w, axis=-1)  # [B, K]: log p(x | label k)
        tokens = jnp.sum(jnp.sum(w, axis=-1) * own, axis=-1)
        lm = jnp.sum(jnp.sum((ce + z) * w, axis=-1) * own, axis=-1) / jnp.maximum(tokens, 1.0)
        contrast = jax.nn.logsumexp(log_lik, axis=-1) - jnp.sum(log_lik * own, axis=-1)
        return lm + weight * contrast, {"ce_sum": -jnp.sum(log_lik * own, axis=-1), "tokens": tokens,
                                        "contrast": contrast}

    return ghost.example_major_rows(loss_fn)
