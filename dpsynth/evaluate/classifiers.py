"""Downstream classifiers (Flax linen): the paper's WordCNN and a pretrained-backbone classifier.

Both map int32 token ids `[B, T]` (0 = padding) to logits `[B, num_classes]`; the featurizers
turn texts into those ids:

- `WordCNN` (Kurakin et al. 2023): words from `text.words` (lowercased, split on whitespace and
  punctuation), a vocabulary of the 30k most frequent words of the classifier's own training
  set, 384-d embeddings trained from scratch, Conv1D (kernel 3, 256 filters, ReLU), global max
  pooling over the non-padding positions, dense 256 with ReLU, and the output layer. When the
  training set is private (the DP-on-real baseline), the vocabulary must not be read from it:
  `SubwordFeaturizer` (the pieces of a public SentencePiece tokenizer) or
  `HashingWordFeaturizer` (words hashed into fixed buckets, no data at all) serve instead.
- `BackboneClassifier`: our decoder-only LM (`dpsynth.models.Transformer`, pretrained on public
  data) with a linear head over the mean-pooled or last-token final hidden states; it plays
  BERT's role (a model that benefits from public pretraining).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from dpsynth.evaluate import text as text_lib

POOLINGS = ("mean", "last")


@dataclasses.dataclass(frozen=True, kw_only=True)
class WordCNNConfig:
    """WordCNN sizes; the defaults are the paper's (tests shrink them).

    Attributes:
      vocab_words: most frequent training-set words kept (ids 0/1 are padding/OOV on top).
      embed_dim: embedding width, trained from scratch.
      filters: Conv1D filters; kernel_size: Conv1D width.
      hidden: width of the dense ReLU layer.
      max_len: words kept per text (truncation).
    """

    vocab_words: int = 30_000
    embed_dim: int = 384
    filters: int = 256
    kernel_size: int = 3
    hidden: int = 256
    max_len: int = 256

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 1:
                raise ValueError(f"WordCNNConfig.{f.name} must be >= 1, got {getattr(self, f.name)}")


class WordCNN(nn.Module):
    """Embedding -> Conv1D(kernel, filters, ReLU) -> masked global max pool -> Dense ReLU -> logits."""

    vocab_size: int
    num_classes: int
    config: WordCNNConfig = WordCNNConfig()

    @nn.compact
    def __call__(self, tokens, embedded=None):
        """`embedded` [B, T, D], if given, replaces the lookup `embed(tokens)` (the DP sparse
        path differentiates with respect to it; the table is then not needed in params)."""
        cfg = self.config
        mask = (tokens != text_lib.PAD)[..., None]
        if embedded is None:
            embedded = nn.Embed(self.vocab_size, cfg.embed_dim, name="embed")(tokens)
        # Padding embeds to exactly zero, so a padded row equals the unpadded one (SAME padding).
        x = embedded * mask
        x = nn.relu(nn.Conv(cfg.filters, (cfg.kernel_size,), padding="SAME", name="conv")(x))
        x = jnp.where(mask, x, -jnp.inf).max(axis=1)
        x = jnp.where(jnp.isfinite(x), x, 0.0)  # an all-padding row pools to zeros
        x = nn.relu(nn.Dense(cfg.hidden, name="dense")(x))
        return nn.Dense(self.num_classes, name="out")(x)


class BackboneClassifier(nn.Module):
    """A dpsynth Transformer backbone plus a linear head on pooled final hidden states."""

    model_config: object  # dpsynth.models.ModelConfig
    num_classes: int
    pooling: str = "mean"
    pad_id: int = 0  # the featurizer's padding id: dpsynth.data.tokenizers.PAD_ID, or -1 for imported tokenizers

    @nn.compact
    def __call__(self, tokens):
        from dpsynth.models import Transformer

        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        valid = tokens != self.pad_id
        segments = valid.astype(jnp.int32)
        if self.pad_id < 0:  # an out-of-vocabulary padding sentinel: look up id 0 there (masked anyway)
            tokens = jnp.where(valid, tokens, 0)
        _, hidden = Transformer(self.model_config, name="backbone")(tokens, segment_ids=segments, return_hidden=True)
        hidden = hidden.astype(jnp.float32)
        if self.pooling == "mean":
            w = valid[..., None].astype(jnp.float32)
            pooled = (hidden * w).sum(axis=1) / jnp.maximum(w.sum(axis=1), 1.0)
        else:
            last = jnp.maximum(valid.sum(axis=1) - 1, 0)
            pooled = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
        return nn.Dense(self.num_classes, name="head")(pooled)


# ----------------------------------------------------------------------------- featurizers


@dataclasses.dataclass(frozen=True)
class WordFeaturizer:
    """Texts -> WordCNN ids with a vocabulary built from one training set."""

    vocab: text_lib.Vocabulary
    max_len: int

    @classmethod
    def fit(cls, texts: Sequence[str], config: WordCNNConfig) -> "WordFeaturizer":
        return cls(text_lib.Vocabulary.build(texts, config.vocab_words), config.max_len)

    @property
    def vocab_size(self) -> int:
        return self.vocab.size

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        return self.vocab.encode_batch(texts, self.max_len)


@dataclasses.dataclass(frozen=True)
class SubwordFeaturizer:
    """Texts -> LM token ids (dpsynth `Tokenizer`), BOS first, truncated and padded with PAD_ID."""

    tokenizer: object  # dpsynth.data.tokenizers.Tokenizer
    max_len: int

    @property
    def pad_id(self) -> int:
        """dpsynth's PAD_ID (0); -1 (never a token) for an imported tokenizer, whose pad may be a real id."""
        return 0 if getattr(self.tokenizer, "native", True) else -1

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.vocab_size)

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        out = np.full((len(texts), self.max_len), self.pad_id, dtype=np.int32)
        for i, t in enumerate(texts):
            ids = np.concatenate([[getattr(self.tokenizer, "bos_id", 2)], np.asarray(self.tokenizer.encode(t), np.int32)])[: self.max_len]
            out[i, : len(ids)] = ids
        return out


