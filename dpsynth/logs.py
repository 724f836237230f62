"""Logging set-up shared by the command-line entry points.

Two jobs:

* `OptionalExtrasFilter` drops the one warning that Apache Beam logs at import when its
  optional Google Cloud extras are not installed ("apitools not found, and bigquery client
  libraries are not available ..."). dpsynth never uses BigQuery, and users read the line as a
  broken install. The filter matches that message only: every other warning still shows.
  `dpsynth/__init__.py` installs it on the root logger (Beam logs it there) before anything
  imports Beam.
* `configure()` sets up the root logger for a CLI run. It uses `force=True` because Beam's
  import-time `logging.warning` call configures the root logger implicitly when nothing has
  yet, which would otherwise turn the entry point's own `basicConfig` into a no-op and hide its
  INFO progress lines.

A user sees only the project's own lines by default: dpsynth's loggers (`PROJECT_LOGGER` and
below) log at `level`, every other library (JAX's "Unable to initialize backend 'tpu'", Apache
Beam's INFO notices, Orbax, absl) at WARNING and above only. `--verbose` (`add_flags`) shows the
libraries' INFO lines too. Every entry point parses its flags first, then calls
`configure(..., verbose=args.verbose)` before it imports JAX or Beam modules that log.
"""

from __future__ import annotations

import logging

# Prefixes of import-time messages from optional extras of our dependencies.
OPTIONAL_EXTRAS_MESSAGES = ("apitools not found, and bigquery client libraries are not available",)


class OptionalExtrasFilter(logging.Filter):
    """Drops the import-time notices of optional extras that dpsynth does not use."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(OPTIONAL_EXTRAS_MESSAGES)


class ReraisedStepErrorFilter(logging.Filter):
    """Drops Apache Beam's ERROR log of a failing step (the error with its worker traceback).

    Beam logs it and then re-raises the same error from `Pipeline.run`, where the entry point
    prints it as one line (`dpsynth.errors.error_line`); the logged copy would put a traceback
    before it.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name.startswith("apache_beam.runners") and record.levelno >= logging.ERROR
                    and "[while running" in str(record.msg))


def install_filter() -> None:
    """Adds `OptionalExtrasFilter` to the root logger once (idempotent)."""
    root = logging.getLogger()
    if not any(isinstance(f, OptionalExtrasFilter) for f in root.filters):
        root.addFilter(OptionalExtrasFilter())


PROJECT_LOGGER = "dpsynth"  # every dpsynth module logs under this name
VERBOSE_HELP = "also show the INFO lines of the libraries (JAX, Apache Beam, Orbax, ...); default: dpsynth's own only"


def add_flags(parser) -> None:
    """Adds `--verbose` to an entry point's argparse parser."""
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)


def configure(level: int = logging.INFO, fmt: str = "%(message)s", *, verbose: bool = False) -> None:
    """Root logging for a CLI run on stderr, replacing any implicit set-up.

    dpsynth's own loggers log at `level`; the other libraries' at WARNING and above, or at
    `level` too with `verbose`.
    """
    logging.basicConfig(level=level if verbose else max(level, logging.WARNING), format=fmt, force=True)
    logging.getLogger(PROJECT_LOGGER).setLevel(level)
    install_filter()
    if not verbose:
        for handler in logging.getLogger().handlers:
            handler.addFilter(ReraisedStepErrorFilter())
