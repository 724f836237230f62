import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpsynth.models import Transformer, get_config
from dpsynth.train import core, lm, optim, sharding


def _linear_loss(params, frozen, batch, key):
    pred = batch["x"] @ params["w"] + frozen["b"]
    return jnp.sum((pred - batch["y"]) ** 2, axis=-1), {"abs": jnp.abs(pred).sum(-1)}


def _linear_batch(n, seed):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(n, 3)).astype(np.float32), "y": rng.normal(size=(n, 2)).astype(np.float32),
            "mask": np.ones((n,), np.float32)}


def _params():
    return {"w": jnp.asarray(np.random.default_rng(9).normal(size=(3, 2)), jnp.float32)}, {"b": jnp.ones((2,))}


def test_mean_gradient_equals_reference_and_ignores_padding():
    params, frozen = _params()
    fns = core.make_train_functions(_linear_loss, optax.sgd(0.1))
    a, b = _linear_batch(4, 1), _linear_batch(6, 2)
    # Microbatch b padded with 2 masked garbage rows.
    b_pad = {k: np.concatenate([v, 100 * np.ones_like(v[:2])]) for k, v in b.items()}
    b_pad["mask"][-2:] = 0
    a_pad = {k: np.concatenate([v, 100 * np.ones_like(v[:4])]) for k, v in a.items()}
    a_pad["mask"][-4:] = 0
    state = fns.init_state(params, frozen, rng=0)
    state, metrics = fns.accumulated_step(state, [a_pad, b_pad])
    both = {k: np.concatenate([a[k], b[k]]) for k in a}
    ref_grad = jax.grad(lambda p: jnp.mean(_linear_loss(p, frozen, both, None)[0]))(params)
    np.testing.assert_allclose(state.params["w"], params["w"] - 0.1 * ref_grad["w"], rtol=1e-5, atol=1e-6)
    assert float(metrics["count"]) == 10
    np.testing.assert_allclose(metrics["loss"], jnp.mean(_linear_loss(params, frozen, both, None)[0]), rtol=1e-5)
    assert int(state.step) == 1 and int(metrics["microbatches"]) == 2
    np.testing.assert_array_equal(state.frozen["b"], frozen["b"])


def test_train_step_equals_single_microbatch_accumulation_and_compiles_once():
    params, frozen = _params()
    fns = core.make_train_functions(_linear_loss, optax.adam(0.01))
    s1 = fns.init_state(params, frozen, rng=3)
    s2 = fns.init_state(params, frozen, rng=3)
    for i in range(3):
        s1, _ = fns.train_step(s1, fns.shard_batch(_linear_batch(5, i)))
        s2, _ = fns.accumulated_step(s2, [_linear_batch(5, i)])
    np.testing.assert_allclose(s1.params["w"], s2.params["w"], rtol=1e-6)
    assert fns._compiled["train"]._cache_size() == 1
    assert fns._compiled["accumulate"]._cache_size() == 1
    # The caller's arrays are not donated away.
    assert np.isfinite(np.asarray(params["w"])).all()


class _KeySpy(core.MeanGradient):
    def accumulate(self, loss_fn, params, frozen, batch, key, acc):
        acc, metrics = super().accumulate(loss_fn, params, frozen, batch, key, acc)
        return acc, {**metrics, "key": key}

    def finalize(self, acc, params, key):
        self.final_key_shape = key.shape
        return super().finalize(acc, params, key)


def test_step_keys_are_fold_ins_and_never_repeat():
    params, frozen = _params()
    fns = core.make_train_functions(_linear_loss, optax.sgd(0.0), _KeySpy())
    state = fns.init_state(params, frozen, rng=7)
    seen = []
    for step in range(3):
        acc = fns.init_accumulator(state)
        for m in range(2):
            acc, metrics = fns.accumulate_step(state, acc, fns.shard_batch(_linear_batch(2, m)))
            seen.append(tuple(np.asarray(metrics["key"])))
            base, final = core.step_keys(jax.random.PRNGKey(7), step)
            assert seen[-1] == tuple(np.asarray(jax.random.fold_in(base, m)))
            assert seen[-1] != tuple(np.asarray(final))
        state, _ = fns.apply_step(state, acc)
    assert len(set(seen)) == len(seen) == 6


