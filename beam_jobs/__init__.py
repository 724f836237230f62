"""Thin Beam entry points (options + pipeline assembly); each exposes `run` and `main`."""

import dpsynth  # noqa: F401  (installs the log filter of dpsynth.logs before Beam is imported)
