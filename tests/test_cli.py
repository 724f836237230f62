"""Tests for dpsynth.cli: the dispatcher and `--help` of every command whose module exists."""

import importlib
import subprocess
import sys

import pytest

from dpsynth import cli


def _available():
    out = []
    for name, (target, _) in cli.COMMANDS.items():
        module = target.split(":")[0]
        try:
            importlib.util.find_spec(module)
        except ModuleNotFoundError:
            continue
        if importlib.util.find_spec(module) is not None:
            out.append(name)
    return out


def test_usage_lists_every_command(capsys):
    assert cli.main([]) == 0
    text = capsys.readouterr().out
    assert all(name in text for name in cli.COMMANDS)
    assert cli.main(["no-such-command"]) == 2


@pytest.mark.parametrize("name", ["tokenizer", "tokenize", "dedup"])
def test_my_commands_exist(name):
    assert name in _available()


@pytest.mark.parametrize("name", _available())
def test_help_of_every_available_command(name, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([name, "--help"])
    assert e.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_help_through_a_subprocess():
    proc = subprocess.run([sys.executable, "-m", "dpsynth.cli", "dedup", "--help"], capture_output=True, text=True,
                          cwd=str(cli.__file__).rsplit("/dpsynth/", 1)[0], timeout=120)
    assert proc.returncode == 0 and "--min-tokens" in proc.stdout and "--sensitive" in proc.stdout


def test_tokenizer_train_help_has_flags(capsys):
    with pytest.raises(SystemExit):
        cli.main(["tokenizer", "train", "--help"])
    out = capsys.readouterr().out
    assert "--corpus" in out and "--vocab-size" in out and "--out" in out
