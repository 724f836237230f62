"""Owner-only files: where dpsynth keeps what must never travel with released artifacts.

Private state (non-DP audits such as the memorisation audit against D_train, non-DP
train/valid losses, and anything else computed from sensitive data without DP) is written
into directories created with mode 0700, as files created with mode 0600, whatever the
process's umask. A released directory (a model's `--out`, a synthetic corpus, a stage
directory of the experiment runner) never contains such a directory: `check_outside`
refuses a private path inside a released one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from dpsynth import fileio

DIR_MODE = fileio.PRIVATE_DIR_MODE
FILE_MODE = fileio.PRIVATE_FILE_MODE


def make_private_dir(path: str) -> str:
    """Creates `path` (and missing parents) and sets it to mode 0700; returns the path.

    Only the leaf is forced to 0700 (an existing parent keeps its mode; a parent created
    here is created 0700 too).
    """
    path = os.path.abspath(path)
    missing = []
    p = path
    while not os.path.exists(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        os.makedirs(d, mode=DIR_MODE, exist_ok=True)
        os.chmod(d, DIR_MODE)
    if not os.path.isdir(path):
        raise NotADirectoryError(f"{path}: exists and is not a directory")
    os.chmod(path, DIR_MODE)
    return path


def write_private_text(path: str, text: str) -> str:
    """Writes `text` to `path` atomically as a 0600 file in a 0700 directory; returns the path."""
    make_private_dir(os.path.dirname(os.path.abspath(path)))
    return fileio.write_text(path, text, mode=FILE_MODE)


def write_private_json(path: str, value: Any) -> str:
    """`write_private_text` of `value` as indented JSON."""
    return write_private_text(path, fileio.dumps_json(value))


def restrict_tree(path: str) -> str:
    """Sets every directory under (and including) the local `path` to 0700 and every file to 0600.

    For a tree written by other writers (Beam's file sinks) into a directory that was made
    private before they started (so nothing in it was ever reachable by others). Returns `path`.
    """
    os.chmod(path, DIR_MODE)
    for root, dirs, files in os.walk(path):
        for d in dirs:
            os.chmod(os.path.join(root, d), DIR_MODE)
        for f in files:
            p = os.path.join(root, f)
            if not os.path.islink(p):
                os.chmod(p, FILE_MODE)
    return path


def is_inside(path: str, directory: str) -> bool:
    """Whether `path` is `directory` or below it (symlinks resolved)."""
    p, d = os.path.realpath(path), os.path.realpath(directory)
    return os.path.commonpath([p, d]) == d


def check_outside(private_path: str, released_dir: str, what: str) -> None:
    """Raises ValueError if `private_path` lies inside the released directory `released_dir`."""
    if is_inside(private_path, released_dir):
        raise ValueError(f"{what} {private_path!r} is inside the released directory {released_dir!r}: private "
                         "state must live outside anything that may be published")


def check_report_location(out_dir: str, released_dir: str, what: str) -> None:
    """Raises ValueError unless the owner-only report directory `out_dir` lies outside `released_dir`
    (which may be published) and is (or can be made) a writable directory."""
    from dpsynth import outdir

    check_outside(out_dir, released_dir, what)
    outdir.check_writable(out_dir)


def make_report_dir(out_dir: str, released_dir: str, *, what: str, report_file: str, allowed: Iterable[str] = (),
                    foreign_hint: str = "") -> str:
    """Creates the owner-only report directory `out_dir` (0700) of a command that reads private data
    (`dpsynth audit`, `dpsynth probe`) after `check_report_location`, refusing one that holds
    `report_file` already or anything but the command's run files (`outdir.RUN_FILES`, held by
    `outdir.claim`) and the `allowed` names (its dead letters); returns its absolute path. Raises
    ValueError (one line)."""
    from dpsynth import outdir

    check_report_location(out_dir, released_dir, what)
    if os.path.exists(os.path.join(out_dir, report_file)):
        raise ValueError(f"{out_dir}: already holds {report_file}; choose another --out or delete it")
    ours = {*allowed, *outdir.RUN_FILES}
    foreign = sorted(set(os.listdir(out_dir)) - ours) if os.path.isdir(out_dir) else []
    if foreign:
        raise ValueError(f"{out_dir}: holds other files ({foreign[0]}, ...){foreign_hint}; choose another --out or "
                         "delete it")
    return make_private_dir(out_dir)
