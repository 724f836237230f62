"""Composition of releases: exact (dp-accounting on the events), never a sum or a maximum."""

import math

import dp_accounting
import pytest

from dpsynth.dp import accounting
from dpsynth.dp.compose import Release, compose, nonprivate

DELTA = 1e-5


def _dpsgd(q, sigma, steps, name="dp_tune"):
    return {"mechanism": "dpsgd", "name": name, "sampling_probability": q, "noise_multiplier": sigma, "clip_norm": 1.0,
            "dataset_size": 10_000, "max_batch_size": None, "steps": steps}


def _gauss(sigma):
    return {"mechanism": "gaussian", "name": "label_histogram", "noise_multiplier": sigma, "count": 1}


def _reference(events, name):
    acc = accounting.make_accountant(name)
    for e in events:
        acc.compose(e)
    return acc.get_epsilon(DELTA)


def test_compose_equals_dp_accounting_on_all_events():
    releases = [Release("a", "dp_tune", (_dpsgd(0.01, 1.1, 300),)), Release("b", "dp_tune", (_dpsgd(0.02, 0.9, 150),)),
                Release("h", "label_histogram", (_gauss(8.0),))]
    got = compose(releases, DELTA)
    events = [dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1)), 300),
        dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(0.02, dp_accounting.GaussianDpEvent(0.9)), 150),
        dp_accounting.GaussianDpEvent(8.0)]
    for name in ("rdp", "pld"):
        assert got.epsilon[name] == pytest.approx(_reference(events, name), rel=1e-9)
        singles = [r.epsilons(DELTA)[name] for r in releases]
        assert max(singles) < got.epsilon[name] < sum(singles)  # composition costs more than any one, less than the sum
    assert got.releases == got.dp_releases == 3 and got.nonprivate == ()
    assert got.counts == {"dp_tune": 2, "label_histogram": 1}


def test_k_copies_are_k_times_the_steps():
    one = Release("t", "dp_tune", (_dpsgd(0.01, 1.0, 100),))
    k = compose([Release(f"t{i}", "dp_tune", one.entries) for i in range(4)], DELTA)
    assert k.epsilon["rdp"] == pytest.approx(Release("x", "dp_tune", (_dpsgd(0.01, 1.0, 400),)).epsilons(DELTA)["rdp"])


def test_a_nonprivate_release_makes_the_whole_non_private_but_is_named():
    dp = Release("a", "dp_tune", (_dpsgd(0.01, 1.1, 300),))
    zero_noise = Release("inf", "dp_tune", (_dpsgd(0.01, 0.0, 300),))
    got = compose([dp, zero_noise, nonprivate("real", "real_baseline"), Release("o", "x", (_gauss(5.0),), dataset="D_other")],
                  DELTA)
    assert all(math.isinf(v) for v in got.epsilon.values())
    assert got.nonprivate == ("inf", "real") and got.releases == 3  # D_other is another dataset
    assert got.epsilon_dp_releases["rdp"] == pytest.approx(dp.epsilons(DELTA)["rdp"])
    assert got.to_json()["epsilon"] == {"rdp": "inf", "pld": "inf"}


def test_user_and_example_level_releases_are_not_composed_into_one_number():
    user = Release("u", "dp_tune", ({**_dpsgd(0.01, 1.0, 10), "unit": "user"},))
    with pytest.raises(ValueError, match="user-level and example-level"):
        compose([user, Release("h", "label_histogram", (_gauss(5.0),))], DELTA)
    assert compose([user], DELTA).dp_releases == 1
