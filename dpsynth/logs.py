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
"""

from __future__ import annotations

import logging

# Prefixes of import-time messages from optional extras of our dependencies.
OPTIONAL_EXTRAS_MESSAGES = ("apitools not found, and bigquery client libraries are not available",)


class OptionalExtrasFilter(logging.Filter):
    """Drops the import-time notices of optional extras that dpsynth does not use."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(OPTIONAL_EXTRAS_MESSAGES)


def install_filter() -> None:
    """Adds `OptionalExtrasFilter` to the root logger once (idempotent)."""
    root = logging.getLogger()
    if not any(isinstance(f, OptionalExtrasFilter) for f in root.filters):
        root.addFilter(OptionalExtrasFilter())


def configure(level: int = logging.INFO, fmt: str = "%(message)s") -> None:
    """Root logging for a CLI run: `level`, `fmt` on stderr, replacing any implicit set-up."""
    logging.basicConfig(level=level, format=fmt, force=True)
    install_filter()
