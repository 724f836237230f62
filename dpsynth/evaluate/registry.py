"""The downstream classifiers by name: one `ClassifierKind` per family, one registry line each.

A family (`dpsynth.evaluate.wordcnn`, `dpsynth.evaluate.backbone`) is one file with a
`ClassifierKind` subclass whose `make(spec, train_texts, num_classes, ...)` builds a fresh
`dpsynth.evaluate.trainer.Model` (Flax module, initial parameters, featurizer); the trainer,
the sweep and the evaluate stage ask the registry and never branch on a classifier's name.
Adding a classifier is one new file and one line in `REGISTRY`.

A family with settings of its own declares them in its file as a frozen dataclass
(`ClassifierKind.settings`, fields declared with `dpsynth.binding.setting`, validated in its
`__post_init__`); a `ClassifierSpec` carries the chosen values as `options` and `make` reads
them with `settings_of(spec)`. The CLI flags (`--<family>-<setting>`, `add_setting_flags`), the
evaluate config (`classifier_options: {family: {setting: value}}`) and the experiment's
`evaluate.options` take them from there: a new setting is a field in its family's file.

This module imports nothing heavy: a family's file (Flax, JAX) is imported when the family is
first asked for (`get`), so configs can validate classifier names cheaply (`names`).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from dpsynth import binding


class ClassifierKind:
    """One classifier family: its needs and a factory of fresh models.

    Attributes:
      needs_model_dir: the classifier needs `spec.model_dir` (a dpsynth checkpoint directory).
      uses_backbone: it reads the pretrained LM (`dpsynth.evaluate.backbone.Backbone`), which
        the evaluate stage loads once and passes to `make`; its sweep is the evaluate config's
        `backbone_sweep` when one is set.
      settings: the frozen dataclass of the family's own settings (None: it has none).
    """

    needs_model_dir: bool = False
    uses_backbone: bool = False
    settings: type | None = None

    def settings_of(self, spec) -> Any:
        """The family's `settings` built from `spec.options` (ValueError naming an unknown or bad one)."""
        options = dict(getattr(spec, "options", None) or {})
        if self.settings is None:
            if options:
                raise ValueError(f"the {spec.kind} classifier has no settings, got {sorted(options)}")
            return None
        try:
            return binding.make_config(self.settings, options, spec.kind)
        except binding.SettingError as e:
            raise ValueError(f"{spec.kind}.{e}") from None

    def check(self, spec) -> None:
        """Raises ValueError for settings that do not go with the rest of `spec` (e.g. a model_dir they need)."""

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


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """One `--<family>-<setting>` flag per setting of every registered family (imports them)."""
    for name in names():
        kind = get(name)
        if kind.settings is not None:
            binding.add_flags(parser, kind.settings, prefix=name)


def options_from_args(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """{family: {setting: value}} of the `add_setting_flags` flags that differ from their defaults."""
    out: dict[str, dict[str, Any]] = {}
    for name in names():
        kind = get(name)
        if kind.settings is None:
            continue
        given = binding.plain(binding.from_args(kind.settings, args, prefix=name))
        changed = {k: v for k, v in given.items() if v != binding.plain(kind.settings()).get(k)}
        if changed:
            out[name] = changed
    return out


def check_options(options: Mapping[str, Mapping[str, Any]]) -> None:
    """Raises ValueError for a family that is not registered or a setting it does not have."""
    from types import SimpleNamespace

    for name, values in options.items():
        get(name).settings_of(SimpleNamespace(kind=name, options=values))


def make(spec, train_texts: Sequence[str] | None, num_classes: int, *, backbone: Any = None, private: bool = False):
    """A fresh model of the family `spec.kind` (`ClassifierKind.make`)."""
    return get(spec.kind).make(spec, train_texts, num_classes, backbone=backbone, private=private)
