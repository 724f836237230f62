"""`bench/paper.py`'s cpu study: every experiment is a valid config, and its flags build the grids they say.

The study itself needs ../shared/data and hours; these checks need neither (configs are built
from paths, never read)."""

from __future__ import annotations

import math
import os
import sys

import pytest

from dpsynth.experiment.config import from_dict
from tests.conftest import REPO

sys.path.insert(0, os.path.join(REPO, "bench"))
import paper  # noqa: E402


@pytest.mark.parametrize("scale", sorted(paper.CPU_SCALES))
def test_every_cpu_experiment_is_a_valid_config_with_one_recipe(scale):
    configs = paper.cpu_experiments(scale, "/nonexistent/data")
    assert set(configs) == set(paper.CPU_EXPERIMENTS) - set(paper.CPU_GEN_SETS)  # (those need --base-model)
    for name, data in configs.items():
        cfg = from_dict(data)
        assert cfg.dp_tune.recipe == "auto", name  # one recipe, chosen by the software, on every set
        length = paper.CPU_SCALES[scale]["max_tokens"] * paper.CPU_LEVERS.get(name, {}).get("max_tokens_factor", 1)
        assert cfg.dp_tune.max_tokens == cfg.generate.max_tokens == length, name


@pytest.mark.parametrize("scale", sorted(paper.CPU_SCALES))
def test_each_lever_changes_one_setting_of_the_long_review_run(scale):
    """A lever's effect is read against `yelp_polarity`'s run: its config differs in that one setting only
    (besides the name, the epsilon-3-only grid, no peers and, for the length, the lengths that follow it)."""
    configs = paper.cpu_experiments(scale, "/nonexistent/data")
    base = configs["yelp_polarity"]
    for name, lever in paper.CPU_LEVERS.items():
        cfg = configs[name]
        assert cfg["sensitive"] == base["sensitive"], name
        assert cfg["pretrain"] == paper._lever_pretrain(lever, base["pretrain"]), name
        assert (cfg["pretrain"] != base["pretrain"]) == ("pretrain_steps_factor" in lever), name
        changed = {k for k in cfg["dp_tune"] if cfg["dp_tune"][k] != base["dp_tune"].get(k)} - {"epsilons"}
        assert changed == set(paper._lever_dp(lever, paper.CPU_SCALES[scale])), name
        assert cfg["generate"]["samplings"] == base["generate"]["samplings"], name


def test_epsilon_flags_set_the_default_grid_and_per_experiment_grids():
    grids = paper._epsilon_grids(["3", "inf", "main=3", "sst2=1,10"])
    assert grids == {"": [3, "inf"], "main": [3], "sst2": [1, 10]}
    assert paper._epsilon("2.5") == 2.5 and paper._epsilon("Infinity") == "inf"
    configs = paper.cpu_experiments("quick", "/nonexistent/data", epsilons=grids)
    eps = {name: from_dict(configs[name]).dp_tune.epsilons for name in ("main", "sst2", "ag_news")}
    assert eps["main"] == (3.0,) and eps["sst2"] == (1.0, 10.0) and eps["ag_news"][0] == 3.0
    assert eps["ag_news"][1] == float("inf")
    # The default grid is the scale's own.
    default = from_dict(paper.cpu_experiments("quick", "/nonexistent/data")["ag_news"]).dp_tune.epsilons
    assert len(default) == len(paper.CPU_SCALES["quick"]["epsilons"])


