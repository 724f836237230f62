"""A fake decoder whose next-token logits are known: `table[last_token] + pos_bias[position]`.

Shared by the generate tests (sampler, job). The logits depend only on the previous token and
the absolute position, so reference decodings are easy to compute by brute force in NumPy.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from dpsynth.tokens import EOS_ID


def make_tables(vocab: int = 12, max_len: int = 64, seed: int = 0, eos_logit: float = -1.0):
    """Random bigram logits `[V, V]` and positional biases `[max_len + 1, V]` (distinct values)."""
    rng = np.random.default_rng(seed)
    table = rng.normal(0.0, 2.0, size=(vocab, vocab)).astype(np.float32)
    table[:, 0:3] = -8.0  # pad/unk/bos practically never drawn
    table[:, EOS_ID] = eos_logit
    pos_bias = np.zeros((max_len + 1, vocab), np.float32)
    pos_bias[:, EOS_ID] = np.linspace(0.0, 3.0, max_len + 1)  # EOS grows likelier with position
    return table, pos_bias


class BigramDecoder:
    """Implements `dpsynth.generate.sampler.DecodeModel`; params = {"table", "pos_bias"}."""

    def init_cache(self, batch, max_len):
        return {"last": jnp.zeros((batch,), jnp.int32), "pos": jnp.zeros((batch,), jnp.int32)}

    @staticmethod
    def _logits(params, last, pos):
        pos = jnp.minimum(pos, params["pos_bias"].shape[0] - 1)
        return params["table"][last] + params["pos_bias"][pos]

    def prefill(self, params, tokens, lengths, cache):
        last = jnp.take_along_axis(tokens, (lengths - 1)[:, None], axis=1)[:, 0]
        cache = {"last": last, "pos": lengths}
        return self._logits(params, last, lengths), cache

    def decode_step(self, params, token, cache):
        cache = {"last": token, "pos": cache["pos"] + 1}
        return self._logits(params, token, cache["pos"]), cache

    def __hash__(self):
        return hash("BigramDecoder")

    def __eq__(self, other):
        return isinstance(other, BigramDecoder)


def logits_np(table, pos_bias, last, pos):
    return table[last] + pos_bias[min(pos, pos_bias.shape[0] - 1)]


def log_softmax_np(x):
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def greedy_reference(table, pos_bias, prompt, max_len, eos_id=EOS_ID):
    """Brute-force greedy decoding: (tokens without EOS, finished, total log-likelihood)."""
    last, pos = int(prompt[-1]), len(prompt)
    out, score = [], 0.0
    while pos < max_len:
        lg = logits_np(table, pos_bias, last, pos)
        t = int(np.argmax(lg))
        score += log_softmax_np(lg)[t]
        if t == eos_id:
            return out, True, score
        out.append(t)
        last, pos = t, pos + 1
    return out, False, score


def score_reference(table, pos_bias, prompt, generated, finished, eos_id=EOS_ID):
    """Total log-likelihood of `generated` (+ EOS when `finished`) after `prompt`."""
    last, pos = int(prompt[-1]), len(prompt)
    score = 0.0
    for t in list(generated) + ([eos_id] if finished else []):
        score += log_softmax_np(logits_np(table, pos_bias, last, pos))[t]
        last, pos = t, pos + 1
    return score
