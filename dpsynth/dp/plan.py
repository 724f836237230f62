"""The privacy plan: one home for turning a run's sizes and target into q, T, delta and sigma.

Every DP-SGD run in dpsynth (the DP tuner, the experiment runner's dry run, the DP-on-real
baseline classifier, the `dpsynth privacy` calculator) calls `plan_privacy`, so that what is
planned, what is shown before a run and what is accounted after it are the same numbers.

    plan = plan_privacy(dataset_size=N, expected_batch_size=B, epochs=10, epsilon=3.0)
    plan.noise_multiplier       # sigma, from the accountant only
    plan.ledger_entry(steps=1)  # what one step records in the ledger

`compositions = k` calibrates one run so that k runs with the same (q, T, sigma) together meet
the target (a hyperparameter sweep of k trials on the same data): k self-composed runs of T
Poisson-subsampled Gaussian steps are exactly k T such steps, so sigma is calibrated for k T.

Mechanisms and units: the mechanism (`dpsynth.dp.mechanisms`, e.g. "dpsgd" or "bandmf" with
`bands=b`: cyclic Poisson sampling, q = B / floor(N / b) within the eligible group and ceil(T / b)
accounted participations) decides q and the DP event; `privacy_unit="user"` plans user-level DP, where N is the number of
users, B the expected users per step and delta defaults to 1 / |users| (`dpsynth.dp.users`).

Formal guarantee: a run that executes the plan (Poisson sampling with rate q, per-example
clipping to C, noise N(0, sigma^2 C^2) on the sum, T steps), composed with the other
`compositions - 1` runs of the same plan, is (target_epsilon, delta)-DP under add-or-remove
adjacency, by the accountant's theorem (`dpsynth.dp.accounting`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from typing import Any

import dp_accounting

from dpsynth.dp import accounting, mechanisms
from dpsynth.dp.users import PRIVACY_UNITS

# The fields whose change between a checkpoint and a resume changes what is accounted.
PLAN_FIELDS = ("dataset_size", "expected_batch_size", "steps", "noise_multiplier", "target_epsilon", "delta",
               "accountant", "max_batch_size", "compositions", "mechanism", "bands", "privacy_unit",
               "spent", "reserved")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrivacyPlan:
    """Everything the accountant decides before the first step.

    Attributes:
        dataset_size: N, the number of privacy units (examples, or users) in the training set.
        expected_batch_size: B = q N (Poisson sampling; q floor(N / b) for BandMF).
        sampling_probability: q = B / N (B / floor(N / b) for BandMF).
        steps: T, DP-SGD steps of one run.
        delta: the delta of the guarantee (1 / N unless given).
        target_epsilon: the budget of all `compositions` runs together (inf: non-private).
        noise_multiplier: sigma (0 for a non-private run), from the accountant.
        accountant: "rdp" or "pld": what sigma is calibrated and the budget enforced with.
        max_batch_size: optional cap on the Poisson batch (truncated Poisson; PLD only).
        compositions: how many runs of this plan the target covers together (>= 1).
        mechanism: the registered mechanism (`dpsynth.dp.mechanisms`): "dpsgd" (iid noise) or
            "bandmf" (banded correlated noise, cyclic Poisson).
        bands: b, the mechanism's cycle length (BandMF's bands; 1 for DP-SGD).
        privacy_unit: "example" or "user".
        spent: ledger entries (`dpsynth.dp.ledger` format) spent on the same data before the run,
            e.g. the DP choice of the example length (`dpsynth.train.recipe.dp_example_length`):
            the target covers them and the run together (sigma is calibrated on their
            composition). Empty for most runs (then absent from `to_json`).
        reserved: ledger entries spent on the same data AFTER the run that the target covers too
            (a later DP selection on D_valid that composes sequentially with the run:
            `dpsynth.dp.private_selection.reserved_entry`). Sigma is calibrated on spent + run +
            reserved, so that the release holding them all meets the target; the run never records
            them (whoever spends them does). Empty for most runs (then absent from `to_json`).
    """

    dataset_size: int
    expected_batch_size: float
    sampling_probability: float
    steps: int
    delta: float
    target_epsilon: float
    noise_multiplier: float
    accountant: str = accounting.DEFAULT_ACCOUNTANT
    max_batch_size: int | None = None
    compositions: int = 1
    mechanism: str = mechanisms.DEFAULT
    bands: int = 1
    privacy_unit: str = "example"
    spent: tuple[dict, ...] = ()
    reserved: tuple[dict, ...] = ()

    @property
    def private(self) -> bool:
        return not math.isinf(self.target_epsilon)

    @property
    def epochs(self) -> float:
        """Expected passes over the data of all T steps (see `epochs_of`)."""
        return self.epochs_of(self.steps)

    def epochs_of(self, steps: int) -> float:
        """Expected passes over the data of `steps` steps: steps x B / N.

        Not steps x q: with BandMF, q = B / floor(N / b) is the rate within the one group of
        units eligible at a step, b times the share of all N that a step draws.
        """
        return steps * self.expected_batch_size / self.dataset_size

    def ledger_entry(self, *, steps: int, clip_norm: float, name: str = "dp_tune",
                     strategy_sha256: str | None = None) -> dict[str, Any]:
        """The ledger entry (`dpsynth.dp.ledger` format) of `steps` steps of this plan.

        BandMF entries need the strategy's `strategy_sha256` (`dpsynth.dp.bandmf`).
        """
        entry = self._entry(steps, self.noise_multiplier, clip_norm=clip_norm, name=name)
        entry.update(mechanisms.get(self.mechanism).entry_fields(cycle_length=self.bands,
                                                                  strategy_sha256=strategy_sha256))
        if self.privacy_unit != "example":
            entry["unit"] = self.privacy_unit
        return entry

    def _entry(self, steps: int, noise_multiplier: float, *, clip_norm: float = 1.0,
               name: str = "dp_tune") -> dict[str, Any]:
        """The common fields of a ledger entry of this plan."""
        return {"mechanism": self.mechanism, "name": name, "sampling_probability": self.sampling_probability,
                "noise_multiplier": noise_multiplier, "clip_norm": float(clip_norm),
                "dataset_size": self.dataset_size, "max_batch_size": self.max_batch_size, "steps": int(steps)}

    def event(self, steps: int, noise_multiplier: float, compositions: int = 1):
        """The DpEvent of `compositions` runs of `steps` steps of this plan at noise multiplier sigma."""
        entry = {**self._entry(steps, noise_multiplier), "bands": self.bands}  # what the mechanism's event reads
        return mechanisms.get(self.mechanism).event(entry, compositions=compositions)

    def epsilons(self, steps: int | None = None) -> dict[str, float | None]:
        """Epsilon of one run of `steps` (default: T) steps, after what was `spent`, from every accountant."""
        if not self.private:
            return {name: math.inf for name in accounting.ACCOUNTANTS}
        out: dict[str, float | None] = {}
        for name in accounting.ACCOUNTANTS:
            try:
                out[name] = accounting.epsilon_of_events(self.spent_events(name) + [
                    self.event(steps or self.steps, self.noise_multiplier)], self.delta, name)
            except accounting.UnsupportedByAccountant:
                out[name] = None
        return out

    def epsilon_with_reserved(self, accountant: str | None = None) -> float:
        """Epsilon of what was spent, one run of T steps (all `compositions`) and what is reserved,
        composed: what the release that spends the reservation will hold (<= the target)."""
        if not self.private:
            return math.inf
        acc = accountant or self.accountant
        run = self.event(self.steps, self.noise_multiplier, compositions=self.compositions)
        return accounting.epsilon_of_events(self.spent_events(acc) + [run] + self.reserved_events(acc), self.delta, acc)

    def spent_events(self, accountant: str | None = None) -> list:
        """The DpEvents of the `spent` entries, for `accountant`."""
        from dpsynth.dp import ledger

        return [ledger.event_of(e, accountant or self.accountant) for e in self.spent]

    def reserved_events(self, accountant: str | None = None) -> list:
        """The DpEvents of the `reserved` entries, for `accountant`."""
        from dpsynth.dp import ledger

        return [ledger.event_of(e, accountant or self.accountant) for e in self.reserved]

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["target_epsilon"] = "inf" if math.isinf(self.target_epsilon) else self.target_epsilon
        for name in ("spent", "reserved"):
            if not getattr(self, name):  # (absent when empty: the plans and fingerprints of runs without it hold)
                del d[name]
            else:
                d[name] = [dict(e) for e in getattr(self, name)]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PrivacyPlan:
        d = dict(d)
        d["target_epsilon"] = math.inf if d["target_epsilon"] == "inf" else float(d["target_epsilon"])
        d["spent"] = tuple(dict(e) for e in d.get("spent", ()))
        d["reserved"] = tuple(dict(e) for e in d.get("reserved", ()))
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})

    def differences(self, other: PrivacyPlan, *, rel_tol: float = 1e-9) -> list[tuple[str, Any, Any]]:
        """(field, self's value, other's value) for every accounted field that differs."""
        out = []
        for name in PLAN_FIELDS:
            a, b = getattr(self, name), getattr(other, name)
            if isinstance(a, float) and isinstance(b, float | int) and not isinstance(b, bool):
                same = a == b or math.isclose(a, float(b), rel_tol=rel_tol)
            else:
                same = a == b
            if not same:
                out.append((name, a, b))
        return out


def _memoized(plan_fn):
    """`plan_fn` computed once per distinct set of arguments in a process (its calibration is a
    bisection of about 20 accountant evaluations, and runs plan the same settings more than once).
    Each call gets its own copy of the plan's ledger entries."""
    cache: dict[str, PrivacyPlan] = {}

    @functools.wraps(plan_fn)
    def planned(**kwargs) -> PrivacyPlan:
        key = json.dumps(kwargs, sort_keys=True, default=repr)
        if key not in cache:
            if len(cache) >= 256:
                cache.pop(next(iter(cache)))
            cache[key] = plan_fn(**kwargs)
        plan = cache[key]
        return dataclasses.replace(plan, spent=tuple(dict(e) for e in plan.spent),
                                   reserved=tuple(dict(e) for e in plan.reserved))

    return planned


