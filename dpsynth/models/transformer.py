"""Decoder-only Transformer (Flax linen) with LoRA adapters, soft prompts and packed sequences.

Architecture: token embedding (tied with the output layer) -> `num_layers` pre-norm blocks
(RMSNorm -> multi-head causal self-attention with rotary positions -> residual; RMSNorm ->
gated MLP (gated GELU or SwiGLU) -> residual) -> RMSNorm -> logits. No biases.

Variable collections returned by `Transformer(config).init(key, tokens)`:
  - "params": the base model (always).
  - "lora": `a` [in, r] (normal init) and `b` [r, out] (zeros) per adapted projection, iff
    `config.lora_rank > 0`. With `b = 0` the model computes exactly the base model's outputs.
  - "prompt": `embedding` [P, d_model] (uniform in [-0.01, 0.01]) iff `config.prompt_length > 0`.
    The P vectors are prepended in embedding space, take rotary positions 0..P-1, are visible
    to every token of the row (also across packed segments) and are stripped from the output.

Because adapters and prompts are their own collections, an optimizer (or a per-example
gradient) over `variables["lora"]` sees exactly the trainable subset; when they are off they
have no variables and cost no compute.

Packing: `segment_ids[B, T]` (0 = padding) keeps attention inside each document; positions
restart at 0 at every segment start unless `positions` are given.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from dpsynth.models.config import ModelConfig

_NEG_INF = -1e30


def _dtype(config: ModelConfig):
    return jnp.bfloat16 if config.dtype == "bfloat16" else jnp.float32


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a learned scale (computed in float32)."""

    eps: float = 1e-6
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * scale).astype(self.dtype)


class Projection(nn.Module):
    """`x @ kernel` (no bias), plus `scale * (x @ a) @ b` when `lora_rank > 0`."""

    features: int
    lora_rank: int = 0
    lora_scale: float = 0.0
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        d_in = x.shape[-1]
        init = nn.initializers.normal(stddev=d_in**-0.5)
        kernel = self.param("kernel", init, (d_in, self.features), jnp.float32)
        y = jnp.dot(x, kernel.astype(self.dtype))
        if self.lora_rank:
            a = self.variable("lora", "a", lambda: init(self.make_rng("params"), (d_in, self.lora_rank), jnp.float32))
            b = self.variable("lora", "b", lambda: jnp.zeros((self.lora_rank, self.features), jnp.float32))
            lora = jnp.dot(jnp.dot(x, a.value.astype(self.dtype)), b.value.astype(self.dtype))
            y = y + (self.lora_scale * lora).astype(y.dtype)
        return y


def rotary(x, positions, base: float):
    """Applies rotary position embeddings to `x[B, S, H, D]` at integer `positions[B, S]`."""
    half = x.shape[-1] // 2
    freqs = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions.astype(jnp.float32)[..., None] * freqs  # [B, S, half]
    sin, cos = jnp.sin(angles)[:, :, None, :], jnp.cos(angles)[:, :, None, :]
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., :half], x32[..., half:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


class Attention(nn.Module):
    """Multi-head causal self-attention; with `cache`, writes K/V at per-row slots first."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x, positions, mask, cache=None):
        cfg, dtype = self.config, _dtype(self.config)
        b, s, _ = x.shape
        h, hd = cfg.num_heads, cfg.head_dim
        lora = dict(lora_rank=cfg.lora_rank if cfg.lora_applies("attention") else 0,
                    lora_scale=cfg.lora_scale, dtype=dtype)
        q = Projection(h * hd, name="q", **lora)(x).reshape(b, s, h, hd)
        k = Projection(h * hd, name="k", **lora)(x).reshape(b, s, h, hd)
        v = Projection(h * hd, name="v", **lora)(x).reshape(b, s, h, hd)
        q, k = rotary(q, positions, cfg.rope_base), rotary(k, positions, cfg.rope_base)
        new_cache = None
        if cache is not None:
            k_cache, v_cache, index = cache
            write = jax.vmap(lambda c, u, i: jax.lax.dynamic_update_slice(c, u, (i, 0, 0)))
            k = write(k_cache, k.astype(k_cache.dtype), index)
            v = write(v_cache, v.astype(v_cache.dtype), index)
            new_cache = (k, v)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k.astype(dtype), preferred_element_type=jnp.float32)
        scores = scores * (hd**-0.5)
        scores = jnp.where(mask[:, None, :, :], scores, _NEG_INF)
        probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", probs, v.astype(dtype)).reshape(b, s, h * hd)
        return Projection(cfg.d_model, name="o", **lora)(out), new_cache


class MLP(nn.Module):
    """Gated MLP: down(act(gate(x)) * up(x)), act = GELU (gated_gelu) or SiLU (swiglu)."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        lora = dict(lora_rank=cfg.lora_rank if cfg.lora_applies("mlp") else 0,
                    lora_scale=cfg.lora_scale, dtype=_dtype(cfg))
        gate = Projection(cfg.d_ff, name="gate", **lora)(x)
        up = Projection(cfg.d_ff, name="up", **lora)(x)
        act = jax.nn.gelu(gate) if cfg.mlp == "gated_gelu" else jax.nn.silu(gate)
        return Projection(cfg.d_model, name="down", **lora)(act * up)