def test_only_runs_in_the_order_given_and_refuses_an_unknown_experiment(tmp_path, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr("dpsynth.experiment.runner.run_experiment",
                        lambda cfg, **kw: ran.append(cfg.name) or (_ for _ in ()).throw(SystemExit(0)))
    with pytest.raises(SystemExit):
        paper.main(["--scale", "quick", "--data", str(tmp_path), "--only", "sst2", "main"])
    assert ran == ["paper-quick-sst2"]  # sst2 first, as given
    assert paper.main(["--scale", "quick", "--data", str(tmp_path), "--only", "x3"]) == 2
    assert "no experiment 'x3' at scale quick" in capsys.readouterr().err


def test_label_repeats_tune_each_experiment_n_times_and_stop_at_dp_tune(tmp_path, monkeypatch):
    """`--label-repeats N`: every --only experiment with N DP repeats, run until dp_tune only, and a table of
    each model's D_valid label scores labelled as non-DP figures (per repeat, mean +- std)."""
    from types import SimpleNamespace

    from tests.test_nondp_figures import unlabelled

    calls = []

    def fake_run(cfg, **kw):
        calls.append((cfg.name, cfg.dp_tune.replicates, kw["until"]))
        trials = [SimpleNamespace(dp_tune=f"dp_tune[r{r}]") for r in range(cfg.dp_tune.replicates) for _ in (0, 1)]
        sens = SimpleNamespace(path=lambda *p: str(tmp_path / "valid.jsonl"))
        return SimpleNamespace(plan=SimpleNamespace(trials=trials), outputs={"sensitive": sens})

    monkeypatch.setattr("dpsynth.experiment.runner.run_experiment", fake_run)
    monkeypatch.setattr("dpsynth.experiment.runner.report_result", lambda result: 0)
    seen = []
    monkeypatch.setattr(paper, "_valid_label_scores", lambda plan, key, valid, max_tokens: seen.append(key) or
                        {"balanced_accuracy": 0.5 + 0.1 * len(seen), "mean_margin": 0.25})
    out = tmp_path / "repeats.md"
    assert paper.main(["--scale", "quick", "--data", str(tmp_path), "--only", "yelp_polarity", "lever_rank16",
                       "--label-repeats", "3", "--out", str(out)]) == 0
    assert calls == [("paper-quick-yelp_polarity", 3, "dp_tune"), ("paper-quick-lever_rank16", 3, "dp_tune")]
    assert seen == ["dp_tune[r0]", "dp_tune[r1]", "dp_tune[r2]"] * 2  # each model once, not once per sampling
    md = out.read_text()
    assert "| yelp_polarity | 3 | 0.600, 0.700, 0.800 | 0.700 +- 0.100 |" in md
    assert not unlabelled(md), unlabelled(md)


def test_lever_table_adds_the_no_dp_ceiling_row_when_the_base_ran_at_epsilon_inf():
    """With the base run at epsilon inf too, section 8 shows its row (the ceiling) with that model's own
    D_valid label scores, beside the epsilon-3 base; without it, no such row."""
    def row(eps, acc):
        return {"trial": f"t{eps}", "mode": "lora", "epsilon": eps, "multiple": 1, "guidance": 0.0, "contrast": "others",
                "replicate": 0, "wordcnn_accuracy": acc, "wordcnn_balanced_accuracy": acc, "steps": 100}

    base = {"rows": [row(3.0, 0.61), row(math.inf, 0.83)], "metrics": {"baselines": []}, "valid_loss": {},
            "label_scores": {"dp3": {"balanced_accuracy": 0.589, "mean_margin": 0.179, "epsilon": 3.0},
                             "dpinf": {"balanced_accuracy": 0.912, "mean_margin": 1.234, "epsilon": math.inf}}}
    lever = {"rows": [row(3.0, 0.5)], "metrics": {"baselines": []}, "valid_loss": {},
             "label_scores": {"dp": {"balanced_accuracy": 0.652, "mean_margin": 0.21, "epsilon": 3.0}}}
    md = "\n".join(paper._render_levers({"yelp_polarity": base, "lever_rank16": lever}, "cpu"))
    lines = [x for x in md.splitlines() if x.startswith("| yelp_polarity |") or x.startswith("| lever_rank16 |")]
    assert len(lines) == 3 and "| base |" in lines[0] and "0.589" in lines[0] and "0.610 / 0.610" in lines[0]
    assert "base without DP (epsilon inf)" in lines[1] and "0.912 | 1.234" in lines[1] and "0.830 / 0.830" in lines[1]
    assert "0.652" in lines[2]
    base3 = {**base, "rows": [row(3.0, 0.61)], "label_scores": {"dp3": base["label_scores"]["dp3"]}}
    md = "\n".join(paper._render_levers({"yelp_polarity": base3, "lever_rank16": lever}, "cpu"))
    assert "epsilon inf" not in md


def test_v3_runs_select_on_every_set_and_reuse_the_sets_models():
    """Study v3: each set's experiment selects with DP among guidance x temperature candidates of its epsilon-3
    model (x multiples on the main set), DP-on-real's sweep selected with DP too; the tuning and the unguided
    and w 1.5 candidates are the set's own experiment's (one cache)."""
    configs = paper.cpu_experiments("cpu", "/nonexistent/data")
    for name, dataset in paper.CPU_V3_SETS.items():
        cfg, own = configs[name], configs[paper.SET_EXPERIMENT[dataset]]
        assert cfg["sensitive"] == own["sensitive"] and cfg["pretrain"] == own["pretrain"]
        assert {k: v for k, v in cfg["dp_tune"].items() if k != "epsilons"} == {
            k: v for k, v in own["dp_tune"].items() if k != "epsilons"} and cfg["dp_tune"]["epsilons"] == [3]
        samplings = cfg["generate"]["samplings"]
        assert len(samplings) == len(paper.CPU_V3_GUIDANCE) * len(paper.CPU_V3_TEMPERATURES)
        assert all(s in samplings for s in own["generate"]["samplings"])  # w 0 and w 1.5 at t 1: cached corpora
        assert cfg["select"]["epsilon"] == cfg["evaluate"]["options"]["dp_select_epsilon"] > 0
        assert from_dict(cfg).select.epsilon == cfg["select"]["epsilon"]
    assert configs["v3_yelp_sentences"]["generate"]["multiples"] == [1, 3]
    assert configs["v3_yelp_polarity"]["select"]["epsilon"] < configs["v3_sst2"]["select"]["epsilon"]


def test_multiples_probe_changes_only_the_v3_candidates():
    """`--multiples M..`: every v3 experiment's candidates become the unguided corpus at those multiples, still
    DP-selected, without baselines; its DP model and everything before it are the experiment's own (cached)."""
    base, probe = paper.cpu_experiments("cpu", "/x"), paper.cpu_experiments("cpu", "/x", multiples=(3, 6, 10))
    for name in (*paper.CPU_V3_SETS, *paper.CPU_V3C_SETS):
        cfg, own = probe[name], base[name]
        assert cfg["generate"]["samplings"] == [paper._sampling(0.0)] and cfg["generate"]["multiples"] == [3, 6, 10]
        assert cfg["evaluate"]["baselines"] is False and cfg["select"] == own["select"]
        assert {k: v for k, v in cfg.items() if k not in ("generate", "evaluate")} == {
            k: v for k, v in own.items() if k not in ("generate", "evaluate")}
        assert {k: v for k, v in cfg["generate"].items() if k not in ("samplings", "multiples")} == {
            k: v for k, v in own["generate"].items() if k not in ("samplings", "multiples")}
        assert from_dict(cfg).generate.multiples == (3.0, 6.0, 10.0)
    assert all(probe[n] == base[n] for n in base if n not in (*paper.CPU_V3_SETS, *paper.CPU_V3C_SETS))


def _v3_row(trial, w, acc, bal, *, t=1.0, rep=0):
    """One v3 candidate's metric row (epsilon 3, 1x) as `bench/paper.py` collects it."""
    return {"trial": trial, "mode": "lora", "epsilon": 3.0, "multiple": 1, "guidance": w, "temperature": t,
            "contrast": "others", "replicate": rep, "wordcnn_accuracy": acc, "wordcnn_balanced_accuracy": bal}


def test_v3_table_sets_the_selected_corpus_beside_every_candidate_and_the_targets():
    rows = [_v3_row("u", 0.0, 0.70, 0.66), _v3_row("g3", 3.0, 0.80, 0.79), _v3_row("g6", 6.0, 0.81, 0.80, t=1.2)]
    res = {"rows": rows, "test_labels": ["a", "b"], "label_scores": {},
           "metrics": {"baselines": [{"baseline": "dp_on_real", "classifier": "wordcnn", "epsilon": 3.0,
                                      "accuracy": 0.75, "balanced_accuracy": 0.74},
                                     {"baseline": "real", "classifier": "wordcnn", "accuracy": 0.9,
                                      "balanced_accuracy": 0.9}]},
           "selections": {"select[lora-eps3]": {"selected": "g3", "composition": "parallel",
                                                "epsilon": {"rdp": 3.002, "pld": None}}},
           "selected_rows": [{"corpus": "selected-lora-eps3", "wordcnn_accuracy": 0.80,
                              "wordcnn_balanced_accuracy": 0.79}]}
    md = "\n".join(paper._render_v3({"v3_sst2": res}))
    line = next(x for x in md.splitlines() if x.startswith("| SST-2 |"))
    assert "| SST-2 | 3 | 1, parallel | 3.002 | g3 | 0.800 / 0.790 | 0.810 / 0.800 (g6) | met |" in line
    assert line.endswith("| 0.750 / 0.740 | 0.900 / 0.900 | met | met |")  # 0.66 >= 0.5 + 0.10
    assert "| g3 (selected) | 3 | 1 | 1 | 0.800 / 0.790 |" in md and "| g6 | 6 | 1.2 | 1 |" in md
    res["selected_rows"][0].update(wordcnn_accuracy=0.70, wordcnn_balanced_accuracy=0.52)
    line = next(x for x in paper._render_v3({"v3_sst2": res}) if x.startswith("| SST-2 |"))
    assert line.count("**not met**") == 2  # 11 points below the best; below DP-on-real
    assert paper._render_v3({"sst2": res}) == []
    # Several tuning epsilons (`--epsilons v3_sst2=1,3`): one row each, its own candidates and DP-on-real peer.
    res["rows"] += [dict(r, epsilon=1.0, trial=r["trial"] + "1") for r in rows]
    res["metrics"]["baselines"].append({"baseline": "dp_on_real", "classifier": "wordcnn", "epsilon": 1.0,
                                        "accuracy": 0.6, "balanced_accuracy": 0.6})
    res["selections"]["select[lora-eps1]"] = {"selected": "u1", "composition": "parallel", "epsilon": {"rdp": 1.0}}
    res["selected_rows"].append({"corpus": "selected-lora-eps1", "wordcnn_accuracy": 0.70, "wordcnn_balanced_accuracy": 0.66})
    lines = [x for x in paper._render_v3({"v3_sst2": res}) if x.startswith("| SST-2 |")]
    assert [x.split(" | ")[1] for x in lines] == ["1", "3"]
    assert "| u1 | 0.700 / 0.660 | 0.810 / 0.800 (g61) |" in lines[0] and "| 0.600 / 0.600 |" in lines[0]
    assert paper.cpu_experiments("cpu", "/x", epsilons={"v3_sst2": [1, 3]})["v3_sst2"]["dp_tune"]["epsilons"] == [1, 3]
    # A tuning at epsilon inf has no DP selection (none is planned): its row shows the candidates, no release.
    res["rows"] += [dict(r, epsilon=math.inf, trial=r["trial"] + "i") for r in rows]
    lines = [x for x in paper._render_v3({"v3_sst2": res}) if x.startswith("| SST-2 |")]
    assert [x.split(" | ")[1] for x in lines] == ["1", "3", "inf"]
    assert lines[2].startswith("| SST-2 | inf | none (no DP selection) | - | - | - | 0.810 / 0.800 (g6i) | - |")
    assert lines[2].endswith("| - | met |")  # the unguided candidate's balanced accuracy is still tabled
    assert "Candidates of SST-2 at tuning epsilon inf" in "\n".join(paper._render_v3({"v3_sst2": res}))


def test_v3_replicates_are_independent_runs_each_selected_and_tabled_with_their_spread(tmp_path, monkeypatch):
    """`--replicates N`: N DP runs per tuning epsilon of every v3 experiment (nothing else changes); the table
    has one row per run, its own candidates and selection, and the runs' mean +- sample std."""
    ran = []
    monkeypatch.setattr("dpsynth.experiment.runner.run_experiment",
                        lambda cfg, **kw: ran.append(cfg.dp_tune.replicates) or (_ for _ in ()).throw(SystemExit(0)))
    with pytest.raises(SystemExit):
        paper.main(["--scale", "quick", "--data", str(tmp_path), "--only", "v3_sst2", "--replicates", "3"])
    assert ran == [3]
    one, three = (paper.cpu_experiments("cpu", "/x", replicates=n) for n in (1, 3))
    for name in (*paper.CPU_V3_SETS, *paper.CPU_V3C_SETS):
        assert from_dict(one[name]).dp_tune.replicates == 1 and from_dict(three[name]).dp_tune.replicates == 3
        assert {k: v for k, v in three[name]["dp_tune"].items() if k != "replicates"} == {
            k: v for k, v in one[name]["dp_tune"].items() if k != "replicates"}
    assert three["sst2"] == one["sst2"]  # only the v3 experiments

    rows = [_v3_row("u", 0.0, 0.60, 0.60), _v3_row("g", 3.0, 0.70, 0.70),
            _v3_row("u-r1", 0.0, 0.64, 0.64, rep=1), _v3_row("g-r1", 3.0, 0.62, 0.62, rep=1)]
    res = {"rows": rows, "test_labels": ["a", "b"], "label_scores": {},
           "metrics": {"baselines": [{"baseline": "dp_on_real", "classifier": "wordcnn", "epsilon": 3.0,
                                      "accuracy": 0.55, "balanced_accuracy": 0.55}]},
           "selections": {"select[lora-eps3-r1]": {"selected": "u-r1", "composition": "parallel", "epsilon": {"rdp": 3.0}},
                          "select[lora-eps3]": {"selected": "g", "composition": "parallel", "epsilon": {"rdp": 3.0}}},
           "selected_rows": [{"corpus": "selected-lora-eps3", "wordcnn_accuracy": 0.70, "wordcnn_balanced_accuracy": 0.70},
                             {"corpus": "selected-lora-eps3-r1", "wordcnn_accuracy": 0.64,
                              "wordcnn_balanced_accuracy": 0.63}]}
    md = paper._render_v3({"v3_sst2": res})
    lines = [x for x in md if x.startswith("| SST-2 |")]
    assert [x.split(" | ")[1] for x in lines] == ["3 (run 1)", "3 (run 2)", "3"]
    # each run's best candidate is among its own candidates only
    assert "| g | 0.700 / 0.700 | 0.700 / 0.700 (g) |" in lines[0]
    assert "| u-r1 | 0.640 / 0.630 | 0.640 / 0.640 (u-r1) |" in lines[1]
    assert lines[2] == "| SST-2 | 3 | 2 | 0.670 +- 0.042 | 0.665 +- 0.049 | 0.670 +- 0.042 | 0.620 +- 0.028 | 0.550 / 0.550 |"
    text = "\n".join(md)
    assert "| g-r1 | 3 | 1 | 1 | 0.620 / 0.620 | - |" in text and "| u-r1 (selected) | 0 | 1 | 1 |" in text
    assert "Candidates of SST-2 at tuning epsilon 3 (run 2)" in text
    # a single run per cell has no spread table, and an epsilon-inf selection is tabled too
    del res["selections"]["select[lora-eps3-r1]"]
    assert not any(x.startswith("| SST-2 | 3 | 2 |") for x in paper._render_v3({"v3_sst2": res}))
    assert paper._v3_groups({"selections": {"select[lora-epsinf]": {}}})[0][:2] == (math.inf, 0)


def test_v3_with_label_contrast_is_v3_with_one_more_tuning_setting():
    """`v3c_<set>`: the v3 experiment of the set with `label_contrast` in its DP tuning and nothing else changed."""
    configs = paper.cpu_experiments("cpu", "/nonexistent/data")
    assert set(paper.CPU_V3C_SETS.values()) == set(paper.CPU_V3_SETS.values())
    for name in paper.CPU_V3C_SETS:
        cfg, v3 = configs[name], configs["v3_" + name[len("v3c_"):]]
        # (the scale's `label_contrast: 0` pin, which keeps v3's hashes, gives way to the options' value)
        assert v3["dp_tune"]["label_contrast"] == 0 and "label_contrast" not in cfg["dp_tune"]
        assert cfg["dp_tune"] == {**{k: v for k, v in v3["dp_tune"].items() if k != "label_contrast"},
                                  "options": {"label_contrast": paper.CPU_LABEL_CONTRAST}}
        assert {k: v for k, v in cfg.items() if k not in ("dp_tune", "name")} == {
            k: v for k, v in v3.items() if k not in ("dp_tune", "name")}
        assert from_dict(cfg).dp_tune.options["label_contrast"] == paper.CPU_LABEL_CONTRAST


def _model_dir(path) -> str:
    """A manifest-only stand-in for a `dpsynth import-model` directory (what a config reads)."""
    import json

    path.mkdir()
    (path / "manifest.json").write_text(json.dumps({"format": "dpsynth.model", "base": None,
                                                    "source": {"family": "gemma3", "path": "/m.gguf"}}))
    return str(path)


def test_generator_cells_are_the_v3_cells_from_the_imported_model(tmp_path):
    """`--base-model DIR`: each set's gen_<set> is its v3 cell (same data, tuning, candidates, selection and
    peers) with `base_model: DIR` in place of the public corpus, dedup, tokenizer and pretraining."""
    model = _model_dir(tmp_path / "gemma")
    configs = paper.cpu_experiments("cpu", "/nonexistent/data", base_model=model)
    assert set(configs) == set(paper.CPU_EXPERIMENTS)
    for name, dataset in paper.CPU_GEN_SETS.items():
        gen, v3 = configs[name], configs["v3_" + name[len("gen_"):]]
        cfg = from_dict(gen)
        assert cfg.base_model == model and not {"public", "dedup", "tokenizer", "pretrain"} & set(gen)
        for section in ("sensitive", "dp_tune", "generate", "select"):
            assert gen[section] == v3[section], (name, section)
        assert gen["evaluate"] == v3["evaluate"] and cfg.dp_tune.epsilons == (3.0,) and cfg.evaluate.baselines
    quick = paper.cpu_experiments("quick", "/nonexistent/data", base_model=model)
    for name in paper.CPU_GEN_SETS:
        cfg = from_dict(quick[name])
        assert cfg.sensitive.max_train == paper.CPU_GEN_QUICK["sizes"]["max_train"]
        assert cfg.dp_tune.max_tokens == cfg.generate.max_tokens == paper.CPU_GEN_QUICK["max_tokens"]
        assert len(cfg.generate.samplings) == len(paper.CPU_GEN_QUICK["guidance"]) and cfg.select.epsilon


def test_base_model_is_refused_outside_the_cpu_scales(tmp_path, capsys):
    with pytest.raises(SystemExit):
        paper.main(["--scale", "small", "--base-model", str(tmp_path)])
    assert "only at the cpu scales" in capsys.readouterr().err


def test_the_probe_verdict_is_read_when_there_and_said_missing_otherwise(tmp_path):
    import json

    assert paper.probe_verdict(None) == "not probed"
    assert paper.probe_verdict(str(tmp_path)).startswith("no probe result (FileNotFoundError")
    (tmp_path / paper.PROBE_FILE).write_text(json.dumps({"verdict": "no evidence of D in pretraining"}))
    assert paper.probe_verdict(str(tmp_path)) == "no evidence of D in pretraining"
    assert paper.probe_verdict(str(tmp_path / paper.PROBE_FILE)) == "no evidence of D in pretraining"
    (tmp_path / paper.PROBE_FILE).write_text(json.dumps({"score": 1}))
    assert paper.probe_verdict(str(tmp_path)) == "no verdict in the probe file"
    (tmp_path / paper.PROBE_FILE).write_text("[1, 2]")
    assert paper.probe_verdict(str(tmp_path)).startswith("no probe result (AttributeError")


def test_the_generator_table_puts_each_generator_and_the_probe_beside_the_figures(tmp_path):
    import json

    (tmp_path / paper.PROBE_FILE).write_text(json.dumps({"verdict": "CONTAMINATED"}))

    def res(acc):
        return {"rows": [_v3_row("u", 0.0, acc, acc)], "num_train": 64, "generator": "gemma3",
                "metrics": {"baselines": [{"baseline": "dp_on_real", "classifier": "wordcnn", "epsilon": 3.0,
                                           "accuracy": 0.55, "balanced_accuracy": 0.54},
                                          {"baseline": "real", "classifier": "wordcnn", "accuracy": 0.8,
                                           "balanced_accuracy": 0.8}]},
                "selections": {"select[lora-eps3]": {"selected": "u", "composition": "parallel", "epsilon": {"rdp": 3.0}}},
                "selected_rows": [{"corpus": "selected-lora-eps3", "wordcnn_accuracy": acc,
                                   "wordcnn_balanced_accuracy": acc}]}

    md = paper._render_generators({"gen_sst2": res(0.7), "v3_sst2": res(0.6)}, "/m/gemma-study", str(tmp_path))
    rows = [x for x in md if x.startswith("| SST-2 |")]
    assert len(rows) == 2
    assert "cpu preset" in rows[0] and "0.600 / 0.600" in rows[0] and rows[0].endswith("| - (dedup, not probed) |")
    assert "imported: gemma-study" in rows[1] and "0.700 / 0.700" in rows[1] and rows[1].endswith("| CONTAMINATED |")
    assert "| 0.550 / 0.540 | 0.800 / 0.800 |" in rows[1]
    assert "NOT deduplicated" in "\n".join(md) and "CONTAMINATED" in md[3]  # the verdict in the text too
    # The probe reads D without DP: its column and note say so (tests/test_nondp_figures.py's label).
    assert any(x.startswith("| set |") and paper.PROBE_COLUMN in x for x in md) and paper.PROBE_NOTE in md
    assert paper.NON_DP_FIGURE in paper.PROBE_COLUMN
    assert paper._render_generators({"v3_sst2": res(0.6)}, None, None) == []  # no generator run: no section
    md = paper._render_generators({"gen_sst2": res(0.7)}, "/m/g", None)
    assert any("cpu preset" in x and "not run" in x for x in md) and any(x.endswith("| not probed |") for x in md)
