"""DP-SGD (Abadi et al. 2016): Poisson sampling, per-unit clipping, iid Gaussian noise on the sum.

Units are examples, or users at user level (each user's mean gradient clipped: `dpsynth.dp.users`).
Formal guarantee: T steps with Poisson rate q, clipping norm C and noise N(0, sigma^2 C^2) on the
sum are the T-fold composition of the Poisson-subsampled Gaussian mechanism (truncated Poisson
with a batch cap), under add-or-remove-one-unit adjacency: `accounting.dpsgd_event`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dp_accounting

from dpsynth.dp import accounting
from dpsynth.dp.mechanisms.base import Built, Mechanism

SAMPLING_METHOD = ("Poisson sampling: each example is in each step's batch independently with probability q, "
                   "from a dedicated per-step random stream (seed, step); noise from an independent JAX key")
USER_SAMPLING_METHOD = ("Poisson sampling over users: each user (with all of its kept rows) is in each step's batch "
                        "independently with probability q; its gradient is the mean of its rows' gradients, clipped")


class DPSGD(Mechanism):
    name = "dpsgd"
    title = "DP-SGD"
    supports_sparse_embedding = True

    def event(self, entry: Mapping[str, Any], compositions: int = 1) -> dp_accounting.DpEvent:
        return accounting.dpsgd_event(entry["sampling_probability"], int(compositions) * entry["steps"],
                                      entry["noise_multiplier"], dataset_size=entry.get("dataset_size"),
                                      max_batch_size=entry.get("max_batch_size"))

    def build(self, plan, *, clip_norm: float, num_units: int, microbatch_size: int, seed: int,
              per_user: bool, strategy_cache_dir: str | None = None) -> Built:
        from dpsynth.dp import sampling  # JAX-heavy; imported only by trainers
        from dpsynth.dp.strategy import DPSGDStrategy, UserDPSGDStrategy

        cls = UserDPSGDStrategy if per_user else DPSGDStrategy
        return Built(strategy=cls(clip_norm=clip_norm, noise_multiplier=plan.noise_multiplier,
                                  expected_batch_size=plan.expected_batch_size),
                     sampler=sampling.PoissonSampler(num_units, plan.expected_batch_size, microbatch_size, seed=seed,
                                                     max_batch_size=plan.max_batch_size))

    def sparse_embedding_strategy(self, plan, *, clip_norm: float, embedding: Any) -> Any:
        from dpsynth.dp.strategy import DPSGDStrategy

        return DPSGDStrategy(clip_norm=clip_norm, noise_multiplier=plan.noise_multiplier,
                             expected_batch_size=plan.expected_batch_size, embedding=embedding)

    def summary(self, cycle_length: int) -> str:
        return ""

    def plan_line(self, cycle_length: int) -> str | None:
        return None

    def report_row(self, report: Mapping[str, Any]) -> str | None:
        return None  # the default mechanism: the report's other rows describe it

    def training_fields(self, *, cycle_length: int, strategy_sha256: str | None, per_user: bool) -> dict[str, Any]:
        return {"sampling": USER_SAMPLING_METHOD} if per_user else {}
