"""What publishing an experiment root costs: the composition of all its releases about D_train."""

import json
import math
import os

import dp_accounting
import pytest

from dpsynth.dp import accounting
from dpsynth.dp import compose as compose_lib
from dpsynth.dp import ledger as ledger_lib
from dpsynth.dp import report as report_lib
from dpsynth.experiment import privacy, runner, stages
from dpsynth.experiment.cache import StageOutput
from dpsynth.experiment.plan import build_plan
from tests.experiment.test_plan import data_files, grid_config  # noqa: F401 (fixture)

N = 1000
SIGMA_LABELS = 6.0


def _grid(data_files, baselines=False):
    # Two models (two learning rates) sharing one calibration: the accountant is the slow part.
    return grid_config(data_files, dp_tune={"modes": ["lora"], "epsilons": [3], "learning_rates": [0.001, 0.01],
                                            "batch_size": 50, "epochs": 2},
                       generate={"label_distribution": "dp_histogram", "label_noise_multiplier": SIGMA_LABELS,
                                 "multiples": [1, 2], "samplings": [{"temperature": 1.0}, {"temperature": 0.7}]},
                       evaluate={"baselines": baselines, "options": {"sweep": {"repeats": 1, "clip_norms": [1.0]}}})


def _rdp(events):
    acc = accounting.make_accountant("rdp")
    for e in events:
        acc.compose(e)
    return acc.get_epsilon(1.0 / N)


def test_dry_run_composes_every_model_and_one_histogram_per_model(data_files, tmp_path, monkeypatch):
    cfg = _grid(data_files)
    plan = build_plan(cfg, str(tmp_path / "run"))
    rows = runner.privacy_budgets(plan, cfg, N)
    root = privacy.planned_releases(plan, cfg, N, rows)
    kinds = root.composition.counts
    assert kinds == {"dp_tune": 2, "label_histogram": 2}  # 2 models x (2 samplings x 2 multiples) corpora: 2 draws
    # Independent reference: every DP-tuning run's planned events (the tuner's own plan,
    # `tune_config.plan_run`, as the dry-run rows give it) and the two histograms, composed.
    events = []
    for row in rows:
        events.append(dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(row["q"], dp_accounting.GaussianDpEvent(row["noise_multiplier"])),
            row["steps"]))
    events += [dp_accounting.GaussianDpEvent(SIGMA_LABELS)] * 2
    expected = _rdp(events)
    assert root.composition.epsilon["rdp"] == pytest.approx(expected, rel=1e-9)
    own = root.corpus_epsilons()
    assert len(own) == 8 and max(e["rdp"] for e in own.values()) < expected  # the root costs more than any corpus
    # a corpus = its model (eps 3) + its histogram, which the tuning reserved: within the target, and only just
    assert 2.99 < own[plan.trials[-1].id]["rdp"] <= 3.0 * (1 + 1e-6)
    monkeypatch.setattr(runner, "train_size", lambda plan, config: (N, "test"))
    monkeypatch.setattr(runner, "privacy_budgets", lambda plan, config, num_train: rows)  # calibrated above
    text = runner.describe_plan(plan, cfg)
    assert "what publishing the whole root costs" in text
    assert f"the whole root: epsilon {expected:.3f} (rdp)" in text
    assert f"{own[plan.trials[0].id]['rdp']:.3f} (rdp)" in text


def test_dry_run_names_non_private_releases(data_files, tmp_path):
    cfg = _grid(data_files, baselines=True).replace(dp_tune={"epsilons": [3, math.inf], "learning_rates": [0.001]})
    plan = build_plan(cfg, str(tmp_path / "run"))
    root = privacy.planned_releases(plan, cfg, N, runner.privacy_budgets(plan, cfg, N))
    c = root.composition
    assert all(math.isinf(v) for v in c.epsilon.values())
    assert "dp_tune[lora-epsinf-lr0.001-C1]" in c.nonprivate and "real-data baseline [wordcnn]" in c.nonprivate
    assert c.counts["dp_on_real"] == 1 and math.isfinite(c.epsilon_dp_releases["rdp"])
    assert "NOT DP" in privacy.render(root, title="t")


