"""`dpsynth select`'s release stays within the epsilon asked for: the DP label histogram of D_train is
reserved by the tuning (`TuneConfig.reserve_label_noise_multiplier`), in the README's flow (dp-tune,
then select --label-source) and in the experiment runner's (one histogram per model); a histogram the
tuning did not cover is refused before it is drawn; the selection's header and note name the right
targets, and a candidate without a privacy report is named by its directory."""

import json
import math
import os

import dp_accounting
import pytest

from dpsynth.dp import histogram
from dpsynth.dp import private_selection as ps
from dpsynth.dp import report as report_lib
from dpsynth.dp.ledger import PrivacyLedger
from dpsynth.evaluate import dp_select
from dpsynth.train import recipe as recipe_lib
from dpsynth.train.tune_config import TuneConfig, TuneError, plan_run
from tests.evaluate.conftest import make_records
from tests.evaluate.test_dp_select import write_corpus

N = 5000  # |D_train|
TARGET = 3.0
DELTA = 1.0 / N
LENGTH_EPSILON = recipe_lib.LENGTH_EPSILON_SHARE * TARGET  # the README's --max-tokens auto spends it first
FAST = dp_select.SelectConfig(epsilon=1.0, max_epochs=1, seed=0)


def length_entry():
    """The ledger entry of the DP example length (`--max-tokens auto`): an exponential mechanism on D_train."""
    return {"mechanism": "exponential", "name": "dp example length", "epsilon": LENGTH_EPSILON, "candidates": 8}


def tuned_report(config: TuneConfig, spent=()) -> tuple[dict, object]:
    """The privacy report of a tuning run of `config` on N examples, as `dp-tune` writes it (the spent
    entries, the planned steps, the reservation in `training`), and its plan."""
    plan = plan_run(config, N, spent=tuple(spent))
    ledger = PrivacyLedger(delta=plan.delta, target_epsilon=config.epsilon, accountant=config.accountant,
                           entries=[dict(e) for e in spent])
    ledger.entries.append({**plan.ledger_entry(steps=plan.steps, clip_norm=config.clip_norm), "run": ledger.run})
    training = {"mode": config.mode, "dataset_size": N, "noise_multiplier": plan.noise_multiplier}
    if config.reserve_label_noise_multiplier:
        training["reserve_label_noise_multiplier"] = config.reserve_label_noise_multiplier
    return report_lib.build_report(ledger, training=training, contamination_sha256=None), plan


def independent_epsilon(plan, spent_epsilon: float, label_sigma: float, selection_epsilon: float | None = None) -> float:
    """The D_train release (spent length + tuning + histogram) composed directly by dp_accounting's RDP
    accountant, from the plan's q, T and sigma (not through dpsynth's ledger)."""
    acc = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(dp_accounting.ZCDpEvent(spent_epsilon ** 2 / 8))
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        plan.sampling_probability, dp_accounting.GaussianDpEvent(plan.noise_multiplier)), plan.steps))
    acc.compose(dp_accounting.GaussianDpEvent(label_sigma))
    eps = acc.get_epsilon(plan.delta)
    return eps if selection_epsilon is None else max(eps, selection_epsilon)  # parallel composition with D_valid


@pytest.mark.parametrize("reserved", [histogram.DEFAULT_NOISE_MULTIPLIER, 8.0])
def test_the_readme_flow_releases_at_most_the_target(reserved):
    """dp-tune --epsilon 3 --recipe auto --max-tokens auto --reserve-label-noise-multiplier SIGMA, then
    select --epsilon 1 --label-source: the selected release, as composed by dp_accounting, is <= 3."""
    config = TuneConfig(epsilon=TARGET, recipe="auto", max_tokens=64, reserve_label_noise_multiplier=reserved)
    rep, plan = tuned_report(config, spent=[length_entry()])
    assert plan.reserved == (histogram.reserved_entry(reserved),)
    sigma = dp_select.label_noise_multiplier(rep)  # select's default: the reserved sigma
    assert sigma == reserved
    assert f"a DP label histogram of D_train at noise multiplier {reserved:g}" in report_lib.render_markdown(rep)
    corpus = report_lib.compose_gaussian(rep, noise_multiplier=sigma, name="label_histogram", run="draw-1")
    sel = dp_select.select(["a", "b"], [10, 12], [corpus, corpus], FAST)
    eps = sel.report["epsilon"]["rdp"]
    assert eps <= TARGET * (1 + 1e-6) and sel.report["selection"]["within_target"]
    assert independent_epsilon(plan, LENGTH_EPSILON, sigma, FAST.epsilon) <= TARGET * (1 + 1e-6)
    assert eps == pytest.approx(independent_epsilon(plan, LENGTH_EPSILON, sigma, FAST.epsilon), rel=1e-6)
    # The same tuning without the reservation is what the trial found: the histogram pushes it past 3.
    bare, bare_plan = tuned_report(TuneConfig(epsilon=TARGET, recipe="auto", max_tokens=64), spent=[length_entry()])
    assert independent_epsilon(bare_plan, LENGTH_EPSILON, sigma) > TARGET * (1 + 1e-6)
    with pytest.raises(ps.PrivacyConfigError, match=r"above its target 3: re-tune with --reserve-label-noise-multiplier"):
        dp_select.label_noise_multiplier(bare)


