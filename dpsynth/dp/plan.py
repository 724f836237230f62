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

Formal guarantee: a run that executes the plan (Poisson sampling with rate q, per-example
clipping to C, noise N(0, sigma^2 C^2) on the sum, T steps), composed with the other
`compositions - 1` runs of the same plan, is (target_epsilon, delta)-DP under add-or-remove
adjacency, by the accountant's theorem (`dpsynth.dp.accounting`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from dpsynth.dp import accounting

# The fields whose change between a checkpoint and a resume changes what is accounted.
PLAN_FIELDS = ("dataset_size", "expected_batch_size", "steps", "noise_multiplier", "target_epsilon", "delta",
               "accountant", "max_batch_size", "compositions")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrivacyPlan:
    """Everything the accountant decides before the first step.

    Attributes:
        dataset_size: N, the number of privacy units (examples) in the sensitive training set.
        expected_batch_size: B = q N (Poisson sampling).
        sampling_probability: q = B / N.
        steps: T, DP-SGD steps of one run.
        delta: the delta of the guarantee (1 / N unless given).
        target_epsilon: the budget of all `compositions` runs together (inf: non-private).
        noise_multiplier: sigma (0 for a non-private run), from the accountant.
        accountant: "rdp" or "pld": what sigma is calibrated and the budget enforced with.
        max_batch_size: optional cap on the Poisson batch (truncated Poisson; PLD only).
        compositions: how many runs of this plan the target covers together (>= 1).
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

    @property
    def private(self) -> bool:
        return not math.isinf(self.target_epsilon)

    @property
    def epochs(self) -> float:
        return self.steps * self.sampling_probability

    def ledger_entry(self, *, steps: int, clip_norm: float, name: str = "dp_tune") -> dict[str, Any]:
        """The ledger entry (`dpsynth.dp.ledger` format) of `steps` steps of this plan."""
        return {"mechanism": "dpsgd", "name": name, "sampling_probability": self.sampling_probability,
                "noise_multiplier": self.noise_multiplier, "clip_norm": float(clip_norm),
                "dataset_size": self.dataset_size, "max_batch_size": self.max_batch_size, "steps": int(steps)}

    def epsilons(self, steps: int | None = None) -> dict[str, float | None]:
        """Epsilon of one run of `steps` (default: T) steps, from every accountant."""
        if not self.private:
            return {name: math.inf for name in accounting.ACCOUNTANTS}
        cap = ({"dataset_size": self.dataset_size, "max_batch_size": self.max_batch_size}
               if self.max_batch_size is not None else {})
        return accounting.epsilons_of_events(
            [accounting.dpsgd_event(self.sampling_probability, steps or self.steps, self.noise_multiplier, **cap)],
            self.delta)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["target_epsilon"] = "inf" if math.isinf(self.target_epsilon) else self.target_epsilon
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PrivacyPlan:
        d = dict(d)
        d["target_epsilon"] = math.inf if d["target_epsilon"] == "inf" else float(d["target_epsilon"])
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
) -> PrivacyPlan:
    """The privacy plan of a DP-SGD run.

    Args:
        dataset_size: N (>= 1).
        expected_batch_size: B; q = B / N must be in (0, 1].
        steps: T; or `epochs` (T = ceil(epochs / q)). `steps` wins when both are given.
        epsilon: target epsilon of all `compositions` runs (math.inf: non-private, sigma 0);
            or `noise_multiplier`: a given sigma (the target is then its epsilon).
        delta: default 1 / N.
        accountant: "rdp" or "pld".
        max_batch_size: cap on the Poisson batch (PLD only).
        compositions: k >= 1 runs of this plan that the target covers together.

    Raises:
        accounting.PrivacyConfigError: bad or unreachable parameters.
    """
    if accountant not in accounting.ACCOUNTANTS:
        raise accounting.PrivacyConfigError(f"unknown accountant {accountant!r}; choose one of {accounting.ACCOUNTANTS}")
    if int(compositions) != compositions or compositions < 1:
        raise accounting.PrivacyConfigError(f"compositions must be a positive integer, got {compositions}")
    if (epsilon is None) == (noise_multiplier is None):
        raise accounting.PrivacyConfigError("give exactly one of epsilon and noise_multiplier")
    q = accounting.sampling_probability(dataset_size, expected_batch_size)
    if steps is None:
        if epochs is None:
            raise accounting.PrivacyConfigError("give steps or epochs")
        steps = accounting.steps_for_epochs(epochs, q)
    accounting.check_sampling(q, steps)
    delta = accounting.check_delta(delta if delta is not None else 1.0 / dataset_size)
    if max_batch_size is not None and accountant != "pld":
        raise accounting.PrivacyConfigError("a batch-size cap (truncated Poisson sampling) is only analysed by the "
                                            "PLD accountant")
    cap = {"dataset_size": int(dataset_size), "max_batch_size": max_batch_size} if max_batch_size is not None else {}
    if epsilon is not None:
        target = float(epsilon)
        sigma = accounting.calibrate_noise_multiplier(target, delta, q, int(steps) * int(compositions), accountant,
                                                      **cap)
    else:
        sigma = float(noise_multiplier)
        if math.isnan(sigma) or sigma < 0:
            raise accounting.PrivacyConfigError(f"noise multiplier must be >= 0, got {sigma}")
        target = (math.inf if sigma == 0 else
                  accounting.epsilon(q, int(steps) * int(compositions), sigma, delta, accountant, **cap))
    return PrivacyPlan(dataset_size=int(dataset_size), expected_batch_size=q * dataset_size, sampling_probability=q,
                       steps=int(steps), delta=delta, target_epsilon=target, noise_multiplier=float(sigma),
                       accountant=accountant, max_batch_size=max_batch_size, compositions=int(compositions))
