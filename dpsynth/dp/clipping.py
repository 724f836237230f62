"""Per-example clipped gradient sums over the trainable subset (wraps `jax_privacy.clipping`).

The DP code sees only a loss over a pytree of trainable parameters:
`loss_fn(params, frozen, batch, key) -> (per_example_loss[B], aux)`, where `batch` is a dict
of arrays with leading batch axis B and a float "mask" [B] (1 = real example, 0 = padding).

`clipped_grad_sum` computes, for every example i of a microbatch, g_i = grad_params
loss_fn(params, frozen, batch[i:i+1], key_i)[0] (vmapped by jax_privacy's `clipped_grad`),
clips it to L2 norm <= C (`clip_pytree`), and sums over the examples whose mask is 1;
padding examples are zeroed (`is_padding_example`), so they contribute exactly nothing.
Only `params` (the trainable collection(s)) are differentiated; `frozen` is a constant.

Formal guarantees:
  - Each per-example term has global L2 norm <= C (NaN/inf gradients are zeroed first).
  - The sum's L2 sensitivity under add-or-remove-one-example adjacency is C: adding or
    removing one (real) example changes exactly one term, whose norm is <= C. This needs
    `loss_fn` to be per-example separable (row i of the output depends only on row i of the
    batch; true for our LM loss: no batch-norm, no cross-example attention).

Cost note (full mode): vmap over per-example gradients materialises B copies of every
trainable array. For a sparse input embedding an example touches only its own rows, so its
norm could be computed from those rows; our Transformer ties the input embedding to the
output layer, whose gradient is dense (the softmax touches every row), so that trick does not
apply here and full mode pays B x |params| memory per microbatch: keep full-mode
microbatches small (the tuner defaults to 8). A model with an untied input embedding (the
downstream WordCNN) uses that trick: `dpsynth.dp.sparse`. See docs/dp.md for measured costs.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from jax_privacy import clipping as jp_clipping

PyTree = Any
LossFn = Callable[[PyTree, PyTree, dict, jax.Array], tuple[jax.Array, Any]]


def _scalar_loss(loss_fn: LossFn) -> Callable:
    """One example's scalar loss (the batch argument keeps a leading axis of size 1)."""

    def fun(params, frozen, batch, key):
        per_example, _ = loss_fn(params, frozen, batch, key)
        return jnp.sum(per_example)

    return fun


def clipped_grad_sum(
    loss_fn: LossFn, params: PyTree, frozen: PyTree, batch: dict, key: jax.Array, clip_norm: float
) -> tuple[PyTree, jax.Array, jax.Array]:
    """Sum over real examples of per-example gradients clipped to L2 norm `clip_norm`.

    Returns:
        (clipped_sum (same structure as params), per-example losses [B], per-example
        unclipped gradient norms [B]). Losses and norms are per-example, non-private
        diagnostics: never release them.
    """
    if "mask" not in batch:
        raise ValueError("batch needs a 'mask' [B] array (1 = real example, 0 = padding)")
    grad_fn = jp_clipping.clipped_grad(
        _scalar_loss(loss_fn),
        argnums=0,
        l2_clip_norm=clip_norm,
        batch_argnums=2,
        keep_batch_dim=True,
        return_values=True,
        return_grad_norms=True,
        prng_argnum=3,
        dtype=jnp.float32,
    )
    is_padding = batch["mask"] <= 0
    grads, aux = grad_fn(params, frozen, batch, key, is_padding_example=is_padding)
    return grads, aux.values, aux.grad_norms


def per_example_grads(loss_fn: LossFn, params: PyTree, frozen: PyTree, batch: dict, key: jax.Array) -> PyTree:
    """Unclipped per-example gradients (leading axis B): a brute-force reference for tests."""
    fun = _scalar_loss(loss_fn)
    keys = jax.random.split(key, batch["mask"].shape[0])

    def one(b, k):
        return jax.grad(fun)(params, frozen, jax.tree.map(lambda x: x[None], b), k)

    return jax.vmap(one)(batch, keys)


def global_norms(tree: PyTree) -> jax.Array:
    """L2 norm of each example's slice of a pytree with leading batch axis."""
    return jax.vmap(optax.global_norm)(tree)


# How a strategy computes the clipped sum: "vmap" (above; any loss) or "ghost" (`dpsynth.dp.ghost`:
# per-example norms from activations and output gradients, one backward pass, no per-example
# gradient copies; models whose layers use the ghost taps, trainable collections "params" or "lora").
METHODS = ("vmap", "ghost")


def method(name: str) -> Callable:
    """The clipped-sum function of a clipping method (same signature and result as `clipped_grad_sum`)."""
    if name == "vmap":
        return clipped_grad_sum
    if name == "ghost":
        from dpsynth.dp import ghost

        return ghost.clipped_grad_sum
    raise ValueError(f"clipping must be one of {METHODS}, got {name!r}")
