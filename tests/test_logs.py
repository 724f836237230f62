"""dpsynth.logs: a quiet start (no Beam optional-extras notice), genuine warnings kept."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ROOT})


def test_cli_starts_without_the_apitools_notice():
    proc = _run("import sys; from dpsynth.cli import main; sys.exit(main(['tokenize', '--help']))")
    assert proc.returncode == 0, proc.stderr
    assert "usage: dpsynth tokenize" in proc.stdout
    assert "apitools" not in proc.stderr and "bigquery" not in proc.stderr


def test_beam_import_is_quiet_but_other_warnings_show_and_info_logs_survive():
    proc = _run(
        "import logging, dpsynth\n"
        "import apache_beam\n"
        "from dpsynth import logs\n"
        "logs.configure()\n"
        "logging.getLogger('dpsynth.x').info('progress line')\n"
        "logging.warning('a genuine warning')\n")
    assert proc.returncode == 0, proc.stderr
    assert "apitools" not in proc.stderr
    assert "a genuine warning" in proc.stderr
    # The implicit root set-up at Beam's import must not swallow the entry point's INFO lines.
    assert "progress line" in proc.stderr


def _cli(args, tmp, **env):
    """`python -m dpsynth.cli ARGS` as a user runs it: no JAX_PLATFORMS pin (JAX probes for a TPU)."""
    environ = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    environ.update(PYTHONPATH=ROOT, **env)
    proc = subprocess.run([sys.executable, "-m", "dpsynth.cli", *args], cwd=str(tmp), capture_output=True, text=True,
                          timeout=300, env=environ)
    return proc, proc.stdout + proc.stderr


@pytest.mark.slow  # make test-slow: ~48 s of subprocess commands
def test_commands_show_only_the_projects_lines_unless_verbose(tmp_path):
    """Issue 23, finding 11: every JAX command printed "Unable to initialize backend 'tpu' ...", and
    `dpsynth evaluate --help` an `INFO apache_beam.io.gcp.bigquery` line."""
    proc, out = _cli(["evaluate", "--help"], tmp_path)
    assert proc.returncode == 0 and "usage: dpsynth evaluate" in out
    assert "INFO apache_beam" not in out and not any(line.startswith("INFO") for line in out.splitlines()), out
    train = tmp_path / "t.jsonl"
    train.write_text('{"text": "a b", "label": "x"}\n{"text": "c d", "label": "y"}\n')
    # A JAX command that initialises the backends and then fails on its input: only its own error line.
    proc, out = _cli(["dp-tune", "--base", "missing", "--train", str(train), "--out", "o", "--batch-size", "1",
                      "--steps", "1"], tmp_path)
    assert proc.returncode == 2 and "dpsynth dp-tune: error:" in out
    assert "Unable to initialize backend" not in out and "xla_bridge" not in out, out
    assert [line for line in out.splitlines() if line.strip()] == [out.strip()]  # one line, the project's
    # --verbose shows the libraries' INFO lines again.
    args = ["evaluate", "--synthetic", "nothing", "--real-train", str(train), "--real-test", str(train), "--out", "e"]
    quiet, out_quiet = _cli(args, tmp_path)
    loud, out_loud = _cli(args + ["--verbose"], tmp_path)
    assert quiet.returncode == loud.returncode == 2 and "dpsynth evaluate: error" in out_quiet
    assert "INFO apache_beam" not in out_quiet and "INFO apache_beam" in out_loud