class Block(nn.Module):
    """One pre-norm decoder block."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x, positions, mask, cache=None):
        cfg = self.config
        y, new_cache = Attention(cfg, name="attention")(
            RMSNorm(cfg.norm_eps, _dtype(cfg), name="attention_norm")(x), positions, mask, cache)
        x = x + y
        x = x + MLP(cfg, name="mlp")(RMSNorm(cfg.norm_eps, _dtype(cfg), name="mlp_norm")(x))
        return x, new_cache


def segment_positions(segment_ids):
    """Positions that restart at 0 at the start of every segment of `segment_ids[B, T]`."""
    t = jnp.arange(segment_ids.shape[1], dtype=jnp.int32)[None, :]
    starts = jnp.concatenate(
        [jnp.ones_like(segment_ids[:, :1], dtype=bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
    start_index = jax.lax.cummax(jnp.where(starts, t, 0), axis=1)
    return (t - start_index).astype(jnp.int32)


class Transformer(nn.Module):
    """The decoder-only LM. See the module docstring for collections and conventions."""

    config: ModelConfig

    @nn.compact
    def __call__(self, tokens, segment_ids=None, positions=None, *, cache=None, with_prompt: bool = True,
                 return_hidden: bool = False):
        """Logits for every token position.

        Args:
          tokens: int32 [B, T].
          segment_ids: int32 [B, T]; tokens attend only within their segment (0 = padding).
            Ignored with `cache`.
          positions: int32 [B, T] rotary positions of the tokens (before the soft-prompt
            offset); default: restart per segment.
          cache: decoding only (see `dpsynth.models.decoding`): dict with "k", "v"
            [layers, B, S, heads, head_dim] and "index" [B] (filled slots). The new tokens are
            written at slots index[b] + t and attend to every earlier slot.
          with_prompt: prepend the soft prompt (if any); decode steps after the prefill pass
            False because the prompt is already in the cache.
          return_hidden: also return the final normalized hidden states [B, T, d_model].

        Returns:
          float32 logits [B, T, vocab] (prompt positions stripped); with `cache`, the tuple
          `(logits, new_cache)`; with `return_hidden`, `(logits, hidden)` (or a triple).
        """
        cfg, dtype = self.config, _dtype(self.config)
        b, t = tokens.shape
        p = cfg.prompt_length if with_prompt else 0
        embedding = self.param("embedding", nn.initializers.normal(stddev=cfg.d_model**-0.5),
                               (cfg.vocab_size, cfg.d_model), jnp.float32)
        x = (jnp.take(embedding, tokens, axis=0) * (cfg.d_model**0.5)).astype(dtype)
        if cfg.prompt_length:
            prompt = self.variable(
                "prompt", "embedding",
                lambda: jax.random.uniform(self.make_rng("params"), (cfg.prompt_length, cfg.d_model), jnp.float32,
                                           -0.01, 0.01))
            if p:
                x = jnp.concatenate([jnp.broadcast_to(prompt.value.astype(dtype)[None], (b, p, cfg.d_model)), x], 1)
        s = p + t
        slots = jnp.arange(s, dtype=jnp.int32)
        if cache is None:
            if segment_ids is None:
                segment_ids = jnp.ones((b, t), jnp.int32)
            if positions is None:
                positions = segment_positions(segment_ids)
            positions = positions.astype(jnp.int32)
            if p:
                positions = jnp.concatenate([jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p)), positions + p],
                                            axis=1)
                segment_ids = jnp.concatenate([jnp.full((b, p), -1, segment_ids.dtype), segment_ids], axis=1)
            causal = slots[None, :, None] >= slots[None, None, :]
            same = segment_ids[:, :, None] == segment_ids[:, None, :]
            is_prompt_key = (slots < p)[None, None, :]
            mask = causal & (same | is_prompt_key)
        else:
            index = cache["index"].astype(jnp.int32)
            positions = index[:, None] + slots[None, :]
            key_slots = jnp.arange(cache["k"].shape[2], dtype=jnp.int32)
            mask = key_slots[None, None, :] <= positions[:, :, None]

        block = nn.remat(Block) if cfg.remat else Block
        new_k, new_v = [], []
        for i in range(cfg.num_layers):
            layer_cache = None if cache is None else (cache["k"][i], cache["v"][i], cache["index"])
            x, layer_new = block(cfg, name=f"layer_{i}")(x, positions, mask, layer_cache)
            if layer_new is not None:
                new_k.append(layer_new[0])
                new_v.append(layer_new[1])
        hidden = RMSNorm(cfg.norm_eps, dtype, name="final_norm")(x)
        hidden = hidden[:, p:]
        logits = jnp.dot(hidden, embedding.astype(dtype).T, preferred_element_type=jnp.float32)
        out = (logits, hidden) if return_hidden else logits
        if cache is None:
            return out
        new_cache = {"k": jnp.stack(new_k), "v": jnp.stack(new_v), "index": cache["index"] + s}
        return (*out, new_cache) if return_hidden else (logits, new_cache)