def test_select_refuses_a_histogram_the_tuning_did_not_cover():
    rep, _ = tuned_report(TuneConfig(epsilon=TARGET, batch_size=256, steps=200, reserve_label_noise_multiplier=20.0))
    assert dp_select.label_noise_multiplier(rep, 40.0) == 40.0  # more noise than reserved: within the target
    with pytest.raises(ps.PrivacyConfigError) as e:
        dp_select.label_noise_multiplier(rep, 5.0)  # less: past it, refused before anything is drawn
    assert "\n" not in str(e.value) and "reserved sigma 20" in str(e.value)
    bare, _ = tuned_report(TuneConfig(epsilon=TARGET, batch_size=256, steps=200))
    # (the default sigma of a model that reserved nothing is refused too)
    with pytest.raises(ps.PrivacyConfigError, match=f"noise multiplier {histogram.DEFAULT_NOISE_MULTIPLIER:g} "):
        dp_select.label_noise_multiplier(bare)


def test_a_reservation_needs_a_private_example_level_run():
    with pytest.raises(TuneError, match="non-private"):
        TuneConfig(epsilon=math.inf, reserve_label_noise_multiplier=30)
    with pytest.raises(TuneError, match="user-level"):
        TuneConfig(privacy_unit="user", max_examples_per_user=2, reserve_label_noise_multiplier=30)
    with pytest.raises(TuneError, match=">= 0"):
        TuneConfig(reserve_label_noise_multiplier=-1)
    assert "reserve_label_noise_multiplier" not in TuneConfig().to_json()  # (old runs' fingerprints hold)


@pytest.mark.parametrize("sigma", [histogram.DEFAULT_NOISE_MULTIPLIER, 4.0])
def test_the_experiment_flow_releases_at_most_the_target(sigma, tmp_path):
    """`label_distribution: dp_histogram`: every private dp_tune node reserves the experiment's sigma, so
    a corpus (the model + its one histogram), and its DP selection, stay within the node's epsilon."""
    from dpsynth.experiment import stages
    from dpsynth.experiment.plan import build_plan
    from tests.experiment.test_plan import grid_config

    d = tmp_path / "data"
    d.mkdir()
    (d / "train.csv").write_text("text,label\na,x\nb,y\n")
    (d / "test.csv").write_text("text,label\nc,x\n")
    (d / "public.txt").write_text("some public text\n")
    plan = build_plan(grid_config(d, dp_tune={"modes": ["lora"], "epsilons": [1, 3, float("inf")]},
                                  generate={"label_distribution": "dp_histogram", "label_noise_multiplier": sigma},
                                  sensitive={"split": {"holdout": "hash"}}, select={"epsilon": 0.5}),
                      str(tmp_path / "run"))
    tunes = [n for n in plan.nodes if n.stage == "dp_tune"]
    assert len(tunes) == 3
    for node in tunes:
        config = stages.tune_config(node.config)
        if not config.private:
            assert "reserve_label_noise_multiplier" not in node.config
            continue
        assert config.reserve_label_noise_multiplier == sigma
        config = TuneConfig(**{**{f: getattr(config, f) for f in ("mode", "epsilon", "clip_norm", "accountant")},
                               "batch_size": 500, "steps": 100, "reserve_label_noise_multiplier": sigma})
        rep, tplan = tuned_report(config)
        corpus = report_lib.compose_gaussian(rep, noise_multiplier=sigma, name="label_histogram", run="labels")
        sel = dp_select.select(["a", "b"], [3, 4], [corpus, corpus], dp_select.SelectConfig(epsilon=0.5, seed=0))
        assert sel.report["selection"]["within_target"] and sel.report["epsilon"]["rdp"] <= config.epsilon * (1 + 1e-6)
        acc = dp_accounting.rdp.RdpAccountant(
            neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
        acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
            tplan.sampling_probability, dp_accounting.GaussianDpEvent(tplan.noise_multiplier)), tplan.steps))
        acc.compose(dp_accounting.GaussianDpEvent(sigma))
        assert acc.get_epsilon(tplan.delta) <= config.epsilon * (1 + 1e-6)


