"""Privacy report: schema fields, composition of a later Gaussian mechanism, markdown."""

import json

import pytest

from dpsynth.dp import accounting, report
from dpsynth.dp.ledger import PrivacyLedger


def make_report():
    ledger = PrivacyLedger(delta=1e-4, target_epsilon=3.0)
    sigma = accounting.calibrate_noise_multiplier(3.0, 1e-4, 0.2, 10)
    ledger.record_dpsgd(sampling_probability=0.2, noise_multiplier=sigma, steps=10, clip_norm=1.0, dataset_size=500)
    training = {"mode": "lora", "noise_multiplier": sigma, "clip_norm": 1.0, "sampling_probability": 0.2,
                "steps": 10, "expected_batch_size": 100.0, "dataset_size": 500}
    return report.build_report(ledger, training=training, contamination_sha256="ab" * 32,
                               side_channels=[report.LABEL_SET_CHANNEL,
                                              {"name": "validation-based selection", "detail": "4 trials"}]), sigma


def test_schema_and_roundtrip(tmp_path):
    rep, sigma = make_report()
    for key in ("unit_of_privacy", "adjacency", "delta", "epsilon", "accountant", "training", "ledger", "covers",
                "contamination_sha256", "side_channels"):
        assert key in rep
    assert rep["private"] and rep["epsilon"]["rdp"] <= 3.0
    assert rep["epsilon"]["pld"] == accounting.epsilon(0.2, 10, sigma, 1e-4, "pld")
    jpath, mpath = report.write_report(str(tmp_path), rep)
    assert report.load_report(str(tmp_path)) == json.loads(open(jpath).read())
    md = open(mpath).read()
    assert "add-or-remove" in md and "validation-based selection" in md and "epsilon (PLD)" in md


def test_compose_label_histogram_recomputes_from_ledger():
    rep, sigma = make_report()
    after = report.compose_gaussian(rep, noise_multiplier=10.0, name="label_histogram")
    ledger = report.ledger_of(after)
    assert len(ledger.entries) == 2
    assert after["epsilon"]["rdp"] == ledger.epsilon("rdp") > rep["epsilon"]["rdp"]
    assert after["composed"][0]["name"] == "label_histogram"
    assert rep["ledger"]["entries"][-1]["mechanism"] == "dpsgd"  # input untouched


def test_nonprivate_report_says_so():
    ledger = PrivacyLedger(delta=1e-4, target_epsilon=float("inf"))
    ledger.record_dpsgd(sampling_probability=0.2, noise_multiplier=0.0, steps=3, clip_norm=1.0, dataset_size=50)
    rep = report.build_report(ledger, training={}, contamination_sha256=None)
    assert rep["private"] is False and rep["epsilon"]["rdp"] == "inf"
    assert "NOT PRIVATE" in report.render_markdown(rep)
    json.dumps(rep, allow_nan=False)  # strict JSON


def test_load_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="privacy report"):
        report.load_report(str(tmp_path))


def test_the_headline_says_when_the_delta_is_weak():
    rep, sigma = make_report()
    headline = report.render_markdown(rep).splitlines()[2]
    assert "DIFFERENTIALLY PRIVATE" in headline and "WEAK" not in headline  # delta 1e-4 < 1/500
    weak = {**rep, "delta": 0.5}
    headline = report.render_markdown(weak).splitlines()[2]
    assert "WEAK DELTA: delta 0.5 is above 1/N = 1/500 examples" in headline
    user = {**weak, "privacy_unit": "user", "max_examples_per_user": 2}
    assert "1/N = 1/500 users" in report.render_markdown(user).splitlines()[2]
