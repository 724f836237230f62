"""Privacy accounting for DP-SGD with Poisson sampling, on top of `dp_accounting`.

Every number here comes from Google's `dp_accounting` library; this module only builds the
`DpEvent`s that describe what training does and asks an accountant about them:

* one DP-SGD step = `PoissonSampledDpEvent(q, GaussianDpEvent(sigma))`: each example is in
  the batch independently with probability `q`, the clipped sum (L2 sensitivity `C` under
  add-or-remove adjacency) gets Gaussian noise of standard deviation `sigma * C`;
* `T` steps = `SelfComposedDpEvent(step, T)`;
* a run = `ComposedDpEvent([...])` of everything in the ledger (`dpsynth.dp.ledger`);
* BandMF with b bands and cyclic Poisson sampling (`dpsynth.dp.bandmf`): T steps are
  `SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(sigma)), ceil(T / b))` with
  q = B / floor(N / b) (the amplified-BandMF reduction of arXiv:2306.08153, as jax-privacy's
  `DpsgdTrainingAccountant` with `cycle_length=b`); b = 1 is DP-SGD;
* user level (`dpsynth.dp.users`): the same events with N = the number of users (each user's
  mean gradient is clipped to C, so one user is one unit of sensitivity C).

Accountants: `"rdp"` (Renyi DP, as in the paper; `RdpAccountant`) and `"pld"` (privacy loss
distributions, `PLDAccountant`; tighter). Both are upper bounds on epsilon for the given
delta; the privacy report gives both and says which one the budget is enforced with.
Adjacency is add-or-remove-one unit throughout (an example, or a user at user level).

Formal guarantee: if training executes exactly the mechanism described by the events
(true Poisson sampling with rate q, per-example clipping to C, noise N(0, sigma^2 C^2 I) on
the sum, fresh independent noise per step), the released sequence of parameters is
(epsilon, delta)-DP for the epsilon returned here, by the accountant's theorem.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

import dp_accounting

from dpsynth.errors import DpsynthError

ACCOUNTANTS = ("rdp", "pld")
DEFAULT_ACCOUNTANT = "rdp"
# PLD grid step for the privacy loss. Measured on N = 22500, B = 1024, T = 1000, sigma 1,
# delta 1/N: epsilon 9.052855 at 1e-3 against 9.052630 at 1e-4 (2.3e-4 absolute, 2.5e-5
# relative; the coarser grid errs high, i.e. pessimistic) in 1.0 s against 6.8 s on a loaded
# 2-core machine (command in docs/dp.md, "PLD discretisation"). The tests check it
# against the independent PRV accountant.
PLD_DISCRETIZATION = 1e-3
# The largest noise multiplier calibration searches for. Beyond it the noise (sigma * C per
# coordinate, divided by the expected batch) swamps any gradient: we call the target
# unreachable and ask for more data, a larger batch or fewer steps.
MAX_NOISE_MULTIPLIER = 500.0
MIN_NOISE_MULTIPLIER = 0.05  # lower end of the calibration search
NEIGHBORING_RELATION = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE

# The RDP accountant logs a warning per order whose series fails to converge; those orders
# are excluded (which only makes epsilon larger), so the warnings are noise for users.
logging.getLogger("absl").setLevel(logging.ERROR)


class PrivacyConfigError(DpsynthError, ValueError):
    """Invalid privacy parameters (epsilon, delta, q, steps) or an unreachable target."""


class UnsupportedByAccountant(PrivacyConfigError):
    """The chosen accountant cannot analyse an event (e.g. RDP and truncated Poisson batches)."""


def check_epsilon(epsilon: float) -> float:
    epsilon = float(epsilon)
    if math.isnan(epsilon) or epsilon <= 0:
        raise PrivacyConfigError(f"epsilon must be > 0 (or inf for a non-private run), got {epsilon}")
    return epsilon


def check_delta(delta: float) -> float:
    delta = float(delta)
    if not 0.0 < delta < 1.0:
        raise PrivacyConfigError(f"delta must be in the open interval (0, 1), got {delta}")
    return delta


def weak_delta(delta: float, units: int) -> bool:
    """Whether `delta` exceeds 1/N for N = `units` privacy units (examples or users): a mechanism
    that publishes one random unit in full is then (0, delta)-DP, so the guarantee protects nobody.
    (The default delta, exactly 1/N, the paper's choice, is at that edge and not counted as above it.)"""
    return float(delta) * int(units) > 1.0 + 1e-9


def check_delta_size(delta: float, units: int, *, unit: str = "examples", allow_large_delta: bool = False) -> float:
    """`check_delta`, and refuses a delta above 1/`units` unless `allow_large_delta` (`weak_delta`)."""
    delta = check_delta(delta)
    if weak_delta(delta, units) and not allow_large_delta:
        raise PrivacyConfigError(
            f"delta {delta:.3g} is above 1/N = 1/{int(units)} {unit} ({1.0 / int(units):.3g}): publishing one random "
            f"{unit.rstrip('s')} in full meets such a delta, so it protects nobody; pass a delta well below 1/N "
            "(or --allow-large-delta: the privacy report then says the delta is weak)")
    return delta


def weak_delta_note(delta: float, units: int, unit: str = "examples") -> str:
    """The headline warning of a report whose delta is above 1/N."""
    return (f"WEAK DELTA: delta {float(delta):.3g} is above 1/N = 1/{int(units)} {unit}; this guarantee does not "
            "protect any single record (allowed with --allow-large-delta)")


def check_sampling(q: float, steps: int) -> None:
    if not 0.0 < q <= 1.0:
        raise PrivacyConfigError(
            f"sampling probability q = expected batch / dataset size must be in (0, 1], got {q}"
        )
    if int(steps) != steps or steps < 1:
        raise PrivacyConfigError(f"steps must be a positive integer, got {steps}")


def sampling_probability(dataset_size: int, batch_size: float) -> float:
    """q = expected batch size / dataset size, with checks."""
    if dataset_size < 1:
        raise PrivacyConfigError(f"dataset size must be >= 1, got {dataset_size}")
    if batch_size <= 0:
        raise PrivacyConfigError(f"batch size must be > 0, got {batch_size}")
    if batch_size > dataset_size:
        raise PrivacyConfigError(
            f"expected batch size {batch_size} exceeds the dataset size {dataset_size}: "
            f"q = B / N would be > 1 (lower the batch size)"
        )
    return float(batch_size) / float(dataset_size)


def steps_for_epochs(epochs: float, q: float) -> int:
    """Steps that visit each example `epochs` times in expectation: ceil(epochs / q)."""
    if epochs <= 0:
        raise PrivacyConfigError(f"epochs must be > 0, got {epochs}")
    return max(1, math.ceil(epochs / q - 1e-9))


def participations(steps: int, cycle_length: int = 1) -> int:
    """How often a unit can be sampled in `steps` steps of (cyclic) Poisson sampling: ceil(T / b)."""
    if int(cycle_length) != cycle_length or cycle_length < 1:
        raise PrivacyConfigError(f"cycle length (bands) must be a positive integer, got {cycle_length}")
    return -(-int(steps) // int(cycle_length))


def dpsgd_event(
    q: float, steps: int, noise_multiplier: float, *, dataset_size: int | None = None, max_batch_size: int | None = None,
    cycle_length: int = 1,
) -> dp_accounting.DpEvent:
    """The DpEvent of `steps` DP-SGD steps with Poisson rate `q` and noise multiplier sigma.

    `cycle_length` b > 1: BandMF with b bands and cyclic Poisson sampling (rate q within the
    eligible group): ceil(steps / b) subsampled Gaussian steps.

    `noise_multiplier` 0 means no noise: a `NonPrivateDpEvent` (epsilon = inf). With a batch
    cap (`max_batch_size`, needs `dataset_size`) a step is a
    `TruncatedSubsampledGaussianDpEvent` (Poisson sample truncated to a uniformly random
    subset of the cap), which only the PLD accountant supports.
    """
    check_sampling(q, steps)
    if noise_multiplier < 0:
        raise PrivacyConfigError(f"noise multiplier must be >= 0, got {noise_multiplier}")
    if noise_multiplier == 0:
        return dp_accounting.NonPrivateDpEvent()
    count = participations(steps, cycle_length)
    if max_batch_size is not None:
        if cycle_length != 1:
            raise PrivacyConfigError("a batch-size cap is not supported with BandMF (cyclic Poisson sampling)")
        if dataset_size is None:
            raise PrivacyConfigError("a batch-size cap needs the dataset size for accounting")
        step = dp_accounting.TruncatedSubsampledGaussianDpEvent(
            int(dataset_size), float(q), int(max_batch_size), float(noise_multiplier)
        )
    else:
        step = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(float(noise_multiplier)))
    return dp_accounting.SelfComposedDpEvent(step, count)


def make_accountant(name: str = DEFAULT_ACCOUNTANT) -> dp_accounting.PrivacyAccountant:
    """A fresh accountant: "rdp" or "pld" (add-or-remove adjacency)."""
    if name == "rdp":
        return dp_accounting.rdp.RdpAccountant(neighboring_relation=NEIGHBORING_RELATION)
    if name == "pld":
        return dp_accounting.pld.PLDAccountant(
            neighboring_relation=NEIGHBORING_RELATION, value_discretization_interval=PLD_DISCRETIZATION
        )
    raise PrivacyConfigError(f"unknown accountant {name!r}; choose one of {ACCOUNTANTS}")


def epsilon_of_events(events: Sequence[dp_accounting.DpEvent], delta: float, accountant: str = DEFAULT_ACCOUNTANT) -> float:
    """Epsilon at `delta` of the composition of `events` (0 for no events)."""
    check_delta(delta)
    if not events:
        return 0.0
    acc = make_accountant(accountant)
    for event in events:
        if isinstance(event, dp_accounting.NonPrivateDpEvent):
            return math.inf
        try:
            acc.compose(event)
        except dp_accounting.UnsupportedEventError as e:
            raise UnsupportedByAccountant(f"the {accountant.upper()} accountant cannot analyse {event}") from e
    return float(acc.get_epsilon(delta))


def epsilon(
    q: float, steps: int, noise_multiplier: float, delta: float, accountant: str = DEFAULT_ACCOUNTANT, **cap
) -> float:
    """Epsilon at `delta` after `steps` Poisson-subsampled Gaussian steps (`cap`: see `dpsgd_event`)."""
    return epsilon_of_events([dpsgd_event(q, steps, noise_multiplier, **cap)], delta, accountant)


def epsilons_of_events(events: Sequence[dp_accounting.DpEvent], delta: float) -> dict[str, float | None]:
    """Epsilon from every accountant, None where an accountant cannot analyse the events."""
    out: dict[str, float | None] = {}
    for name in ACCOUNTANTS:
        try:
            out[name] = epsilon_of_events(events, delta, name)
        except UnsupportedByAccountant:
            out[name] = None
    return out


def epsilons(q: float, steps: int, noise_multiplier: float, delta: float, **cap) -> dict[str, float | None]:
    """Epsilon from every accountant: {"rdp": ..., "pld": ...} (None where unsupported)."""
    return epsilons_of_events([dpsgd_event(q, steps, noise_multiplier, **cap)], delta)


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    q: float,
    steps: int,
    accountant: str = DEFAULT_ACCOUNTANT,
    *,
    tol: float | None = None,
    already_spent: Sequence[dp_accounting.DpEvent] = (),
    dataset_size: int | None = None,
    max_batch_size: int | None = None,
    cycle_length: int = 1,
) -> float:
    """The smallest noise multiplier whose epsilon (composed after `already_spent`) <= target.

    Uses `dp_accounting.calibrate_dp_mechanism` (bisection over sigma). Returns 0.0 for
    `target_epsilon = inf` (non-private). `dataset_size`/`max_batch_size`: a batch cap
    (truncated Poisson sampling; PLD only); `cycle_length`: BandMF bands; see `dpsgd_event`.

    Raises:
        PrivacyConfigError: bad epsilon/delta/q/steps, or a target that needs a noise
            multiplier above `MAX_NOISE_MULTIPLIER` (unreachable in practice).
    """
    check_sampling(q, steps)
    spent = list(already_spent)
    return calibrate(
        lambda sigma: dp_accounting.ComposedDpEvent(spent + [dpsgd_event(
            q, steps, sigma, dataset_size=dataset_size, max_batch_size=max_batch_size, cycle_length=cycle_length)]),
        target_epsilon, delta, accountant, tol=tol, what=f"q = {q:.6g} and {steps} steps")


