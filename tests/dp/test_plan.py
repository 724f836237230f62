"""dpsynth.dp.plan: the one privacy plan, against dp-accounting directly."""

import math

import dp_accounting
import pytest

from dpsynth.dp import accounting
from dpsynth.dp.plan import PrivacyPlan, plan_privacy


def _rdp_epsilon(q, steps, sigma, delta):
    acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps))
    return acc.get_epsilon(delta)


def test_epochs_steps_delta_and_calibration_meet_target():
    plan = plan_privacy(dataset_size=1000, expected_batch_size=50, epochs=2, epsilon=3.0)
    assert plan.sampling_probability == pytest.approx(0.05)
    assert plan.steps == 40 and plan.delta == pytest.approx(1e-3)
    eps = _rdp_epsilon(0.05, 40, plan.noise_multiplier, 1e-3)
    assert eps <= 3.0 + 1e-6
    # Calibrated tightly: 1% less noise exceeds the target.
    assert _rdp_epsilon(0.05, 40, plan.noise_multiplier * 0.99, 1e-3) > 3.0


def test_compositions_cover_k_runs_together():
    k = 4
    plan = plan_privacy(dataset_size=1000, expected_batch_size=50, steps=30, epsilon=2.0, compositions=k)
    one = plan_privacy(dataset_size=1000, expected_batch_size=50, steps=30, epsilon=2.0)
    assert plan.noise_multiplier > one.noise_multiplier
    # k independent runs composed with dp-accounting meet the target.
    acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    for _ in range(k):
        acc.compose(dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(plan.noise_multiplier)), 30))
    assert acc.get_epsilon(plan.delta) <= 2.0 + 1e-6


def test_given_sigma_and_nonprivate():
    plan = plan_privacy(dataset_size=500, expected_batch_size=25, steps=10, noise_multiplier=1.5, delta=1e-5)
    assert plan.target_epsilon == pytest.approx(_rdp_epsilon(0.05, 10, 1.5, 1e-5))
    inf = plan_privacy(dataset_size=500, expected_batch_size=25, steps=10, epsilon=math.inf)
    assert inf.noise_multiplier == 0.0 and not inf.private
    assert inf.epsilons()["rdp"] == math.inf


def test_differences_name_each_field_and_json_round_trip():
    a = plan_privacy(dataset_size=120, expected_batch_size=24, steps=8, epsilon=4.0)
    b = plan_privacy(dataset_size=120, expected_batch_size=24, steps=3, epsilon=4.0)
    diff = {name: (x, y) for name, x, y in a.differences(b)}
    assert set(diff) == {"steps", "noise_multiplier"}
    assert diff["steps"] == (8, 3)
    assert PrivacyPlan.from_json(a.to_json()) == a
    assert a.differences(PrivacyPlan.from_json(a.to_json())) == []


@pytest.mark.parametrize("kwargs, match", [
    (dict(dataset_size=10, expected_batch_size=20, steps=1, epsilon=1.0), "exceeds the dataset size"),
    (dict(dataset_size=10, expected_batch_size=2, epsilon=1.0), "steps or epochs"),
    (dict(dataset_size=10, expected_batch_size=2, steps=1), "exactly one"),
    (dict(dataset_size=10, expected_batch_size=2, steps=1, epsilon=1.0, compositions=0), "compositions"),
    (dict(dataset_size=10, expected_batch_size=2, steps=1, epsilon=1.0, max_batch_size=3), "PLD"),
])
def test_bad_input(kwargs, match):
    with pytest.raises(accounting.PrivacyConfigError, match=match):
        plan_privacy(**kwargs)


def test_bandmf_epochs_are_steps_times_b_over_n_not_steps_times_q():
    """The audit's case (N = 3600, B = 64, T = 1000, b = 8): 17.8 epochs, not T x q = 142.2."""
    p = plan_privacy(dataset_size=3600, expected_batch_size=64, steps=1000, noise_multiplier=2.0,
                     mechanism="bandmf", bands=8)
    assert p.sampling_probability == pytest.approx(64 / 450)
    assert p.epochs == pytest.approx(1000 * 64 / 3600) and p.epochs_of(500) == pytest.approx(500 * 64 / 3600)
    d = plan_privacy(dataset_size=3600, expected_batch_size=64, steps=1000, noise_multiplier=2.0)
    assert d.epochs_of(10) == pytest.approx(10 * d.sampling_probability)  # DP-SGD: steps x q, as before


@pytest.mark.parametrize("unit, n", [("example", 300), ("user", 40)])
def test_a_delta_above_one_over_n_is_refused_unless_allowed(unit, n):
    """delta > 1/N protects nobody (publishing one random unit in full meets it); N counts users at user level."""
    common = dict(dataset_size=n, expected_batch_size=8, steps=5, epsilon=3.0, privacy_unit=unit)
    what = "users" if unit == "user" else "examples"
    for delta in (0.5, 1.5 / n):
        with pytest.raises(accounting.PrivacyConfigError, match=rf"above 1/N = 1/{n} {what}.*--allow-large-delta"):
            plan_privacy(delta=delta, **common)
        assert plan_privacy(delta=delta, allow_large_delta=True, **common).delta == delta
    assert plan_privacy(**common).delta == 1.0 / n  # the default, 1/N, is at the edge: accepted
    assert plan_privacy(delta=1.0 / n, **common).delta == 1.0 / n
    assert not accounting.weak_delta(1.0 / n, n) and accounting.weak_delta(1.0001 / n, n)


def test_a_repeated_plan_is_calibrated_once_and_each_caller_gets_its_own_ledger(monkeypatch):
    spent = ({"mechanism": "gaussian", "noise_multiplier": 4.0, "what": "label histogram"},)
    kwargs = dict(dataset_size=977, expected_batch_size=31.0, steps=13, epsilon=2.5, spent=spent)
    first = plan_privacy(**kwargs)
    calls = []
    monkeypatch.setattr(accounting, "calibrate", lambda *a, **k: calls.append(a) or 1.0)
    again = plan_privacy(**kwargs)
    assert again == first and not calls  # the same arguments: no second calibration
    again.spent[0]["noise_multiplier"] = 0.0  # a caller editing its copy changes no other caller's plan
    assert plan_privacy(**kwargs).spent[0]["noise_multiplier"] == 4.0
    plan_privacy(**dict(kwargs, steps=14))  # other arguments: calibrated (here by the stand-in)
    assert len(calls) == 1
