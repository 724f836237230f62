"""The pretrained-backbone classifier family: our pretrained LM plus a linear head.

`classifiers.BackboneClassifier` over the mean-pooled or last-token final hidden states of a
dpsynth pretrained model (public data); the whole model or only the head (`freeze`)
trains. The LM (`Backbone`) is loaded once per evaluate stage and shared by every sweep.

Settings of its own (`BackboneSettings`, `--backbone-<setting>` flags, `classifier_options:
{backbone: {...}}`): `pooling`, `freeze` and `truncate` (which end of a text longer than the input
the model reads). Its input length is the spec's `max_len` (the evaluate config's `backbone_max_len`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpsynth import binding
from dpsynth.evaluate import classifiers, registry, trainer

TRUNCATIONS = ("head", "tail")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BackboneSettings:
    """The backbone classifier's own settings.

    Attributes:
      pooling: how the final hidden states become one vector (`classifiers.POOLINGS`): the mean
        over the non-padding positions ("mean", the default) or the last one ("last").
      freeze: train the head only (the pretrained LM stays as it is); default: the whole model.
      truncate: which tokens of a text longer than the input are read after BOS: its first
        ("head", the default) or its last ("tail": e.g. a review's verdict at its end).
    """

    pooling: str = binding.setting("mean", choices=classifiers.POOLINGS,
                                   help="the backbone classifier's pooling of the final hidden states")
    freeze: bool = binding.setting(False, help="train the backbone classifier's head only (the LM stays fixed)")
    truncate: str = binding.setting("head", choices=TRUNCATIONS, help="which tokens of a long text the backbone "
                                    "classifier reads after BOS: the first (head) or the last (tail)")

    def __post_init__(self):
        if self.pooling not in classifiers.POOLINGS:
            raise binding.SettingError("pooling", f"must be one of {', '.join(classifiers.POOLINGS)}; got {self.pooling!r}")
        if self.truncate not in TRUNCATIONS:
            raise binding.SettingError("truncate", f"must be one of {', '.join(TRUNCATIONS)}; got {self.truncate!r}")


@dataclasses.dataclass(frozen=True)
class TailSubwordFeaturizer(classifiers.SubwordFeaturizer):
    """`SubwordFeaturizer` that keeps the LAST `max_len - 1` tokens of a long text after BOS."""

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        out = np.full((len(texts), self.max_len), self.pad_id, dtype=np.int32)
        keep = self.max_len - 1
        for i, t in enumerate(texts):
            ids = np.asarray(self.tokenizer.encode(t), np.int32)
            ids = np.concatenate([[getattr(self.tokenizer, "bos_id", 2)], ids[max(0, len(ids) - keep):] if keep else ids[:0]])
            out[i, : len(ids)] = ids
        return out


@dataclasses.dataclass(frozen=True)
class Backbone:
    """A pretrained LM: `ModelConfig`, base parameters and its `Tokenizer`."""

    config: Any
    params: Any
    tokenizer: Any

    @classmethod
    def load(cls, model_dir: str) -> "Backbone":
        from dpsynth.models.directory import load_model  # lazily: Orbax

        loaded = load_model(model_dir)
        return cls(loaded.config, loaded.variables["params"], loaded.tokenizer)


def backbone_model(backbone: Backbone, num_classes: int, *, max_len: int = 128, seed: int = 0,
                   settings: BackboneSettings = BackboneSettings()) -> trainer.Model:
    """The pretrained LM plus a fresh linear head; the whole model or only the head (`settings.freeze`) trains."""
    cfg = backbone.config
    if getattr(cfg, "lora_rank", 0) or getattr(cfg, "prompt_length", 0):
        cfg = dataclasses.replace(cfg, lora_rank=0, prompt_length=0)  # the classifier uses the base weights
    if max_len > cfg.max_len:
        raise ValueError(f"max_len {max_len} exceeds the backbone's max_len {cfg.max_len}")
    featurizer = TailSubwordFeaturizer if settings.truncate == "tail" else classifiers.SubwordFeaturizer
    feat = featurizer(backbone.tokenizer, max_len)
    module = classifiers.BackboneClassifier(cfg, num_classes, settings.pooling, pad_id=feat.pad_id)
    init = module.init(jax.random.PRNGKey(seed), jnp.zeros((1, max_len), jnp.int32))["params"]
    head = {"head": init["head"]}
    base = {"backbone": jax.tree.map(jnp.asarray, backbone.params)}
    vocab = {"source": "tokenizer", "size": feat.vocab_size,
             "detail": f"the pretrained model's tokenizer (sha256 {backbone.tokenizer.sha256})"}
    if settings.freeze:
        return trainer.Model(module, head, base, feat, "backbone-head", vocabulary=vocab)
    return trainer.Model(module, {**base, **head}, {}, feat, "backbone", vocabulary=vocab)


class BackboneKind(registry.ClassifierKind):
    """The backbone classifier: `spec.model_dir`'s LM read at `spec.max_len` tokens, with `BackboneSettings`."""

    needs_model_dir = True
    uses_backbone = True
    settings = BackboneSettings

    def make(self, spec, train_texts: Sequence[str] | None, num_classes: int, *, backbone: Any = None,
             private: bool = False) -> trainer.Model:
        backbone = backbone if backbone is not None else Backbone.load(spec.model_dir)
        return backbone_model(backbone, num_classes, max_len=spec.max_len, settings=self.settings_of(spec))


BACKBONE = BackboneKind()
