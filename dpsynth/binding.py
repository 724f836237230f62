"""Binding frozen config dataclasses to command-line flags and to plain mappings (YAML, JSON).

A library's config dataclass is the one place its fields, types and defaults are named:
`add_flags` makes one `--field-name` flag per field (type and default from the dataclass,
help and choices from the entry point), `from_args` builds the config back from the parsed
flags, and `make_config` builds it from the plain values of an experiment config.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any


def flag_name(field: str) -> str:
    """The command-line flag of a config field: `max_tokens` -> `--max-tokens`."""
    return "--" + field.replace("_", "-")


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _scalar_type(tp: Any) -> Any:
    """`X | None` -> X; anything else unchanged."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def add_flags(parser: argparse.ArgumentParser, cls: type, *, defaults: Any = None,
              overrides: Mapping[str, Mapping[str, Any]] | None = None, skip: tuple[str, ...] = ()) -> list[str]:
    """Adds one flag per field of the dataclass `cls` to `parser`, in field order.

    The flag is `flag_name(field)`; its type comes from the annotation (`X | None` reads as
    X; a `bool` field is a `store_true` switch; `str` takes the text as is) and its default
    from `defaults` (an instance of `cls`), else from the field.

    Args:
        parser: The parser (or argument group) to add to.
        cls: A dataclass.
        defaults: An instance of `cls` whose values are the flags' defaults.
        overrides: Field name -> argparse keyword arguments (help, choices, type, metavar,
            action) added to or replacing the derived ones; the key `container` adds that
            field's flag to another group (e.g. a mutually exclusive one) instead of `parser`,
            and `flags` gives other option strings than `flag_name(field)` (the `dest` stays
            the field name, e.g. `{"flags": ("--no-tensorboard",), "action": "store_false"}`).
        skip: Fields that get no flag.

    Returns:
        The names of the fields bound (the `dest` of each flag).
    """
    hints = typing.get_type_hints(cls)
    overrides = overrides or {}
    unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ValueError(f"overrides name fields {sorted(unknown)} that {cls.__name__} does not have")
    names = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        kwargs = dict(overrides.get(f.name, {}))
        container = kwargs.pop("container", parser)
        flags = tuple(kwargs.pop("flags", (flag_name(f.name),)))
        default = getattr(defaults, f.name) if defaults is not None else _field_default(f)
        tp = _scalar_type(hints[f.name])
        if tp is bool:
            derived: dict[str, Any] = {"action": "store_true" if not default else argparse.BooleanOptionalAction,
                                       "default": default}
        elif tp in (int, float):
            derived = {"type": tp, "default": default}
        else:
            derived = {"default": default}
        container.add_argument(*flags, **{"dest": f.name, **derived, **kwargs})
        names.append(f.name)
    return names


def from_args(cls: type, args: argparse.Namespace, names: typing.Iterable[str] | None = None):
    """`cls(**{name: args.name})` for the fields `add_flags` bound (`names`; default: every field)."""
    names = [f.name for f in dataclasses.fields(cls)] if names is None else names
    return cls(**{name: getattr(args, name) for name in names})


def make_config(cls: type, kwargs: Mapping[str, Any], where: str):
    """`cls(**kwargs)` for a library's frozen config dataclass, from plain YAML values.

    Nested mappings become the nested dataclass a field holds by default (e.g. an evaluate
    `sweep: {repeats: 1}` becomes a `SweepConfig`), lists become tuples. Unknown keys raise
    ValueError naming `where` and the known keys.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    out = {}
    for key, value in kwargs.items():
        if key not in fields:
            raise ValueError(f"{where}.{key}: not an option of {cls.__name__} (known: {', '.join(sorted(fields))})")
        default = _field_default(fields[key])
        target = type(default) if dataclasses.is_dataclass(default) else None
        if target is None and typing.get_origin(hints[key]) in (typing.Union, types.UnionType):
            target = next((a for a in typing.get_args(hints[key]) if dataclasses.is_dataclass(a)), None)  # `X | None`
        if isinstance(value, Mapping) and target is not None:
            value = make_config(target, value, f"{where}.{key}")
        elif isinstance(value, list):
            value = tuple(value)
        out[key] = value
    return cls(**out)
