"""Decoder-only Transformer (Flax linen) with LoRA adapters, soft prompts and packed sequences.

Architecture (native presets): token embedding (tied with the output layer) -> `num_layers`
pre-norm blocks (RMSNorm -> multi-head causal self-attention with rotary positions -> residual;
RMSNorm -> gated MLP (gated GELU or SwiGLU) -> residual) -> RMSNorm -> logits. No biases.
The `ModelConfig` options for imported families (Llama, Mistral, Qwen2, Gemma 1/2/3, GPT-2)
switch on grouped-query attention, biases, LayerNorm, `(1 + w)` norms, q/k and post norms,
learned positions, an untied `lm_head` [d_model, vocab], scaled rope, sliding-window layers
and soft-capping; with the defaults the computation is the native one, op for op.

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

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from dpsynth.dp import ghost
from dpsynth.models.config import ModelConfig

_NEG_INF = -1e30


def _dtype(config: ModelConfig):
    return jnp.bfloat16 if config.dtype == "bfloat16" else jnp.float32


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a learned scale (computed in float32).

    With `kind="layernorm"` it is a mean-centred LayerNorm with a learned bias (GPT-2); with
    `offset` the scale applied is `scale + offset` (Gemma's `1 + w`, initialized at zero).
    """

    eps: float = 1e-6
    dtype: Any = jnp.float32
    kind: str = "rms"
    offset: float = 0.0

    @nn.compact
    def __call__(self, x):
        init = nn.initializers.zeros if self.offset else nn.initializers.ones
        scale = self.param("scale", init, (x.shape[-1],), jnp.float32)
        x32 = x.astype(jnp.float32)
        if self.kind == "layernorm":
            x32 = x32 - jnp.mean(x32, axis=-1, keepdims=True)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        if self.offset:
            scale = scale.astype(jnp.float32) + self.offset
        y = ghost.scale(self, "scale", y, scale.astype(jnp.float32))
        if self.kind == "layernorm":
            y = ghost.bias(self, "bias", y, self.param("bias", nn.initializers.zeros, (x.shape[-1],), jnp.float32))
        return y.astype(self.dtype)


def _norm(cfg: ModelConfig, name: str) -> RMSNorm:
    return RMSNorm(cfg.norm_eps, _dtype(cfg), cfg.norm, cfg.norm_scale_offset, name=name)


class Projection(nn.Module):
    """`x @ kernel (+ bias)`, plus `scale * (x @ a) @ b` when `lora_rank > 0`.

    Every product and bias goes through a `dpsynth.dp.ghost` tap ("kernel", "bias"; the adapter's "a" and
    "b" of the "lora" collection), which is the plain op outside a ghost-clipping session."""

    features: int
    lora_rank: int = 0
    lora_scale: float = 0.0
    dtype: Any = jnp.float32
    use_bias: bool = False

    @nn.compact
    def __call__(self, x):
        d_in = x.shape[-1]
        init = nn.initializers.normal(stddev=d_in**-0.5)
        kernel = self.param("kernel", init, (d_in, self.features), jnp.float32)
        y = ghost.dense(self, "kernel", x, kernel.astype(self.dtype))
        if self.use_bias:
            y = ghost.bias(self, "bias", y,
                           self.param("bias", nn.initializers.zeros, (self.features,), jnp.float32).astype(self.dtype))
        if self.lora_rank:
            a = self.variable("lora", "a", lambda: init(self.make_rng("params"), (d_in, self.lora_rank), jnp.float32))
            b = self.variable("lora", "b", lambda: jnp.zeros((self.lora_rank, self.features), jnp.float32))
            # two ghost taps ("a", "b" of the "lora" collection): plain dots outside a clipping session
            h = ghost.dense(self, "a", x, a.value.astype(self.dtype))
            lora = ghost.dense(self, "b", h, b.value.astype(self.dtype))
            y = y + (self.lora_scale * lora).astype(y.dtype)
        return y


