"""The privacy ledger: every DP mechanism run on the sensitive data, as JSON-able entries.

A ledger is an ordered list of entries; their composition (`events()`) is what the
accountants analyse. Entry kinds:

* `{"mechanism": "dpsgd", "name", "sampling_probability", "noise_multiplier", "steps",
  "clip_norm", "dataset_size", "max_batch_size"}`: `steps` DP-SGD steps (Poisson-subsampled
  Gaussian, truncated Poisson if `max_batch_size` is set). Consecutive steps with the same
  parameters are merged into one entry (the count grows).
* `{"mechanism": "bandmf", "name", "sampling_probability", "noise_multiplier", "steps", "clip_norm",
  "dataset_size", "max_batch_size" (null), "bands", "strategy_sha256"}`: `steps` BandMF steps with
  `bands` bands and cyclic Poisson sampling (rate q within the eligible group), accounted as
  ceil(steps / bands) subsampled Gaussian participations (`dpsynth.dp.bandmf`); the strategy
  matrix is identified by its SHA-256. Merged like DP-SGD steps.
* Entries of other registered mechanisms (`dpsynth.dp.mechanisms`) have the DP-SGD fields plus
  their own (the mechanism's `entry_fields`), and are accounted by its `event`.
* DP-SGD and BandMF entries of a user-level run carry `"unit": "user"` (`dataset_size` is then
  the number of users); entries without it are example-level.
* `{"mechanism": "gaussian", "name", "noise_multiplier", "count"}`: `count` Gaussian
  mechanisms of L2 sensitivity 1 (noise std = noise_multiplier * sensitivity), e.g. the
  generator's DP label histogram.
* `{"mechanism": "exponential", "name", "epsilon", "candidates", "dataset"}`: one pure
  epsilon-DP selection (`dpsynth.dp.private_selection`), accounted by `accounting.exponential_event`.
* `{"mechanism": "nonprivate", "name"}`: anything released without DP (epsilon = inf).
* Any entry may carry `"dataset"` (default "D_train"): the part of D it reads, e.g. "D_valid" for
  a DP selection; `dpsynth.dp.private_selection.guarantee` composes the parts in parallel when the
  split is data-independent. `epsilons()` always composes every entry (sequential, an upper bound).
* Every recorded entry carries `"run"`: a random id (`new_run_id`, 128 bits from the OS entropy
  pool, independent of the data and of every seed) of the execution of the mechanism that made it:
  one ledger object's recordings (one tuning process, from its start or its resume), one DP label
  histogram draw, one DP selection. Two copies of an entry with the same run id and content are ONE
  release (a model's tuning in the reports of its many corpora); identical entries with different
  run ids are separate releases (two tunings with the same settings), which
  `private_selection.tuning_entries` must both count. Entries written before run ids existed
  lack the field.

Resume semantics: the tuner saves the ledger in every checkpoint together with the step
counter it belongs to (`steps_recorded` must equal the training step), and a resumed run
reloads it: no step is counted twice or skipped (tested). The budget is enforced with
`check_budget(planned)` before any step is run: a run that would end above the target
epsilon (by the chosen accountant) is refused before it starts, and on resume before it
continues.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import secrets
from collections.abc import Sequence
from typing import Any

import dp_accounting

from dpsynth import fileio
from dpsynth.dp import accounting, mechanisms
from dpsynth.errors import DpsynthError

FORMAT = "dpsynth.privacy_ledger"
FORMAT_VERSION = 1
# Relative slack for the budget check: calibration returns sigma with epsilon <= target,
# this only absorbs float round-off between the calibration and the later re-check.
BUDGET_SLACK = 1e-6


class BudgetExceeded(DpsynthError, RuntimeError):
    """Running the planned mechanisms would exceed the privacy budget."""


def new_run_id() -> str:
    """A fresh id for one execution of a DP mechanism (see the module docstring's `"run"`)."""
    return secrets.token_hex(16)


def event_of(entry: dict, accountant: str | None = None) -> dp_accounting.DpEvent:
    """The event of one entry for `accountant` (only a DP selection's event depends on it)."""
    kind = entry["mechanism"]
    if mechanisms.is_training_entry(entry):  # training steps: the registered mechanism accounts them
        mech = mechanisms.get(kind)
        mech.check_entry(entry)
        return mech.event(entry)
    if kind == "gaussian":
        if entry["noise_multiplier"] <= 0:
            return dp_accounting.NonPrivateDpEvent()
        return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(entry["noise_multiplier"]), entry.get("count", 1))
    if kind == "nonprivate":
        return dp_accounting.NonPrivateDpEvent()
    if kind == "exponential":
        accounting.check_epsilon(entry["epsilon"])
        return accounting.exponential_event(entry["epsilon"], accountant)
    raise ValueError(f"unknown ledger entry mechanism {kind!r}")


