"""The reading flags every command shares are declared once (`dpsynth.data.read_config`)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import pathlib
import re

import pytest

from dpsynth.data import read_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
# entry module -> its parser factory
PARSERS = {"beam_jobs.dedup": "build_parser", "beam_jobs.tokenize": "build_parser", "beam_jobs.generate": "build_parser",
           "beam_jobs.metrics": "parser", "trainers.audit": "build_parser", "trainers.classify": "parser",
           "trainers.dp_tune": "build_parser", "trainers.select": "parser", "trainers.tokenizer": "build_parser"}


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    out = {a.dest: a for a in parser._actions}
    for a in parser._actions:  # (the tokenizer's flags live on its `train` subcommand)
        if isinstance(a, argparse._SubParsersAction):
            for sub in a.choices.values():
                out.update(_actions(sub))
    return out


@pytest.mark.parametrize("module", sorted(PARSERS))
def test_each_command_binds_its_reading_flags_from_the_one_config(module):
    actions = _actions(getattr(importlib.import_module(module), PARSERS[module])())
    bound = [f for f in read_config.FIELDS if f in actions]
    assert "encoding" in bound  # every command that reads files takes --encoding
    defaults = read_config.ReadConfig()
    for name in bound:
        a = actions[name]
        assert a.option_strings == ["--" + name.replace("_", "-")] and a.default == getattr(defaults, name)
        meta = {f.name: f.metadata for f in dataclasses.fields(read_config.ReadConfig)}[name]
        assert a.help.startswith(meta["help"])  # the one help text (plus this command's note)
    if "max_dead_letters" in bound:
        assert actions["max_dead_letters"].metavar == "N|P%"


def test_no_entry_point_declares_a_reading_flag_by_hand():
    flags = "|".join(re.escape("--" + f.replace("_", "-")) for f in read_config.FIELDS)
    hand = re.compile(r'add_argument\(\s*"(' + flags + r')"')
    found = [f"{p.relative_to(ROOT)}: {m.group(1)}" for d in ("beam_jobs", "trainers", "dpsynth")
             for p in (ROOT / d).rglob("*.py") for m in hand.finditer(p.read_text())]
    assert found == []


def test_add_flags_refuses_unknown_fields_and_stray_notes():
    with pytest.raises(ValueError, match="unknown"):
        read_config.add_flags(argparse.ArgumentParser(), "delimiter")
    with pytest.raises(ValueError, match="not bound"):
        read_config.add_flags(argparse.ArgumentParser(), "encoding", notes={"text_column": "x"})
    p = argparse.ArgumentParser()
    assert read_config.add_flags(p, "encoding", "text_column") == ["text_column", "encoding"]  # the config's order
    args = p.parse_args(["--encoding", "cp1252"])
    assert (args.encoding, args.text_column) == ("cp1252", "text")
