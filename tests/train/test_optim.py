import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpsynth.train import optim


def test_rsqrt_schedule_values():
    s = optim.rsqrt_schedule(0.01)
    # count c is step c + 1: min(0.01, 1/sqrt(step)).
    for count, expected in [(0, 0.01), (99, 0.01), (9_999, 0.01), (39_999, 0.005), (999_999, 0.001)]:
        np.testing.assert_allclose(float(s(count)), expected, rtol=1e-6)


def test_warmup_cosine():
    s = optim.warmup_cosine_schedule(1e-3, total_steps=100, warmup_steps=10)
    assert float(s(0)) == 0.0
    np.testing.assert_allclose(float(s(10)), 1e-3, rtol=1e-6)
    np.testing.assert_allclose(float(s(100)), 1e-4, rtol=1e-5)


@pytest.mark.parametrize("name", optim.OPTIMIZERS)
def test_optimizers_apply_weight_decay(name):
    params = {"w": jnp.ones((200, 130))}
    opt = optim.make_optimizer(name, learning_rate=0.1, weight_decay=0.5)
    state = opt.init(params)
    zero = {"w": jnp.zeros((200, 130))}
    updates, _ = opt.update(zero, state, params)
    # With a zero gradient only the decoupled weight decay moves the weights (towards 0).
    assert float(optax.apply_updates(params, updates)["w"].mean()) < 1.0
    with pytest.raises(ValueError):
        optim.make_optimizer("sgd")
