"""The DP mechanism of one training run: strategy, batches and ledger entries, chosen by the plan.

A trainer asks this module for everything that depends on the privacy unit and the mechanism,
so it never builds a strategy or a sampler by hand:

    plan = plan_privacy(..., privacy_unit="user", mechanism="bandmf", bands=4)
    mech = build_run_mechanism(plan, clip_norm=C, microbatch_size=32, seed=secret_seed,
                               num_rows=len(rows), user_ids=[r["user"] for r in rows], max_examples_per_user=8)
    fns = core.make_train_functions(loss_fn, optimizer, mech.strategy)
    for step in range(T):
        state, _ = fns.accumulated_step(state, mech.microbatches(arrays, step))
        ledger.record_steps(mech.ledger_entry(1))

The mechanism (`plan.mechanism`, from the registry `dpsynth.dp.mechanisms`) builds the strategy
and the sampler over units; this module adds the privacy unit: at example level the units are
rows; at user level they are users (`users.group_by_user` bounds each to K rows with the secret
seed, and `users.UserBatches` turns sampled users into [users, W] row-slot matrices; the
strategy clips each user's mean gradient).

Formal guarantee: the combination executes exactly the mechanism `plan` accounts (see the
mechanism's module); a user-level plan must have `dataset_size` = the number of distinct users.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpsynth.dp import mechanisms, sampling, users
from dpsynth.dp.plan import PrivacyPlan


def count_users(user_ids: Sequence) -> int:
    """The number of distinct users (ids compared as strings); raises on a missing id."""
    for i, u in enumerate(user_ids):
        if u is None or (isinstance(u, str) and not u.strip()):
            raise users.UserColumnError(f"row {i}: missing or empty user id")
    return len({str(u) for u in user_ids})


@dataclasses.dataclass(frozen=True)
class RunMechanism:
    """What a training run executes for its plan (see the module docstring).

    Attributes:
        plan: the privacy plan.
        clip_norm: C.
        strategy: the training core's gradient strategy.
        batches: `.microbatches(step)` -> index arrays (1-D rows, or [users, W] slot matrices).
        groups: the bounded user groups (user level), else None.
        strategy_sha256: the identity of the mechanism's strategy matrix (BandMF), else None.
    """

    plan: PrivacyPlan
    clip_norm: float
    strategy: Any
    batches: Any
    groups: users.UserGroups | None = None
    strategy_sha256: str | None = None

    @property
    def mechanism(self) -> mechanisms.Mechanism:
        return mechanisms.get(self.plan.mechanism)

    @property
    def per_user(self) -> bool:
        return self.plan.privacy_unit == "user"

    @property
    def rows_per_microbatch(self) -> int:
        """The leading dimension of every microbatch: rows, or users at user level."""
        return self.batches.rows_per_microbatch if self.per_user else self.batches.microbatch_size

    def microbatches(self, examples: dict[str, np.ndarray], step: int) -> list[dict[str, np.ndarray]]:
        """The host microbatches of `step` (padded, fixed shapes)."""
        gather = users.gather_users if self.per_user else sampling.gather
        return [gather(examples, m) for m in self.batches.microbatches(step)]

    def ledger_entry(self, steps: int, name: str = "dp_tune") -> dict[str, Any]:
        return self.plan.ledger_entry(steps=steps, clip_norm=self.clip_norm, name=name,
                                      strategy_sha256=self.strategy_sha256)

    def report_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `report.build_report` for this mechanism."""
        mech = {"name": self.plan.mechanism, **self.mechanism.report_fields(
            cycle_length=self.plan.bands, strategy_sha256=self.strategy_sha256)}
        return {"privacy_unit": self.plan.privacy_unit, "mechanism": mech,
                "max_examples_per_user": self.groups.max_examples_per_user if self.groups else None}

    def training_fields(self) -> dict[str, Any]:
        """Fields of the report's `training` section that describe the mechanism."""
        out: dict[str, Any] = {"mechanism": self.plan.mechanism, "privacy_unit": self.plan.privacy_unit}
        out.update(self.mechanism.training_fields(cycle_length=self.plan.bands, strategy_sha256=self.strategy_sha256,
                                                  per_user=self.per_user))
        if self.per_user:
            out.update(num_users=self.groups.num_users, max_examples_per_user=self.groups.max_examples_per_user,
                       gradient="per-user mean gradient clipped to C + noise / expected users")
        return out

    def side_channels(self) -> list[dict[str, str]]:
        """Non-DP releases this mechanism adds to the report.

        Never the number of rows the contribution bound dropped: one user with m > K rows moves
        it by m - K, so the exact count would reveal that user's presence. It is in
        `private_counts()`, for the trainer's private state only.
        """
        if not self.per_user:
            return []
        return [{"name": "contribution bounding", "detail":
                 f"at most {self.groups.max_examples_per_user} rows per user were kept (chosen with the secret seed); "
                 "how many rows the bound dropped is not released (an exact count would reveal whether one user "
                 "with more rows is in D_train): it stays in the trainer's private state"},
                {"name": "number of users", "detail": "|users| sets q and delta = 1/|users| by default; it is recorded "
                 "without DP"}]

    def private_counts(self) -> dict[str, int]:
        """Exact counts of the mechanism computed from the data without DP: private state only."""
        if not self.per_user:
            return {}
        return {"rows_kept": int(self.groups.rows_kept), "rows_dropped": int(self.groups.rows_dropped)}


