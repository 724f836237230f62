import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpsynth.models import Transformer, get_config
from dpsynth.models import decoding


@pytest.mark.parametrize("kw", [
    {}, {"lora_rank": 2, "prompt_length": 3},
    # grouped-query attention (two query heads per cached K/V head) with a sliding-window layer
    {"num_kv_heads": 2, "sliding_window": 4, "layer_kinds": ("sliding", "full"), "qk_norm": True},
    {"positions": "learned", "num_kv_heads": 1, "prompt_length": 2}])
def test_kv_cache_decoding_equals_full_recomputation(kw):
    config = get_config("tiny", vocab_size=64, max_len=32, **kw)
    model = Transformer(config)
    rng = np.random.default_rng(0)
    full_tokens = jnp.asarray(rng.integers(4, 64, (3, 14)), jnp.int32)
    variables = jax.jit(model.init)(jax.random.PRNGKey(0), full_tokens)
    if "lora" in variables:  # make the adapters matter
        variables["lora"] = jax.tree.map(lambda x: x + 0.03, variables["lora"])
    reference = jax.jit(model.apply)(variables, full_tokens)
    lengths = jnp.asarray([3, 6, 1], jnp.int32)
    prompt = jnp.where(jnp.arange(6)[None] < lengths[:, None], full_tokens[:, :6], 0)
    cache = decoding.init_cache(config, 3, 8)  # grown to 16 tokens after three steps (as the sampler's phases)
    last, cache = jax.jit(lambda v, t, l, c: decoding.prefill(model, v, t, l, c))(variables, prompt, lengths, cache)
    np.testing.assert_allclose(last, reference[jnp.arange(3), lengths - 1], atol=2e-5)
    step = jax.jit(lambda v, t, c: decoding.decode_step(model, v, t, c))
    for i in range(7):
        if i == 2:
            cache = decoding.grow_cache(config, cache, 16)
            assert cache["k"][0].shape[2] == config.prompt_length + 16
        token = full_tokens[jnp.arange(3), lengths + i]
        logits, cache = step(variables, token, cache)
        np.testing.assert_allclose(logits, reference[jnp.arange(3), lengths + i], atol=2e-5)
    np.testing.assert_array_equal(cache["index"], config.prompt_length + lengths + 7)


def test_greedy_decode_matches_argmax_of_recomputation():
    config = get_config("tiny", vocab_size=64, max_len=32)
    model = Transformer(config)
    tokens = jnp.asarray([[5, 9, 11, 7]], jnp.int32)
    variables = jax.jit(model.init)(jax.random.PRNGKey(3), tokens)
    out = decoding.greedy_decode(model, variables, tokens, jnp.asarray([4]), max_len=12, steps=5)
    # Reference: recompute the whole (fixed-shape, right-padded) sequence at every step.
    apply = jax.jit(model.apply)
    seq = jnp.zeros((1, 9), jnp.int32).at[:, :4].set(tokens)
    for i in range(4, 9):
        nxt = jnp.argmax(apply(variables, seq)[:, i - 1], axis=-1)
        seq = seq.at[:, i].set(nxt.astype(jnp.int32))
    np.testing.assert_array_equal(out, seq[:, 4:])


def test_init_cache_checks_length():
    with pytest.raises(ValueError, match="max_len"):
        decoding.init_cache(get_config("tiny"), 1, 10_000)
    config = get_config("tiny", max_len=32)
    cache = decoding.init_cache(config, 1, 8)
    with pytest.raises(ValueError, match="max_len"):
        decoding.grow_cache(config, cache, 33)
    with pytest.raises(ValueError, match="shrink"):
        decoding.grow_cache(config, cache, 4)
