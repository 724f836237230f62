"""Pluggable text embedders for MAUVE: our pretrained LM, hashing bag-of-words, sentence-transformers.

An embedder has a `name` and `embed(texts) -> float32 [n, d]`. Choose one with `make_embedder`:

- `"lm:DIR"`: mean-pooled last hidden states of a dpsynth checkpoint (`dpsynth.models.directory`);
  the default when a model directory is given (the paper featurises with its own LM).
- `"hashing"` (or `"hashing:DIM"`): signed feature hashing of word unigrams and bigrams with
  sublinear term frequency; no model, no dependency, deterministic across processes.
- `"st:PATH"`: a local sentence-transformers model (the `[sentence-transformers]` extra); never
  downloads.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from dpsynth.evaluate import text as text_lib


class Embedder(Protocol):
    name: str

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def _stable_hash(s: str) -> int:
    return zlib.crc32(s.encode("utf-8"))


@dataclasses.dataclass(frozen=True)
class HashingEmbedder:
    """Signed hashing of word uni- and bigrams into `dim` buckets, `log1p` term frequencies."""

    dim: int = 1024
    bigrams: bool = True

    def __post_init__(self):
        if self.dim < 2:
            raise ValueError(f"dim must be >= 2, got {self.dim}")

    @property
    def name(self) -> str:
        return f"hashing:{self.dim}"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float64)
        for i, t in enumerate(texts):
            ws = text_lib.words(t)
            feats = ws + ([a + " " + b for a, b in zip(ws, ws[1:])] if self.bigrams else [])
            for f in feats:
                h = _stable_hash(f)
                out[i, h % self.dim] += 1.0 if (h >> 31) & 1 == 0 else -1.0
        return (np.sign(out) * np.log1p(np.abs(out))).astype(np.float32)


class LMEmbedder:
    """Mean-pooled last hidden states of a dpsynth language model (loaded once)."""

    def __init__(self, model_dir: str, batch_size: int = 32, max_len: int = 256):
        from dpsynth.evaluate import lm  # models package; imported lazily

        self.model_dir, self.batch_size, self.max_len = model_dir, batch_size, max_len
        self._lm = lm.LanguageModel.load(model_dir)
        self.name = f"lm:{model_dir}"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self._lm.embed(texts, batch_size=self.batch_size, max_len=self.max_len)


class SentenceTransformerEmbedder:
    """A local sentence-transformers model (path on disk; nothing is downloaded)."""

    def __init__(self, path: str, batch_size: int = 32):
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as e:  # pragma: no cover - depends on the extra
            raise ImportError("the 'st:' embedder needs `pip install dpsynth[sentence-transformers]`") from e
        self._model = SentenceTransformer(path, local_files_only=True) if _accepts_local(SentenceTransformer) else SentenceTransformer(path)
        self.batch_size, self.name = batch_size, f"st:{path}"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self._model.encode(list(texts), batch_size=self.batch_size), dtype=np.float32)


def _accepts_local(cls) -> bool:
    import inspect

    return "local_files_only" in inspect.signature(cls.__init__).parameters


def make_embedder(spec: str) -> Embedder:
    """`"hashing[:DIM]"`, `"lm:DIR"` or `"st:PATH"` -> an embedder."""
    kind, _, arg = spec.partition(":")
    if kind == "hashing":
        return HashingEmbedder(dim=int(arg) if arg else 1024)
    if kind == "lm" and arg:
        return LMEmbedder(arg)
    if kind == "st" and arg:
        return SentenceTransformerEmbedder(arg)
    raise ValueError(f"unknown embedder {spec!r}: use 'hashing[:DIM]', 'lm:MODEL_DIR' or 'st:PATH'")
