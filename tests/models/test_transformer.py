import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpsynth.models import Transformer, get_config, segment_positions

TINY = dict(vocab_size=64, max_len=64)


def _init(config, tokens, seed=0):
    return jax.jit(Transformer(config).init)(jax.random.PRNGKey(seed), tokens)


def _apply(config):
    return jax.jit(Transformer(config).apply)


def _tokens(shape, seed=0, vocab=64):
    return jnp.asarray(np.random.default_rng(seed).integers(4, vocab, shape), jnp.int32)


def test_output_shapes_and_collections():
    tokens = _tokens((2, 7))
    for kw, expected in [({}, {"params"}), ({"lora_rank": 2}, {"params", "lora"}),
                         ({"prompt_length": 3}, {"params", "prompt"})]:
        config = get_config("tiny", **TINY, num_layers=1, **kw)
        variables = _init(config, tokens)
        assert set(variables) == expected
        logits = _apply(config)(variables, tokens)
        assert logits.shape == (2, 7, 64) and logits.dtype == jnp.float32


def test_segment_positions_restart():
    seg = jnp.asarray([[1, 1, 1, 2, 2, 3, 0, 0]])
    np.testing.assert_array_equal(segment_positions(seg), [[0, 1, 2, 0, 1, 0, 0, 1]])


def test_packing_never_attends_across_documents():
    config = get_config("tiny", **TINY)
    model = _apply(config)
    seg = jnp.asarray([[1] * 5 + [2] * 6 + [3] * 5])
    tokens = _tokens((1, 16), seed=1)
    variables = _init(config, tokens)
    base = model(variables, tokens, segment_ids=seg)
    # Perturb document 2 only: documents 1 and 3 keep exactly their logits.
    perturbed = tokens.at[0, 5:11].set(_tokens((6,), seed=2))
    out = model(variables, perturbed, segment_ids=seg)
    np.testing.assert_array_equal(out[0, :5], base[0, :5])
    np.testing.assert_array_equal(out[0, 11:], base[0, 11:])
    assert not np.allclose(out[0, 5:11], base[0, 5:11])
    # A packed document equals the same document run alone (positions restart per segment).
    alone = model(variables, tokens[:, 11:])
    np.testing.assert_allclose(base[0, 11:], alone[0], atol=1e-5)


def test_causal():
    config = get_config("tiny", **TINY)
    model = _apply(config)
    tokens = _tokens((2, 10))
    variables = _init(config, tokens)
    base = model(variables, tokens)
    changed = model(variables, tokens.at[:, 6].set(5))
    np.testing.assert_array_equal(base[:, :6], changed[:, :6])


@pytest.mark.parametrize("targets", ["attention", "mlp", "all"])
def test_lora_targets(targets):
    config = get_config("tiny", **TINY, lora_rank=4, lora_targets=targets)
    shapes = jax.eval_shape(Transformer(config).init, jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))
    names = {k for layer in shapes["lora"].values() for group in layer.values() for k in group}
    expected = {"all": {"q", "k", "v", "o", "gate", "up", "down"}, "attention": {"q", "k", "v", "o"},
                "mlp": {"gate", "up", "down"}}[targets]
    assert names == expected


def test_lora_with_zero_b_is_exactly_the_base_model():
    tokens = _tokens((2, 9))
    base_config = get_config("tiny", **TINY)
    base_vars = _init(base_config, tokens)
    config = base_config.replace(lora_rank=4, lora_targets="all")
    variables = _init(config, tokens, seed=1)
    assert all(np.all(np.asarray(b) == 0) for b in jax.tree.leaves(
        jax.tree_util.tree_map_with_path(lambda p, x: x if p[-1].key == "b" else jnp.zeros(()), variables["lora"])))
    variables = {"params": base_vars["params"], "lora": variables["lora"]}
    np.testing.assert_array_equal(_apply(config)(variables, tokens),
                                  _apply(base_config)(base_vars, tokens))
    # Non-zero B changes the outputs, and only the targeted projections carry adapters.
    lora = jax.tree.map(lambda x: x + 0.05, variables["lora"])
    out = _apply(config)({"params": base_vars["params"], "lora": lora}, tokens)
    assert not np.allclose(out, _apply(base_config)(base_vars, tokens))


def test_soft_prompt_changes_only_what_it_should():
    tokens = _tokens((2, 8))
    config = get_config("tiny", **TINY, prompt_length=4)
    model = Transformer(config)
    variables = _init(config, tokens)
    logits = _apply(config)(variables, tokens)
    assert logits.shape == (2, 8, 64)  # prompt positions are stripped

    def loss(prompt):
        out = model.apply({"params": variables["params"], "prompt": prompt}, tokens)
        return jnp.sum(jax.nn.log_softmax(out)[..., 0])

    grads = jax.jit(jax.grad(loss))(variables["prompt"])
    assert float(jnp.abs(grads["embedding"]).sum()) > 0
    # Changing the prompt changes every position's output (the prompt is visible to all tokens).
    other = {"params": variables["params"], "prompt": {"embedding": variables["prompt"]["embedding"] + 1.0}}
    changed = _apply(config)(other, tokens)
    assert np.all(np.abs(np.asarray(changed - logits)).max(axis=-1) > 0)
    # Base params get gradients too if asked, but the collection layout keeps them separable.
    full_grads = jax.jit(jax.grad(lambda v: jnp.sum(model.apply(v, tokens))))(variables)
    assert set(full_grads) == {"params", "prompt"}


def test_bfloat16_compute_keeps_float32_logits():
    config = get_config("tiny", **TINY, dtype="bfloat16", num_layers=1)
    tokens = _tokens((1, 5))
    variables = _init(config, tokens)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(variables))
    logits = _apply(config)(variables, tokens)
    ref = _apply(config.replace(dtype="float32"))(variables, tokens)
    assert logits.dtype == jnp.float32
    np.testing.assert_allclose(logits, ref, atol=0.15)


def test_remat_gives_same_gradients():
    tokens = _tokens((1, 6))
    config = get_config("tiny", **TINY, num_layers=1)
    variables = _init(config, tokens)
    f = lambda cfg: jax.jit(jax.grad(lambda v: jnp.sum(Transformer(cfg).apply(v, tokens) ** 2)))(variables)
    for a, b in zip(jax.tree.leaves(f(config)), jax.tree.leaves(f(config.replace(remat=True)))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
