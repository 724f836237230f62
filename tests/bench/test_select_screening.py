"""bench/select_screening.py: the agreement measure against references, and a run on the fake model."""

import json
import os

import numpy as np
import pytest

from bench import select_screening as bench


def test_spearman_against_scipy_with_ties():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for _ in range(20):
        a, b = rng.integers(0, 5, 8), rng.integers(0, 5, 8)
        if a.std() and b.std():
            assert bench.spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic)
    assert np.isnan(bench.spearman([1, 1, 1], [1, 2, 3]))


def test_agreement_and_the_accuracy_lost():
    same = bench.agreement(["a", "b", "c"], [1, 5, 3], [10, 50, 30], 100)
    assert same["same_choice"] and same["accuracy_lost"] == 0 and same["spearman"] == pytest.approx(1.0)
    other = bench.agreement(["a", "b", "c"], [1, 5, 3], [10, 30, 50], 100)
    assert not other["same_choice"] and other["accuracy_lost"] == pytest.approx(0.2)
    assert (other["screened_choice"], other["full_choice"]) == ("b", "c")


def test_subsample_keeps_each_labels_share_and_draws_without_replacement():
    rng = np.random.default_rng(0)
    records = [{"id": i, "text": f"t{i}", "label": "a" if i % 4 else "b"} for i in range(400)]  # 300 a, 100 b
    sub = bench.subsample(records, 40, rng)
    assert len(sub) == 40 and len({r["id"] for r in sub}) == 40
    assert sum(r["label"] == "b" for r in sub) == 10  # 25% of 40, exactly
    odd = bench.subsample(records, 7, rng)  # 5.25 a + 1.75 b: the largest remainder rounds b up
    assert len(odd) == 7 and sum(r["label"] == "b" for r in odd) == 2
    draws = [tuple(r["id"] for r in bench.subsample(records, 40, np.random.default_rng(s))) for s in range(5)]
    assert len(set(draws)) == 5  # random, not the first 40 each time


def test_run_on_the_fake_model(tmp_path):
    from dpsynth.dp import report as report_lib
    from dpsynth.dp.ledger import PrivacyLedger
    from tests.evaluate.conftest import make_records
    from tests.generate.fakes import load_fake_bundle, write_fake_model_dir

    model = write_fake_model_dir(str(tmp_path / "model"), max_len=12)
    ledger = PrivacyLedger(delta=1e-5, target_epsilon=3.0)
    ledger.record_dpsgd(sampling_probability=0.05, noise_multiplier=1.0, steps=100, clip_norm=1.0, dataset_size=40)
    report_lib.write_report(model, report_lib.build_report(ledger, training={"mode": "lora", "dataset_size": 40},
                                                           contamination_sha256=None, max_tokens_per_example=12))
    valid = tmp_path / "valid.jsonl"
    valid.write_text("".join(json.dumps(r) + "\n" for r in make_records(20, 3)))
    out = str(tmp_path / "bench")
    r = bench.run(model, str(valid), out, screen_size=20, guidances=(0.0, 1.5), temperatures=(1.0,), multiple=1.0,
                  max_epochs=1, loader=load_fake_bundle, generate_options={"max_len": 12, "batch_size": 4}, draws=3)
    assert r["settings"] == ["w0-t1", "w1.5-t1"] and r["full_train_size"] == 40
    assert r["generation_ratio"] == pytest.approx((2 * 22 + 44) / (2 * 44))
    assert 0 <= r["accuracy_lost"] <= 1 and (r["accuracy_lost"] == 0 if r["same_choice"] else True)
    scores = json.load(open(os.path.join(out + ".private", "screening_scores.json")))
    assert scores["dp"] is False and len(scores["screened_correct"]) == len(scores["full_correct"]) == 2
    d = r["repeated"]
    assert len(d["draws"]) == 3 and 0 <= d["same_choice_rate"] <= 1
    assert d["same_choice_rate"] == pytest.approx(np.mean([x["same_choice"] for x in d["draws"]]))
    assert 0 <= d["mean_accuracy_lost"] <= d["max_accuracy_lost"] <= 1
    assert all(x["full_choice"] == r["full_choice"] for x in d["draws"])  # the full-size scoring is shared
