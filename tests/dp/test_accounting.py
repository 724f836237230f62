"""Accounting: equals dp-accounting called directly, agrees with the PRV accountant, calibrates."""

import math

import dp_accounting
import pytest
from prv_accountant.dpsgd import DPSGDAccountant

from dpsynth.dp import accounting

GRID = [(1024 / 3600, 20, 1.5, 1 / 3600), (0.01, 300, 1.0, 1e-5), (0.1, 50, 3.0, 1e-6), (0.5, 5, 0.8, 1e-3)]


@pytest.mark.parametrize("q,steps,sigma,delta", GRID)
def test_equals_dp_accounting_directly(q, steps, sigma, delta):
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(event)
    assert accounting.epsilon(q, steps, sigma, delta, "rdp") == rdp.get_epsilon(delta)
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=accounting.PLD_DISCRETIZATION)
    pld.compose(event)
    assert accounting.epsilon(q, steps, sigma, delta, "pld") == pld.get_epsilon(delta)


@pytest.mark.parametrize("q,steps,sigma,delta", GRID)
def test_agrees_with_independent_prv_accountant(q, steps, sigma, delta):
    # Tolerance: PLD (dp-accounting) within [prv lower - 2%, prv upper + 2%] of the PRV
    # accountant's (Gopi et al.) error-bounded interval; RDP is a looser upper bound, so it must
    # be >= the PRV lower bound and not absurdly far above it (< 1.5x + 0.5).
    prv = DPSGDAccountant(noise_multiplier=sigma, sampling_probability=q, max_steps=steps,
                          eps_error=0.01, delta_error=delta / 1000)
    lo, est, hi = prv.compute_epsilon(delta=delta, num_steps=steps)
    pld = accounting.epsilon(q, steps, sigma, delta, "pld")
    assert lo * 0.98 - 1e-3 <= pld <= hi * 1.02 + 1e-3, (lo, est, hi, pld)
    rdp = accounting.epsilon(q, steps, sigma, delta, "rdp")
    assert lo * 0.98 <= rdp <= 1.5 * hi + 0.5


@pytest.mark.parametrize("accountant,target", [("rdp", 1.0), ("rdp", 3.0), ("rdp", 8.0), ("pld", 3.0)])
def test_calibration_hits_target(accountant, target):
    q, steps, delta = 0.2, 10, 1e-4
    sigma = accounting.calibrate_noise_multiplier(target, delta, q, steps, accountant)
    eps = accounting.epsilon(q, steps, sigma, delta, accountant)
    assert eps <= target
    assert eps >= 0.99 * target  # close: a slightly smaller sigma would overspend
    assert accounting.epsilon(q, steps, sigma * 0.98, delta, accountant) > target


def test_calibration_with_already_spent_events_leaves_room():
    q, steps, delta = 0.2, 10, 1e-4
    spent = [dp_accounting.GaussianDpEvent(5.0)]
    sigma = accounting.calibrate_noise_multiplier(3.0, delta, q, steps, "rdp", already_spent=spent)
    total = accounting.epsilon_of_events(spent + [accounting.dpsgd_event(q, steps, sigma)], delta, "rdp")
    assert 2.97 <= total <= 3.0
    assert sigma > accounting.calibrate_noise_multiplier(3.0, delta, q, steps, "rdp")


def test_bad_inputs_and_unreachable_targets():
    with pytest.raises(accounting.PrivacyConfigError, match="epsilon"):
        accounting.calibrate_noise_multiplier(0.0, 1e-5, 0.1, 10)
    with pytest.raises(accounting.PrivacyConfigError, match="delta"):
        accounting.calibrate_noise_multiplier(1.0, 1.0, 0.1, 10)
    with pytest.raises(accounting.PrivacyConfigError, match="delta"):
        accounting.epsilon(0.1, 10, 1.0, 0.0)
    with pytest.raises(accounting.PrivacyConfigError, match="unreachable"):
        accounting.calibrate_noise_multiplier(1e-4, 1e-5, 1.0, 10**6)
    with pytest.raises(accounting.PrivacyConfigError, match="exceeds"):
        accounting.sampling_probability(100, 200)
    assert accounting.calibrate_noise_multiplier(math.inf, 1e-5, 0.1, 10) == 0.0
    assert accounting.epsilon(0.1, 10, 0.0, 1e-5) == math.inf


def test_truncated_batches_are_pld_only_and_cost_at_least_untruncated():
    kw = dict(dataset_size=1000, max_batch_size=120)
    eps = accounting.epsilons(0.1, 20, 1.5, 1e-4, **kw)
    assert eps["rdp"] is None
    assert eps["pld"] >= accounting.epsilon(0.1, 20, 1.5, 1e-4, "pld") - 1e-3
    with pytest.raises(accounting.UnsupportedByAccountant):
        accounting.epsilon(0.1, 20, 1.5, 1e-4, "rdp", **kw)


def test_steps_for_epochs():
    assert accounting.steps_for_epochs(10, 0.25) == 40
    assert accounting.steps_for_epochs(1, 0.3) == 4