def planned_strategy_sha256(plan: PrivacyPlan, *, strategy_cache_dir: str | None = None) -> str | None:
    """The SHA-256 of the strategy matrix a run of `plan` would use now (None without one: DP-SGD).

    A BandMF strategy is read from the cache, or optimised and cached (data-independent; no data
    is read), exactly as `build_run_mechanism` does.
    """
    return mechanisms.get(plan.mechanism).planned_strategy_sha256(plan, strategy_cache_dir=strategy_cache_dir)


def recorded_strategies(ledger_entries: Sequence[dict]) -> set[str]:
    """The strategy-matrix hashes (BandMF) a ledger's training entries were run with."""
    return {e["strategy_sha256"] for e in ledger_entries
            if mechanisms.is_training_entry(e) and e.get("strategy_sha256")}


def strategy_differences(ledger_entries: Sequence[dict], plan: PrivacyPlan, *,
                         strategy_cache_dir: str | None = None) -> list[tuple[str, Any, Any]]:
    """("strategy_sha256", checkpoint's, this run's) when a resume would switch the BandMF strategy.

    The accounted guarantee (ceil(T / b) participations of sensitivity C) needs ONE b-banded,
    column-normalised strategy C for the whole run: the noise of the steps run so far came from
    the checkpoint's C^{-1}, and a resumed run that read another C (another cache, another
    jax-privacy optimiser) would continue with noise whose columns no longer match. Refuse it.
    """
    saved = recorded_strategies(ledger_entries)
    mine = planned_strategy_sha256(plan, strategy_cache_dir=strategy_cache_dir)
    if mine is None and not saved:
        return []
    if saved != ({mine} if mine else set()):
        return [("strategy_sha256", sorted(saved)[0] if len(saved) == 1 else sorted(saved), mine)]
    return []


def build_run_mechanism(
    plan: PrivacyPlan,
    *,
    clip_norm: float,
    microbatch_size: int,
    seed: int,
    num_rows: int,
    user_ids: Sequence | None = None,
    max_examples_per_user: int | None = None,
    strategy_cache_dir: str | None = None,
    data_shards: int = 1,
) -> RunMechanism:
    """The strategy and batches of a run of `plan` over `num_rows` training rows.

    User level (`plan.privacy_unit == "user"`) needs `user_ids` (one per row) and
    `max_examples_per_user`; user microbatches hold floor(microbatch_size / W) users of W
    row slots each, so a compiled microbatch stays about `microbatch_size` rows; they are padded
    with empty users to a multiple of `data_shards` (the mesh's data axis), which changes no
    step. Example-level microbatches are `microbatch_size` rows (the caller makes it divisible).

    Raises:
        users.UserColumnError: missing user ids, or a user count other than the plan's.
        ValueError: a plan that cannot be executed (e.g. bad bands).
    """
    mechanism = mechanisms.get(plan.mechanism)
    built = dict(clip_norm=float(clip_norm), seed=seed, strategy_cache_dir=strategy_cache_dir)
    if plan.privacy_unit == "user":
        if user_ids is None or len(user_ids) != num_rows:
            raise users.UserColumnError("user-level DP needs one user id per training row (read the data with its "
                                        "user column)")
        if max_examples_per_user is None:
            raise users.UserColumnError("user-level DP needs max_examples_per_user (the contribution bound K)")
        groups = users.group_by_user(user_ids, max_examples_per_user, seed)
        if groups.num_users != plan.dataset_size:
            raise users.UserColumnError(f"the plan is for {plan.dataset_size} users but the data has "
                                        f"{groups.num_users}")
        per_mb = max(1, int(microbatch_size) // groups.slots.shape[1])
        run = mechanism.build(plan, num_units=groups.num_users, microbatch_size=per_mb, per_user=True, **built)
        return RunMechanism(plan=plan, clip_norm=float(clip_norm), strategy=run.strategy,
                            batches=users.UserBatches(groups, run.sampler, per_mb, pad_multiple=data_shards),
                            groups=groups, strategy_sha256=run.strategy_sha256)
    if num_rows != plan.dataset_size:
        raise ValueError(f"the plan is for {plan.dataset_size} examples but the data has {num_rows}")
    run = mechanism.build(plan, num_units=num_rows, microbatch_size=microbatch_size, per_user=False, **built)
    return RunMechanism(plan=plan, clip_norm=float(clip_norm), strategy=run.strategy, batches=run.sampler,
                        strategy_sha256=run.strategy_sha256)
