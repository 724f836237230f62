"""Clipped per-example gradient sums: norms <= C, brute-force agreement, sensitivity, masking."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpsynth.dp import clipping


def toy_loss(params, frozen, batch, key):
    """A per-example separable MLP regression loss over a pytree of trainable params."""
    h = jnp.tanh(batch["x"] @ params["w1"] + params["b1"] + frozen["shift"])
    pred = h @ params["w2"]
    return jnp.sum((pred - batch["y"]) ** 2, axis=-1), {}


def make(seed, n=6, d=5, scale=1.0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 6)
    params = {"w1": scale * jax.random.normal(ks[0], (d, 7)), "b1": jax.random.normal(ks[1], (7,)),
              "w2": scale * jax.random.normal(ks[2], (7, 2))}
    frozen = {"shift": jax.random.normal(ks[3], (7,))}
    batch = {"x": 3 * jax.random.normal(ks[4], (n, d)), "y": jax.random.normal(ks[5], (n, 2)),
             "mask": jnp.ones((n,), jnp.float32)}
    return params, frozen, batch


@pytest.mark.parametrize("clip_norm", [1e-3, 0.1, 1.0, 10.0, 1e4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_brute_force_and_clipped_norms_bounded(seed, clip_norm):
    params, frozen, batch = make(seed, scale=1.0 + seed)
    key = jax.random.PRNGKey(9)
    total, losses, norms = clipping.clipped_grad_sum(toy_loss, params, frozen, batch, key, clip_norm)
    per_ex = clipping.per_example_grads(toy_loss, params, frozen, batch, key)
    ref_norms = clipping.global_norms(per_ex)
    np.testing.assert_allclose(norms, ref_norms, rtol=1e-5)
    scale = jnp.minimum(1.0, clip_norm / ref_norms)
    clipped = jax.tree.map(lambda g: g * scale.reshape((-1,) + (1,) * (g.ndim - 1)), per_ex)
    assert np.all(np.asarray(clipping.global_norms(clipped)) <= clip_norm * (1 + 1e-5))
    ref_sum = jax.tree.map(lambda g: g.sum(0), clipped)
    for a, b in zip(jax.tree.leaves(total), jax.tree.leaves(ref_sum)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * clip_norm)
    np.testing.assert_allclose(losses, toy_loss(params, frozen, batch, key)[0], rtol=1e-5)


@pytest.mark.parametrize("seed", range(5))
def test_sensitivity_neighbouring_batches_differ_by_at_most_c(seed):
    clip_norm = 0.5
    params, frozen, batch = make(seed, scale=2.0)
    key = jax.random.PRNGKey(0)
    full, _, _ = clipping.clipped_grad_sum(toy_loss, params, frozen, batch, key, clip_norm)
    drop = int(np.random.default_rng(seed).integers(batch["mask"].shape[0]))
    neighbour = dict(batch, mask=batch["mask"].at[drop].set(0.0))
    without, _, _ = clipping.clipped_grad_sum(toy_loss, params, frozen, neighbour, key, clip_norm)
    diff = optax.global_norm(jax.tree.map(jnp.subtract, full, without))
    assert float(diff) <= clip_norm * (1 + 1e-5)
    assert float(diff) > 0


def test_padding_rows_contribute_exactly_nothing_even_if_nan():
    params, frozen, batch = make(3)
    key = jax.random.PRNGKey(0)
    real = {k: v[:4] for k, v in batch.items()}
    padded = {k: v.copy() if hasattr(v, "copy") else v for k, v in batch.items()}
    padded["mask"] = jnp.array([1, 1, 1, 1, 0, 0], jnp.float32)
    padded["x"] = padded["x"].at[4].set(jnp.nan).at[5].set(1e30)
    a, _, _ = clipping.clipped_grad_sum(toy_loss, params, frozen, real, key, 1.0)
    b, _, _ = clipping.clipped_grad_sum(toy_loss, params, frozen, padded, key, 1.0)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_requires_mask():
    params, frozen, batch = make(0)
    with pytest.raises(ValueError, match="mask"):
        clipping.clipped_grad_sum(toy_loss, params, frozen, {"x": batch["x"], "y": batch["y"]}, jax.random.PRNGKey(0), 1.0)
