"""Binding frozen config dataclasses to command-line flags and to plain mappings (YAML, JSON).

A library's config dataclass is the one place its fields, types and defaults are named:
`add_flags` makes one `--field-name` flag per field (type and default from the dataclass,
help and choices from the field's `setting` metadata or the entry point), `from_args` builds
the config back from the parsed flags, and `make_config` builds it from the plain values of an
experiment config.

A field declared with `setting(...)` carries its own help text, choices and cache-key rule
(`UNLESS_DEFAULT`), so a config that derives from it (`subconfig`), its flags and the
experiment's stage hashes (`stage_dict`) need no second declaration. A config's
`__post_init__` raises `SettingError(field, message)` so each caller can name the field its
own way (`--min-p`, `generate.samplings[0].min_p`).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import types
import typing
from collections.abc import Mapping
from typing import Any

from dpsynth.errors import DpsynthError

# Field metadata keys of `setting`.
HELP = "help"
CHOICES = "choices"
# A setting added after stage caches existed: it enters a stage's hash only when set
# (`stage_dict`), so caches made before it existed keep their hashes. True: left out at its own
# default; a field name: left out while that field is at its default (the setting only means
# something with it, e.g. the noise of a DP label histogram).
UNLESS_DEFAULT = "hash_unless_default"


class SettingError(DpsynthError, ValueError):
    """A setting's value is invalid: `field` names it, `message` says why ("must be >= 0, got -1")."""

    def __init__(self, field: str, message: str | None = None):
        if message is None:  # its one-line form, as pickling and Beam's re-raise pass it back
            field, _, message = field.partition(": ")
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def setting(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING, help: str | None = None,
            choices: tuple | None = None, unless_default: bool | str | None = None, **metadata: Any) -> Any:
    """`dataclasses.field` of a setting with its help text, its choices and its hash rule
    (`unless_default`: see `UNLESS_DEFAULT`); `metadata` adds keys of the caller's."""
    meta = dict(metadata)
    if help is not None:
        meta[HELP] = help
    if choices is not None:
        meta[CHOICES] = tuple(choices)
    if unless_default is not None:
        meta[UNLESS_DEFAULT] = unless_default
    return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


def is_default(config: Any, f: dataclasses.Field) -> bool:
    """Whether `config`'s field `f` holds its declared default."""
    return getattr(config, f.name) == _field_default(f)


def plain(value: Any) -> Any:
    """A config as plain JSON/YAML-compatible data (tuples become lists; inf stays float)."""
    if dataclasses.is_dataclass(value):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def stage_dict(config: Any) -> dict[str, Any]:
    """`plain(config)` without the settings marked `UNLESS_DEFAULT` that are not set (so the
    hashes of caches made before they existed hold)."""
    fields = {f.name: f for f in dataclasses.fields(config)}
    out = {}
    for name, value in plain(config).items():
        mark = fields[name].metadata.get(UNLESS_DEFAULT)
        if mark is True and is_default(config, fields[name]):
            continue
        if isinstance(mark, str) and is_default(config, fields[mark]):
            continue
        out[name] = value
    return out


def subconfig(name: str, cls: type, keep: typing.Callable[[dataclasses.Field], bool], *, module: str,
              namespace: Mapping[str, Any] | None = None, doc: str | None = None,
              preset: Mapping[str, Any] | None = None, extra: typing.Sequence[tuple] = (),
              retype: Mapping[str, Any] | None = None, unless_default: typing.Collection[str] = ()) -> type:
    """A frozen, keyword-only dataclass `name` of the fields of `cls` that `keep` selects: the
    same names, types, defaults and metadata (one declaration, in `cls`); `namespace` adds
    methods. `preset` replaces some defaults (a named preset over the library's, e.g. CPU-sized
    experiment runs); `extra` appends `(name, type, field)` entries of the caller's own (such as
    an `options` mapping). `retype` gives a field another type where the caller's values must keep
    theirs (an experiment hashes `batch_size: 64`, not 64.0); `unless_default` marks fields whose
    value enters the caller's cache keys only when set (`UNLESS_DEFAULT`). It does not validate:
    building `cls` from it does."""
    hints = {**typing.get_type_hints(cls), **dict(retype or {})}
    preset = dict(preset or {})
    unknown = set(preset) - {f.name for f in dataclasses.fields(cls) if keep(f)}
    if unknown:
        raise TypeError(f"subconfig {name}: the preset names fields it does not keep: {sorted(unknown)}")

    def field(f: dataclasses.Field) -> dataclasses.Field:
        metadata = {**f.metadata, **({UNLESS_DEFAULT: True} if f.name in unless_default else {})}
        if f.name in preset:
            return dataclasses.field(default=preset[f.name], metadata=metadata)
        return dataclasses.field(default=f.default, default_factory=f.default_factory, metadata=metadata)

    fields = [(f.name, hints[f.name], field(f)) for f in dataclasses.fields(cls) if keep(f)] + list(extra)
    out = dataclasses.make_dataclass(name, fields, namespace=dict(namespace or {}), frozen=True, kw_only=True)
    out.__module__ = module
    out.__doc__ = doc or f"The settings of `{cls.__name__}` selected for `{name}` (declared there)."
    return out


def _or_auto(cast: type, what: str):
    """The flag type of a `cast | "auto"` setting: the text "auto", else `cast(text)`."""

    def parse(text: str):
        if text == "auto":
            return text
        try:
            return cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} or 'auto', got {text!r}") from None

    return parse


int_or_auto = _or_auto(int, "an integer")  # `--microbatch-size N|auto`
float_or_auto = _or_auto(float, "a number")  # `--label-contrast LAMBDA|auto`


