"""The interface of a DP training mechanism: one object bundles everything that depends on it.

A mechanism is how the steps of a private training run are sampled, noised and accounted.
Everything in dpsynth that depends on which mechanism runs asks its `Mechanism` object
(found by name in the registry, `dpsynth.dp.mechanisms`), never branches on the name:

| concern | method | used by |
|---|---|---|
| validate its settings | `cycle_length`, `check_plan` | `plan_privacy`, the configs |
| sampling rate | `sampling_probability` | `plan_privacy` |
| DP event (accounting) | `event` | the ledger, calibration, `PrivacyPlan.epsilons` |
| ledger entry fields | `entry_fields`, `check_entry` | `PrivacyPlan.ledger_entry`, the ledger |
| strategy and sampler | `build` | `dpsynth.dp.mechanisms.run.build_run_mechanism` |
| strategy identity | `planned_strategy_sha256` | dry run, resume checks |
| description | `describe`, `report_row`, `report_fields`, `training_fields`, `summary`, `plan_line` | reports, calculator, runner |

Adding a mechanism: one file with a `Mechanism` subclass, plus its line in the registry
(`REGISTRY` in `dpsynth/dp/mechanisms/__init__.py`), or `register()` for one defined elsewhere.
Formal guarantee: a subclass must make `event(entry)` the DpEvent of exactly what `build`
executes for `entry["steps"]` steps (same q, sigma, clipping norm and unit); its tests must
check that property.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import dp_accounting

from dpsynth.dp import accounting

# The fields every training-mechanism ledger entry has (`dpsynth.dp.ledger`).
ENTRY_FIELDS = ("mechanism", "name", "sampling_probability", "noise_multiplier", "clip_norm", "dataset_size",
                "max_batch_size", "steps")


@dataclasses.dataclass(frozen=True)
class Built:
    """What a run executes: the training core's gradient strategy and the unit sampler.

    Attributes:
        strategy: the strategy (`dpsynth.train.core`'s protocol: accumulate, finalize, ...).
        sampler: `.microbatches(step)` -> lists of unit index arrays (fixed shape, -1 padding).
        strategy_sha256: the identity of a data-independent strategy matrix, else None.
    """

    strategy: Any
    sampler: Any
    strategy_sha256: str | None = None


class Mechanism:
    """One DP training mechanism (see the module docstring). Subclasses set `name` and `title`."""

    name: str = ""
    title: str = ""  # how reports name one step: "DP-SGD", "BandMF"
    supports_batch_cap: bool = True  # truncated Poisson sampling (`max_batch_size`)
    supports_sparse_embedding: bool = False  # exact sparse clipping of an untied input table

    # ------------------------------------------------------------------ settings
    def cycle_length(self, bands: int | None) -> int:
        """The plan's cycle length (`PrivacyPlan.bands`) from the user's `bands` setting; raises
        `accounting.PrivacyConfigError` when the setting does not belong to this mechanism."""
        if bands not in (None, 1):
            raise accounting.PrivacyConfigError(f"is a BandMF setting (mechanism 'bandmf'), not one of mechanism "
                                                f"{self.name!r}")
        return 1

    def check_settings(self, *, bands: int | None, max_batch_size: int | None) -> tuple[str, str] | None:
        """(setting, message) for a setting a run of this mechanism cannot have (config time), else None."""
        try:
            self.cycle_length(bands)
        except accounting.PrivacyConfigError as e:
            return "bands", str(e)
        if max_batch_size is not None and not self.supports_batch_cap:
            return "max_batch_size", f"a batch-size cap is not supported with {self.title}"
        return None

    def sampling_probability(self, *, dataset_size: int, expected_batch_size: float, steps: int,
                             cycle_length: int) -> float:
        """q of one step (Poisson sampling over all N units by default)."""
        return accounting.sampling_probability(dataset_size, expected_batch_size)

    # ------------------------------------------------------------------ accounting
    def event(self, entry: Mapping[str, Any], compositions: int = 1) -> dp_accounting.DpEvent:
        """The DpEvent of `compositions` runs of the entry's `steps` steps."""
        raise NotImplementedError

    def entry_fields(self, *, cycle_length: int, strategy_sha256: str | None) -> dict[str, Any]:
        """Ledger-entry fields of this mechanism beyond `ENTRY_FIELDS` (and the unit)."""
        return {}

    def check_entry(self, entry: Mapping[str, Any]) -> None:
        """Raises ValueError for a ledger entry this mechanism cannot account."""

    # ------------------------------------------------------------------ execution
    def planned_strategy_sha256(self, plan, *, strategy_cache_dir: str | None = None) -> str | None:
        """The identity of the strategy a run of `plan` would use now (None: no strategy matrix)."""
        return None

    def build(self, plan, *, clip_norm: float, num_units: int, microbatch_size: int, seed: int,
              per_user: bool, strategy_cache_dir: str | None = None) -> Built:
        """The strategy and the sampler over `num_units` units that execute `plan`."""
        raise NotImplementedError

    def sparse_embedding_strategy(self, plan, *, clip_norm: float, embedding: Any) -> Any:
        """The example-level strategy of `plan` that clips an untied input table exactly and
        sparsely (`embedding`: `dpsynth.dp.strategy`'s embedding spec); only where
        `supports_sparse_embedding`."""
        raise NotImplementedError(f"{self.name} does not support sparse embedding clipping")

    # ------------------------------------------------------------------ description
    def describe(self, entry: Mapping[str, Any]) -> str:
        """How the markdown report names the entry's steps, e.g. "DP-SGD"."""
        return self.title

    def summary(self, cycle_length: int) -> str:
        """A short suffix for one-line descriptions of a run ("" for the default mechanism)."""
        return f", {self.title}"

    def plan_line(self, cycle_length: int) -> str | None:
        """The calculator's "mechanism" line (None: not shown, as for the default mechanism)."""
        return self.title

    def report_fields(self, *, cycle_length: int, strategy_sha256: str | None) -> dict[str, Any]:
        """The privacy report's top-level fields besides `mechanism` (e.g. BandMF's bands)."""
        return {}

    def report_row(self, report: Mapping[str, Any]) -> str | None:
        """The markdown report's "mechanism" table row (None: not shown, the default)."""
        return f"| mechanism | {self.title} |"

    def training_fields(self, *, cycle_length: int, strategy_sha256: str | None, per_user: bool) -> dict[str, Any]:
        """The report's `training` fields that describe sampling (besides mechanism and unit)."""
        return {}