# ----------------------------------------------------------------------------- the final report


def _model_output(tmp_path, key, q, sigma, steps):
    ledger = ledger_lib.PrivacyLedger(delta=1.0 / N, target_epsilon=3.0)
    ledger.record_dpsgd(sampling_probability=q, noise_multiplier=sigma, steps=steps, clip_norm=1.0, dataset_size=N)
    rep = report_lib.build_report(ledger, training={"mode": "lora"}, contamination_sha256=None)
    d = tmp_path / "stages" / key
    report_lib.write_report(str(d / "model"), rep)
    return StageOutput(key=key, stage="dp_tune", hash="0" * 64, dir=str(d), summary={}, seconds=0, cached=True), rep


def _labels_output(tmp_path, key, sigma):
    d = tmp_path / "stages" / key
    d.mkdir(parents=True)
    (d / privacy.LABEL_DISTRIBUTION_FILE).write_text(json.dumps({"labels": ["a", "b"], "weights": [0.5, 0.5],
                                                                "source": "dp_histogram", "noise_multiplier": sigma}))
    return StageOutput(key=key, stage="labels", hash="1" * 64, dir=str(d), summary={}, seconds=0, cached=True)


def test_final_report_composes_the_ledgers_the_stages_wrote(tmp_path):
    m1, r1 = _model_output(tmp_path, "dp_tune[a]", 0.05, 1.2, 80)
    m2, _ = _model_output(tmp_path, "dp_tune[b]", 0.05, 0.8, 40)
    l1, l2 = _labels_output(tmp_path, "labels[a]", 5.0), _labels_output(tmp_path, "labels[b]", 5.0)
    base_ledger = ledger_lib.PrivacyLedger(delta=1.0 / N, target_epsilon=3.0)
    base_ledger.record_dpsgd(sampling_probability=0.1, noise_multiplier=2.0, steps=30, clip_norm=1.0, dataset_size=N)
    base_ledger.record_dpsgd(sampling_probability=0.1, noise_multiplier=2.0, steps=30, clip_norm=0.5, dataset_size=N)
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "dp.json").write_text(json.dumps({"ledger": base_ledger.to_json()}))
    baselines = [{"baseline": "real", "classifier": "wordcnn", "epsilon": math.inf},
                 {"baseline": "dp_on_real", "classifier": "wordcnn", "epsilon": 3.0, "privacy_report": "dp.json"}]
    trials = [{"id": f"{m}-{s}", "epsilon": 3.0, "dp_tune": f"dp_tune[{m}]", "labels": f"labels[{m}]"}
              for m in "ab" for s in ("t1", "t0.7")]
    root = privacy.completed_releases(eval_cfg={"trials": trials, "baselines": True, "classifiers": ["wordcnn"]},
                                      models=[m1, m2], labels=[l1, l2], baselines=baselines,
                                      out_dir=str(tmp_path / "eval"), num_train=N)
    entries = [e for r in root.releases if r.private for e in r.entries]
    assert len(entries) == 2 + 2 + 2  # two models, one histogram each, the baseline's two ledger entries
    ref = ledger_lib.PrivacyLedger(delta=1.0 / N, target_epsilon=math.inf, entries=entries).epsilons()
    assert root.composition.epsilon_dp_releases == pytest.approx(ref)
    assert root.composition.nonprivate == ("real-data baseline [wordcnn]",)
    # A corpus's own epsilon is its privacy report's: the model's ledger composed with its histogram.
    corpus_report = report_lib.compose_gaussian(r1, noise_multiplier=5.0, name="label_histogram")
    own = root.corpus_epsilons()["a-t1"]
    assert own["rdp"] == pytest.approx(corpus_report["epsilon"]["rdp"]) and own["rdp"] < ref["rdp"]
    json_path, md_path = privacy.write(root, str(tmp_path / "eval"), title="t")
    with open(json_path) as f:
        data = json.load(f)
    assert data["root"]["epsilon_dp_releases"]["rdp"] == pytest.approx(ref["rdp"]) and data["root"]["epsilon"]["rdp"] == "inf"
    html = tmp_path / "eval" / "report.html"
    html.write_text("<html><body><h1>r</h1><script>x</script></body></html>")
    privacy.add_to_html(str(html), privacy.html_section(root))
    text = html.read_text()
    assert f"{ref['rdp']:.3f} (rdp)" in text and text.index("Privacy of the whole root") < text.index("<script>")