@dataclasses.dataclass
class PrivacyLedger:
    """DP events spent on one sensitive dataset, with the budget they must stay within.

    Attributes:
        delta: the delta of the guarantee.
        target_epsilon: the budget (inf for a non-private run).
        accountant: the accountant the budget is enforced with ("rdp" or "pld").
        entries: the ledger entries (see module docstring).
        run: the run id this object stamps on the entries it records (fresh per object: a resumed
            run's later steps get a new one, so two continuations of one checkpoint stay two).
    """

    delta: float
    target_epsilon: float
    accountant: str = accounting.DEFAULT_ACCOUNTANT
    entries: list[dict] = dataclasses.field(default_factory=list)
    run: str = dataclasses.field(default_factory=new_run_id, compare=False, repr=False)

    def __post_init__(self):
        accounting.check_delta(self.delta)
        if not math.isinf(self.target_epsilon):
            accounting.check_epsilon(self.target_epsilon)
        if self.accountant not in accounting.ACCOUNTANTS:
            raise ValueError(f"unknown accountant {self.accountant!r}")

    # ------------------------------------------------------------------ recording
    def record_dpsgd(self, *, sampling_probability: float, noise_multiplier: float, steps: int, clip_norm: float,
                     dataset_size: int, max_batch_size: int | None = None, name: str = "dp_tune",
                     unit: str = "example") -> None:
        """Records `steps` example- (or `unit="user"`) level DP-SGD steps, merged into the last entry
        when parameters match. Other mechanisms: `record_steps(plan.ledger_entry(...))`."""
        entry = {"mechanism": "dpsgd", "name": name, "sampling_probability": float(sampling_probability),
                 "noise_multiplier": float(noise_multiplier), "clip_norm": float(clip_norm),
                 "dataset_size": int(dataset_size), "max_batch_size": max_batch_size, "steps": int(steps)}
        if unit != "example":
            entry["unit"] = unit
        self.record_steps(entry)

    def record_steps(self, entry: dict) -> None:
        """Records training steps of a registered mechanism (e.g. `PrivacyPlan.ledger_entry`), merged
        into the last entry when everything but the step count matches."""
        if not mechanisms.is_training_entry(entry):
            raise ValueError(f"record_steps takes training entries of {mechanisms.names()}, "
                             f"got {entry['mechanism']!r}")
        steps = entry["steps"]
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        event_of(entry)  # validates
        entry = {**copy.deepcopy(entry), "run": self.run}
        last = self.entries[-1] if self.entries else None
        if last is not None and {k: v for k, v in last.items() if k != "steps"} == {
                k: v for k, v in entry.items() if k != "steps"}:
            last["steps"] += int(steps)
        else:
            self.entries.append(entry)

    def record_gaussian(self, *, noise_multiplier: float, name: str, count: int = 1, run: str | None = None) -> None:
        """Records `count` Gaussian mechanisms with L2 sensitivity 1 (e.g. a DP label histogram).

        `run`: the id of the draw (e.g. `LabelDistribution.run`), so that one draw composed into
        several reports counts once; default this ledger's."""
        if noise_multiplier < 0:
            raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
        if self.privacy_unit == "user":
            raise ValueError(f"{name}: a Gaussian mechanism of sensitivity 1 per example cannot be composed into a "
                             "user-level ledger (one user may change several counts); it would overstate the guarantee")
        self.entries.append({"mechanism": "gaussian", "name": name, "noise_multiplier": float(noise_multiplier),
                             "count": int(count), "run": run or self.run})

    def record_selection(self, entry: dict) -> None:
        """Records a DP selection's entry (`private_selection.DpSelection.ledger_entry`), stamped with
        this ledger's run id unless it has one."""
        if entry["mechanism"] not in ("exponential", "gaussian"):
            raise ValueError(f"not a selection entry: {entry['mechanism']!r}")
        event_of(entry)  # validates
        self.entries.append({"run": self.run, **copy.deepcopy(entry)})

    def record_nonprivate(self, name: str) -> None:
        self.entries.append({"mechanism": "nonprivate", "name": name, "run": self.run})

    @property
    def privacy_unit(self) -> str:
        """"user" if any training entry is user-level, else "example"."""
        return "user" if any(e.get("unit") == "user" for e in self.entries) else "example"

    @property
    def steps_recorded(self) -> int:
        """Number of training steps in the ledger (must equal the training step on resume)."""
        return sum(e["steps"] for e in self.entries if mechanisms.is_training_entry(e))

    # ------------------------------------------------------------------ accounting
    def events(self, extra: Sequence[dict] = (), accountant: str | None = None) -> list[dp_accounting.DpEvent]:
        return [event_of(e, accountant) for e in list(self.entries) + list(extra)]

    def epsilon(self, accountant: str | None = None, extra: Sequence[dict] = ()) -> float:
        """Epsilon spent (plus `extra` planned entries) by one accountant."""
        accountant = accountant or self.accountant
        return accounting.epsilon_of_events(self.events(extra, accountant), self.delta, accountant)

    def epsilons(self, extra: Sequence[dict] = ()) -> dict[str, float | None]:
        """Epsilon from every accountant (None where an accountant cannot analyse the events)."""
        out: dict[str, float | None] = {}
        for name in accounting.ACCOUNTANTS:
            try:
                out[name] = self.epsilon(name, extra)
            except accounting.UnsupportedByAccountant:
                out[name] = None
        return out

    def check_budget(self, planned: Sequence[dict] = ()) -> float:
        """Raises BudgetExceeded unless spent + planned stays within the target epsilon.

        Returns the epsilon (by the ledger's accountant) after the planned entries.
        """
        eps = self.epsilon(extra=planned)
        if math.isinf(self.target_epsilon):
            return eps
        if eps > self.target_epsilon * (1 + BUDGET_SLACK):
            raise BudgetExceeded(
                f"privacy budget exceeded: spent + planned epsilon = {eps:.4f} ({self.accountant.upper()}, "
                f"delta {self.delta:.3g}) > target epsilon {self.target_epsilon}. Refusing to run; "
                f"ledger has {len(self.entries)} entries, {self.steps_recorded} DP-SGD steps."
            )
        return eps

    # ------------------------------------------------------------------ persistence
    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "delta": self.delta,
                "target_epsilon": _num(self.target_epsilon), "accountant": self.accountant,
                "entries": copy.deepcopy(self.entries)}

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "ledger") -> "PrivacyLedger":
        if data.get("format") != FORMAT:
            raise ValueError(f"{where}: not a privacy ledger (format {data.get('format')!r})")
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{where}: ledger format version {data.get('format_version')} is not {FORMAT_VERSION}")
        ledger = cls(delta=float(data["delta"]), target_epsilon=_unnum(data["target_epsilon"]),
                     accountant=data["accountant"], entries=copy.deepcopy(list(data["entries"])))
        for e in ledger.entries:
            event_of(e)  # validates every entry
        return ledger

    def save(self, path: str) -> None:
        fileio.write_json(path, self.to_json(), indent=1, newline=False)

    @classmethod
    def load(cls, path: str) -> "PrivacyLedger":
        return cls.from_json(fileio.read_json(path), where=path)

    def copy(self) -> "PrivacyLedger":
        return PrivacyLedger.from_json(self.to_json())


def _num(x: float) -> float | str:
    """JSON has no inf: store it as the string "inf"."""
    return "inf" if math.isinf(x) else float(x)


def _unnum(x: float | str) -> float:
    return math.inf if x == "inf" else float(x)
