"""Differential privacy: Poisson sampling, clipping, noise, accounting, ledger, privacy report, audit.

Only this package adds noise or spends privacy budget. `DPSGDStrategy` (the training core's DP
gradient strategy) is importable from here; submodules are imported lazily so that
`dpsynth privacy` starts without loading JAX.
"""

from __future__ import annotations

import importlib

__all__ = ["DPSGDStrategy"]


def __getattr__(name: str):
    if name == "DPSGDStrategy":
        return importlib.import_module("dpsynth.dp.strategy").DPSGDStrategy
    raise AttributeError(f"module 'dpsynth.dp' has no attribute {name!r}")