def rope_frequencies(config: ModelConfig, local: bool = False):
    """Rotary inverse frequencies [head_dim // 2] (with the config's scaling; `local`: sliding layers)."""
    half = config.head_dim // 2
    if local and config.rope_local_base is not None:
        return config.rope_local_base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    if config.rope_scaling == "none":
        return config.rope_base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    inv = 1.0 / (config.rope_base ** (np.arange(0, config.head_dim, 2, dtype=np.float32) / config.head_dim))
    if config.rope_scaling == "linear":
        return jnp.asarray(inv / config.rope_factor, jnp.float32)
    # "llama3": long wavelengths divided by the factor, short ones kept, a smooth band between.
    old = config.rope_original_max_len
    low_wavelen, high_wavelen = old / config.rope_low_freq_factor, old / config.rope_high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / config.rope_factor, inv)
    smooth = (old / wavelen - config.rope_low_freq_factor) / (config.rope_high_freq_factor - config.rope_low_freq_factor)
    smoothed = (1 - smooth) * scaled / config.rope_factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return jnp.asarray(np.where(medium, smoothed, scaled), jnp.float32)


def rotary(x, positions, base: float | None = None, *, freqs=None):
    """Applies rotary position embeddings to `x[B, S, H, D]` at integer `positions[B, S]`.

    Pairs dimension i with i + D/2 ("rotate half", the Hugging Face layout); the inverse
    frequencies are `base ** (-i / (D/2))` unless `freqs` [D/2] are given.
    """
    half = x.shape[-1] // 2
    if freqs is None:
        freqs = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions.astype(jnp.float32)[..., None] * freqs  # [B, S, half]
    sin, cos = jnp.sin(angles)[:, :, None, :], jnp.cos(angles)[:, :, None, :]
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., :half], x32[..., half:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def _softcap(x, cap):
    return x if cap is None else cap * jnp.tanh(x / cap)


def output_layer(config: ModelConfig, hidden, weight, dot=None):
    """The output layer: float32 logits of `hidden` [..., d_model] against `weight`, the tied
    `embedding` [vocab, d_model] (`config.tie_embeddings`) or the `lm_head` [d_model, vocab], with
    the final softcap. `dot(x, w, transpose)`: the product (default `jnp.dot`; the model passes its
    ghost-tapped one). A caller holding the frozen weight applies it to the hidden states it needs
    (`Transformer(..., head=False)`; `dpsynth.train.lm`'s target-only head)."""
    w = weight.astype(_dtype(config))
    if dot is None:
        logits = jnp.dot(hidden, w.T if config.tie_embeddings else w, preferred_element_type=jnp.float32)
    else:
        logits = dot(hidden, w, config.tie_embeddings)
    return _softcap(logits, config.final_softcap)


class Attention(nn.Module):
    """Causal self-attention (grouped-query when `num_kv_heads < num_heads`); with `cache`,
    writes K/V at per-row slots first."""

    config: ModelConfig
    local: bool = False

    @nn.compact
    def __call__(self, x, positions, mask, cache=None):
        cfg, dtype = self.config, _dtype(self.config)
        b, s, _ = x.shape
        h, kvh, hd = cfg.num_heads, cfg.kv_heads, cfg.head_dim
        lora = dict(lora_rank=cfg.lora_rank if cfg.lora_applies("attention") else 0,
                    lora_scale=cfg.lora_scale, dtype=dtype)
        q = Projection(h * hd, name="q", use_bias=cfg.qkv_bias, **lora)(x).reshape(b, s, h, hd)
        k = Projection(kvh * hd, name="k", use_bias=cfg.qkv_bias, **lora)(x).reshape(b, s, kvh, hd)
        v = Projection(kvh * hd, name="v", use_bias=cfg.qkv_bias, **lora)(x).reshape(b, s, kvh, hd)
        if cfg.qk_norm:
            q, k = _norm(cfg, "q_norm")(q), _norm(cfg, "k_norm")(k)
        if cfg.positions == "rope":
            if cfg.rope_scaling == "none" and not (self.local and cfg.rope_local_base is not None):
                q, k = rotary(q, positions, cfg.rope_base), rotary(k, positions, cfg.rope_base)
            else:
                freqs = rope_frequencies(cfg, self.local)
                q, k = rotary(q, positions, freqs=freqs), rotary(k, positions, freqs=freqs)
        kv = "bkhd"  # the layout of k and v: [B, S, kv_heads, head_dim], or the cache's [B, kv_heads, S, head_dim]
        new_cache = None
        if cache is not None:
            k_cache, v_cache, index = cache
            write = jax.vmap(lambda c, u, i: jax.lax.dynamic_update_slice(c, u, (0, i, 0)))
            k = write(k_cache, k.swapaxes(1, 2).astype(k_cache.dtype), index)
            v = write(v_cache, v.swapaxes(1, 2).astype(v_cache.dtype), index)
            new_cache, kv = (k, v), "bhkd"
        scale = hd**-0.5 if cfg.query_pre_attn_scalar is None else cfg.query_pre_attn_scalar**-0.5
        if kvh == h:
            scores = jnp.einsum(f"bqhd,{kv}->bhqk", q, k.astype(dtype), preferred_element_type=jnp.float32)
            scores = _softcap(scores * scale, cfg.attn_softcap)
            scores = jnp.where(mask[:, None, :, :], scores, _NEG_INF)
            probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
            out = jnp.einsum(f"bhqk,{kv}->bqhd", probs, v.astype(dtype)).reshape(b, s, h * hd)
        else:  # query head j uses key/value head j // (h // kvh), as Hugging Face's repeat_kv
            qg = q.reshape(b, s, kvh, h // kvh, hd)
            kv = kv.replace("h", "c")
            scores = jnp.einsum(f"bqcgd,{kv}->bcgqk", qg, k.astype(dtype), preferred_element_type=jnp.float32)
            scores = _softcap(scores * scale, cfg.attn_softcap)
            scores = jnp.where(mask[:, None, None, :, :], scores, _NEG_INF)
            probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
            out = jnp.einsum(f"bcgqk,{kv}->bqcgd", probs, v.astype(dtype)).reshape(b, s, h * hd)
        return Projection(cfg.d_model, name="o", use_bias=cfg.o_bias, **lora)(out), new_cache


class MLP(nn.Module):
    """Gated MLP: down(act(gate(x)) * up(x)), act = GELU (gated_gelu) or SiLU (swiglu);
    or plain down(GELU(up(x))) (mlp="gelu", GPT-2). GELU is the tanh approximation."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        lora = dict(lora_rank=cfg.lora_rank if cfg.lora_applies("mlp") else 0,
                    lora_scale=cfg.lora_scale, dtype=_dtype(cfg), use_bias=cfg.mlp_bias)
        if cfg.mlp == "gelu":
            return Projection(cfg.d_model, name="down", **lora)(jax.nn.gelu(Projection(cfg.d_ff, name="up", **lora)(x)))
        gate = Projection(cfg.d_ff, name="gate", **lora)(x)
        up = Projection(cfg.d_ff, name="up", **lora)(x)
        act = jax.nn.gelu(gate) if cfg.mlp == "gated_gelu" else jax.nn.silu(gate)
        return Projection(cfg.d_model, name="down", **lora)(act * up)


class Block(nn.Module):
    """One pre-norm decoder block (with `post_norms`, also normed sublayer outputs)."""

    config: ModelConfig
    local: bool = False

    @nn.compact
    def __call__(self, x, positions, mask, cache=None):
        cfg = self.config
        y, new_cache = Attention(cfg, self.local, name="attention")(_norm(cfg, "attention_norm")(x), positions, mask,
                                                                    cache)
        if cfg.post_norms:
            y = _norm(cfg, "attention_post_norm")(y)
        x = x + y
        y = MLP(cfg, name="mlp")(_norm(cfg, "mlp_norm")(x))
        if cfg.post_norms:
            y = _norm(cfg, "mlp_post_norm")(y)
        return x + y, new_cache


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
                 return_hidden: bool = False, embedded=None, head: bool = True):
        """Logits for every token position.

        Args:
          tokens: int32 [B, T].
          segment_ids: int32 [B, T]; tokens attend only within their segment (0 = padding).
            Ignored with `cache`.
          positions: int32 [B, T] rotary positions of the tokens (before the soft-prompt
            offset); default: restart per segment.
          cache: decoding only (see `dpsynth.models.decoding`): dict with "k", "v" (tuples of
            num_layers arrays [B, kv_heads, S, head_dim]) and "index" [B] (filled slots). The new
            tokens are written at slots index[b] + t and attend to every earlier slot.
          with_prompt: prepend the soft prompt (if any); decode steps after the prefill pass
            False because the prompt is already in the cache.
          return_hidden: also return the final normalized hidden states [B, T, d_model].
          embedded: float [B, T, d_model] rows of the embedding table for `tokens`, used instead
            of the lookup (the DP sparse-embedding path, `dpsynth.dp.sparse`; untied tables only).
          head: False: skip the output layer and return the final normalized hidden states
            [B, T, d_model] alone (prompt positions stripped; no `cache`), for a caller that applies
            `output_layer` to the positions it needs.

        Returns:
          float32 logits [B, T, vocab] (prompt positions stripped); with `cache`, the tuple
          `(logits, new_cache)`; with `return_hidden`, `(logits, hidden)` (or a triple).
        """
        cfg, dtype = self.config, _dtype(self.config)
        b, t = tokens.shape
        p = cfg.prompt_length if with_prompt else 0
        embedding = self.param("embedding", nn.initializers.normal(stddev=cfg.d_model**-0.5),
                               (cfg.vocab_size, cfg.d_model), jnp.float32)
        x = ghost.lookup(self, "embedding", embedding, tokens) if embedded is None else embedded
        if cfg.scale_embedding:
            x = x * (cfg.d_model**0.5)
        x = x.astype(dtype)
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
            key_slots = jnp.arange(cache["k"][0].shape[2], dtype=jnp.int32)
            mask = key_slots[None, None, :] <= positions[:, :, None]
        if cfg.positions == "learned":
            table = self.param("position_embedding", nn.initializers.normal(stddev=0.02), (cfg.max_len, cfg.d_model),
                               jnp.float32)
            ids = jnp.clip(positions, 0, cfg.max_len - 1)
            x = x + ghost.lookup(self, "position_embedding", table, ids).astype(dtype)
        sliding_mask = None
        if "sliding" in cfg.layer_kinds:
            w = cfg.sliding_window
            if cache is None:
                sliding_mask = mask & (slots[None, :, None] - slots[None, None, :] < w)
            else:
                sliding_mask = mask & (positions[:, :, None] - key_slots[None, None, :] < w)

        block = nn.remat(Block) if cfg.remat else Block
        new_k, new_v = [], []
        for i in range(cfg.num_layers):
            layer_cache = None if cache is None else (cache["k"][i], cache["v"][i], cache["index"])
            local = cfg.layer_kind(i) == "sliding"
            x, layer_new = block(cfg, local, name=f"layer_{i}")(x, positions, sliding_mask if local else mask,
                                                                layer_cache)
            if layer_new is not None:
                new_k.append(layer_new[0])
                new_v.append(layer_new[1])
        hidden = _norm(cfg, "final_norm")(x)
        hidden = hidden[:, p:]
        if cfg.tie_embeddings:
            name, weight = "embedding", embedding
        else:
            name, weight = "lm_head", self.param("lm_head", nn.initializers.normal(stddev=cfg.d_model**-0.5),
                                                 (cfg.d_model, cfg.vocab_size), jnp.float32)
        if not head:
            if cache is not None:
                raise ValueError("head=False is for training losses, not decoding with a cache")
            return hidden
        logits = output_layer(cfg, hidden, weight, lambda x, w, transpose: ghost.dense(
            self, name, x, w, transpose=transpose, preferred_element_type=jnp.float32))
        out = (logits, hidden) if return_hidden else logits
        if cache is None:
            return out
        new_cache = {"k": tuple(new_k), "v": tuple(new_v), "index": cache["index"] + s}
        return (*out, new_cache) if return_hidden else (logits, new_cache)
