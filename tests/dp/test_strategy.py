"""DPSGDStrategy: noise std sigma*C, division by expected batch size, independence of keys, core fit."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpsynth.dp import clipping
from dpsynth.dp.strategy import DPSGDStrategy
from dpsynth.train import core
from tests.dp.test_clipping import make, toy_loss


def test_empirical_noise_std_is_sigma_c():
    strat = DPSGDStrategy(clip_norm=0.7, noise_multiplier=1.3, expected_batch_size=10.0)
    params = {"w": jnp.zeros((200, 50))}
    acc = strat.init_accumulator(params)
    noisy = strat.noisy_sum(acc, jax.random.PRNGKey(1))["w"]
    std = float(jnp.std(noisy))
    assert abs(std - 1.3 * 0.7) < 0.02 * 1.3 * 0.7  # 10k samples: rel. std error ~0.7%
    assert abs(float(jnp.mean(noisy))) < 0.05
    grads = strat.finalize(acc, params, jax.random.PRNGKey(1))["w"]
    np.testing.assert_allclose(grads, noisy / 10.0, rtol=1e-6)
    # Fresh noise for different finalize keys (steps), same noise for the same key.
    other = strat.noisy_sum(acc, jax.random.PRNGKey(2))["w"]
    assert abs(float(jnp.corrcoef(noisy.ravel(), other.ravel())[0, 1])) < 0.05
    np.testing.assert_array_equal(noisy, strat.noisy_sum(acc, jax.random.PRNGKey(1))["w"])


def test_zero_noise_is_clipped_mean_over_expected_batch():
    params, frozen, batch = make(1)
    strat = DPSGDStrategy(clip_norm=0.3, noise_multiplier=0.0, expected_batch_size=4.0)
    acc, metrics = strat.accumulate(toy_loss, params, frozen, batch, jax.random.PRNGKey(0), strat.init_accumulator(params))
    assert float(metrics["count"]) == 6
    ref, _, _ = clipping.clipped_grad_sum(toy_loss, params, frozen, batch, jax.random.PRNGKey(0), 0.3)
    out = strat.finalize(acc, params, jax.random.PRNGKey(5))
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        np.testing.assert_allclose(a, b / 4.0, rtol=1e-6)


def test_validates():
    with pytest.raises(ValueError):
        DPSGDStrategy(clip_norm=0.0, noise_multiplier=1.0, expected_batch_size=1.0)
    with pytest.raises(ValueError):
        DPSGDStrategy(clip_norm=1.0, noise_multiplier=-1.0, expected_batch_size=1.0)
    with pytest.raises(ValueError):
        DPSGDStrategy(clip_norm=1.0, noise_multiplier=1.0, expected_batch_size=0.0)


def test_in_training_core_only_trainable_changes_and_accumulation_equals_one_batch():
    params, frozen, batch = make(2)
    strat = DPSGDStrategy(clip_norm=0.5, noise_multiplier=0.8, expected_batch_size=6.0)
    fns = core.make_train_functions(toy_loss, optax.sgd(0.1), strat, donate=False)
    s0 = fns.init_state(params, frozen, rng=3)
    # Two microbatches of 3 (the second padded to 4 with a masked row) == one batch of 6.
    mb1 = {k: v[:3] for k, v in batch.items()}
    mb2 = {k: jnp.concatenate([v[3:], v[:1]]) for k, v in batch.items()}
    mb2["mask"] = jnp.array([1, 1, 1, 0], jnp.float32)
    mb1 = {k: jnp.concatenate([v, v[:1]]) for k, v in mb1.items()}
    mb1["mask"] = jnp.array([1, 1, 1, 0], jnp.float32)
    s_acc, m = fns.accumulated_step(s0, [mb1, mb2])
    fns1 = core.make_train_functions(toy_loss, optax.sgd(0.1), strat, donate=False)
    s_one, _ = fns1.accumulated_step(fns1.init_state(params, frozen, rng=3), [batch])
    for a, b in zip(jax.tree.leaves(s_acc.params), jax.tree.leaves(s_one.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert float(m["count"]) == 6
    for a, b in zip(jax.tree.leaves(s_acc.frozen), jax.tree.leaves(frozen)):
        np.testing.assert_array_equal(a, b)
    assert any(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(s_acc.params), jax.tree.leaves(params)))


def test_two_processes_clip_once_and_add_noise_once():
    """2 processes x 4 CPU devices (mesh 4 x 2: batch rows and kernels split across processes).

    Each example's gradient is clipped once: 11 real examples with gradients of norm >> C in
    one direction sum to norm exactly 11 C (per-host clipping of partial sums would give
    2 C; padding rows add nothing). Noise is added once to the global sum: with zero
    gradients the update's variance is (sigma C)^2 -- noise drawn per host (or per device)
    and summed would multiply it by 2 (or 8) -- and it is the very noise of one process with
    8 devices.
    """
    from tests import multiprocess
    from tests.dp import multihost_cases

    clip_norm, sigma = 0.5, 3.0
    results = multiprocess.run("tests.dp.multihost_cases:dp_step_case", num_processes=2, devices=4,
                               kwargs={"clip_norm": clip_norm, "noise_multiplier": sigma}, timeout=180)
    reference = multihost_cases.dp_step_case(clip_norm=clip_norm, noise_multiplier=sigma)
    assert reference["processes"] == 1
    n = multihost_cases.REAL_ROWS
    for r in results:
        assert r["processes"] == 2 and r["sharded"]
        assert r["count"] == n and r["clipped"] == n
        assert r["clip_update_norm"] == pytest.approx(n * clip_norm, rel=1e-5)
        # Sampling error of the variance over ~98k coordinates: ~0.5%; a second draw: +100%.
        assert r["noise_var"] == pytest.approx((sigma * clip_norm) ** 2, rel=0.05)
        assert abs(r["noise_mean"]) < 5 * sigma * clip_norm / np.sqrt(r["noise_size"])
        np.testing.assert_allclose(r["noise_head"], reference["noise_head"], rtol=1e-6, atol=1e-6)
        assert r["noise_var"] == pytest.approx(reference["noise_var"], rel=1e-6)
