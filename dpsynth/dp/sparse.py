"""Exact per-example clipping for a model with a sparse input-embedding table.

With `vmap(grad)` (`dpsynth.dp.clipping.clipped_grad_sum`) every example materialises a dense
copy of the embedding table's gradient (vocab x D floats), although an example only touches
the rows of its own token ids. Here the table is declared (`EmbeddingSpec`: where it sits in
the params pytree, which batch key holds the ids) and the loss is given as a function of the
embedded inputs (`EmbeddedLoss`), so the per-example table gradient is never formed:

* per example i: dense gradients of the other parameters `rest` (vmapped, small) and
  g_{i,t} = dL_i / d embedded_{i,t} ([T, D]);
* the table's per-example gradient is G_i = sum_t onehot(w_{i,t}) g_{i,t}^T, whose squared
  Frobenius norm is exactly sum_{t,s} [w_{i,t} == w_{i,s}] <g_{i,t}, g_{i,s}> (a T x T masked
  Gram matrix), so norm_i^2 = ||dense_i||^2 + ||G_i||^2;
* c_i = min(1, C / norm_i) (0 when the norm is 0/NaN/inf, NaN/inf gradient entries are zeroed
  first, as in `jax_privacy.clipping.clip_pytree`; padding rows get c_i = 0);
* the clipped sum is sum_i c_i dense_i for `rest`, and the scatter-add
  zeros(table).at[ids].add(c_i g_{i,t}) = sum_i c_i G_i for the table.

Formal guarantee: the result equals `clipped_grad_sum` of the same loss (up to float rounding;
the NaN handling differs only in that NaN/inf entries are zeroed in g_{i,t} rather than in
G_i), so each example's contribution has L2 norm <= C and the sum has add-or-remove-one
sensitivity C, provided the loss is per-example separable and the table is used ONLY through
`table[ids]` (a table also used elsewhere, e.g. tied to an output layer, is not supported:
its other gradient would be silently dropped). Memory per microbatch: B x (|rest| + T x D)
instead of B x |params|.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Callable

import jax
import jax.numpy as jnp

PyTree = Any
# loss_from_embedded(params_rest, frozen, batch, embedded[B, T, D], key) -> (per_example_loss[B], aux)
FromEmbeddedFn = Callable[[PyTree, PyTree, dict, jax.Array, jax.Array], tuple[jax.Array, Any]]


@dataclasses.dataclass(frozen=True)
class EmbeddingSpec:
    """Declares an input-embedding table used only through `table[batch[ids_key]]`.

    Attributes:
        param_path: keys leading to the table [vocab, D] in the trainable params (nested dicts).
        ids_key: batch key of the int ids [B, T] that index the table.
    """

    param_path: tuple[str, ...]
    ids_key: str

    def __post_init__(self):
        if not self.param_path or not all(isinstance(k, str) for k in self.param_path):
            raise ValueError(f"param_path must be a non-empty tuple of str, got {self.param_path!r}")
        if not self.ids_key:
            raise ValueError("ids_key must be non-empty")


@dataclasses.dataclass(frozen=True)
class EmbeddedLoss:
    """A loss over params written as a function of the embedded inputs.

    Calling it is the ordinary `loss_fn(params, frozen, batch, key)` (so the dense path, the
    non-private core and evaluation use it unchanged); `DPSGDStrategy(embedding=spec)` calls
    `from_embedded` directly to clip per example without dense table gradients.
    """

    spec: EmbeddingSpec
    from_embedded: FromEmbeddedFn

    def __call__(self, params, frozen, batch, key):
        table, rest = split_table(params, self.spec.param_path)
        return self.from_embedded(rest, frozen, batch, jnp.take(table, batch[self.spec.ids_key], axis=0), key)


def split_table(params: PyTree, path: tuple[str, ...]) -> tuple[jax.Array, PyTree]:
    """(table, params without it); parents left empty by the removal are dropped too."""

    def pop(tree, keys):
        if not isinstance(tree, Mapping) or keys[0] not in tree:
            raise KeyError(f"embedding table {'/'.join(path)!r} not found in params")
        out = dict(tree)
        if len(keys) == 1:
            return out.pop(keys[0]), out
        leaf, sub = pop(out[keys[0]], keys[1:])
        if sub:
            out[keys[0]] = sub
        else:
            del out[keys[0]]
        return leaf, out

    return pop(params, tuple(path))


def merge_table(rest: PyTree, path: tuple[str, ...], table: jax.Array) -> PyTree:
    """Inverse of `split_table`."""
    out = dict(rest)
    if len(path) == 1:
        out[path[0]] = table
    else:
        out[path[0]] = merge_table(out.get(path[0], {}), path[1:], table)
    return out


def _finite(x):
    return jnp.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)


def clipped_grad_sum_sparse_embedding(
    loss: EmbeddedLoss, params: PyTree, frozen: PyTree, batch: dict, key: jax.Array, clip_norm: float
) -> tuple[PyTree, jax.Array, jax.Array]:
    """`clipping.clipped_grad_sum` for an `EmbeddedLoss`, without per-example table gradients.

    Per-example keys are `jax.random.split(key, B)`, as in `clipped_grad_sum`.

    Returns:
        (clipped_sum (same structure as params), per-example losses [B], per-example unclipped
        gradient norms [B]); losses and norms are non-private diagnostics.
    """
    if "mask" not in batch:
        raise ValueError("batch needs a 'mask' [B] array (1 = real example, 0 = padding)")
    spec = loss.spec
    table, rest = split_table(params, spec.param_path)
    ids = batch[spec.ids_key]
    if ids.ndim != 2:
        raise ValueError(f"batch[{spec.ids_key!r}] must be [B, T] ids, got shape {ids.shape}")
    keys = jax.random.split(key, ids.shape[0])
    embedded = jnp.take(table, ids, axis=0)  # [B, T, D]: B x T x D floats, not B x |table|

    def one(rest_, emb, example, k):
        ex = jax.tree.map(lambda x: x[None], example)
        per_example, _ = loss.from_embedded(rest_, frozen, ex, emb[None], k)
        return jnp.sum(per_example)

    values, (g_rest, g_emb) = jax.vmap(jax.value_and_grad(one, argnums=(0, 1)), in_axes=(None, 0, 0, 0))(
        rest, embedded, batch, keys)
    g_rest = jax.tree.map(lambda g: _finite(g.astype(jnp.float32)), g_rest)
    g_emb = _finite(g_emb.astype(jnp.float32))  # [B, T, D]

    rest_sq = sum((jnp.sum(jnp.square(g), axis=tuple(range(1, g.ndim))) for g in jax.tree.leaves(g_rest)),
                  jnp.zeros(ids.shape[0], jnp.float32))
    gram = jnp.einsum("btd,bsd->bts", g_emb, g_emb)
    same = (ids[:, :, None] == ids[:, None, :]).astype(jnp.float32)
    table_sq = jnp.maximum(jnp.sum(gram * same, axis=(1, 2)), 0.0)
    norms = jnp.sqrt(rest_sq + table_sq)
    scale = jnp.nan_to_num(jnp.minimum(1.0, clip_norm / norms), nan=0.0, posinf=0.0)
    scale = jnp.where(batch["mask"] > 0, scale, 0.0)

    rest_sum = jax.tree.map(lambda g: jnp.tensordot(scale, g, axes=1), g_rest)
    contrib = (g_emb * scale[:, None, None]).reshape(-1, g_emb.shape[-1])
    table_sum = jnp.zeros(table.shape, jnp.float32).at[ids.reshape(-1)].add(contrib)
    return merge_table(rest_sum, spec.param_path, table_sum), values, norms