def _lm_setup(vocab=64):
    config = get_config("tiny", vocab_size=vocab, max_len=64, num_layers=1)
    model = Transformer(config)
    rng = np.random.default_rng(0)
    x = rng.integers(4, vocab, (8, 17)).astype(np.int32)
    seg = np.repeat(np.array([[1] * 9 + [2] * 7]), 8, axis=0).astype(np.int32)
    batch = {"inputs": x[:, :-1], "targets": x[:, 1:], "weights": np.ones((8, 16), np.float32),
             "segment_ids": seg, "mask": np.ones((8,), np.float32)}
    variables = jax.jit(model.init)(jax.random.PRNGKey(0), batch["inputs"])
    return model, variables, batch


def test_loss_decreases_on_a_tiny_corpus():
    model, variables, batch = _lm_setup()
    fns = core.make_train_functions(lm.make_lm_loss(model), optim.make_optimizer("adam", learning_rate=1e-2))
    state = fns.init_state(*lm.split_variables(variables), rng=0)
    losses = []
    for _ in range(12):
        state, metrics = fns.train_step(state, fns.shard_batch(batch))
        losses.append(float(metrics["loss"]))
    assert losses[-1] < 0.7 * losses[0]


@pytest.mark.parametrize("optimizer", ["sgd_momentum", "adam"])
def test_sharded_mesh_equals_single_device(optimizer):
    """The 4 x 2 mesh's steps (plain and accumulated) compute what one device computes.

    What is compared is what rounding cannot amplify: the losses, the gradient's moments and, under
    SGD with momentum (an update linear in the gradients), the parameters, within float32 rounding of
    a reordered reduction (1e-5 relative). Adam's parameters are not compared: its first step moves
    every element by lr * g / (|g| + eps), so an element whose gradient is at rounding level moves
    by up to lr either way on either side (a 1e-4 bound held on one CPU and not on another), and
    what the next gradient sees inherits that; its moments are compared after the first step.
    """
    assert len(jax.devices()) >= 8, "tests/conftest.py sets 8 host devices"
    model, variables, batch = _lm_setup()
    params, frozen = lm.split_variables(variables)
    make = {"sgd_momentum": lambda: optax.sgd(1e-2, momentum=0.9),
            "adam": lambda: optim.make_optimizer("adam", learning_rate=1e-2)}[optimizer]
    results = {}
    for name, mesh in [("single", None), ("mesh", sharding.make_mesh(4, 2))]:
        fns = core.make_train_functions(lm.make_lm_loss(model), make(), mesh=mesh)
        state = fns.init_state(params, frozen, rng=0)
        losses = []
        state, m = fns.train_step(state, fns.shard_batch(batch))
        losses.append(float(m["loss"]))
        first = jax.device_get(state.opt_state if optimizer == "adam" else None)
        halves = [{k: v[:4] for k, v in batch.items()}, {k: v[4:] for k, v in batch.items()}]
        state, m = fns.accumulated_step(state, halves)
        losses.append(float(m["loss"]))
        if mesh is not None:
            kernel = state.params["params"]["layer_0"]["mlp"]["up"]["kernel"]
            assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "model")
            assert len(kernel.sharding.device_set) == 8
        results[name] = (losses, jax.device_get(state.params), first or jax.device_get(state.opt_state))
    single, mesh = results["single"], results["mesh"]
    np.testing.assert_allclose(single[0], mesh[0], rtol=1e-5)
    if optimizer == "sgd_momentum":
        for a, b in zip(jax.tree.leaves(single[1]), jax.tree.leaves(mesh[1])):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    moments = [(a, b) for a, b in zip(jax.tree.leaves(single[2]), jax.tree.leaves(mesh[2])) if np.ndim(a) >= 1]
    assert moments
    for a, b in moments:  # momentum traces, Adam's mu and nu: sums of (squared) gradients
        scale = float(np.max(np.abs(a))) or 1.0
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * scale)


def test_trainable_subset_only_changes():
    config = get_config("tiny", vocab_size=64, max_len=64, lora_rank=2, prompt_length=2, num_layers=1)
    model = Transformer(config)
    _, _, batch = _lm_setup()
    variables = jax.jit(model.init)(jax.random.PRNGKey(1), batch["inputs"])
    for trainable in (("lora",), ("prompt",)):
        params, frozen = lm.split_variables(variables, trainable)
        fns = core.make_train_functions(lm.make_lm_loss(model), optim.make_optimizer("adam", learning_rate=1e-2))
        state = fns.init_state(params, frozen, rng=0)
        state, _ = fns.train_step(state, fns.shard_batch(batch))
        for c in variables:
            tree = state.params[c] if c in trainable else state.frozen[c]
            same = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(variables[c])))
            assert same == (c not in trainable), (trainable, c)
    with pytest.raises(ValueError, match="trainable collections"):
        lm.split_variables({"params": {}}, ("lora",))
