import pytest

from dpsynth.experiment.config import from_dict
from dpsynth.experiment.plan import build_plan, fingerprint_paths


@pytest.fixture
def data_files(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    (d / "train.csv").write_text("text,label\na,x\nb,y\n")
    (d / "test.csv").write_text("text,label\nc,x\n")
    (d / "public.txt").write_text("some public text\n")
    return d


def grid_config(data, **sections):
    base = {
        "public": {"embedded": False, "paths": [str(data / "public.txt")]},
        "sensitive": {"embedded": False, "train": str(data / "train.csv"), "test": str(data / "test.csv")},
        "dp_tune": {"modes": ["lora", "prompt"], "epsilons": [1, 3]},
        "generate": {"multiples": [1, 2, 3]},
    }
    for k, v in sections.items():
        base[k] = {**base.get(k, {}), **v}
    return from_dict(base)


def test_grid_of_12_shares_the_expensive_stages(data_files, tmp_path):
    plan = build_plan(grid_config(data_files), str(tmp_path / "run"))
    assert len(plan.trials) == 12
    kinds = [n.stage for n in plan.nodes]
    for shared in ("sensitive", "public", "tokenizer", "dedup", "pretrain", "evaluate"):
        assert kinds.count(shared) == 1
    assert kinds.count("dp_tune") == 4 and kinds.count("generate") == 12
    # Topological order: every input precedes its consumer.
    seen = set()
    for node in plan.nodes:
        assert set(node.input_keys()) <= seen
        seen.add(node.key)
    assert len({n.hash for n in plan.nodes}) == len(plan.nodes)
    assert len({t.id for t in plan.trials}) == 12


def _changed(a, b):
    ha = {n.key: n.hash for n in a.nodes}
    hb = {n.key: n.hash for n in b.nodes}
    assert ha.keys() == hb.keys()
    return {k for k in ha if ha[k] != hb[k]}


def _downstream(plan, roots):
    """Reference closure: `roots` and every node reachable from them (independent of hashing)."""
    out = set(roots)
    for node in plan.nodes:  # topological order
        if set(node.input_keys()) & out:
            out.add(node.key)
    return out


@pytest.mark.parametrize(
    "edit, direct",
    [
        ({"pretrain": {"steps": 301}}, lambda k: k == "pretrain"),
        ({"tokenizer": {"vocab_size": 4000}}, lambda k: k in ("dedup", "tokenizer")),  # dedup: its temporary one
        ({"dedup": {"min_tokens": 40}}, lambda k: k == "dedup"),
        ({"dp_tune": {"batch_size": 32}}, lambda k: k.startswith("dp_tune[") or k == "evaluate"),
        ({"dp_tune": {"lora_rank": 4}}, lambda k: k.startswith("dp_tune[lora")),
        ({"dp_tune": {"prompt_length": 8}}, lambda k: k.startswith("dp_tune[prompt")),
        ({"generate": {"max_tokens": 64}}, lambda k: k.startswith("generate[")),
        ({"evaluate": {"baselines": False}}, lambda k: k == "evaluate"),
        ({"seed": 1}, lambda k: k not in ("sensitive", "public")),
    ],
)
def test_a_changed_key_changes_exactly_the_affected_stages(data_files, tmp_path, edit, direct):
    base = build_plan(grid_config(data_files), str(tmp_path / "run"))
    cfg = grid_config(data_files, **{k: v for k, v in edit.items() if k != "seed"})
    if "seed" in edit:
        cfg = cfg.replace(seed=edit["seed"])
    new = build_plan(cfg, str(tmp_path / "run"))
    roots = {n.key for n in base.nodes if direct(n.key)}
    assert _changed(base, new) == _downstream(base, roots)


def test_data_content_changes_rerun_data_stages(data_files, tmp_path):
    base = build_plan(grid_config(data_files), str(tmp_path / "run"))
    (data_files / "train.csv").write_text("text,label\na,x\nB,y\n")
    new = build_plan(grid_config(data_files), str(tmp_path / "run"))
    assert _changed(base, new) == _downstream(base, {"sensitive"}) - {"public"}
    (data_files / "public.txt").write_text("other public text\n")
    newer = build_plan(grid_config(data_files), str(tmp_path / "run"))
    assert _changed(new, newer) == _downstream(new, {"public"})


def test_planting_makes_public_depend_on_sensitive(data_files, tmp_path):
    plan = build_plan(grid_config(data_files, public={"plant": 2}), str(tmp_path / "run"))
    assert plan.node("public").inputs == {"sensitive": "sensitive"}
    (data_files / "train.csv").write_text("text,label\nz,x\n")
    new = build_plan(grid_config(data_files, public={"plant": 2}), str(tmp_path / "run"))
    assert _changed(plan, new) == _downstream(plan, {"sensitive"}) and "tokenizer" in _changed(plan, new)


def test_adding_an_epsilon_keeps_existing_trials(data_files, tmp_path):
    base = build_plan(grid_config(data_files), str(tmp_path / "run"))
    new = build_plan(grid_config(data_files, dp_tune={"epsilons": [1, 3, 10]}), str(tmp_path / "run"))
    old = {n.key: n.hash for n in base.nodes}
    assert all(old[n.key] == n.hash for n in new.nodes if n.key in old and n.key != "evaluate")
    assert len(new.trials) == 18


def test_fingerprint_is_content_based(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("hello")
    first = fingerprint_paths([str(tmp_path)])
    f.write_text("hello")  # same content, new mtime
    assert fingerprint_paths([str(tmp_path)]) == first
    f.write_text("hellO")
    assert fingerprint_paths([str(tmp_path)]) != first
    assert fingerprint_paths([str(tmp_path / "missing")]) != fingerprint_paths([str(tmp_path / "missing2")])


def test_mode_learning_rates_replace_the_axis_of_their_mode_only(data_files, tmp_path):
    base = build_plan(grid_config(data_files), str(tmp_path / "run"))
    cfg = grid_config(data_files, dp_tune={"learning_rates": [0.001], "mode_learning_rates": {"prompt": [0.03, "1e-1"]}})
    new = build_plan(cfg, str(tmp_path / "run"))
    lrs = {(t.mode, t.learning_rate) for t in new.trials}
    assert lrs == {("lora", 0.001), ("prompt", 0.03), ("prompt", 0.1)}
    assert len(new.trials) == 2 * 3 * 3  # (1 lora lr + 2 prompt lrs) x 2 epsilons x 3 multiples
    # The LoRA trials and the shared stages keep their hashes: only prompt nodes and evaluate change.
    old = {n.key: n.hash for n in base.nodes}
    changed = {n.key for n in new.nodes if old.get(n.key) != n.hash}
    assert changed and all(k.startswith(("dp_tune[prompt", "generate[prompt")) or k == "evaluate" for k in changed)


def test_dp_label_histogram_changes_the_private_tunings_and_below(data_files, tmp_path):
    kw = {"dp_tune": {"modes": ["lora", "prompt"], "epsilons": [1, 3, float("inf")]}}
    base = build_plan(grid_config(data_files, **kw), str(tmp_path / "run"))
    assert all("label_distribution" not in n.config for n in base.nodes)  # the default stays out of the hashes
    hist = build_plan(grid_config(data_files, **kw, generate={"label_distribution": "dp_histogram",
                                                              "label_noise_multiplier": 10}), str(tmp_path / "run"))
    shared = {n.key for n in base.nodes}
    assert {n.key for n in hist.nodes} - shared == {n.key for n in hist.nodes if n.stage == "labels"}  # one per model
    hb = {n.key: n.hash for n in hist.nodes}
    changed = {n.key for n in base.nodes if n.hash != hb[n.key]}
    # Each private tuning reserves its histogram (`reserve_label_noise_multiplier`: its target covers the
    # corpus's histogram too), so it and everything below it change; the non-private ones do not.
    private_tunes = {n.key for n in base.nodes if n.stage == "dp_tune" and "epsinf" not in n.key}
    assert all(hist.node(k).config["reserve_label_noise_multiplier"] == 10 for k in private_tunes)
    assert changed == _downstream(base, private_tunes | {n.key for n in base.nodes if n.stage == "generate"})
    assert not any("reserve_label_noise_multiplier" in n.config for n in hist.nodes if "epsinf" in n.key)
    assert all(n.config["label_noise_multiplier"] == 10 for n in hist.nodes if n.stage == "generate")


def test_user_level_and_bandmf_settings_enter_only_when_set(data_files, tmp_path):
    base = build_plan(grid_config(data_files), str(tmp_path / "run"))
    for key in ("privacy_unit", "max_examples_per_user", "mechanism", "bands", "user_column"):
        assert all(key not in n.config for n in base.nodes)  # defaults stay out of the hashes
    (data_files / "train.csv").write_text("text,label,author\n" + "".join(f"t{i},{'xy'[i % 2]},u1\n" for i in range(20)))
    user = build_plan(grid_config(data_files, sensitive={"user_column": "author"},
                                  dp_tune={"privacy_unit": "user", "max_examples_per_user": 4, "mechanism": "bandmf",
                                           "bands": 2},
                                  evaluate={"baselines": False}),  # example-level baselines: refused at user level
                      str(tmp_path / "run"))
    tunes = [n for n in user.nodes if n.stage == "dp_tune"]
    assert all(n.config["privacy_unit"] == "user" and n.config["bands"] == 2 for n in tunes)
    assert user.node("sensitive").config["user_column"] == "author"
    from dpsynth.experiment import stages

    tc = stages.tune_config(tunes[0].config)
    assert (tc.privacy_unit, tc.max_examples_per_user, tc.mechanism, tc.bands) == ("user", 4, "bandmf", 2)
    splits, _ = stages.load_sensitive_splits(user.node("sensitive").config)
    assert [r["user"] for r in splits["train"]] == ["u1"] * len(splits["train"])
    assert stages.count_train_users(user.node("sensitive").config) == 1


def test_recipe_guidance_and_label_dropout_enter_only_when_set(data_files, tmp_path):
    base = build_plan(grid_config(data_files), str(tmp_path / "run"))
    for key in ("recipe", "token_budget", "label_dropout", "guidance", "guidance_contrast"):
        assert all(key not in n.config and key not in n.config.get("sampling", {}) for n in base.nodes)
    auto = build_plan(grid_config(data_files, dp_tune={"recipe": "auto", "token_budget": 1e6, "label_dropout": 0.1},
                                  generate={"samplings": [{"guidance": 0}, {"guidance": 2.0, "guidance_contrast": "null"}],
                                            "multiples": [1]}), str(tmp_path / "run"))
    tunes = [n for n in auto.nodes if n.stage == "dp_tune"]
    assert sorted(n.key for n in tunes) == ["dp_tune[lora-eps1-auto-C1]", "dp_tune[lora-eps3-auto-C1]",
                                            "dp_tune[prompt-eps1-auto-C1]", "dp_tune[prompt-eps3-auto-C1]"]
    assert all("learning_rate" not in n.config and n.config["recipe"] == "auto" for n in tunes)
    from dpsynth.experiment import stages

    tc = stages.tune_config(tunes[0].config)
    assert (tc.recipe, tc.token_budget, tc.label_dropout) == ("auto", 1e6, 0.1)
    gens = sorted(n.key for n in auto.nodes if n.stage == "generate")
    assert "generate[lora-eps3-auto-C1-t1-k0-n1-g2-null-x1]" in gens and "generate[lora-eps3-auto-C1-t1-k0-n1-x1]" in gens
    unguided = [n for n in auto.nodes if n.key == "generate[lora-eps3-auto-C1-t1-k0-n1-x1]"][0]
    assert "guidance" not in unguided.config["sampling"]
    assert all(t.learning_rate is None for t in auto.trials)


def test_label_contrast_enters_a_node_where_the_run_takes_it_and_absent_means_off(data_files, tmp_path):
    """The recipe's contrast ("auto") changes what a recipe-auto run trains, so it enters those nodes'
    hashes; a run without it (manual recipe, or pinned to 0) hashes as before the setting existed,
    and the stage reads absent as off. Given in `options`, it is hashed with them."""
    from dpsynth.experiment import stages
    from dpsynth.experiment.config import ConfigError

    def tunes(**dp):
        plan = build_plan(grid_config(data_files, dp_tune=dp), str(tmp_path / "run"))
        assert all("label_contrast" not in k for k in plan.node("evaluate").config["dp_tune"])  # DP-on-real: not its
        return [n for n in plan.nodes if n.stage == "dp_tune"]

    def contrast(node):
        return stages.tune_config(node.config).label_contrast

    for node in tunes() + tunes(recipe="auto", label_contrast=0):
        assert "label_contrast" not in node.config and contrast(node) == 0.0
    assert {n.key: n.hash for n in tunes(label_contrast=0)} == {n.key: n.hash for n in tunes()}
    for node in tunes(recipe="auto"):
        assert node.config["label_contrast"] == "auto" and contrast(node) == "auto"
    for node in tunes(label_contrast=0.5):
        assert node.config["label_contrast"] == 0.5 and contrast(node) == 0.5
    for node in tunes(recipe="auto", options={"label_contrast": 1.0}):
        assert "label_contrast" not in node.config and contrast(node) == 1.0
    with pytest.raises(ConfigError, match="label_contrast is given twice"):
        grid_config(data_files, dp_tune={"label_contrast": 1.0, "options": {"label_contrast": 1.0}})
    with pytest.raises(ConfigError, match=r"dp_tune.label_contrast: .*or 'auto'"):
        grid_config(data_files, dp_tune={"label_contrast": "yes"})


def test_replicates_are_independent_runs_that_share_everything_else(data_files, tmp_path):
    one = build_plan(grid_config(data_files), str(tmp_path / "run"))
    three = build_plan(grid_config(data_files, dp_tune={"replicates": 3}), str(tmp_path / "run"))
    assert len(three.trials) == 3 * len(one.trials)
    assert {n.key: n.hash for n in one.nodes if n.stage != "evaluate"}.items() <= \
        {n.key: n.hash for n in three.nodes}.items()  # repeat 0 is the run without repeats
    tunes = [n for n in three.nodes if n.stage == "dp_tune"]
    assert len({n.hash for n in tunes}) == len(tunes) == 12
    r2 = three.node("dp_tune[lora-eps3-lr0.001-C1-r2]")
    assert r2.config["replicate"] == 2
    gens = {t.id: three.node(t.generate).config["seed"] for t in three.trials if t.mode == "lora" and t.epsilon == 3}
    assert gens["lora-eps3-lr0.001-C1-t1-k0-n1-x1"] != gens["lora-eps3-lr0.001-C1-r2-t1-k0-n1-x1"]
    assert sorted({t.replicate for t in three.trials}) == [0, 1, 2]


def test_dedup_also_against_shares_dedup_and_pretrain_across_sensitive_sets(data_files, tmp_path):
    (data_files / "other.csv").write_text("text,label\nd,x\ne,y\nf,x\n")
    a_sens = {"embedded": False, "train": str(data_files / "train.csv"), "test": str(data_files / "test.csv")}
    b_sens = {"embedded": False, "train": str(data_files / "other.csv"), "test": str(data_files / "test.csv")}
    both = {"a": a_sens, "b": b_sens}
    a = build_plan(grid_config(data_files, sensitive=a_sens, dedup={"also_against": both}), str(tmp_path / "r"))
    b = build_plan(grid_config(data_files, sensitive=b_sens, dedup={"also_against": both}), str(tmp_path / "r"))
    assert a.node("sensitive").hash != b.node("sensitive").hash
    assert a.node("dedup").hash == b.node("dedup").hash and a.node("pretrain").hash == b.node("pretrain").hash
    assert a.node("dedup").config["sets"] == ["a", "b"]
    assert a.node("dedup").inputs["sensitive_sets"] == ("sensitive[a]", "sensitive[b]")
    assert a.node("sensitive[a]").hash == a.node("sensitive").hash  # the same dataset, one cache entry
    # The experiment's own set is always cut, even when not listed.
    c = build_plan(grid_config(data_files, sensitive=b_sens, dedup={"also_against": {"a": a_sens}}), str(tmp_path / "r"))
    assert c.node("dedup").config["sets"] == ["a", "sensitive"]
    # Without also_against the dedup stage (and its hash) is what it was.
    plain = build_plan(grid_config(data_files), str(tmp_path / "r"))
    assert "also_against" not in plain.node("dedup").config and "sensitive" in plain.node("dedup").inputs
    with pytest.raises(Exception, match="dedup.also_against.x.train"):
        grid_config(data_files, dedup={"also_against": {"x": {"embedded": False, "test": "t.csv"}}})


def test_dp_label_histogram_is_one_node_per_dp_tuned_model(data_files, tmp_path):
    cfg = grid_config(data_files, generate={"label_distribution": "dp_histogram", "label_noise_multiplier": 4.0,
                                            "multiples": [1, 2]})
    plan = build_plan(cfg, str(tmp_path / "run"))
    tunes = [n for n in plan.nodes if n.stage == "dp_tune"]
    labels = [n for n in plan.nodes if n.stage == "labels"]
    gens = [n for n in plan.nodes if n.stage == "generate"]
    assert len(labels) == len(tunes) and len(gens) > len(tunes)  # S x M corpora per model, one histogram
    for g in gens:
        lab = plan.node(g.inputs["labels"])
        assert lab.inputs["model"] == g.inputs["model"]
    assert set(plan.node("evaluate").inputs["labels"]) == {n.key for n in labels}
    assert set(plan.node("evaluate").inputs["models"]) == {n.key for n in tunes}
    # The default (uniform labels) has no labels node.
    assert not [n for n in build_plan(grid_config(data_files), str(tmp_path / "run")).nodes if n.stage == "labels"]


def test_select_nodes_only_when_asked_and_one_per_private_dp_run(data_files, tmp_path):
    base = build_plan(grid_config(data_files, dp_tune={"epsilons": [1, 3, float("inf")]}), str(tmp_path / "run"))
    assert not [n for n in base.nodes if n.stage == "select"]
    plan = build_plan(grid_config(data_files, dp_tune={"epsilons": [1, 3, float("inf")]}, select={"epsilon": 0.5}),
                      str(tmp_path / "run"))
    selects = [n for n in plan.nodes if n.stage == "select"]
    assert sorted(n.key for n in selects) == ["select[lora-eps1]", "select[lora-eps3]", "select[prompt-eps1]",
                                              "select[prompt-eps3]"]  # none for the non-private epsilon
    for n in selects:
        assert len(n.config["candidates"]) == 3 and n.config["split"] == "positional"  # last 10% of train
        assert len(n.inputs["synthetic"]) == 3
    ev = plan.node("evaluate")
    assert set(ev.inputs["selected"]) == {n.key for n in selects}
    # A positional D_valid: the selection composes sequentially, so each private tuning reserves it (its
    # target covers the selection: `TuneConfig.reserve_selection_epsilon`); the non-private one does not.
    tunes = {n.key: n for n in plan.nodes if n.stage == "dp_tune"}
    for key, n in tunes.items():
        assert n.config.get("reserve_selection_epsilon") == (None if "epsinf" in key else 0.5)
    changed = {k for k, n in tunes.items() if n.hash != base.node(k).hash}
    assert changed == {k for k in tunes if "epsinf" not in k}
    # A data-independent split: nothing upstream changes; the evaluate node reads the selected corpora
    kw = {"dp_tune": {"epsilons": [1, 3, float("inf")]}, "sensitive": {"split": {"holdout": "hash"}}}
    base = build_plan(grid_config(data_files, **kw), str(tmp_path / "run"))
    plan = build_plan(grid_config(data_files, **kw, select={"epsilon": 0.5}), str(tmp_path / "run"))
    same = {n.key: n.hash for n in base.nodes}
    assert all(same[n.key] == n.hash for n in plan.nodes if n.key in same and n.stage != "evaluate")
    assert plan.node("evaluate").hash != base.node("evaluate").hash
    # a Gaussian selection reserves nothing (the reservation is the exponential mechanism's entry)
    gauss = build_plan(grid_config(data_files, select={"epsilon": 0.5, "mechanism": "gaussian"}), str(tmp_path / "r"))
    assert not any("reserve_selection_epsilon" in n.config for n in gauss.nodes if n.stage == "dp_tune")


def test_select_split_kind_follows_the_sensitive_config(data_files, tmp_path):
    from dpsynth.experiment.plan import valid_split_kind

    (data_files / "valid.csv").write_text("text,label\nd,x\n")
    files = grid_config(data_files, sensitive={"valid": str(data_files / "valid.csv")})
    assert valid_split_kind(files.sensitive) == "files"
    assert valid_split_kind(grid_config(data_files, sensitive={"split": {"holdout": "hash"}}).sensitive) == "hash"
    assert valid_split_kind(grid_config(data_files).sensitive) == "positional"
    assert valid_split_kind(grid_config(data_files, sensitive={"valid": str(data_files / "valid.csv"),
                                                               "max_valid": 1}).sensitive) == "positional"
