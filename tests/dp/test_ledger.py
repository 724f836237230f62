"""Ledger: merging, accounting equals the composed events, budget refusal, persistence."""

import math

import dp_accounting
import pytest

from dpsynth.dp import accounting
from dpsynth.dp.ledger import BudgetExceeded, PrivacyLedger

KW = dict(sampling_probability=0.1, noise_multiplier=1.2, clip_norm=1.0, dataset_size=1000)


def test_steps_merge_and_epsilon_equals_direct_accounting():
    ledger = PrivacyLedger(delta=1e-5, target_epsilon=10.0)
    for _ in range(7):
        ledger.record_dpsgd(steps=1, **KW)
    ledger.record_dpsgd(steps=3, **KW)
    assert len(ledger.entries) == 1 and ledger.steps_recorded == 10
    assert ledger.epsilon("rdp") == accounting.epsilon(0.1, 10, 1.2, 1e-5, "rdp")
    ledger.record_gaussian(noise_multiplier=5.0, name="label_histogram")
    direct = dp_accounting.rdp.RdpAccountant()
    direct.compose(accounting.dpsgd_event(0.1, 10, 1.2))
    direct.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(5.0), 1))
    assert ledger.epsilon("rdp") == pytest.approx(direct.get_epsilon(1e-5), rel=1e-12)
    assert ledger.epsilon("rdp") > accounting.epsilon(0.1, 10, 1.2, 1e-5, "rdp")


def test_budget_refusal_before_running():
    sigma = accounting.calibrate_noise_multiplier(2.0, 1e-5, 0.1, 20)
    ledger = PrivacyLedger(delta=1e-5, target_epsilon=2.0)
    plan = [dict(mechanism="dpsgd", name="dp_tune", steps=20, **{**KW, "noise_multiplier": sigma})]
    assert ledger.check_budget(plan) <= 2.0
    with pytest.raises(BudgetExceeded, match="budget"):
        ledger.check_budget([dict(plan[0], steps=25)])
    ledger.record_dpsgd(steps=20, **{**KW, "noise_multiplier": sigma})
    with pytest.raises(BudgetExceeded):
        ledger.check_budget([dict(plan[0], steps=1)])


def test_roundtrip_and_nonprivate(tmp_path):
    ledger = PrivacyLedger(delta=1e-4, target_epsilon=math.inf, accountant="pld")
    ledger.record_dpsgd(steps=4, **{**KW, "noise_multiplier": 0.0})
    assert math.isinf(ledger.epsilon())
    ledger.check_budget()  # inf budget never refuses
    path = str(tmp_path / "ledger.json")
    ledger.save(path)
    again = PrivacyLedger.load(path)
    assert again.to_json() == ledger.to_json() and math.isinf(again.target_epsilon)


def test_rejects_bad_budget_and_files(tmp_path):
    with pytest.raises(accounting.PrivacyConfigError):
        PrivacyLedger(delta=0.0, target_epsilon=1.0)
    with pytest.raises(accounting.PrivacyConfigError):
        PrivacyLedger(delta=1e-5, target_epsilon=-1.0)
    with pytest.raises(ValueError, match="not a privacy ledger"):
        PrivacyLedger.from_json({"format": "other"})