def calibrate(
    make_event: Callable[[float], dp_accounting.DpEvent],
    target_epsilon: float,
    delta: float,
    accountant: str = DEFAULT_ACCOUNTANT,
    *,
    tol: float | None = None,
    what: str = "these settings",
) -> float:
    """The smallest noise multiplier sigma with epsilon(make_event(sigma)) <= target (any mechanism).

    Uses `dp_accounting.calibrate_dp_mechanism` (bisection over sigma in [MIN, MAX]). Returns 0.0
    for `target_epsilon = inf` (non-private). `what` names the settings in the error message.

    Raises:
        PrivacyConfigError: a bad epsilon/delta, or a target that needs a noise multiplier above
            `MAX_NOISE_MULTIPLIER` (unreachable in practice).
    """
    check_delta(delta)
    if math.isinf(target_epsilon) and target_epsilon > 0:
        return 0.0
    target_epsilon = check_epsilon(target_epsilon)

    def event(sigma: float) -> dp_accounting.DpEvent:
        e = make_event(sigma)
        return e if isinstance(e, dp_accounting.ComposedDpEvent) else dp_accounting.ComposedDpEvent([e])

    if epsilon_of_events([event(MAX_NOISE_MULTIPLIER)], delta, accountant) > target_epsilon:
        raise PrivacyConfigError(
            f"target epsilon {target_epsilon} at delta {delta:g} is unreachable with {what}: it would need a "
            f"noise multiplier above {MAX_NOISE_MULTIPLIER:g}. Use more data, fewer steps or a larger epsilon."
        )
    if epsilon_of_events([event(MIN_NOISE_MULTIPLIER)], delta, accountant) <= target_epsilon:
        return MIN_NOISE_MULTIPLIER  # any target this loose is met by the smallest sigma searched
    sigma = dp_accounting.calibrate_dp_mechanism(
        lambda: make_accountant(accountant),
        event,
        target_epsilon,
        delta,
        bracket_interval=dp_accounting.ExplicitBracketInterval(MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER),
        tol=tol if tol is not None else 1e-4,
    )
    return float(sigma)


def exponential_event(epsilon: float, accountant: str | None = None) -> dp_accounting.DpEvent:
    """The event of one exponential-mechanism selection at `epsilon`, for `accountant`.

    RDP: epsilon^2 / 8-zCDP, since the exponential mechanism is epsilon-bounded-range (Cesar and
    Rogers 2021). PLD: unsupported (dp-accounting 0.6 has no pure-DP event under add-or-remove
    adjacency; its randomized response needs replace-one), so the PLD epsilon of a ledger holding
    one is None ("n/a"): use the Gaussian variant for PLD accounting. `guarantee` also bounds a
    part holding only such selections by the sum of their epsilons (basic composition of pure DP).
    """
    if (accountant or DEFAULT_ACCOUNTANT) == "rdp":
        return dp_accounting.ZCDpEvent(float(epsilon) ** 2 / 8.0)
    return dp_accounting.UnsupportedDpEvent()
