"""The one base of dpsynth's user errors, and the one place that prints them.

Every error dpsynth raises for something the user can fix (bad input, bad config, bad state
such as a privacy budget that would be exceeded) is a `DpsynthError`, also keeping its
standard base (`class TuneError(DpsynthError, ValueError)`) so `except ValueError` still
catches it. A command prints one as one line on stderr, `dpsynth COMMAND: error: MESSAGE`,
and exits with `EXIT_USER_ERROR`; `command` wraps each entry point's `main` so that holds
however it is called (`dpsynth COMMAND`, `python -m`, a test calling `main(argv)`).

This module imports nothing from dpsynth: every module may import it.
"""

from __future__ import annotations

import functools
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
    printed by `report` and `main` returns `EXIT_USER_ERROR`; anything else propagates (a bug:
    the traceback is wanted).
    """
    caught = (DpsynthError, *also)

    def wrap(main: Callable) -> Callable:
        @functools.wraps(main)
        def wrapped(argv: list[str] | None = None) -> int:
            try:
                return main(argv)
            except caught as e:
                return report(name, e)

        return wrapped

    return wrap
