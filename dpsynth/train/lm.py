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


def head_capacities(length: int, step: int = 16) -> tuple[int, ...]:
    """The target-only head's static row widths for rows of `length` tokens: about 1/4, 1/2 and 3/4
    of it (multiples of `step`) and `length` itself, ascending and distinct."""
    caps = {min(length, max(step, -(-int(length * f) // step) * step)) for f in (0.25, 0.5, 0.75)}
    return tuple(sorted(caps | {length}))


def _weight(variables: dict, config):
    return variables["params"]["embedding" if config.tie_embeddings else "lm_head"]


def row_sums(model, variables: dict, inputs, targets, weights, z_loss: float, *, segment_ids=None, positions=None,
             target_only: bool = False):
    """Per row of `inputs` [N, T]: (sum_t w_t ce_t, sum_t w_t z_t), the weighted cross-entropy and
    z-loss sums (float32 [N]).

    `target_only`: the output layer (the model's costliest matmul at a large vocabulary) runs only on
    the positions the loss weighs. Each row's weighted positions are moved to the front in their
    order (a stable sort), and the head runs on the first c columns, c the smallest of
    `head_capacities(T)` that holds every row's count (`lax.switch`: one compiled branch per
    width, the one taken chosen per batch); positions past a row's count carry weight 0. The same
    sums over the same terms, only in another order. The branch also forms each row's gradient in
    its hidden states ([N, T, d_model]; one more for the z-loss when it is on) and a custom VJP
    scales them by the rows' cotangents: differentiating through the switch instead would make every
    branch carry the widest one's [N, T, vocab] residuals. For a frozen output layer (LoRA: no
    gradient of the table, no ghost tap on it) under batched clipping; under `vmap` per-example
    clipping a per-example switch would run every branch.
    """
    w = weights.astype(jnp.float32)
    if not target_only:
        logits = model.apply(variables, inputs, segment_ids=segment_ids, positions=positions)
        ce, z = cross_entropy_with_z_loss(logits, targets, z_loss)
        return jnp.sum(ce * w, axis=-1), jnp.sum(z * w, axis=-1)
    from dpsynth.models.transformer import output_layer

    cfg = model.config
    hidden = model.apply(variables, inputs, segment_ids=segment_ids, positions=positions, head=False)
    table = jax.lax.stop_gradient(_weight(variables, cfg))
    caps = head_capacities(inputs.shape[1])
    with_z = z_loss != 0.0

    def sums(h, table, targets, w):
        ce, z = cross_entropy_with_z_loss(output_layer(cfg, h, table), targets, z_loss)
        return jnp.sum(ce * w, axis=-1), jnp.sum(z * w, axis=-1)

    def branch(c):
        def run(h, table, targets, w, order):
            """Sums and their per-row gradients in h: row b's sums depend on row b alone, so the VJP
            of the batch's sums with a cotangent of ones is each row's own gradient."""
            if c < h.shape[1]:
                idx = order[:, :c]
                hc = jnp.take_along_axis(h, idx[..., None], axis=1)
                tc, wc = jnp.take_along_axis(targets, idx, axis=1), jnp.take_along_axis(w, idx, axis=1)
            else:
                hc, tc, wc = h, targets, w
            (ce_s, z_s), vjp = jax.vjp(lambda x: sums(x, table, tc, wc), hc)
            ones, zeros = jnp.ones_like(ce_s), jnp.zeros_like(ce_s)
            grads = [vjp((ones, zeros))[0]] + ([vjp((zeros, ones))[0]] if with_z else [])
            if c < h.shape[1]:  # back to the rows' own positions (the others get 0)
                rows = jnp.arange(h.shape[0])[:, None]
                grads = [jnp.zeros_like(h).at[rows, idx].set(g) for g in grads]
            return (ce_s, z_s), tuple(grads)
        return run

    def fwd(h, table, targets, w):
        order = jnp.argsort((w <= 0).astype(jnp.int32), axis=1, stable=True)  # weighted positions first
        needed = jnp.max(jnp.sum(w > 0, axis=1))
        index = jnp.sum(needed > jnp.asarray(caps[:-1], jnp.int32)).astype(jnp.int32)
        return jax.lax.switch(index, [branch(c) for c in caps], h, table, targets, w, order)

    # Every array is an argument (the table too, with no cotangent: it is frozen), none a closure: a
    # custom VJP may not close over the tracers of an enclosing transformation (jit inside grad).
    @jax.custom_vjp
    def head(h, table, targets, w):
        return fwd(h, table, targets, w)[0]

    def bwd(grads, g):
        g_ce, g_z = g
        dh = g_ce[:, None, None] * grads[0]
        if with_z:
            dh = dh + g_z[:, None, None] * grads[1]
        return dh.astype(h_dtype), None, None, None

    h_dtype = hidden.dtype
    head.defvjp(fwd, bwd)
    return head(hidden, table, targets, w)


def make_lm_loss(model, z_loss: float = 1e-4, target_only: bool = False):
    """A core loss_fn for next-token prediction.

    The batch holds "inputs", "targets" int32 [B, T], "weights" float [B, T] (0 on padding and
    on tokens that must not be trained on, e.g. a Prefix-LM prefix), optional "segment_ids"
    and "positions" [B, T], and "mask" [B]. Each example's loss is the weighted mean over its
    tokens of (cross-entropy + z-loss). Aux sums: "ce_sum" (for perplexity), "tokens".
    `target_only`: the output layer only at weighted positions (`row_sums`; a frozen output layer).
    """

    def loss_fn(params, frozen, batch, key):
        del key  # the model is deterministic (no dropout)
        ce_sum, z_sum = row_sums(model, merge_variables(params, frozen), batch["inputs"], batch["targets"],
                                 batch["weights"], z_loss, segment_ids=batch.get("segment_ids"),
                                 positions=batch.get("positions"), target_only=target_only)
        tokens = jnp.sum(batch["weights"].astype(jnp.float32), axis=-1)
        per_example = (ce_sum + z_sum) / jnp.maximum(tokens, 1.0)
        return per_example, {"ce_sum": ce_sum, "tokens": tokens}

    return loss_fn


def make_label_contrast_loss(model, weight: float, z_loss: float = 0.0, target_only: bool = False):
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
    lm_loss = make_lm_loss(model, z_loss, target_only=target_only)

    def loss_fn(params, frozen, batch, key):
        if "contrast_inputs" not in batch:
            return lm_loss(params, frozen, batch, key)
        b, k, t = batch["contrast_inputs"].shape
        ce_sum, z_sum = row_sums(model, merge_variables(params, frozen), batch["contrast_inputs"].reshape(b * k, t),
                                 batch["contrast_targets"].reshape(b * k, t),
                                 batch["contrast_weights"].reshape(b * k, t), z_loss, target_only=target_only)
        ce_sum, z_sum = ce_sum.reshape(b, k), z_sum.reshape(b, k)
        w = batch["contrast_weights"].astype(jnp.float32)
        own = jax.nn.one_hot(batch["contrast_label"], k, dtype=jnp.float32)  # [B, K]
        log_lik = -ce_sum  # [B, K]: log p(x | label k)
        tokens = jnp.sum(jnp.sum(w, axis=-1) * own, axis=-1)
        lm = jnp.sum((ce_sum + z_sum) * own, axis=-1) / jnp.maximum(tokens, 1.0)
        contrast = jax.nn.logsumexp(log_lik, axis=-1) - jnp.sum(log_lik * own, axis=-1)
        return lm + weight * contrast, {"ce_sum": -jnp.sum(log_lik * own, axis=-1), "tokens": tokens,
                                        "contrast": contrast}

    return ghost.example_major_rows(loss_fn)