def test_evaluate_stage_writes_the_composition_into_the_final_report(tmp_path, monkeypatch):
    from dpsynth.evaluate import report as evaluate_lib
    from dpsynth.evaluate import tables
    from dpsynth.experiment import cache
    from dpsynth.experiment.plan import StageNode

    m1, _ = _model_output(tmp_path, "dp_tune[a]", 0.05, 1.2, 80)
    sens = tmp_path / "stages" / "sensitive"
    (sens / "data").mkdir(parents=True)
    for split in ("train", "valid", "test"):
        (sens / "data" / f"{split}.jsonl").write_text(
            "".join(json.dumps({"text": f"t {i}", "label": "ab"[i % 2]}) + "\n" for i in range(N if split == "train" else 4)))
    synth = tmp_path / "stages" / "gen"
    synth.mkdir()

    def fake_evaluate(dirs, real, out_dir, config):
        with open(os.path.join(out_dir, "report.html"), "w") as f:
            f.write("<html><body></body></html>")
        return {"rows": [], "baselines": [], "paths": {"html": os.path.join(out_dir, "report.html")}}

    monkeypatch.setattr(evaluate_lib, "evaluate", fake_evaluate)
    monkeypatch.setattr(tables, "summary_table", lambda result, kinds: "table")
    trials = [{"id": "a-t1", "epsilon": 3.0, "dp_tune": "dp_tune[a]", "labels": None}]
    node = StageNode(key="evaluate", stage="evaluate", hash="f" * 64, inputs={},
                     config={"trials": trials, "baselines": False, "classifiers": [], "options": {}})

    def out(key, d, stage):
        return StageOutput(key=key, stage=stage, hash="2" * 64, dir=str(d), summary={}, seconds=0, cached=True)

    done = cache.run_stage(str(tmp_path / "root"), node, stages.evaluate, {
        "synthetic": (out("generate[a-t1]", synth, "generate"),), "sensitive": out("sensitive", sens, "sensitive"),
        "pretrain": out("pretrain", tmp_path, "pretrain"), "models": (m1,)})
    eps = compose_lib.compose([compose_lib.Release("m", "dp_tune", tuple(
        report_lib.load_report(m1.path("model"))["ledger"]["entries"]))], 1.0 / N).epsilon["rdp"]
    assert f"the whole root: epsilon {eps:.3f} (rdp)" in done.report
    # The stored report names the final stage directory (it is shown again when cached), not the .work one.
    assert f"report: {os.path.join(done.dir, 'report.html')}" in done.report and ".work-" not in done.report
    assert os.path.exists(done.path(privacy.FILE_JSON)) and f"{eps:.3f}" in open(done.path("report.html")).read()
    assert done.summary["root_epsilon"]["epsilon"]["rdp"] == pytest.approx(eps)


# ----------------------------------------------------------------------------- the dry run equals the run

UNITS = {
    "dpsgd": {},
    "bandmf": {"mechanism": "bandmf", "bands": 4},
    "user": {"privacy_unit": "user", "max_examples_per_user": 4, "batch_size": 5},
    "user-bandmf": {"privacy_unit": "user", "max_examples_per_user": 4, "batch_size": 4, "mechanism": "bandmf",
                    "bands": 2},
}


