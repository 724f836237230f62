"""Batched autoregressive sampling with a KV cache: temperature, top-k, best-of-N, EOS.

The sampler is written against an abstract `DecodeModel` (`init_cache`, `prefill`,
`decode_step`), so tests can drive it with a fake model whose logits are known and the job
drives it with the Transformer's KV-cache decoding (`TransformerDecodeModel`).

One call samples a fixed-shape batch of prompts inside ONE jitted function (prefill, then
`lax.while_loop`s over decode steps that stop as soon as every row has finished), so the
function compiles once per (batch size, prompt-length bucket) and never per example.

Phases (`cache_block`, `decode_phases`): a row of a batch of prompts padded to width T holds at
most T + t + 1 tokens after decode step t, so the steps run as consecutive loops of
`cache_block` steps over a KV cache that grows between them (`DecodeModel.grow_cache`) to the
slots the next loop's rows can fill: a decode step reads a cache of about the length generated so
far, not of `max_len` (docs/generate.md: tokens/s at 512 tokens). Rows that have finished feed
padding past their cache's end; their logits are unused.

Sampling semantics:
  * `temperature`: logits are divided by it before sampling; `temperature == 0` is greedy
    (argmax), and the distribution tends to greedy as temperature -> 0.
  * `top_k`: only the k most likely tokens can be drawn (0 = the full distribution;
    `top_k == 1` is greedy).
  * `min_p` (p in [0, 1]): only tokens whose probability (after temperature) is at least p
    times the most likely token's can be drawn (0 = off); with top-k, both filters apply.

The configuration (`SamplerConfig`, the options a user chooses: `SamplingOptions`) and the
logit filters of the options (`filter_logits`) are in `dpsynth.generate.sampler_config`.
  * `num_decodes`: N candidates are drawn independently per prompt and the one with the
    highest total log-likelihood under the MODEL (untempered, un-truncated log-softmax,
    summed over the generated tokens including the closing EOS) is kept.
  * `max_len`: the total length (prompt + generated tokens) of a row; a row that reaches it
    stops without EOS.
  * Masking: ids in `banned_ids` (PAD, BOS) and ids >= `vocab_limit` get logit -inf before
    anything else, so the model is restricted to (and scored as a distribution over) the
    tokens the tokenizer can decode.
  * EOS: a row stops at its first EOS (the EOS is scored but not part of the returned
    tokens); positions after a row's end hold `pad_id`.
  * `guidance` (w, label-guided sampling, classifier-free guidance over the prompts): each row
    comes with C contrast prompts (e.g. the other labels' prompts, or a null prompt) that
    follow the same generated tokens in their own KV-cache streams (one batch of (1 + C) times
    the rows). At every step the token is drawn from

        g = lp(x | own) + w * (lp(x | own) - lp(x | contrast)),
        lp(x | contrast) = log mean_c exp(lp(x | contrast_c)),

    where lp are the (masked) log-softmax log-probabilities of each stream; temperature,
    top-k and min-p then apply to g. `w = 0` never builds the contrast streams (the unguided function,
    byte for byte). Scores stay the model's own log-likelihood under the row's prompt. A guided
    row's budget is `max_len` minus its longest stream prompt, so every stream fits the cache.
    Guidance is post-processing of the model: it costs no privacy.

Randomness: every prompt row comes with its own PRNG key (the job derives it as
`fold_in(shard_key, example_index)`); candidate j uses `fold_in(row_key, j)` and decode step t
uses `fold_in(candidate_key, t)`, from which `draw` takes one uniform number. A row's output
therefore does not depend on which other rows share its batch. (Until 2026-12-06 the draw was
`jax.random.categorical`'s Gumbel-max: the same distribution, other tokens for the same key.)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from dpsynth.generate.sampler_config import (NEG_INF, SamplerConfig, SamplingOptions, allowed_ids,  # noqa: F401
                                             filter_logits)


class DecodeModel(Protocol):
    """What the sampler needs from a model (all methods are traced inside `jax.jit`).

    `params` is whatever pytree the model needs (e.g. Flax variables); it is an argument of
    the compiled function, never a baked-in constant.
    """

    def init_cache(self, batch: int, max_len: int) -> Any:
        """An empty cache for `batch` rows of up to `max_len` tokens."""

    def prefill(self, params: Any, tokens: jax.Array, lengths: jax.Array, cache: Any) -> tuple[jax.Array, Any]:
        """Runs the prompts `tokens[B, T]` (row b valid up to `lengths[b]`); returns the
        logits `[B, V]` for the token after each prompt, and the filled cache."""

    def grow_cache(self, cache: Any, max_len: int) -> Any:
        """`cache` with room for `max_len` tokens per row, its contents kept."""

    def decode_step(self, params: Any, token: jax.Array, cache: Any) -> tuple[jax.Array, Any]:
        """Appends `token[B]` to each row; returns the next-token logits `[B, V]` and cache."""


class TransformerDecodeModel:
    """`DecodeModel` over `dpsynth.models` (a Flax `Transformer` and its KV-cache decoding)."""

    def __init__(self, model_config: Any):
        from dpsynth.models import decoding

        self._decoding = decoding
        self.config = model_config
        self.model = _make_transformer(model_config)

    def init_cache(self, batch, max_len):
        return self._decoding.init_cache(self.config, batch, max_len)

    def prefill(self, params, tokens, lengths, cache):
        return self._decoding.prefill(self.model, params, tokens, lengths, cache)

    def grow_cache(self, cache, max_len):
        return self._decoding.grow_cache(self.config, cache, max_len)

    def decode_step(self, params, token, cache):
        return self._decoding.decode_step(self.model, params, token, cache)

    def sequence_logits(self, params, tokens):
        """Logits `[B, T, V]` of a teacher-forced pass (scoring: `dpsynth.generate.label_scores`)."""
        return self.model.apply(params, tokens)

    # Hash/eq by config so two wrappers of the same model share compiled functions.
    def __hash__(self):
        return hash(("TransformerDecodeModel", repr(self.config)))

    def __eq__(self, other):
        return isinstance(other, TransformerDecodeModel) and repr(other.config) == repr(self.config)


def _make_transformer(model_config):
    from dpsynth.models import Transformer

    return Transformer(model_config)


@dataclasses.dataclass(frozen=True)
class SampleOutput:
    """Sampled continuations (NumPy, host side).

    Attributes:
      tokens: `[B, G]` generated ids per prompt (EOS excluded), `pad_id` after `lengths[b]`.
      lengths: `[B]` number of generated tokens (EOS excluded).
      scores: `[B]` total model log-likelihood of the kept candidate (including its EOS).
      finished: `[B]` True where the row ended with EOS (False: it hit `max_len`).
      all_tokens/all_lengths/all_scores/all_finished: `[B, N, ...]` every candidate.
    """

    tokens: np.ndarray
    lengths: np.ndarray
    scores: np.ndarray
    finished: np.ndarray
    all_tokens: np.ndarray
    all_lengths: np.ndarray
    all_scores: np.ndarray
    all_finished: np.ndarray


def draw(key: jax.Array, logits: jax.Array) -> jax.Array:
    """One token from `softmax(logits[V])`: inverse transform sampling with one uniform u in (0, 1]
    from `key`, the first token whose cumulative probability reaches u (times the total, so that
    rounding never runs past the end). The distribution of `jax.random.categorical`, whose
    Gumbel-max draws V random numbers: on CPU those cost most of a small model's decode step
    (`bench/generate.py --draw`). A token of probability 0 (logit `NEG_INF`) is never drawn.

    The cumulative sum in two levels: the probabilities in blocks of about sqrt(V) tokens
    (`draw_block`), the first block whose cumulative sum reaches the target, then the first token
    of that block whose cumulative sum (from the blocks before it) reaches it. The same token as one
    cumulative sum over the whole vocabulary up to float32 rounding of the partial sums (whose error
    stays near float32 rounding: tested against float64), without that sum's V-long scan (XLA:CPU
    lowers `cumsum` to a reduce-window: 16 ms for 16 rows at a 262,144-token vocabulary against
    1.7 ms for the softmax itself, docs/measured.md). Within the chosen block the first token that
    reaches the target has probability > 0: the blocks before it sum to less than the target."""
    p = jax.nn.softmax(logits.astype(jnp.float32))
    b = draw_block(p.shape[0])
    blocks = jnp.pad(p, (0, -p.shape[0] % b)).reshape(-1, b)
    ends = jnp.cumsum(jnp.sum(blocks, axis=1))  # each block's cumulative end
    target = (1.0 - jax.random.uniform(key, (), jnp.float32)) * ends[-1]
    i = jnp.argmax(ends >= target)
    block = blocks[i]
    reach = jnp.where(i > 0, ends[jnp.maximum(i - 1, 0)], 0.0) + jnp.cumsum(block) >= target
    # (rounding of the block's own sum can leave it short of a target its end reached: its last token)
    last = b - 1 - jnp.argmax(block[::-1] > 0)
    j = jnp.where(jnp.any(reach), jnp.argmax(reach), last)
    return (i * b + j).astype(jnp.int32)


def draw_block(vocab: int) -> int:
    """`draw`'s block: the power of two nearest above sqrt(vocab) (512 at 262,144 tokens)."""
    return 1 << max(0, math.ceil(math.log2(max(vocab, 1)) / 2))


