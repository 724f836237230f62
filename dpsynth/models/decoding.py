"""KV-cache decoding for `dpsynth.models.Transformer` (works with LoRA and soft prompts).

The cache is a dict of arrays (a pytree, so it passes through `jax.jit`):
  - "k", "v": tuples of num_layers arrays [B, kv_heads, S, head_dim], S = max_len + prompt_length
    (kv_heads is `num_kv_heads`, fewer than the query heads with grouped-query attention). One
    buffer per layer, so that a decode step writes its slot of each layer in place (a stacked
    [num_layers, ...] array was copied whole at every step), and heads before slots, so that
    attention reads each head's keys contiguously (docs/generate.md: 1.6x the sampler's
    tokens/s at 72 tokens, 3.3x at 512, `cpu` preset);
  - "index": int32 [B], the number of filled slots of each row.

A cache may start short and grow (`grow_cache`): attention reads every slot of the cache it is
given (masked beyond each row's index), so a decode step costs what the cache holds, not the
longest sequence the model allows. The sampler grows it in phases (`dpsynth.generate.sampler`).

With a soft prompt, the prompt occupies slots 0..P-1 of every row (written by `prefill`);
token t of a row then lives at slot P + t with rotary position P + t, exactly as in the full
(uncached) forward pass, so cached logits equal recomputed ones.

Usage:
    cache = init_cache(config, batch, max_len)
    logits, cache = prefill(model, variables, prompt_tokens, prompt_lengths, cache)
    for _ in range(n):
        token = sample(logits)
        logits, cache = decode_step(model, variables, token, cache)

Rows may have different prompt lengths: `prompt_tokens` is right-padded and `lengths` says
how many tokens are real; the padding slots are overwritten by the following decode steps.
The caller keeps `index` below S (writes past the end are clamped by XLA, not checked).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from dpsynth.models.config import ModelConfig

Cache = dict[str, Any]


def init_cache(config: ModelConfig, batch: int, max_len: int, dtype=None) -> Cache:
    """An empty cache for `batch` rows of up to `max_len` tokens (plus the soft prompt)."""
    if max_len <= 0 or max_len > config.max_len:
        raise ValueError(f"decoding max_len {max_len} must be in [1, {config.max_len}] (the model's max_len)")
    if dtype is None:
        dtype = jnp.bfloat16 if config.dtype == "bfloat16" else jnp.float32
    shape = (batch, config.kv_heads, max_len + config.prompt_length, config.head_dim)
    layers = lambda: tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers))  # noqa: E731
    return {"k": layers(), "v": layers(), "index": jnp.zeros((batch,), jnp.int32)}


def grow_cache(config: ModelConfig, cache: Cache, max_len: int) -> Cache:
    """`cache` with room for `max_len` tokens (plus the soft prompt): empty slots appended to every
    layer's K and V (one copy of the cache); the filled slots and `index` unchanged."""
    if max_len > config.max_len:
        raise ValueError(f"decoding max_len {max_len} must be at most {config.max_len} (the model's max_len)")
    extra = max_len + config.prompt_length - cache["k"][0].shape[2]
    if extra < 0:
        raise ValueError(f"cannot shrink a cache of {cache['k'][0].shape[2]} slots to {max_len} tokens")
    pad = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, extra), (0, 0)))  # noqa: E731
    return dict(cache, k=tuple(map(pad, cache["k"])), v=tuple(map(pad, cache["v"])))


def prefill(model, variables, tokens, lengths, cache: Cache):
    """Runs the prompt `tokens[B, T]` (right-padded, `lengths[B]` real tokens, >= 1) into `cache`.

    Returns:
      (logits [B, vocab] of each row's last real token, the cache with index = P + lengths).
    """
    tokens = jnp.asarray(tokens, jnp.int32)
    lengths = jnp.asarray(lengths, jnp.int32)
    start = cache["index"]
    logits, cache = model.apply(variables, tokens, cache=cache, with_prompt=True)
    last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]
    cache = dict(cache, index=start + model.config.prompt_length + lengths)
    return last, cache


def decode_step(model, variables, token, cache: Cache):
    """Feeds one token per row (`token[B]`) and returns (logits [B, vocab], updated cache)."""
    token = jnp.asarray(token, jnp.int32)[:, None]
    logits, cache = model.apply(variables, token, cache=cache, with_prompt=False)
    return logits[:, 0], cache


def greedy_decode(model, variables, tokens, lengths, max_len: int, steps: int):
    """Greedy decoding of `steps` tokens (a reference/convenience; the sampler lives in generate/)."""
    cache = init_cache(model.config, tokens.shape[0], max_len)
    logits, cache = jax.jit(lambda v, t, l, c: prefill(model, v, t, l, c))(variables, tokens, lengths, cache)
    step = jax.jit(lambda v, t, c: decode_step(model, v, t, c))
    out = []
    for _ in range(steps):
        token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        out.append(token)
        logits, cache = step(variables, token, cache)
    return jnp.stack(out, axis=1)
