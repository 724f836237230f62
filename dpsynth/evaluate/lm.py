"""The generator as an evaluator: perplexity of real text (Prefix-LM) and mean-pooled features.

Perplexity of the real test set under the generator: each real example is encoded exactly as
the DP tuner encodes training rows (`dpsynth.train.prompts.encode_examples`: BOS + label prompt
as prefix, then the text and EOS as target), and the perplexity is
`exp(sum of target-token NLL / number of target tokens)` over the whole set (token-weighted;
the label prompt is conditioning, never scored).

Features for MAUVE: mean over the non-padding positions of the final normalised hidden states
(`Transformer(..., return_hidden=True)`) of BOS + text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

LENGTH_BUCKET = 32  # rows are padded to a multiple of this: few compiled shapes


def _round_up(n: int, m: int) -> int:
    return max(m, -(-n // m) * m)


class LanguageModel:
    """A dpsynth LM (config, variables incl. adapters, tokenizer) with jitted scoring functions."""

    def __init__(self, config, variables, tokenizer, template: str | None = None):
        from dpsynth.train.prompts import DEFAULT_TEMPLATE
        from dpsynth.models import Transformer

        self.config, self.variables, self.tokenizer = config, variables, tokenizer
        self.template = template or DEFAULT_TEMPLATE
        model = Transformer(config)

        def forward(variables, tokens):
            seg = (tokens != 0).astype(jnp.int32)
            return model.apply(variables, tokens, segment_ids=seg, return_hidden=True)

        def nll(variables, inputs, targets, weights):
            logits, _ = forward(variables, inputs)
            logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
            tok = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
            return jnp.sum(tok * weights, axis=1), jnp.sum(weights, axis=1)

        def pooled(variables, tokens):
            _, hidden = forward(variables, tokens)
            w = (tokens != 0)[..., None].astype(jnp.float32)
            return (hidden.astype(jnp.float32) * w).sum(1) / jnp.maximum(w.sum(1), 1.0)

        self._nll, self._pooled = jax.jit(nll), jax.jit(pooled)

    @classmethod
    def load(cls, model_dir: str) -> "LanguageModel":
        """Loads a checkpoint directory (base + adapters) and the label-prompt template its manifest records."""
        from dpsynth.models.directory import load_model  # Orbax (~0.5 s to import): only when a model is loaded
        from dpsynth.train.prompts import template_of

        loaded = load_model(model_dir)
        return cls(loaded.config, loaded.variables, loaded.tokenizer, template_of(loaded.manifest))

    def perplexity(self, records: Sequence[Mapping], labels: Sequence[str], *, batch_size: int = 16,
                   max_tokens: int = 512) -> dict[str, float]:
        """Token-level perplexity of `records` ({"text", "label"}) with the label prompt as prefix."""
        from dpsynth.train.prompts import ExampleConfig, encode_examples

        max_tokens = min(max_tokens, self.config.max_len + 1)
        enc = encode_examples(list(records), self.tokenizer, labels, ExampleConfig(template=self.template, max_tokens=max_tokens),
                              where="real test set")
        length = min(_round_up(enc.inputs.shape[1], LENGTH_BUCKET), max_tokens - 1)
        arrays = {k: _pad_cols(v, length) for k, v in enc.arrays().items()}
        total, count = 0.0, 0.0
        for lo in range(0, len(enc), batch_size):
            rows = {k: _pad_rows(v[lo : lo + batch_size], batch_size) for k, v in arrays.items()}
            s, c = self._nll(self.variables, rows["inputs"], rows["targets"], rows["weights"])
            total += float(np.sum(s))
            count += float(np.sum(c))
        nll = total / max(count, 1.0)
        return {"perplexity": float(math.exp(nll)), "nll_per_token": float(nll), "target_tokens": int(count),
                "examples": len(enc), "truncated": int(enc.truncated)}

    def mean_log_likelihoods(self, rows: Sequence[np.ndarray], *, batch_size: int = 16) -> np.ndarray:
        """float64 [n]: each token row's mean log-likelihood per token under the model, the row as a
        document (BOS, then the row's tokens, each scored given those before it; no label prompt, no
        EOS). Rows must be non-empty and at most `config.max_len` tokens (callers truncate)."""
        from dpsynth.data.tokenizers import BOS_ID

        bos = getattr(self.tokenizer, "bos_id", BOS_ID)
        for i, r in enumerate(rows):
            if not 1 <= len(r) <= self.config.max_len:
                raise ValueError(f"row {i} has {len(r)} tokens; need 1 <= length <= max_len={self.config.max_len}")
        length = min(_round_up(max((len(r) for r in rows), default=1), LENGTH_BUCKET), self.config.max_len)
        inputs, targets = np.zeros((len(rows), length), np.int32), np.zeros((len(rows), length), np.int32)
        weights = np.zeros((len(rows), length), np.float32)
        for i, r in enumerate(rows):
            inputs[i, 0], inputs[i, 1 : len(r)], targets[i, : len(r)], weights[i, : len(r)] = bos, r[:-1], r, 1.0
        out = []
        for lo in range(0, len(rows), batch_size):
            batch = [_pad_rows(a[lo : lo + batch_size], batch_size) for a in (inputs, targets, weights)]
            s, c = self._nll(self.variables, *batch)
            n = min(batch_size, len(rows) - lo)
            out.append(-np.asarray(s, np.float64)[:n] / np.maximum(np.asarray(c, np.float64)[:n], 1.0))
        return np.concatenate(out) if out else np.zeros((0,), np.float64)

    def embed(self, texts: Sequence[str], *, batch_size: int = 32, max_len: int = 256) -> np.ndarray:
        """float32 [n, d_model]: mean-pooled final hidden states of BOS + text (truncated)."""
        from dpsynth.data.tokenizers import BOS_ID, PAD_ID

        max_len = min(max_len, self.config.max_len)
        bos, pad = getattr(self.tokenizer, "bos_id", BOS_ID), getattr(self.tokenizer, "pad_id", PAD_ID)
        rows = [np.concatenate([[bos], np.asarray(self.tokenizer.encode(t), np.int32)])[:max_len] for t in texts]
        length = min(_round_up(max((len(r) for r in rows), default=1), LENGTH_BUCKET), max_len)
        tokens = np.full((len(rows), length), pad, np.int32)
        for i, r in enumerate(rows):
            tokens[i, : len(r)] = r
        out = []
        for lo in range(0, len(rows), batch_size):
            batch = _pad_rows(tokens[lo : lo + batch_size], batch_size)
            out.append(np.asarray(self._pooled(self.variables, batch))[: min(batch_size, len(rows) - lo)])
        return np.concatenate(out).astype(np.float32) if out else np.zeros((0, self.config.d_model), np.float32)


def _pad_cols(x: np.ndarray, length: int) -> np.ndarray:
    if x.shape[1] >= length:
        return x[:, :length]
    return np.concatenate([x, np.zeros((x.shape[0], length - x.shape[1]), x.dtype)], axis=1)


def _pad_rows(x: np.ndarray, rows: int) -> np.ndarray:
    if len(x) == rows:
        return x
    return np.concatenate([x, np.zeros((rows - len(x),) + x.shape[1:], x.dtype)], axis=0)
