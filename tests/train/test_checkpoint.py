import jax
import jax.numpy as jnp
import numpy as np
import optax

from dpsynth.train import checkpoint, core, lm


def test_train_checkpointer_roundtrip(tmp_path):
    params = {"w": jnp.arange(6.0).reshape(2, 3)}
    opt = optax.adafactor(0.01)
    fns = core.make_train_functions(lambda p, f, b, k: (jnp.sum(p["w"]) * b["mask"], {}), opt)
    state = fns.init_state(params, {}, rng=11)
    state, _ = fns.train_step(state, {"mask": jnp.ones((2,))})
    ck = checkpoint.TrainCheckpointer(str(tmp_path / "ckpt"))
    assert ck.latest_step() is None
    ck.save(state, {"rows_consumed": 4})
    fresh = fns.init_state(params, {}, rng=0)
    restored, meta = ck.restore(fresh)
    assert meta == {"rows_consumed": 4} and ck.read_meta() == meta
    assert int(restored.step) == 1
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
        np.testing.assert_array_equal(a, b)