@_memoized
def plan_privacy(
    *,
    dataset_size: int,
    expected_batch_size: float,
    steps: int | None = None,
    epochs: float | None = None,
    epsilon: float | None = None,
    noise_multiplier: float | None = None,
    delta: float | None = None,
    accountant: str = accounting.DEFAULT_ACCOUNTANT,
    max_batch_size: int | None = None,
    compositions: int = 1,
    mechanism: str = mechanisms.DEFAULT,
    bands: int | None = None,
    privacy_unit: str = "example",
    allow_large_delta: bool = False,
    spent: tuple[dict, ...] = (),
    reserved: tuple[dict, ...] = (),
) -> PrivacyPlan:
    """The privacy plan of a DP-SGD (or BandMF) run.

    Args:
        dataset_size: N (>= 1): examples, or users with `privacy_unit="user"`.
        expected_batch_size: B; q = B / N must be in (0, 1] (BandMF: B / floor(N / b)).
        steps: T; or `epochs` (T = ceil(epochs N / B)). `steps` wins when both are given.
        epsilon: target epsilon of all `compositions` runs (math.inf: non-private, sigma 0);
            or `noise_multiplier`: a given sigma (the target is then its epsilon).
        delta: default 1 / N.
        accountant: "rdp" or "pld".
        max_batch_size: cap on the Poisson batch (PLD only).
        compositions: k >= 1 runs of this plan that the target covers together.
        mechanism: a registered mechanism's name (`dpsynth.dp.mechanisms`): "dpsgd" or "bandmf".
        bands: b >= 1 for "bandmf" (required there; b <= T and B <= floor(N / b)).
        privacy_unit: "example" or "user" (N and B then count users).
        allow_large_delta: accept a delta above 1/N (`accounting.weak_delta`; refused otherwise).
        spent: ledger entries already spent on the same data that the target must cover too
            (`PrivacyPlan.spent`); sigma is calibrated on their composition with the run.
        reserved: ledger entries to be spent on the same data after the run that the target must
            cover too (`PrivacyPlan.reserved`); composed in the calibration, never recorded by the run.

    Raises:
        accounting.PrivacyConfigError: bad or unreachable parameters.
    """
    if accountant not in accounting.ACCOUNTANTS:
        raise accounting.PrivacyConfigError(f"unknown accountant {accountant!r}; choose one of {accounting.ACCOUNTANTS}")
    if int(compositions) != compositions or compositions < 1:
        raise accounting.PrivacyConfigError(f"compositions must be a positive integer, got {compositions}")
    if (epsilon is None) == (noise_multiplier is None):
        raise accounting.PrivacyConfigError("give exactly one of epsilon and noise_multiplier")
    mech = mechanisms.get(mechanism)
    if privacy_unit not in PRIVACY_UNITS:
        raise accounting.PrivacyConfigError(f"unknown privacy unit {privacy_unit!r}; choose one of {PRIVACY_UNITS}")
    try:
        bands = mech.cycle_length(bands)
    except accounting.PrivacyConfigError as e:
        raise accounting.PrivacyConfigError(f"bands {e}") from None
    q_all = accounting.sampling_probability(dataset_size, expected_batch_size)
    if steps is None:
        if epochs is None:
            raise accounting.PrivacyConfigError("give steps or epochs")
        steps = accounting.steps_for_epochs(epochs, q_all)
    q = mech.sampling_probability(dataset_size=dataset_size, expected_batch_size=expected_batch_size,
                                  steps=int(steps), cycle_length=bands)
    accounting.check_sampling(q, steps)
    delta = accounting.check_delta_size(delta if delta is not None else 1.0 / dataset_size, dataset_size,
                                        unit="users" if privacy_unit == "user" else "examples",
                                        allow_large_delta=allow_large_delta)
    if max_batch_size is not None and accountant != "pld":
        raise accounting.PrivacyConfigError("a batch-size cap (truncated Poisson sampling) is only analysed by the "
                                            "PLD accountant")
    if max_batch_size is not None and not mech.supports_batch_cap:
        raise accounting.PrivacyConfigError(f"a batch-size cap is not supported with {mech.title}")
    plan = PrivacyPlan(dataset_size=int(dataset_size), expected_batch_size=q_all * dataset_size,
                       sampling_probability=q, steps=int(steps), delta=delta, target_epsilon=math.inf,
                       noise_multiplier=0.0, accountant=accountant, max_batch_size=max_batch_size,
                       compositions=int(compositions), mechanism=mechanism, bands=bands, privacy_unit=privacy_unit,
                       spent=tuple(dict(e) for e in spent), reserved=tuple(dict(e) for e in reserved))
    try:
        before = plan.spent_events(accountant)
    except (ValueError, KeyError) as e:
        raise accounting.PrivacyConfigError(f"spent: not a ledger entry ({e})") from None
    try:
        after = plan.reserved_events(accountant)
    except (ValueError, KeyError) as e:
        raise accounting.PrivacyConfigError(f"reserved: not a ledger entry ({e})") from None
    if any(isinstance(e, dp_accounting.UnsupportedDpEvent) for e in after):
        raise accounting.PrivacyConfigError(f"a reserved pure-DP selection is composed by the RDP accountant only, not "
                                            f"{accountant!r}: pass accountant rdp")

    def make_event(sigma: float):  # all k runs of the plan together, after what was spent, before what is reserved
        run = plan.event(int(steps), sigma, compositions=int(compositions))
        return dp_accounting.ComposedDpEvent(before + [run] + after) if before or after else run

    if epsilon is not None:
        target = float(epsilon)
        sigma = accounting.calibrate(make_event, target, delta, accountant,
                                     what=f"q = {q:.6g} and {int(compositions) * int(steps)} steps")
    else:
        sigma = float(noise_multiplier)
        if math.isnan(sigma) or sigma < 0:
            raise accounting.PrivacyConfigError(f"noise multiplier must be >= 0, got {sigma}")
        target = math.inf if sigma == 0 else accounting.epsilon_of_events([make_event(sigma)], delta, accountant)
    return dataclasses.replace(plan, target_epsilon=target, noise_multiplier=float(sigma))