def _tuned_like_the_tuner(node, records, out_dir):
    """The model report the dp_tune stage writes for `node`, built the way `finetune.dp_tune` builds it:
    the tuner's own plan and mechanism (`plan_for_records`, `build_run_mechanism`), one ledger record
    per step of the strategy that adds the noise (`strategy_ledger_entry`)."""
    from dpsynth.dp.mechanisms.run import build_run_mechanism
    from dpsynth.train import tune_config, tune_loop

    tc = stages.tune_config(node.config)
    p = tune_config.plan_for_records(tc, records)
    mech = build_run_mechanism(p, clip_norm=tc.clip_norm, microbatch_size=8, seed=7, num_rows=len(records),
                               user_ids=tune_config.user_ids(tc, records), max_examples_per_user=tc.max_examples_per_user)
    ledger = ledger_lib.PrivacyLedger(delta=p.delta, target_epsilon=tc.epsilon, accountant=tc.accountant)
    for _ in range(p.steps):
        entry = tune_loop.strategy_ledger_entry(p, mech.strategy, steps=1, clip_norm=tc.clip_norm,
                                                strategy_sha256=mech.strategy_sha256)
        ledger.record_steps(entry)
    rep = report_lib.build_report(ledger, training={"mode": tc.mode}, contamination_sha256=None,
                                  **mech.report_kwargs())
    report_lib.write_report(os.path.join(out_dir, "model"), rep)
    return StageOutput(key=node.key, stage="dp_tune", hash=node.hash, dir=out_dir, summary={}, seconds=0, cached=True)


@pytest.mark.parametrize("unit", sorted(UNITS))
def test_dry_run_composition_equals_the_final_one(data_files, tmp_path, monkeypatch, unit):
    """The audit's finding: the dry run hard-coded DP-SGD and example level (T steps instead of
    ceil(T / b), delta 1/|train| instead of 1/|users|); it now composes each model's own plan entry."""
    from dpsynth.data import readers

    monkeypatch.setenv("DPSYNTH_CACHE_DIR", str(tmp_path / "cache"))  # BandMF strategies: a private cache
    n = 200
    (data_files / "train.csv").write_text("text,label,author\n" + "".join(
        f"review {i},{'xy'[i % 2]},u{i % 40}\n" for i in range(n)))
    user = UNITS[unit].get("privacy_unit") == "user"
    cfg = _grid(data_files).replace(
        sensitive={"user_column": "author"} if user else {},
        dp_tune={"modes": ["lora"], "epsilons": [2, math.inf], "learning_rates": [0.001], "batch_size": 10,
                 "epochs": None, "steps": 12, **UNITS[unit]},
        generate={"label_distribution": "uniform", "label_noise_multiplier": None},
        evaluate={"baselines": False})
    plan = build_plan(cfg, str(tmp_path / "run"))
    rows = runner.privacy_budgets(plan, cfg, n)
    dry = privacy.planned_releases(plan, cfg, n, rows)
    records = readers.read_sensitive(str(data_files / "train.csv"), user_column="author" if user else None).records
    models = [_tuned_like_the_tuner(node, records, str(tmp_path / "stages" / node.key))
              for node in plan.nodes if node.stage == "dp_tune"]
    final = privacy.completed_releases(eval_cfg=plan.node("evaluate").config, models=models, labels=[], baselines=[],
                                       out_dir=str(tmp_path), num_train=n)
    assert dry.delta == final.delta == (1 / 40 if user else 1 / n)
    assert [r.name for r in dry.releases] == [r.name for r in final.releases]
    for a, b in zip(dry.releases, final.releases):
        assert a.private == b.private and a.unit == b.unit
        assert dry.release_epsilons[a.name] == pytest.approx(final.release_epsilons[b.name], rel=1e-9)
    assert dry.composition.epsilon_dp_releases == pytest.approx(final.composition.epsilon_dp_releases, rel=1e-9)
    own_dry, own_final = dry.corpus_epsilons(), final.corpus_epsilons()
    assert own_dry.keys() == own_final.keys()
    for trial, eps in own_dry.items():
        assert eps == pytest.approx(own_final[trial], rel=1e-9)
    private = [r for r in dry.releases if r.private]
    assert private and private[0].epsilons(dry.delta)["rdp"] == pytest.approx(2.0, rel=1e-3)  # the target


