"""Every command's `--help`: each option with a default shows it, no option's help names a flag
its parser lacks, and no help says "a" before a vowel ("a evaluation report").

The parsers are the ones the commands build (`dpsynth.cli.COMMANDS`, each entry point's `main`
stopped where argparse would print the help), subcommands included (`tokenizer train`)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import re

import pytest

from dpsynth import binding, cli


class _Parsed(BaseException):  # not an Exception: the entry points' error handlers let it through
    pass


def _parsers(command: str) -> list[tuple[str, argparse.ArgumentParser]]:
    """(name, parser) of `dpsynth COMMAND` and of each of its subcommands."""
    module, function = cli.COMMANDS[command][0].split(":")
    main = getattr(importlib.import_module(module), function)

    def stop(parser, file=None):
        raise _Parsed(parser)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(argparse.ArgumentParser, "print_help", stop)
        try:
            main(["--help"])
        except _Parsed as got:
            top = got.args[0]
        else:
            raise AssertionError(f"dpsynth {command} --help printed no help")
    out, todo = [], [(command, top)]
    while todo:
        name, parser = todo.pop()
        out.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += [(f"{name} {sub}", p) for sub, p in action.choices.items()]
    return out


def _helps(parser: argparse.ArgumentParser):
    """(action, its help as printed) of every option of `parser` with a help."""
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.option_strings and action.help and action.help is not argparse.SUPPRESS:
            yield action, formatter._expand_help(action)


SWITCHES = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction,
            argparse._CountAction, argparse._HelpAction, argparse._VersionAction)


def _shown(value) -> list[str]:
    """The ways a help may write the default `value`: `binding.default_text`'s, `%(default)s`'s,
    and a sequence comma-separated (the flags that take `1,2,3`)."""
    out = [binding.default_text(value), str(value)]
    if isinstance(value, (tuple, list)):
        out.append(",".join(str(v) for v in value))
    return out


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_every_default_is_shown_in_its_help(command):
    missing = []
    for name, parser in _parsers(command):
        helps = dict(_helps(parser))
        for action in parser._actions:
            if not action.option_strings or isinstance(action, SWITCHES) or action.help is argparse.SUPPRESS:
                continue
            if binding.default_text(action.default) is None:  # None, False, empty: nothing to show
                continue
            text = helps.get(action, "")
            if "default" not in text.lower() or not any(re.search(rf"(?<![\w.]){re.escape(s)}(?![\w.])", text)
                                                        for s in _shown(action.default)):
                missing.append(f"dpsynth {name} {action.option_strings[-1]} (default {action.default!r}): {text!r}")
    assert not missing, "options whose --help hides their default:\n" + "\n".join(missing)


def _other_commands_spans(text: str, command: str) -> str:
    """`text` without its backticked spans that quote another command (`generate --guidance-contrast
    null`, `dpsynth select ...`): a flag named there is that command's."""
    others = {c for c in cli.COMMANDS if c != command.split()[0]}

    def keep(span: re.Match) -> str:
        words = span.group(1).split()
        words = words[1:] if words[:1] == ["dpsynth"] else words
        return "" if words and words[0] in others else span.group(0)

    return re.sub(r"`([^`]*)`", keep, text)


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_no_help_names_a_flag_its_parser_lacks(command):
    wrong = []
    for name, parser in _parsers(command):
        flags = {s for a in parser._actions for s in a.option_strings}
        for action, text in _helps(parser):
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", _other_commands_spans(text, name)):
                if flag not in flags:
                    wrong.append(f"dpsynth {name} {action.option_strings[-1]}: names {flag}: {text!r}")
    assert not wrong, "\n".join(wrong)


VOWEL_AFTER_A = re.compile(r"(?<![\w`'.-])a [aeio]\w*", re.I)  # "a one-line", "a user" are right
ALLOWED = re.compile(r"a one\b", re.I)


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_no_help_says_a_before_a_vowel(command):
    found = []
    for name, parser in _parsers(command):
        texts = [parser.description or ""] + [text for _, text in _helps(parser)]
        for text in texts:
            found += [f"dpsynth {name}: {m.group(0)!r} in {text!r}" for m in VOWEL_AFTER_A.finditer(text)
                      if not ALLOWED.match(m.group(0))]
    assert not found, "\n".join(found)


# ----------------------------------------------------------------------------- binding.add_flags


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Config:
    steps: int = binding.setting(100, help="optimizer steps")
    batch_size: int | str = binding.setting(8, help="rows per step; auto: the largest that fits")
    memory_limit: str | None = binding.setting(None, help="--batch-size auto: the memory to fit in")
    rate: float = binding.setting(0.5, help="the rate (default: %(default)s)")
    label: str = binding.setting("1%", help="")
    sizes: tuple = binding.setting((1, 2), help="sizes")
    fast: bool = binding.setting(False, help="go fast")
    check: bool = binding.setting(True, help="check")


def test_add_flags_shows_each_default_once_and_names_the_flags_of_this_parser():
    p = argparse.ArgumentParser()
    binding.add_flags(p, _Config, prefix="gen", overrides={"sizes": {"nargs": "+", "type": int}})
    helps = {a.option_strings[-1]: text for a, text in _helps(p)}
    assert helps["--gen-steps"] == "optimizer steps (default: 100)"
    assert helps["--gen-batch-size"] == "rows per step; auto: the largest that fits (default: 8)"
    assert helps["--gen-memory-limit"] == "--gen-batch-size auto: the memory to fit in"  # default None: nothing
    assert helps["--gen-rate"] == "the rate (default: 0.5)"  # not twice
    assert helps["--gen-label"] == "(default: 1%)"  # a "%" in a default is text, not a format
    assert helps["--gen-sizes"] == "sizes (default: 1 2)"
    assert helps["--gen-fast"] == "go fast"  # a switch: off unless given
    assert helps["--no-gen-check"].count("default") == 1  # argparse's BooleanOptionalAction shows its own
    p = argparse.ArgumentParser()
    binding.add_flags(p, _Config, overrides={"steps": {"default": 7}})
    helps = {a.option_strings[-1]: text for a, text in _helps(p)}
    assert helps["--steps"] == "optimizer steps (default: 7)" and helps["--memory-limit"].startswith("--batch-size ")