def _report_at(target: float, sigma: float) -> dict:
    ledger = PrivacyLedger(delta=1e-4, target_epsilon=target)
    ledger.record_gaussian(noise_multiplier=sigma, name=f"stand-in for a tuning at {target:g}")
    return report_lib.build_report(ledger, training={"mode": "lora", "dataset_size": 200}, contamination_sha256=None)


def test_a_selection_over_models_of_different_targets_states_them(tmp_path, capsys):
    from trainers import select as cli

    lo, hi = _report_at(3.0, 1.0), _report_at(8.0, 0.5)
    sel = dp_select.select(["m3", "m8"], [10, 12], [lo, hi], FAST)
    s = sel.report["selection"]
    assert s["target_epsilons"] == {"m3": 3.0, "m8": 8.0}
    md = report_lib.render_markdown(sel.report)
    header = md.splitlines()[2]
    assert "the candidates' target epsilons 3 (m3), 8 (m8)" in header and "(target epsilon 3)" not in header
    assert sel.report["epsilon"]["rdp"] > 8 and not s["within_target"]  # two tunings composed: above both
    # The CLI's note says the same.
    root = str(tmp_path)
    paths = [write_corpus(root, name, make_records(60, i, signal=3), make_records(12, i + 10, signal=3), rep)
             for i, (name, rep) in enumerate((("m3", lo), ("m8", hi)))]
    valid = os.path.join(root, "valid.jsonl")
    with open(valid, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in make_records(30, 7, signal=2, prefix="v"))
    assert cli.main(["--candidates", *paths, "--valid", valid, "--out", str(tmp_path / "out"), "--epsilon", "1",
                     "--max-epochs", "1", "--seed", "0"]) == 0
    err = capsys.readouterr().err
    assert "exceeds the candidates' target epsilons 3 (m3), 8 (m8)" in err and "target 3.0" not in err
    # One model: the single target, as before.
    one = dp_select.select(["a", "b"], [10, 12], [lo, lo], FAST)
    assert "(target epsilon 3)" in report_lib.render_markdown(one.report).splitlines()[2]


def test_a_candidate_without_a_privacy_report_is_named_by_its_directory(tmp_path):
    root = str(tmp_path)
    ok = write_corpus(root, "ok", make_records(40, 1), make_records(8, 2), _report_at(3.0, 1.0))
    bare = write_corpus(root, "bare", make_records(40, 3), make_records(8, 4), None)
    with pytest.raises(ValueError) as e:
        dp_select.select_corpora({"ok": ok, "bare": bare}, make_records(10, 5, prefix="v"), FAST)
    assert f"candidate bare ({bare}) has no privacy report" in str(e.value) and "candidate 1" not in str(e.value)


def test_the_cli_refuses_an_uncovered_histogram_before_anything_is_generated(tmp_path, capsys):
    from trainers import select as cli

    rep, _ = tuned_report(TuneConfig(epsilon=TARGET, batch_size=256, steps=200))  # reserved nothing
    model = str(tmp_path / "lora")
    report_lib.write_report(model, rep)
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in make_records(50, 1)))
    valid = tmp_path / "valid.jsonl"
    valid.write_text("".join(json.dumps(r) + "\n" for r in make_records(20, 2, prefix="v")))
    out = str(tmp_path / "synth")
    assert cli.main(["--model", model, "--valid", str(valid), "--label-source", str(train), "--out", out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("dpsynth select: error: --label-source: a DP label histogram at noise multiplier 30 ")
    assert "above its target 3" in err[-1]
    assert not os.path.exists(out + ".candidates")
