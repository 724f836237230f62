"""The releasable model directory is complete only when its manifest is there, and the manifest is written last.

A model directory (`dpsynth.models.directory` layout) is COMPLETE when `manifest.json` exists.
The trainers write everything else first (the variables, the tokenizer, the config and, for a
DP-tuned model, its final privacy report) and the manifest last, atomically (a temporary file
renamed into place: `dpsynth.fileio`). The DP tuner's manifest also records the SHA-256 of the
privacy report it was released with (`REPORT_SHA256`), so a report that does not belong to the
model (left by an interrupted later run, or edited) makes the directory incomplete as well.

So a run killed while it writes its outputs leaves a directory without a manifest: nothing
loads it (`directory.load_model`, `generate`), `status` says what happened, and a rerun with
`--resume` rewrites it from the final checkpoint (its message says so). Before a run rewrites
a directory that is already complete (a resumed run that had finished), `unmark` removes the
manifest first, so a crash in the middle of the rewrite cannot leave a complete-looking mix.
"""

from __future__ import annotations

import os

from dpsynth import fileio
from dpsynth.dp import report as report_lib
from dpsynth.errors import DpsynthError

MANIFEST = "manifest.json"
REPORT_JSON = report_lib.REPORT_JSON
REPORT_SHA256 = "privacy_report_sha256"  # manifest field: the report the model was released with
MODEL_FILES = ("variables", "config.json", "tokenizer.model", "tokenizer.json")


class ReleaseError(DpsynthError, ValueError):
    """A directory that must not be written into (it holds a finished model of another run)."""


def status(directory: str) -> str | None:
    """None when `directory` is absent, holds no model yet, or is complete; else what is wrong (one sentence)."""
    if not os.path.isdir(directory):
        return None
    manifest_path = os.path.join(directory, MANIFEST)
    if os.path.exists(manifest_path):
        try:
            manifest = fileio.read_json(manifest_path)
        except ValueError:
            return "its manifest.json is not valid JSON (a run stopped while writing it?); it is incomplete"
        want = manifest.get(REPORT_SHA256)
        report = os.path.join(directory, REPORT_JSON)
        if want and (not os.path.exists(report) or fileio.sha256_file(report) != want):
            return ("its privacy_report.json is not the one its manifest was released with (a later run was "
                    "interrupted in it, or it was edited); it is incomplete: never release it as is")
        return None
    if any(os.path.exists(os.path.join(directory, name)) for name in MODEL_FILES):
        return ("it holds model files but no manifest.json: a run stopped while writing its outputs (incomplete; "
                "never release it as is)")
    return None


def is_complete(directory: str) -> bool:
    """Whether `directory` holds a complete model directory (its manifest, matching its privacy report)."""
    return os.path.exists(os.path.join(directory, MANIFEST)) and status(directory) is None


def check_fresh_run(directory: str) -> str | None:
    """Before a fresh run (not a resume) writes into `directory`.

    Raises:
        ReleaseError: `directory` holds a finished model (its privacy report would be replaced
            by this run's while its manifest and weights stayed).
    Returns:
        What is wrong with a half-written `directory` (this run will replace it), or None.
    """
    if os.path.exists(os.path.join(directory, MANIFEST)) and status(directory) is None:
        raise ReleaseError(f"{directory}: holds a finished model (manifest.json); a new run would mix its privacy "
                           "report with that model: choose a new --out, or delete the directory")
    return status(directory)


def unmark(directory: str) -> None:
    """Removes the manifest before a directory's model is rewritten (it is written again last)."""
    path = os.path.join(directory, MANIFEST)
    if os.path.exists(path):
        os.remove(path)


def report_fields(directory: str) -> dict[str, str]:
    """The manifest field that ties a model to the privacy report written next to it (before the manifest)."""
    return {REPORT_SHA256: fileio.sha256_file(os.path.join(directory, REPORT_JSON))}
