"""Composition of every release about one sensitive dataset, exactly, with dp-accounting.

A publication usually holds more than one DP release about the same sensitive dataset: an
experiment root holds every DP-tuned model of a grid (each one's synthetic corpora are its
post-processing), every DP label histogram, every DP-on-real baseline classifier. Each release
has its own ledger (`dpsynth.dp.ledger` entries); whoever publishes several of them pays for
their composition, not for the largest one. `compose` puts the ledger entries of all the
releases into one ledger and asks the accountants (`dpsynth.dp.accounting`, i.e.
dp-accounting's RDP and PLD accountants) for its epsilon at one delta: exact composition of
the mechanisms that ran, never a sum of epsilons.

Formal guarantee: if each release ran exactly the mechanisms its ledger entries describe, each
with fresh independent randomness, then publishing all the DP releases together is
(epsilon, delta)-DP for the dataset, with epsilon = `Composition.epsilon[accountant]`
(add-or-remove adjacency). A release that is not DP (epsilon = inf: a non-private trial, a
classifier trained on the real data without noise) makes the whole publication non-private;
`Composition` then reports inf for everything and, separately, the composed epsilon of the DP
releases alone, naming the non-private ones.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from dpsynth.dp import accounting, mechanisms
from dpsynth.dp.ledger import PrivacyLedger


@dataclasses.dataclass(frozen=True)
class Release:
    """One artifact released about a sensitive dataset, with its ledger entries.

    Attributes:
        name: what is released (e.g. `dp_tune[lora-eps3-lr0.001-C1]`).
        kind: "dp_tune", "label_histogram", "dp_on_real", "real_baseline", ...
        entries: its ledger entries (`dpsynth.dp.ledger` format); a `nonprivate` entry (or a
            DP-SGD entry with noise multiplier 0) makes it non-private.
        dataset: the sensitive dataset it is about (default "D_train").
    """

    name: str
    kind: str
    entries: tuple[Mapping[str, Any], ...]
    dataset: str = "D_train"

    def ledger(self, delta: float) -> PrivacyLedger:
        return PrivacyLedger(delta=delta, target_epsilon=math.inf, entries=[dict(e) for e in self.entries])

    def epsilons(self, delta: float) -> dict[str, float | None]:
        """This release's own epsilon at `delta`, by every accountant."""
        return self.ledger(delta).epsilons()

    @property
    def private(self) -> bool:
        return not any(e["mechanism"] == "nonprivate" or ((mechanisms.is_training_entry(e) or e["mechanism"] == "gaussian")
                                                            and float(e["noise_multiplier"]) == 0.0)
                       for e in self.entries)

    @property
    def unit(self) -> str:
        """"user" when its DP-SGD/BandMF entries are user-level, else "example"."""
        return "user" if any(e.get("unit") == "user" for e in self.entries) else "example"


def nonprivate(name: str, kind: str, dataset: str = "D_train") -> Release:
    """A release without DP (epsilon = inf)."""
    return Release(name=name, kind=kind, entries=({"mechanism": "nonprivate", "name": name},), dataset=dataset)


@dataclasses.dataclass(frozen=True)
class Composition:
    """The composed cost of a set of releases about one dataset.

    Attributes:
        dataset: the sensitive dataset.
        delta: the delta all epsilons are given at.
        epsilon: epsilon of publishing ALL the releases, per accountant (inf if any is not DP).
        epsilon_dp_releases: epsilon of the DP releases alone, per accountant.
        releases: how many releases were composed; dp_releases: how many of them are DP.
        nonprivate: names of the releases that are not DP.
        counts: releases per kind.
    """

    dataset: str
    delta: float
    epsilon: dict[str, float | None]
    epsilon_dp_releases: dict[str, float | None]
    releases: int
    dp_releases: int
    nonprivate: tuple[str, ...]
    counts: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        def num(x):
            return None if x is None else ("inf" if math.isinf(x) else float(x))

        return {"dataset": self.dataset, "delta": self.delta, "epsilon": {k: num(v) for k, v in self.epsilon.items()},
                "epsilon_dp_releases": {k: num(v) for k, v in self.epsilon_dp_releases.items()},
                "releases": self.releases, "dp_releases": self.dp_releases, "nonprivate": list(self.nonprivate),
                "counts": dict(self.counts)}


def compose(releases: Sequence[Release], delta: float, dataset: str = "D_train") -> Composition:
    """Composes every release about `dataset` at `delta` (exact, by each dp-accounting accountant).

    Raises:
        accounting.PrivacyConfigError: a bad delta.
        ValueError: user-level and example-level releases mixed (no common unit of privacy).
    """
    delta = accounting.check_delta(delta)
    mine = [r for r in releases if r.dataset == dataset]
    units = {r.unit for r in mine if r.private}
    if len(units) > 1:  # an example-level guarantee does not compose into a user-level one (nor the reverse)
        raise ValueError(f"{dataset}: releases with user-level and example-level guarantees cannot be composed "
                         f"into one epsilon: {', '.join(f'{r.name} ({r.unit})' for r in mine if r.private)}")
    dp = [r for r in mine if r.private]
    dp_entries = [dict(e) for r in dp for e in r.entries]
    eps_dp = PrivacyLedger(delta=delta, target_epsilon=math.inf, entries=dp_entries).epsilons()
    bad = tuple(r.name for r in mine if not r.private)
    eps_all = {k: math.inf for k in eps_dp} if bad else dict(eps_dp)
    counts: dict[str, int] = {}
    for r in mine:
        counts[r.kind] = counts.get(r.kind, 0) + 1
    return Composition(dataset=dataset, delta=delta, epsilon=eps_all, epsilon_dp_releases=eps_dp, releases=len(mine),
                       dp_releases=len(dp), nonprivate=bad, counts=counts)
