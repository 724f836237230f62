"""The downstream classifiers by name: one `ClassifierKind` per family, one registry line each.

A family (`dpsynth.evaluate.wordcnn`, `dpsynth.evaluate.backbone`) is one file with a
`ClassifierKind` subclass whose `make(spec, train_texts, num_classes, ...)` builds a fresh
`dpsynth.evaluate.trainer.Model` (Flax module, initial parameters, featurizer); the trainer,
the sweep and the evaluate stage ask the registry and never branch on a classifier's name.
Adding a classifier is one new file and one line in `REGISTRY`.

This module imports nothing heavy: a family's file (Flax, JAX) is imported when the family is
first asked for (`get`), so configs can validate classifier names cheaply (`names`).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any


class ClassifierKind:
    """One classifier family: its needs and a factory of fresh models.

    Attributes:
      needs_model_dir: the classifier needs `spec.model_dir` (a dpsynth checkpoint directory).
      uses_backbone: it reads the pretrained LM (`dpsynth.evaluate.backbone.Backbone`), which
        the evaluate stage loads once and passes to `make`; its sweep is the evaluate config's
        `backbone_sweep` when one is set.
    """

    needs_model_dir: bool = False
    uses_backbone: bool = False

    def input_len(self, spec) -> int:
        """Tokens kept per example (the report's max_tokens_per_example)."""
        return spec.max_len

    def reads_train_texts(self, spec, private: bool) -> bool:
        """Whether `make` reads the training texts (e.g. a vocabulary fitted on them)."""
        return False

    def make(self, spec, train_texts: Sequence[str] | None, num_classes: int, *, backbone: Any = None,
             private: bool = False):
        """A fresh `dpsynth.evaluate.trainer.Model` for one training set.

        Args:
          spec: the `dpsynth.evaluate.train_classifier.ClassifierSpec`.
          train_texts: the training texts when `reads_train_texts(spec, private)`, else None.
          num_classes: the number of labels.
          backbone: the pretrained LM when already loaded (None: load it from spec.model_dir).
          private: the training set is private (DP-on-real): read nothing of it without DP.
        """
        raise NotImplementedError


# name -> "module:attribute" of its `ClassifierKind` (imported on first use) or the object itself.
# The order is the order of the report's tables.
REGISTRY: dict[str, str | ClassifierKind] = {
    "wordcnn": "dpsynth.evaluate.wordcnn:WORDCNN",
    "backbone": "dpsynth.evaluate.backbone:BACKBONE",
}


def names() -> tuple[str, ...]:
    """The registered classifier names, in registry order."""
    return tuple(REGISTRY)


def get(name: str) -> ClassifierKind:
    """The family registered as `name`; ValueError naming the known ones otherwise."""
    entry = REGISTRY.get(name)
    if entry is None:
        raise ValueError(f"classifier must be one of {names()}, got {name!r}")
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = getattr(importlib.import_module(module), attr)
    return entry


def make(spec, train_texts: Sequence[str] | None, num_classes: int, *, backbone: Any = None, private: bool = False):
    """A fresh model of the family `spec.kind` (`ClassifierKind.make`)."""
    return get(spec.kind).make(spec, train_texts, num_classes, backbone=backbone, private=private)
