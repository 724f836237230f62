"""Label margins of generated samples: does the DP model itself find a sample on-label?

For a sample x generated under label y, with the model's label prompts prompt(l):

    margin(x, y) = log p(x | prompt(y)) - max_{l != y} log p(x | prompt(l))

summed over x's tokens (its EOS included when the sampler emitted one). A positive margin
means the model would have been more likely to write x for its own label than for any other.
The `off_label` post-processing filter (`dpsynth.generate.postprocess`) keeps samples whose
margin exceeds a threshold: a label-consistency selection that amplifies weak label
conditioning. It reads only the DP model and its own samples, so it is post-processing of a
DP release and costs no privacy.

The scores come from one teacher-forced forward pass per (sample, label), in fixed-shape
batches (`batch_size` rows, lengths rounded up to a multiple of `bucket`), jitted once per
shape.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpsynth.generate.sampler_config import allowed_ids


@functools.lru_cache(maxsize=8)
def _score_fn(decoder: Any, vocab_limit: int | None, banned_ids: tuple[int, ...]):
    """Jitted (params, tokens [B, T], start [B], end [B]) -> sum of log p(tokens[t]) for t in [start, end)."""

    def fn(params, tokens, start, end):
        logits = decoder.sequence_logits(params, tokens).astype(jnp.float32)  # [B, T, V]
        allowed = jnp.asarray(allowed_ids(logits.shape[-1], vocab_limit, banned_ids))
        logits = jnp.where(allowed, logits, -1e30)  # the sampler's own restriction, so scores match its
        logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)  # position t-1 predicts token t
        tok_logp = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]  # [B, T-1]
        t = jnp.arange(1, tokens.shape[1])[None, :]
        mask = (t >= start[:, None]) & (t < end[:, None])
        return jnp.sum(jnp.where(mask, tok_logp, 0.0), axis=1)

    return jax.jit(fn)


def label_log_likelihoods(decoder: Any, params: Any, prompts: Mapping[str, np.ndarray],
                          samples: Sequence[np.ndarray], *, batch_size: int = 32, pad_id: int = 0,
                          vocab_limit: int | None = None, banned_ids: Sequence[int] = (),
                          bucket: int = 16) -> np.ndarray:
    """log p(sample | prompt(label)) for every sample and label.

    Args:
      decoder: a decoder with `sequence_logits(params, tokens[B, T]) -> logits [B, T, V]`
        (`dpsynth.generate.sampler.TransformerDecodeModel`).
      params: its parameters.
      prompts: label -> prompt token ids (`dpsynth.train.prompts.prompt_ids`), in column order.
      samples: token ids of each sample (the EOS appended where the sample finished).
      batch_size: rows per compiled call.
      pad_id: the padding id (right padding; causal attention never sees it).
      vocab_limit, banned_ids: score as a distribution over ids < vocab_limit, less the banned
        ones (the sampler's restriction: the scores then equal its sample scores).
      bucket: padded lengths are multiples of this (fewer compiled shapes).

    Returns:
      float64 `[len(samples), len(prompts)]`.
    """
    if not hasattr(decoder, "sequence_logits"):
        raise TypeError(f"{type(decoder).__name__} cannot score sequences (no `sequence_logits`): the "
                        "off_label filter needs a dpsynth Transformer model")
    fn = _score_fn(decoder, vocab_limit, tuple(sorted(int(i) for i in banned_ids)))
    labels = list(prompts)
    out = np.zeros((len(samples), len(labels)), np.float64)
    rows = [(i, j) for i in range(len(samples)) for j in range(len(labels))]
    for lo in range(0, len(rows), batch_size):
        chunk = rows[lo:lo + batch_size]
        lens = [len(prompts[labels[j]]) + len(samples[i]) for i, j in chunk]
        width = -(-max(lens) // bucket) * bucket
        toks = np.full((batch_size, width), pad_id, np.int32)
        start = np.zeros((batch_size,), np.int32)
        end = np.zeros((batch_size,), np.int32)
        for r, (i, j) in enumerate(chunk):
            p = np.asarray(prompts[labels[j]], np.int32)
            s = np.asarray(samples[i], np.int32)
            toks[r, :len(p)] = p
            toks[r, len(p):len(p) + len(s)] = s
            start[r], end[r] = len(p), len(p) + len(s)
        scores = np.asarray(jax.device_get(fn(params, toks, start, end)), np.float64)
        for r, (i, j) in enumerate(chunk):
            out[i, j] = scores[r]
    return out


def record_log_likelihoods(decoder: Any, params: Any, tokenizer: Any, template: str, labels: Sequence[str],
                           records: Sequence[Mapping[str, Any]], max_tokens: int, *,
                           batch_size: int = 64) -> tuple[np.ndarray, list[int]]:
    """`label_log_likelihoods` of labelled text records ({"text", "label"}, each label in `labels`)
    under the label prompts of `template`, every text cut to the tokens an example of `max_tokens`
    leaves after the longest prompt; and each record's own label column. What a generative
    classifier of the model reads (argmax per row) and `label_margins` take."""
    from dpsynth.train import prompts

    labels = list(labels)
    ids = {l: prompts.prompt_ids(tokenizer, template, l) for l in labels}
    room = max_tokens - max(len(p) for p in ids.values())
    samples = [np.asarray(tokenizer.encode(r["text"]), np.int32)[:room] for r in records]
    loglik = label_log_likelihoods(decoder, params, ids, samples, batch_size=batch_size)
    return loglik, [labels.index(r["label"]) for r in records]


def label_margins(loglik: np.ndarray, own: Sequence[int]) -> np.ndarray:
    """margin = loglik[i, own[i]] - max over the other columns (+inf with a single label)."""
    loglik = np.asarray(loglik, np.float64)
    own = np.asarray(own, np.int64)
    rows = np.arange(len(own))
    mine = loglik[rows, own]
    if loglik.shape[1] < 2:
        return np.full(len(own), np.inf)
    others = loglik.copy()
    others[rows, own] = -np.inf
    return mine - others.max(axis=1)
