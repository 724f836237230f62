"""dpsynth.logs: a quiet start (no Beam optional-extras notice), genuine warnings kept."""

import os
import subprocess
import sys

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