def flag_name(field: str) -> str:
    """The command-line flag of a config field: `max_tokens` -> `--max-tokens`."""
    return "--" + field.replace("_", "-")


def default_text(value: Any) -> str | None:
    """How a flag's help shows its default `value`: None where there is none to show (None,
    False, an empty text, sequence or mapping); a sequence as its items joined by spaces (as
    `nargs="+"` takes them); anything else as `str(value)`."""
    if value is None or value is False or value is argparse.SUPPRESS or value == "":
        return None
    if isinstance(value, (tuple, list)):
        return " ".join(str(v) for v in value) or None
    if isinstance(value, Mapping):
        return " ".join(f"{k}={v}" for k, v in value.items()) or None
    return str(value)


def with_default(help: str | None, default: Any) -> str | None:
    """`help` with " (default: D)" appended (D = `default_text(default)`), unless there is no
    default to show, the help is suppressed, or it names its default already (`%(default)s`, or
    the word "default" and D). The one place a derived flag's help gets its default."""
    text = default_text(default)
    if text is None or help is argparse.SUPPRESS:
        return help
    help = help or ""
    if "%(default)" in help or ("default" in help.lower() and _word(text).search(help)):
        return help
    return f"{help} (default: {text.replace('%', '%%')})".lstrip()


def _word(text: str) -> re.Pattern:
    """`text` as a whole word of a help text ("1" not in "16GiB")."""
    return re.compile(r"(?<![\w.])" + re.escape(text) + r"(?![\w.])")


def _flag_pattern(flag: str) -> re.Pattern:
    """`flag` as a whole option string in a help text (not a prefix of a longer one)."""
    return re.compile(r"(?<![\w-])" + re.escape(flag) + r"(?![\w-])")


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
              overrides: Mapping[str, Mapping[str, Any]] | None = None, skip: tuple[str, ...] = (),
              prefix: str = "") -> list[str]:
    """Adds one flag per field of the dataclass `cls` to `parser`, in field order.

    The flag is `flag_name(field)`; its type comes from the annotation (`X | None` reads as
    X; a `bool` field is a `store_true` switch; `str` takes the text as is) and its default
    from `defaults` (an instance of `cls`), else from the field. Its help shows that default
    (`with_default`; a `store_true`/`store_false` switch is off unless given), and a help
    that names another field's flag (`--batch-size auto`) names the flag that field has here
    (`--gen-batch-size` with `prefix="gen"`), so no help names a flag its parser lacks.

    Args:
        parser: The parser (or argument group) to add to.
        cls: A dataclass.
        defaults: An instance of `cls` whose values are the flags' defaults.
        overrides: Field name -> argparse keyword arguments (help, choices, type, metavar,
            action; help and choices default to the field's `setting` metadata)
            added to or replacing the derived ones; the key `container` adds that
            field's flag to another group (e.g. a mutually exclusive one) instead of `parser`,
            and `flags` gives other option strings than `flag_name(field)` (the `dest` stays
            the field name, e.g. `{"flags": ("--no-tensorboard",), "action": "store_false"}`).
        skip: Fields that get no flag.
        prefix: Flags `--<prefix>-<field>` with dest `<prefix>_<field>` (a family's settings
            beside others: `--backbone-truncate`); read back with `from_args(..., prefix=)`.

    Returns:
        The names of the fields bound (without the prefix).
    """
    hints = typing.get_type_hints(cls)
    overrides = overrides or {}
    unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ValueError(f"overrides name fields {sorted(unknown)} that {cls.__name__} does not have")
    bound = [f for f in dataclasses.fields(cls) if f.name not in skip]
    renamed = {}  # a field's plain flag -> the flag it has here, where they differ
    for f in bound:
        flag = tuple(overrides.get(f.name, {}).get("flags", (flag_name(f"{prefix}_{f.name}" if prefix else f.name),)))[0]
        if flag != flag_name(f.name):
            renamed[flag_name(f.name)] = flag
    names = []
    for f in bound:
        kwargs = dict(overrides.get(f.name, {}))
        container = kwargs.pop("container", parser)
        dest = f"{prefix}_{f.name}" if prefix else f.name
        flags = tuple(kwargs.pop("flags", (flag_name(dest),)))
        default = getattr(defaults, f.name) if defaults is not None else _field_default(f)
        tp = _scalar_type(hints[f.name])
        for key in (HELP, CHOICES):
            if key in f.metadata and key not in kwargs:
                kwargs[key] = f.metadata[key]
        if tp is bool:
            derived: dict[str, Any] = {"action": "store_true" if not default else argparse.BooleanOptionalAction,
                                       "default": default}
        elif tp in (int, float):
            derived = {"type": tp, "default": default}
        else:
            derived = {"default": default}
        kwargs = {"dest": dest, **derived, **kwargs}
        if isinstance(kwargs.get("help"), str):
            for plain_flag, flag in renamed.items():
                kwargs["help"] = _flag_pattern(plain_flag).sub(flag, kwargs["help"])
        action = container.add_argument(*flags, **kwargs)
        if not isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):  # (switches: off)
            action.help = with_default(action.help, action.default)
        names.append(f.name)
    return names


def from_args(cls: type, args: argparse.Namespace, names: typing.Iterable[str] | None = None, *, prefix: str = ""):
    """`cls(**{name: args.name})` for the fields `add_flags` bound (`names`; default: every field
    that has a flag; a field `add_flags` skipped keeps its default)."""
    if names is None:
        names = [f.name for f in dataclasses.fields(cls) if hasattr(args, f"{prefix}_{f.name}" if prefix else f.name)]
    return cls(**{name: getattr(args, f"{prefix}_{name}" if prefix else name) for name in names})


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
