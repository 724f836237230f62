"""BandMF: banded matrix-factorisation (correlated) noise with cyclic Poisson sampling.

The strategy, the noise and the sampler are in `dpsynth.dp.bandmf` (on jax-privacy).
Formal guarantee: with a b-banded, column-normalised strategy and every unit's participations
at least b steps apart, T steps cost ceil(T / b) Poisson-subsampled Gaussian participations at
rate q = B / floor(N / b) (Choquette-Choo et al. 2023, Theorem 4): `accounting.dpsgd_event`
with `cycle_length=b`. The ledger identifies the strategy matrix by its SHA-256.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dp_accounting

from dpsynth.dp import accounting
from dpsynth.dp.mechanisms.base import Built, Mechanism

SAMPLING_METHOD = ("cyclic Poisson sampling (BandMF): units are assigned to b groups independently and "
                   "uniformly at random; step t samples group t mod b, each unit with probability q")


class BandMF(Mechanism):
    name = "bandmf"
    title = "BandMF"
    supports_batch_cap = False

    def cycle_length(self, bands: int | None) -> int:
        if bands is None or isinstance(bands, bool) or int(bands) != bands or bands < 1:
            raise accounting.PrivacyConfigError(f"must be >= 1 with mechanism 'bandmf', got {bands}")
        return int(bands)

    def sampling_probability(self, *, dataset_size: int, expected_batch_size: float, steps: int,
                             cycle_length: int) -> float:
        if cycle_length == 1:
            return accounting.sampling_probability(dataset_size, expected_batch_size)
        if cycle_length > steps:
            raise accounting.PrivacyConfigError(f"BandMF bands ({cycle_length}) cannot exceed the steps ({steps})")
        if dataset_size // cycle_length < expected_batch_size:
            raise accounting.PrivacyConfigError(
                f"BandMF with {cycle_length} bands samples from groups of floor(N / b) = "
                f"{dataset_size // cycle_length} units: the expected batch {expected_batch_size} must not exceed it "
                "(fewer bands or a smaller batch)")
        return float(expected_batch_size) / (dataset_size // cycle_length)

    def event(self, entry: Mapping[str, Any], compositions: int = 1) -> dp_accounting.DpEvent:
        b, steps = int(entry["bands"]), int(entry["steps"])
        if compositions != 1:  # k runs of ceil(T / b) participations: k b ceil(T / b) steps of the same cycle
            steps = int(compositions) * b * accounting.participations(steps, b)
        return accounting.dpsgd_event(entry["sampling_probability"], steps, entry["noise_multiplier"],
                                      dataset_size=entry.get("dataset_size"),
                                      max_batch_size=entry.get("max_batch_size"), cycle_length=b)

    def entry_fields(self, *, cycle_length: int, strategy_sha256: str | None) -> dict[str, Any]:
        if not strategy_sha256:
            raise ValueError("a BandMF ledger entry needs the strategy's sha256")
        return {"bands": cycle_length, "strategy_sha256": strategy_sha256}

    def check_entry(self, entry: Mapping[str, Any]) -> None:
        if not (isinstance(entry.get("bands"), int) and entry.get("strategy_sha256")):
            raise ValueError("a bandmf ledger entry needs integer 'bands' and 'strategy_sha256'")

    def planned_strategy_sha256(self, plan, *, strategy_cache_dir: str | None = None) -> str | None:
        from dpsynth.dp import bandmf  # JAX-heavy; imported only by trainers

        coefs = bandmf.optimized_coefs(plan.steps, plan.bands, directory=strategy_cache_dir)
        return bandmf.strategy_sha256(plan.steps, plan.bands, coefs)

    def build(self, plan, *, clip_norm: float, num_units: int, microbatch_size: int, seed: int,
              per_user: bool, strategy_cache_dir: str | None = None) -> Built:
        from dpsynth.dp import bandmf  # JAX-heavy; imported only by trainers

        coefs = tuple(float(c) for c in bandmf.optimized_coefs(plan.steps, plan.bands, directory=strategy_cache_dir))
        strategy = bandmf.BandMFStrategy(clip_norm=clip_norm, noise_multiplier=plan.noise_multiplier,
                                         expected_batch_size=plan.expected_batch_size, coefs=coefs,
                                         steps=plan.steps, per_user=per_user)
        return Built(strategy=strategy,
                     sampler=bandmf.CyclicPoissonSampler(num_units, plan.expected_batch_size, plan.bands,
                                                         microbatch_size, seed),
                     strategy_sha256=bandmf.strategy_sha256(plan.steps, plan.bands, coefs))

    def describe(self, entry: Mapping[str, Any]) -> str:
        return f"BandMF ({entry['bands']} bands, cyclic Poisson)"

    def summary(self, cycle_length: int) -> str:
        return f", BandMF {cycle_length} bands"

    def plan_line(self, cycle_length: int) -> str | None:
        return f"BandMF, {cycle_length} bands (ceil(T/b) participations accounted)"

    def report_fields(self, *, cycle_length: int, strategy_sha256: str | None) -> dict[str, Any]:
        return {"bands": cycle_length, "strategy_sha256": strategy_sha256}

    def report_row(self, report: Mapping[str, Any]) -> str | None:
        return (f"| mechanism | {report['mechanism']} ({report.get('bands')} bands, strategy sha256 "
                f"{str(report.get('strategy_sha256'))[:16]}...) |")

    def training_fields(self, *, cycle_length: int, strategy_sha256: str | None, per_user: bool) -> dict[str, Any]:
        return {"bands": cycle_length, "strategy_sha256": strategy_sha256,
                "sampling": SAMPLING_METHOD + (" (units: users)" if per_user else "")}