def _select_token(logits: jax.Array, keys: jax.Array, cfg: SamplerConfig) -> jax.Array:
    """Draws one token per row from `logits[R, V]` with per-row typed keys `keys[R]`."""
    if cfg.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    scaled = filter_logits(logits / jnp.asarray(cfg.temperature, logits.dtype), cfg)
    return jax.vmap(draw)(keys, scaled)


def guided_log_probs(own: jax.Array, contrast: jax.Array, guidance: float) -> jax.Array:
    """`own + w (own - logmeanexp_c contrast[c])` for log-probs `own[R, V]`, `contrast[C, R, V]`."""
    if contrast.shape[0] == 1:  # one contrast (two labels, or the null prompt): the mean is that stream
        con = contrast[0]
    else:
        con = jax.nn.logsumexp(contrast, axis=0) - jnp.log(jnp.float32(contrast.shape[0]))
    return own + jnp.float32(guidance) * (own - con)


MAX_PHASES = 8  # compiled decode loops per sampler call at most (each compiles the model's step once)


def decode_phases(width: int, max_len: int, block: int) -> list[tuple[int, int]]:
    """The decode loop's phases for prompts padded to `width`: `(end, cache_len)` pairs, the steps
    t < end (after the previous phase's) over a cache of `cache_len` tokens per row, which holds
    every row still generating (at most `width + t + 1` tokens after step t); the last phase runs to
    `max_len`. `block` steps per phase (0: one phase), widened to at most `MAX_PHASES` phases."""
    steps = max_len - width  # a row of width tokens reaches max_len after this many steps
    if block <= 0 or steps <= block:
        return [(max_len, max_len)]
    block = max(block, -(-steps // MAX_PHASES))
    return [(end, width + end) for end in range(block, steps, block)] + [(max_len, max_len)]


def _sample_impl(decoder: DecodeModel, cfg: SamplerConfig, params, prompts, prompt_lengths, key_data,
                 contrast=None, contrast_lengths=None):
    """The jitted body. prompts `[B, P]`, prompt_lengths `[B]`, key_data `[B, ...]` raw keys;
    guided (`cfg.guided`): contrast `[B, C, P]`, contrast_lengths `[B, C]`."""
    batch, _ = prompts.shape
    n = cfg.num_decodes
    rows = batch * n
    gen_len = cfg.max_len  # static buffer width; each row's budget is max_len - prompt length
    row_keys = jax.random.wrap_key_data(key_data)
    cand_keys = jax.vmap(lambda k: jax.vmap(lambda j: jax.random.fold_in(k, j))(jnp.arange(n)))(row_keys)
    cand_keys = cand_keys.reshape((rows,))
    tokens = jnp.repeat(prompts, n, axis=0)
    lengths = jnp.repeat(prompt_lengths.astype(jnp.int32), n, axis=0)
    budget = cfg.max_len - lengths
    streams = 1
    if cfg.guided:  # stream-major layout: rows of the own prompts, then of each contrast prompt
        streams += contrast.shape[1]
        c_tokens = jnp.repeat(contrast, n, axis=0).transpose(1, 0, 2).reshape((-1, contrast.shape[2]))
        c_lengths = jnp.repeat(contrast_lengths.astype(jnp.int32), n, axis=0)
        budget = cfg.max_len - jnp.maximum(lengths, jnp.max(c_lengths, axis=1))
        tokens = jnp.concatenate([tokens, c_tokens], axis=0)
        lengths = jnp.concatenate([lengths, c_lengths.T.reshape((-1,))], axis=0)

    phases = decode_phases(prompts.shape[1], gen_len, cfg.cache_block)
    cache = decoder.init_cache(rows * streams, phases[0][1])
    logits, cache = decoder.prefill(params, tokens, lengths, cache)

    def cond(end):
        def go_on(state):
            t, _, _, _, done, *_ = state
            return jnp.logical_and(t < end, jnp.logical_not(jnp.all(done)))
        return go_on

    vocab = logits.shape[-1]
    allowed = jnp.asarray(allowed_ids(vocab, cfg.vocab_limit, cfg.banned_ids))

    def body(state):
        t, logits, cache, out, done, count, score, finished = state
        logits = jnp.where(allowed, logits.astype(jnp.float32), NEG_INF)
        step_keys = jax.vmap(lambda k: jax.random.fold_in(k, t))(cand_keys)
        if cfg.guided:
            logp_all = jax.nn.log_softmax(logits, axis=-1).reshape((streams, rows, vocab))
            own = logp_all[0]
            mixed = jnp.where(allowed, guided_log_probs(own, logp_all[1:], cfg.guidance), NEG_INF)
            nxt = _select_token(mixed, step_keys, cfg)
        else:
            nxt = _select_token(logits, step_keys, cfg)
            own = jax.nn.log_softmax(logits, axis=-1)
        logp = jnp.take_along_axis(own, nxt[:, None], axis=-1)[:, 0]
        active = jnp.logical_not(done)
        is_eos = nxt == cfg.eos_id
        keep = jnp.logical_and(active, jnp.logical_not(is_eos))
        out = out.at[:, t].set(jnp.where(keep, nxt, cfg.pad_id))
        score = score + jnp.where(active, logp, 0.0)
        count = count + keep.astype(jnp.int32)
        finished = jnp.logical_or(finished, jnp.logical_and(active, is_eos))
        done = jnp.logical_or(done, jnp.logical_or(is_eos, t + 1 >= budget))
        feed = jnp.where(done, cfg.pad_id, nxt)
        feed = jnp.tile(feed, streams) if streams > 1 else feed
        logits, cache = decoder.decode_step(params, feed, cache)
        return t + 1, logits, cache, out, done, count, score, finished

    state = (
        jnp.int32(0),
        logits,
        cache,
        jnp.full((rows, gen_len), cfg.pad_id, jnp.int32),
        budget <= 0,
        jnp.zeros((rows,), jnp.int32),
        jnp.zeros((rows,), jnp.float32),
        jnp.zeros((rows,), bool),
    )
    for i, (end, cache_len) in enumerate(phases):
        if i:
            state = (*state[:2], decoder.grow_cache(state[2], cache_len), *state[3:])
        state = jax.lax.while_loop(cond(end), body, state)
    _, _, _, out, _, count, score, finished = state
    out = out.reshape((batch, n, gen_len))
    count = count.reshape((batch, n))
    score = score.reshape((batch, n))
    finished = finished.reshape((batch, n))
    best = jnp.argmax(score, axis=1)
    take = lambda a: jnp.take_along_axis(a, best.reshape((batch,) + (1,) * (a.ndim - 1)), axis=1)[:, 0]
    return take(out), take(count), take(score), take(finished), out, count, score, finished


def key_data(key: jax.Array) -> np.ndarray:
    """Raw key bits of a (typed or raw uint32) PRNG key, as NumPy."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    return np.asarray(key)


def example_keys(shard_key_data: np.ndarray, indices: Sequence[int]) -> np.ndarray:
    """Per-example raw keys `fold_in(shard_key, i)` for example indices `i` of a shard."""
    shard_key = jax.random.wrap_key_data(jnp.asarray(shard_key_data, jnp.uint32))
    idx = jnp.asarray(np.asarray(indices, np.uint32))
    return np.asarray(jax.random.key_data(jax.vmap(lambda i: jax.random.fold_in(shard_key, i))(idx)))


def seed_to_key_data(seed: int) -> np.ndarray:
    """A threefry key from a 64-bit integer seed (all 64 bits are used)."""
    seed = int(seed) % (1 << 64)
    return np.asarray([seed >> 32, seed & 0xFFFFFFFF], dtype=np.uint32)


class Sampler:
    """Samples continuations of token prompts in fixed-shape, jit-compiled batches.

    Usage:
        sampler = Sampler(decoder, SamplerConfig(temperature=1.0, max_len=512))
        out = sampler.sample(params, prompts, keys)   # prompts: list of int arrays

    The compiled function is cached per (batch size, prompt bucket); `compile_count` reports
    how many distinct compilations exist.
    """

    def __init__(self, decoder: DecodeModel, config: SamplerConfig):
        self.decoder = decoder
        self.config = config
        self._fn = jax.jit(functools.partial(_sample_impl, decoder, config))

    @property
    def compile_count(self) -> int:
        return int(self._fn._cache_size())

    def bucket(self, length: int) -> int:
        b = self.config.prompt_bucket
        return max(b, -(-length // b) * b)

    def lower(self, params, prompt_width: int, num_contrasts: int = 1):
        """The compiled call `sample_batch` makes for `config.batch_size` prompts padded to
        `prompt_width`, lowered on `params` (arrays or ShapeDtypeStructs; the resource plan and
        `--batch-size auto`); guided, with `num_contrasts` contrast prompts per row."""
        b, width = self.config.batch_size, self.bucket(prompt_width)
        args = [params, jax.ShapeDtypeStruct((b, width), jnp.int32), jax.ShapeDtypeStruct((b,), jnp.int32),
                jax.ShapeDtypeStruct((b, 2), jnp.uint32)]
        if self.config.guided:
            c = int(num_contrasts)
            args += [jax.ShapeDtypeStruct((b, c, width), jnp.int32), jax.ShapeDtypeStruct((b, c), jnp.int32)]
        return self._fn.lower(*args)

    def sample_batch(self, params, prompts: np.ndarray, prompt_lengths: np.ndarray, keys: np.ndarray,
                     contrast: np.ndarray | None = None, contrast_lengths: np.ndarray | None = None):
        """One compiled call on an already padded batch; returns device arrays (see `_sample_impl`)."""
        args = [params, jnp.asarray(prompts, jnp.int32), jnp.asarray(prompt_lengths, jnp.int32),
                jnp.asarray(keys, jnp.uint32)]
        if self.config.guided:
            args += [jnp.asarray(contrast, jnp.int32), jnp.asarray(contrast_lengths, jnp.int32)]
        return self._fn(*args)

    def sample(self, params, prompts: Sequence[np.ndarray], keys: np.ndarray,
               contrasts: Sequence[Sequence[np.ndarray]] | None = None) -> SampleOutput:
        """Samples one continuation per prompt.

        Args:
          params: the model parameters (pytree passed to the decoder).
          prompts: token ids per prompt (each non-empty, shorter than `max_len`).
          keys: `[len(prompts), 2]` raw uint32 keys, one per prompt (see `example_keys`).
          contrasts: guided sampling only (`config.guidance > 0`): per prompt, its C contrast
            prompts (the same C for every prompt); ignored when unguided.

        Returns:
          `SampleOutput` with one row per prompt, in order.
        """
        cfg = self.config
        keys = np.asarray(keys, np.uint32)
        if len(prompts) != len(keys):
            raise ValueError(f"{len(prompts)} prompts but {len(keys)} keys")
        for i, p in enumerate(prompts):
            if len(p) == 0 or len(p) >= cfg.max_len:
                raise ValueError(f"prompt {i} has {len(p)} tokens; need 1 <= length < max_len={cfg.max_len}")
        if cfg.guided:
            if contrasts is None or len(contrasts) != len(prompts):
                raise ValueError(f"guided sampling (guidance {cfg.guidance}) needs contrast prompts for each of the "
                                 f"{len(prompts)} prompts")
            num_c = {len(c) for c in contrasts}
            if len(num_c) > 1 or 0 in num_c:
                raise ValueError(f"every prompt needs the same number (>= 1) of contrast prompts, got {sorted(num_c)}")
            for i, cs in enumerate(contrasts):
                for c in cs:
                    if len(c) == 0 or len(c) >= cfg.max_len:
                        raise ValueError(f"a contrast prompt of prompt {i} has {len(c)} tokens; need 1 <= length < "
                                         f"max_len={cfg.max_len}")
        width = [max([len(p)] + ([len(c) for c in contrasts[i]] if cfg.guided else [])) for i, p in enumerate(prompts)]
        # Group by bucket so each compiled shape is reused; keep the original order at the end.
        order = sorted(range(len(prompts)), key=lambda i: (self.bucket(width[i]), i))
        results: dict[int, tuple] = {}
        bs = cfg.batch_size
        pos = 0
        while pos < len(order):
            bucket = self.bucket(width[order[pos]])
            chunk = []
            while pos < len(order) and len(chunk) < bs and self.bucket(width[order[pos]]) == bucket:
                chunk.append(order[pos])
                pos += 1
            toks = np.full((bs, bucket), cfg.pad_id, np.int32)
            lens = np.ones((bs,), np.int32)
            kd = np.zeros((bs,) + keys.shape[1:], np.uint32)
            ctoks = clens = None
            if cfg.guided:
                num = len(contrasts[chunk[0]])
                ctoks = np.full((bs, num, bucket), cfg.pad_id, np.int32)
                clens = np.ones((bs, num), np.int32)
            for r, i in enumerate(chunk):
                toks[r, : len(prompts[i])] = prompts[i]
                lens[r] = len(prompts[i])
                kd[r] = keys[i]
                if cfg.guided:
                    for c, cp in enumerate(contrasts[i]):
                        ctoks[r, c, : len(cp)] = cp
                        clens[r, c] = len(cp)
            for r in range(len(chunk), bs):  # filler rows: a copy of the first row, discarded
                toks[r], lens[r], kd[r] = toks[0], lens[0], kd[0]
                if cfg.guided:
                    ctoks[r], clens[r] = ctoks[0], clens[0]
            outs = jax.device_get(self.sample_batch(params, toks, lens, kd, ctoks, clens))
            for r, i in enumerate(chunk):
                results[i] = tuple(o[r] for o in outs)
        stacked = [np.stack([results[i][k] for i in range(len(prompts))]) for k in range(8)] if prompts else None
        if stacked is None:
            g, n = cfg.max_len, cfg.num_decodes
            e = lambda shape, dt: np.zeros(shape, dt)
            return SampleOutput(e((0, g), np.int32), e((0,), np.int32), e((0,), np.float32), e((0,), bool),
                                e((0, n, g), np.int32), e((0, n), np.int32), e((0, n), np.float32), e((0, n), bool))
        return SampleOutput(*stacked)
