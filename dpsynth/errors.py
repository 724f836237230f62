"""The one base of dpsynth's user errors, and the one place that prints them.

Every error dpsynth raises for something the user can fix (bad input, bad config, bad state
such as a privacy budget that would be exceeded) is a `DpsynthError`, also keeping its
standard base (`class TuneError(DpsynthError, ValueError)`) so `except ValueError` still
catches it. A command prints one as one line on stderr, `dpsynth COMMAND: error: MESSAGE`,
and exits with `EXIT_USER_ERROR`; `command` wraps each entry point's `main` so that holds
however it is called (`dpsynth COMMAND`, `python -m`, a test calling `main(argv)`).

A full disk (or quota) is a user error too: `fileio`'s writers raise `DiskFullError` naming the
file ("no space left on device writing PATH"), and `command` also reports as one line an
`ENOSPC`/`EDQUOT` `OSError` that escaped elsewhere, or one that Apache Beam re-raised from a
pipeline step wrapped in a `RuntimeError` (it keeps the original as `__context__`).

This module imports nothing from dpsynth: every module may import it.
"""

from __future__ import annotations

import errno
import functools
import re
import sys
from collections.abc import Callable

EXIT_USER_ERROR = 2  # a command's exit status on a `DpsynthError` (argparse's for bad flags, too)


class DpsynthError(Exception):
    """Base of every error dpsynth raises for something the user can fix (bad input, bad config,
    bad state such as a budget that would be exceeded); a command prints its message as one line
    and exits 2. `kind` is the word before the message (`dpsynth experiment: config error: ...`)."""

    kind = "error"


class MissingFileError(DpsynthError, FileNotFoundError):
    """A file or directory the user named (or one it must hold) does not exist; the message names it."""


DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_DISK_FULL_WORDS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}


class DiskFullError(DpsynthError, OSError):
    """A write failed because its file system is full (or over quota); the message names the file.
    Nothing is left under the file's final name (`dpsynth.fileio`): free space and rerun."""

    def __init__(self, message: str):
        super().__init__(message)
        self.errno = errno.ENOSPC

    @classmethod
    def of(cls, path: str, error: OSError | None = None) -> "DiskFullError":
        """The error of a failed write of `path` (`error`: the `OSError` it raised, for its errno)."""
        code = getattr(error, "errno", None)
        made = cls(f"{_DISK_FULL_WORDS.get(code, _DISK_FULL_WORDS[errno.ENOSPC])} writing {path}")
        if code in DISK_FULL_ERRNOS:
            made.errno = code
        return made

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "no space left on device"


def is_disk_full(error: BaseException) -> bool:
    """Whether `error` is a write's full-disk (or over-quota) `OSError`."""
    return isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS


# A `DiskFullError`'s message inside the text of a `RuntimeError` (a Beam worker in another process
# sends its error back as text only).
_DISK_FULL_TEXT = re.compile(r"DiskFullError: ((?:no space left on device|disk quota exceeded) writing .+?)"
                             r"(?: \[while running .*)?$", re.M)


def disk_full_in(error: BaseException) -> DiskFullError | None:
    """The full disk behind `error` (itself, or its `__cause__`/`__context__` chain: Apache Beam
    re-raises a step's error as a `RuntimeError`, or as a copy with the step's name appended; or
    the text of a `RuntimeError` from a worker process), as a `DiskFullError` (the innermost one:
    the original message); None if there is none."""
    found, seen, e = None, set(), error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, DiskFullError):
            found = e
        elif is_disk_full(e) and found is None:
            found = DiskFullError.of(e.filename if e.filename is not None else "a file", e)
        e = e.__cause__ or e.__context__
    if found is None and isinstance(error, RuntimeError) and (m := _DISK_FULL_TEXT.search(str(error))):
        found = DiskFullError(m.group(1))
    return found


def error_line(error: BaseException) -> str:
    """An error as the one line a command prints.

    The first line of the message (Apache Beam appends a worker's traceback to the message of
    an error it re-raises from a pipeline: the user needs the file, record and reason, not the
    traceback); for a file-system error with a file name, `FILE: REASON` (permission denied,
    disk full).
    """
    if isinstance(error, OSError) and error.filename is not None:
        text = f"{error.filename}: {error.strerror or error}"
    else:
        text = str(error).strip()
    return text.splitlines()[0].strip() if text else type(error).__name__


def report(command: str, error: BaseException) -> int:
    """Prints `error` as `dpsynth COMMAND: error: MESSAGE` on stderr; returns `EXIT_USER_ERROR`."""
    kind = error.kind if isinstance(error, DpsynthError) else DpsynthError.kind
    print(f"dpsynth {command}: {kind}: {error_line(error)}", file=sys.stderr)
    return EXIT_USER_ERROR


def command(name: str, *, also: tuple[type[BaseException], ...] = ()) -> Callable[[Callable], Callable]:
    """Decorates the entry point `main(argv) -> int` of `dpsynth NAME`.

    A `DpsynthError` (or one of `also`: the broader errors a command has always reported as
    one line, e.g. a `ValueError` of a library it calls, a missing file) escaping `main` is
    printed by `report` and `main` returns `EXIT_USER_ERROR`; so is a full disk (`disk_full_in`),
    however wrapped; anything else propagates (a bug: the traceback is wanted).
    """
    caught = (DpsynthError, *also)

    def wrap(main: Callable) -> Callable:
        @functools.wraps(main)
        def wrapped(argv: list[str] | None = None) -> int:
            try:
                return main(argv)
            except BaseException as e:
                full = disk_full_in(e) if isinstance(e, Exception) else None
                if full is not None:
                    return report(name, full)
                if isinstance(e, caught):
                    return report(name, e)
                raise

        return wrapped

    return wrap
