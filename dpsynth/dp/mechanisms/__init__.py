"""The registry of DP training mechanisms: name -> `Mechanism` (interface: `base.py`).

Everything that depends on the mechanism of a run (planning, calibration, ledger events,
strategy and sampler, reports, config validation) looks it up here by the name a config,
plan or ledger entry carries:

    mech = mechanisms.get(plan.mechanism)
    mech.event(entry)                    # the DpEvent of a ledger entry

Adding a mechanism: a file in this package with a `Mechanism` subclass and its line in
`REGISTRY` below (or `register(MyMechanism())` for one defined elsewhere, e.g. in a test).
`dpsynth.dp.mechanisms.run` builds what a training run executes from a plan.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from dpsynth.dp import accounting
from dpsynth.dp.mechanisms.bandmf import BandMF
from dpsynth.dp.mechanisms.base import Built, Mechanism
from dpsynth.dp.mechanisms.dpsgd import DPSGD

__all__ = ["DEFAULT", "REGISTRY", "Built", "Mechanism", "get", "is_training_entry", "names", "register",
           "registered"]

DEFAULT = "dpsgd"
REGISTRY: dict[str, Mechanism] = {m.name: m for m in (DPSGD(), BandMF())}


def names() -> tuple[str, ...]:
    """The registered mechanisms' names (the choices of every `mechanism` setting)."""
    return tuple(REGISTRY)


def get(name: str) -> Mechanism:
    """The mechanism called `name`; raises `accounting.PrivacyConfigError` naming the choices."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise accounting.PrivacyConfigError(f"unknown mechanism {name!r}; choose one of {names()}") from None


def register(mechanism: Mechanism) -> Mechanism:
    """Adds `mechanism` under its name (refused if the name is taken or empty)."""
    if not mechanism.name or mechanism.name in REGISTRY or mechanism.name in ("gaussian", "nonprivate"):
        raise ValueError(f"cannot register a mechanism named {mechanism.name!r}: the name is empty or taken")
    REGISTRY[mechanism.name] = mechanism
    return mechanism


@contextlib.contextmanager
def registered(mechanism: Mechanism) -> Iterator[Mechanism]:
    """`register(mechanism)` for the duration of a `with` block (tests)."""
    register(mechanism)
    try:
        yield mechanism
    finally:
        REGISTRY.pop(mechanism.name, None)


def is_training_entry(entry: Mapping[str, Any]) -> bool:
    """Whether a ledger entry records training steps of a registered mechanism."""
    return entry.get("mechanism") in REGISTRY
