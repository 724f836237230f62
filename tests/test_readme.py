"""The README's and the docs' commands use flags the commands have: every `dpsynth COMMAND ...` line of
their code blocks (continuation lines joined, commented-out alternatives included; a command's printed
output, `dpsynth COMMAND: ...`, is not one) is checked against that command's own argparse parser
(and, for the Beam jobs, Beam's pipeline options), so a renamed or removed flag cannot leave them behind."""

from __future__ import annotations

import argparse
import importlib
import pathlib
import re
import shlex

import pytest

from dpsynth import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
PARSER_BUILDERS = ("build_parser", "parser", "_parser")


def readme_commands(document: pathlib.Path) -> list[str]:
    """Every `dpsynth ...` command of a Markdown file's fenced code blocks, one string each."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", document.read_text(encoding="utf-8"), flags=re.S)
    out = []
    for block in blocks:
        joined = re.sub(r"\\\n\s*#?\s*", " ", block)  # continuation lines (also of a commented command)
        for line in joined.splitlines():
            line = line.strip().lstrip("#").strip()
            if re.match(r"dpsynth [a-z-]+(\s|$)", line) and "..." not in line:
                out.append(line.split("  #")[0].strip())
    return out


def _option_strings(parser: argparse.ArgumentParser, words: list[str]) -> set[str]:
    """The options of `parser`, descending into the subcommand `words` names (`tokenizer train`)."""
    options = set()
    for action in parser._actions:
        options.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for word in words:
                if word in action.choices:
                    options |= _option_strings(action.choices[word], words)
    return options


def _beam_options() -> set[str]:
    """The option strings of Beam's pipeline options (`--runner`, `--project`, ...): the Beam jobs pass them on."""
    from apache_beam.options.pipeline_options import PipelineOptions

    parser, seen, todo = argparse.ArgumentParser(conflict_handler="resolve"), set(), [PipelineOptions]
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.add(cls)
            cls._add_argparse_args(parser)
            todo.extend(cls.__subclasses__())
    return {s for a in parser._actions for s in a.option_strings}


def _parser(command: str) -> argparse.ArgumentParser:
    module = importlib.import_module(cli.COMMANDS[command][0].split(":")[0])
    for name in PARSER_BUILDERS:
        if hasattr(module, name):
            return getattr(module, name)()
    raise AssertionError(f"dpsynth {command}: no parser builder ({PARSER_BUILDERS}) in {module.__name__}")


COMMANDS = [(doc.relative_to(ROOT).as_posix(), c) for doc in DOCUMENTS for c in readme_commands(doc)]


def test_the_readme_has_commands_to_check():
    names = {shlex.split(c)[1] for doc, c in COMMANDS if doc == "README.md"}
    assert {"dedup", "pretrain", "dp-tune", "select", "evaluate"} <= names


@pytest.mark.parametrize("where, command", COMMANDS)
def test_every_flag_of_a_documented_command_exists(where, command):
    words = shlex.split(command)
    name = words[1]
    assert name in cli.COMMANDS, f"{where}: unknown command dpsynth {name}"
    if name == "demo":
        return
    known = _option_strings(_parser(name), words[2:])
    if cli.COMMANDS[name][0].startswith("beam_jobs.") or name == "select":  # Beam flags pass through
        known |= _beam_options()
    unknown = [f for f in (w.split("=")[0] for w in words[2:] if w.startswith("--")) if f not in known]
    assert not unknown, f"{where}: `{command}` uses {unknown}, which dpsynth {name} does not have"