@dataclasses.dataclass(frozen=True)
class HashingWordFeaturizer:
    """Texts -> WordCNN ids by hashing each word (`text.words`) into `buckets` fixed ids.

    No vocabulary is fitted: id = 2 + CRC-32(word) mod `buckets` (0/1 stay padding/OOV), a
    function of the word alone, so nothing about any dataset enters the featurizer.
    """

    buckets: int
    max_len: int

    def __post_init__(self):
        if self.buckets < 1 or self.max_len < 1:
            raise ValueError(f"buckets and max_len must be >= 1, got {self.buckets} and {self.max_len}")

    @property
    def vocab_size(self) -> int:
        return self.buckets + 2

    def word_id(self, word: str) -> int:
        return 2 + zlib.crc32(word.encode("utf-8")) % self.buckets

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.max_len), dtype=np.int32)
        cache: dict[str, int] = {}
        for i, t in enumerate(texts):
            ids = [cache.get(w) or cache.setdefault(w, self.word_id(w)) for w in text_lib.words(t)[: self.max_len]]
            out[i, : len(ids)] = ids
        return out


@dataclasses.dataclass(frozen=True)
class LabelMap:
    """Label strings <-> class ids (sorted, so the map is deterministic)."""

    labels: tuple[str, ...]

    @classmethod
    def from_labels(cls, labels: Sequence[str]) -> "LabelMap":
        return cls(tuple(sorted(set(labels))))

    def encode(self, labels: Sequence[str]) -> np.ndarray:
        index = {l: i for i, l in enumerate(self.labels)}
        unknown = sorted(set(labels) - set(index))
        if unknown:
            raise ValueError(f"unknown labels {unknown[:5]} (known: {list(self.labels)})")
        return np.array([index[l] for l in labels], dtype=np.int32)
