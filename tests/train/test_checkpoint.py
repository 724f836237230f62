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


def test_a_private_checkpoint_is_owner_only_whatever_the_umask(tmp_path):
    """dp-tune's checkpoints (in its `.private` state directory): every directory 0700, every file 0600
    after each save; Orbax alone writes them with the umask's modes (the non-private control)."""
    import os

    params = {"w": jnp.arange(6.0).reshape(2, 3)}
    fns = core.make_train_functions(lambda p, f, b, k: (jnp.sum(p["w"]) * b["mask"], {}), optax.sgd(0.1))
    state = fns.init_state(params, {}, rng=11)
    old = os.umask(0o022)
    try:
        trees = {}
        for private in (True, False):
            ck = checkpoint.TrainCheckpointer(str(tmp_path / f"ckpt-{private}"), max_to_keep=1, private=private)
            for _ in range(2):  # a second save (and Orbax's removal of the first) keeps the modes
                state, _ = fns.train_step(state, {"mask": jnp.ones((2,))})
                ck.save(state, {"rows_consumed": 4})
            ck.close()
            trees[private] = {p: os.stat(p).st_mode & 0o777 for p in _walk(ck.directory)}
    finally:
        os.umask(old)
    assert any(os.path.isfile(p) for p in trees[True])
    assert {p: m for p, m in trees[True].items() if m != (0o700 if os.path.isdir(p) else 0o600)} == {}
    assert 0o644 in trees[False].values() or 0o755 in trees[False].values()  # what the private run changes


def _walk(root):
    import os

    yield root
    for d, dirs, files in os.walk(root):
        yield from (os.path.join(d, n) for n in dirs + files)