def test_dry_run_of_the_audits_bandmf_grid_point_shows_its_target(data_files, tmp_path):
    """N = 3600, B = 64, T = 1000, b = 8, epsilon 3: the dry run showed 10.206 (RDP) / 9.205 (PLD)."""
    cfg = _grid(data_files).replace(
        dp_tune={"modes": ["lora"], "epsilons": [3], "learning_rates": [0.001], "batch_size": 64, "epochs": None,
                 "steps": 1000, "mechanism": "bandmf", "bands": 8},
        generate={"label_distribution": "uniform", "label_noise_multiplier": None}, evaluate={"baselines": False})
    plan = build_plan(cfg, str(tmp_path / "run"))
    root = privacy.planned_releases(plan, cfg, 3600, runner.privacy_budgets(plan, cfg, 3600))
    [release] = root.releases
    assert release.entries[0]["mechanism"] == "bandmf" and release.entries[0]["bands"] == 8
    eps = root.composition.epsilon
    assert eps["rdp"] == pytest.approx(3.0, abs=1e-3) and eps["pld"] < 3.0  # the audit's independent value: 2.658


def test_selections_on_d_valid_are_releases_of_the_root_dry_and_final(data_files, tmp_path, monkeypatch):
    """A `select` stage releases a DP selection on D_valid: the dry run plans its entry (at twice its
    epsilon on the default positional split), the final report reads it from the selected corpus's
    privacy report, both compose it with the D_train releases (sequentially, an upper bound) and say so."""
    from dpsynth.dp import private_selection as ps

    cfg = _grid(data_files).replace(dp_tune={"learning_rates": [0.001]}, select={"epsilon": 0.5})
    plan = build_plan(cfg, str(tmp_path / "run"))
    rows = runner.privacy_budgets(plan, cfg, N)
    dry = privacy.planned_releases(plan, cfg, N, rows)
    sel = [r for r in dry.releases if r.kind == "dp_selection"]
    assert [r.name for r in sel] == ["select[lora-eps3]"] and sel[0].entries[0]["epsilon"] == 1.0  # group of 2
    base = compose_lib.compose([r for r in dry.releases if r.kind != "dp_selection"], dry.delta).epsilon["rdp"]
    assert dry.composition.epsilon["rdp"] > base and privacy.SELECTION_NOTE in dry.notes
    # The final report: the selected corpus's report holds the tuning's entries and the selection's.
    node = plan.node("select[lora-eps3]")
    entry = ps.DpSelection(epsilon=0.5).ledger_entry(len(node.config["candidates"]), name=node.key, group=2)
    ledger = ledger_lib.PrivacyLedger(delta=dry.delta, target_epsilon=3.0, entries=[
        planned_dict for r in dry.releases if r.kind == "dp_tune" for planned_dict in r.entries] + [entry])
    d = tmp_path / "stages" / node.key
    report_lib.write_report(str(d), report_lib.build_report(ledger, training={}, contamination_sha256=None))
    out = StageOutput(key=node.key, stage="select", hash=node.hash, dir=str(d), summary={}, seconds=0, cached=True)
    final = privacy.completed_releases(eval_cfg=plan.node("evaluate").config, models=[], labels=[], baselines=[],
                                       out_dir=str(tmp_path), num_train=N, selections=[out])
    assert [dict(e) for r in final.releases for e in r.entries] == [entry]  # the D_valid entry only
    assert final.release_epsilons[node.key] == pytest.approx(dry.release_epsilons[node.key])
    assert "dp_selection" in privacy.render(final, title="t") and privacy.SELECTION_NOTE in final.notes
    # The dry run says that each private run's noise covers its (positional, sequential) selection too.
    monkeypatch.setattr(runner, "train_size", lambda plan, config: (N, "test"))
    monkeypatch.setattr(runner, "privacy_budgets", lambda plan, config, num_train: rows)
    text = runner.describe_plan(plan, cfg)
    assert "also covers its DP selection on D_valid (epsilon 0.5, accounted at 1" in text
    assert "select[lora-eps3]" in text and "dp_selection" in text
