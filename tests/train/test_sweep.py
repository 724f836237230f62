"""The dp-tune sweep's DP selection among its trials on D_valid: the score's sensitivity, the
ledger entry on D_valid, the parallel composition and the closed side channel."""

import dataclasses
import os

import pytest

from dpsynth.dp import private_selection as ps
from dpsynth.dp import report
from dpsynth.models.directory import load_model
from dpsynth.train import finetune, sweep
from tests.train.conftest import make_records
from tests.dp.ledgers import without_run

TRAIN, VALID = make_records(120, 1), make_records(30, 2, "v")
CFG = finetune.TuneConfig(mode="lora", epsilon=4.0, batch_size=24, steps=2, microbatch_size=16, max_tokens=32,
                          checkpoint_every=2, lora_rank=2, learning_rate=1e-2, seed=3)


def test_dp_selected_sweep_composes_on_valid_and_the_score_has_sensitivity_one(tiny_base, tmp_path):
    base_dir, _ = tiny_base
    out = str(tmp_path / "sweep")
    result, trials = sweep.sweep(base_dir, TRAIN, VALID, out, CFG, learning_rates=[1e-3, 3e-2], clip_norms=[1.0],
                                 select_epsilon=0.5, progress_interval=1e9)
    rep = report.load_report(out)
    on_valid = [e for e in rep["ledger"]["entries"] if e.get("dataset") == ps.VALID]
    assert [without_run(e) for e in on_valid] == [{"mechanism": "exponential", "name": "dp_selection among 2 sweep trials", "epsilon": 0.5,
                         "candidates": 2, "dataset": ps.VALID}]
    on_train = [e for e in rep["ledger"]["entries"] if e.get("dataset", ps.TRAIN) == ps.TRAIN]
    assert sum(e["steps"] for e in on_train) == 2 * CFG.steps  # both trials accounted
    tuning = ps.guarantee(on_train, rep["delta"], ps.SEQUENTIAL)["epsilon"]["rdp"]
    sel = rep["selection"]
    assert sel["composition"] == ps.PARALLEL and sel["within_tuning_epsilon"]
    assert rep["epsilon"]["rdp"] == pytest.approx(max(tuning, 0.5)) == pytest.approx(result.epsilon["rdp"])
    assert not any(c["name"].startswith("validation-based") for c in rep["side_channels"])  # the channel is closed
    chosen = sel["selected"]
    assert chosen == {k: trials[chosen["trial"]][k] for k in ("trial", "learning_rate", "clip_norm")}
    assert load_model(out).manifest["dp_tune"]["epsilon"] == rep["epsilon"]
    assert all("valid_score" in t for t in trials) and b"valid_score" not in open(
        os.path.join(out, report.REPORT_JSON), "rb").read()
    # The score moves by at most 1, downwards, when one D_valid example is added (an ordinary one,
    # or a nonsense one), by exactly that example's own score: the sum over examples is additive.
    model = os.path.join(result.state_dir, "trials", "000", "model")
    cfg = dataclasses.replace(CFG, learning_rate=trials[0]["learning_rate"])
    base = sweep.valid_score(model, VALID, cfg)
    for extra in (make_records(1, 9, "x")[0], {"id": "z", "text": "zq" * 40, "label": "great"}):
        diff = sweep.valid_score(model, VALID + [extra], cfg) - base
        assert -1.0 - 1e-5 <= diff <= 1e-6
        assert sweep.valid_score(model, [extra], cfg) == pytest.approx(diff, abs=1e-5)


def test_dp_selection_is_refused_where_it_cannot_hold(tiny_base, tmp_path):
    base_dir, _ = tiny_base
    for kwargs, match in (({"sweep_accounting": "selected-only"}, "composed"), ({"valid_split": "random"}, "valid_split"),
                          ({"select_epsilon": float("inf")}, "finite")):
        with pytest.raises(finetune.TuneError, match=match):
            sweep.sweep(base_dir, TRAIN, VALID, str(tmp_path / "s"), CFG, learning_rates=[1e-3], clip_norms=[1.0],
                        **{"select_epsilon": 1.0, **kwargs})
    with pytest.raises(finetune.TuneError, match="non-private"):
        sweep.sweep(base_dir, TRAIN, VALID, str(tmp_path / "s"), dataclasses.replace(CFG, epsilon=float("inf")),
                    learning_rates=[1e-3], clip_norms=[1.0], select_epsilon=1.0)
