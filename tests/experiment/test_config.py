import dataclasses
import math

import pytest
import yaml

from dpsynth.experiment import config as cfgmod
from dpsynth.experiment.config import ConfigError, ExperimentConfig, from_dict, load_config, to_dict


def test_defaults_are_valid_and_round_trip_through_yaml(tmp_path):
    cfg = from_dict({})
    assert cfg == ExperimentConfig()
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(to_dict(cfg)))
    assert load_config(str(path)) == cfg


def test_full_config_parses_types():
    cfg = from_dict(
        {
            "name": "x",
            "dp_tune": {"modes": ["lora", "prompt"], "epsilons": [1, "3", ".inf", "inf"], "learning_rates": "1e-3"},
            "generate": {"samplings": [{"temperature": 0.5, "top_k": 40}], "multiples": 3},
            "pretrain": {"preset": "small", "options": {"warmup_steps": 10}},
        }
    )
    assert cfg.dp_tune.modes == ("lora", "prompt")
    assert cfg.dp_tune.epsilons[:2] == (1.0, 3.0) and all(math.isinf(e) for e in cfg.dp_tune.epsilons[2:])
    assert cfg.dp_tune.learning_rates == (1e-3,)  # scalar -> one-element tuple; YAML string number
    assert cfg.generate.samplings == (cfgmod.SamplingConfig(temperature=0.5, top_k=40),)
    assert cfg.generate.multiples == (3.0,)
    assert cfg.pretrain.options == {"warmup_steps": 10}
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.pretrain.steps = 3  # type: ignore[misc]


_USER_LEVEL = {"sensitive": {"embedded": False, "train": "t.csv", "test": "u.csv", "user_column": "author"},
               "dp_tune": {"privacy_unit": "user", "max_examples_per_user": 4}}


@pytest.mark.parametrize(
    "data, key",
    [
        ({"dp_tune": {"epsilon": [1]}}, "dp_tune.epsilon: unknown key (did you mean 'epsilons'?)"),
        ({"dp_tune": {"epsilons": [1, -1]}}, "dp_tune.epsilons[1]: must be > 0"),
        ({"dp_tune": {"epsilons": []}}, "dp_tune.epsilons: must list at least one value"),
        ({"dp_tune": {"modes": ["lora", "adapter"]}}, "dp_tune.modes[1]: must be one of full, prompt, lora"),
        ({"dp_tune": {"delta": 2}}, "dp_tune.delta: must be in the open interval (0, 1)"),
        ({"dp_tune": {"mode_learning_rates": {"adapter": [0.1]}}}, "dp_tune.mode_learning_rates.adapter: must be one of"),
        ({"dp_tune": {"mode_learning_rates": {"full": [0.1]}}}, "dp_tune.mode_learning_rates.full: names a mode that is not in"),
        ({"dp_tune": {"mode_learning_rates": {"lora": [0.1, -1]}}}, "dp_tune.mode_learning_rates.lora[1]: must be a number > 0"),
        ({"dp_tune": {"mode_learning_rates": {"lora": ["fast"]}}}, "dp_tune.mode_learning_rates.lora[0]: must be a number > 0"),
        ({"dp_tune": {"mode_learning_rates": {"lora": []}}}, "dp_tune.mode_learning_rates.lora: must list at least one value"),
        ({"dp_tune": {"steps": 10}}, "dp_tune: give exactly one of `epochs` and `steps`"),
        ({"dp_tune": {"batch_size": "big"}}, "dp_tune.batch_size: expected an integer"),
        ({"generate": {"samplings": [{"temperature": -1}]}}, "generate.samplings[0].temperature: must be a finite number >= 0"),
        ({"generate": {"samplings": [{"topk": 3}]}}, "generate.samplings[0].topk: unknown key (did you mean 'top_k'?)"),
        ({"pretrain": {"steps": 0}}, "pretrain.steps: must be positive"),
        ({"dedup": {"min_tokens": 0}}, "dedup.min_tokens: must be an integer >= 1"),
        ({"dedup": {"threads": 2}}, "dedup.threads: unknown key"),
        ({"pretrain": {"learning_rate": -1}}, "pretrain.learning_rate: must be > 0"),
        ({"pretrain": {"preset": "huge"}}, "pretrain.preset: must name a model preset"),
        ({"pretrain": {"options": {"warmup": 10}}}, "pretrain.options.warmup: not an option of PretrainConfig"),
        ({"pretrain": {"options": {"valid_unit": "page"}}}, "pretrain.options.valid_unit: must be one of"),
        ({"generate": {"label_distribution": "counts"}}, "generate.label_distribution: must be one of uniform, dp_histogram"),
        ({"generate": {"label_distribution": "dp_histogram"}}, "generate.label_noise_multiplier: must be > 0"),
        ({"generate": {"label_noise_multiplier": 5}}, "generate.label_noise_multiplier: only applies to"),
        ({"pretrain": "tiny"}, "pretrain: expected a mapping"),
        ({"public": {"embedded": False}}, "public: needs `embedded: true` or at least one entry in `paths`"),
        ({"public": {"embedded": "yes"}}, "public.embedded: expected true or false"),
        ({"sensitive": {"embedded": False, "test": "t.csv"}}, "sensitive.train: is required"),
        ({"sensitive": {"train": "t.csv"}}, "sensitive: give either `embedded: true` or file paths"),
        ({"sensitive": {"format": "xml"}}, "sensitive.format: must be one of"),
        ({"sensitive": {"split": {"holdout": "random"}}}, "sensitive.split: holdout must be one of"),
        ({"sensitive": {"split": {"colum": "x"}}}, "sensitive.split.colum: unknown key"),
        ({"sensitive": {"embedded": False, "train": "a.csv", "test": "b.csv",
                        "split": {"holdout": "hash", "test_fraction": 0.1}}}, "sensitive.test: give a test file"),
        ({"evaluate": {"classifiers": ["bert"]}}, "evaluate.classifiers[0]: must be one of wordcnn, backbone"),
        # `options` are the library's EvaluateConfig fields, validated by it when the file loads
        ({"evaluate": {"options": {"dp_sweep_accounting": "all"}}}, "evaluate.options.dp_sweep_accounting: must be one of"),
        ({"evaluate": {"options": {"wordcnn": {"filters": 8, "kernels": 3}}}},
         "evaluate.options.wordcnn.kernels: not an option of WordCNNConfig"),
        ({"evaluate": {"options": {"model_dir": "/elsewhere"}}}, "evaluate.options.model_dir: is set by the experiment"),
        ({"seed": None}, "seed: must not be null"),
        ({"dp_tune": {"privacy_unit": "person"}}, "dp_tune.privacy_unit: must be 'example' or 'user'"),
        ({"dp_tune": {"privacy_unit": "user"}}, "dp_tune.privacy_unit: 'user' needs max_examples_per_user >= 1"),
        ({"dp_tune": {"privacy_unit": "user", "max_examples_per_user": 4}}, "dp_tune.privacy_unit: user needs sensitive.user_column"),
        ({"dp_tune": {"mechanism": "bandmf"}}, "dp_tune.bands: must be >= 1 with mechanism 'bandmf'"),
        ({"dp_tune": {"bands": 4}}, "dp_tune.bands: is a BandMF setting"),
        ({"sensitive": {"user_column": "author"}}, "sensitive.user_column: the embedded reviews have no user column"),
        ({"dp_tune": {"recipe": "magic"}}, "dp_tune.recipe: must be one of manual, auto"),
        ({"dp_tune": {"recipe": "auto", "learning_rates": [0.1, 0.2]}}, "dp_tune.recipe: auto chooses the learning rate"),
        ({"dp_tune": {"token_budget": 1e6}}, "dp_tune.token_budget: is a setting of the automatic recipe"),
        ({"dp_tune": {"label_dropout": 1.0}}, "dp_tune.label_dropout: must be in [0, 1)"),
        ({"dp_tune": {"max_tokens": "auto"}}, "dp_tune.max_tokens: 'auto' is chosen by the automatic recipe"),
        ({"dp_tune": {"recipe": "auto", "max_tokens": "long"}}, "dp_tune.max_tokens: must be a number of tokens or 'auto'"),
        ({"generate": {"max_tokens": 4}}, "generate.max_tokens: must be >= 8 (or null"),
        ({"generate": {"batch_size": "max"}}, "generate.batch_size: must be a positive integer or 'auto'"),
        ({"generate": {"batch_size": 0}}, "generate.batch_size: must be a positive integer or 'auto'"),
        # `options` are the job's settings, validated by the job's config when the file loads
        ({"generate": {"options": {"examples_per_shard": 0}}}, "generate.options.examples_per_shard: must be >= 1"),
        ({"generate": {"options": {"formats": ["csv"]}}}, "generate: --format must include jsonl"),  # (the flag's name)
        ({"generate": {"options": {"shards": 3}}}, "generate.options.shards: not an option of GenerateConfig"),
        ({"generate": {"options": {"seed": 3}}}, "generate.options.seed: is set by the experiment"),
        ({"generate": {"samplings": [{"guidance": -1}]}}, "generate.samplings[0].guidance: must be a finite number >= 0"),
        ({"generate": {"samplings": [{"guidance": 1, "guidance_contrast": "x"}]}},
         "generate.samplings[0].guidance_contrast: must be one of others, null"),
        ({"bogus": 1}, "bogus: unknown key"),
        # A user-level model cannot be composed with example-level releases: refused when the config is loaded,
        # not at the evaluate stage (the audit's run failed there with ValueError after every model was trained).
        (_USER_LEVEL, "evaluate.baselines: with dp_tune.privacy_unit: user"),
        ({**_USER_LEVEL, "evaluate": {"baselines": False}, "generate": {"label_distribution": "dp_histogram",
                                                                        "label_noise_multiplier": 10}},
         "generate.label_distribution: with dp_tune.privacy_unit: user"),
    ],
)
def test_errors_name_the_yaml_key(data, key):
    with pytest.raises(ConfigError) as err:
        from_dict(data)
    assert str(err.value).startswith(key), str(err.value)


def test_load_config_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="missing.yaml: config file not found"):
        load_config(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("dp_tune: {epsilons: [0]}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: dp_tune.epsilons\[0\]: must be > 0"):
        load_config(str(bad))
    broken = tmp_path / "broken.yaml"
    broken.write_text("dp_tune: [\n")
    with pytest.raises(ConfigError, match="broken.yaml: not valid YAML"):
        load_config(str(broken))


def test_replace_validates_and_merges_sections():
    cfg = from_dict({"pretrain": {"preset": "small", "steps": 5}})
    new = cfg.replace(pretrain={"steps": 7})
    assert new.pretrain.steps == 7 and new.pretrain.preset == "small" and cfg.pretrain.steps == 5
    with pytest.raises(ConfigError, match="pretrain.steps"):
        cfg.replace(pretrain={"steps": -1})


def test_repo_configs_are_valid():
    import pathlib

    configs = sorted((pathlib.Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))
    assert configs, "configs/*.yaml missing"
    for path in configs:
        load_config(str(path))


def test_uncomposable_releases_name_what_to_change():
    for data in (_USER_LEVEL, {**_USER_LEVEL, "evaluate": {"baselines": False},
                               "generate": {"label_distribution": "dp_histogram", "label_noise_multiplier": 10}}):
        with pytest.raises(ConfigError) as err:
            from_dict(data)
        assert "dp_tune: {privacy_unit: example}" in str(err.value)
    ok = from_dict({**_USER_LEVEL, "evaluate": {"baselines": False}})  # user-level models alone compose
    assert ok.dp_tune.privacy_unit == "user"
    # Non-private user-level trials have no unit: nothing to refuse.
    assert from_dict({**_USER_LEVEL, "dp_tune": {**_USER_LEVEL["dp_tune"], "epsilons": [math.inf]}})


SECTIONS = (cfgmod.PublicConfig, cfgmod.SensitiveConfig, cfgmod.TokenizerConfig, cfgmod.DedupConfig,
            cfgmod.PretrainConfig, cfgmod.DPTuneConfig, cfgmod.SamplingConfig, cfgmod.GenerateConfig,
            cfgmod.EvaluateConfig)
# A non-default value of each setting marked `UNLESS_DEFAULT` (and of the field it follows).
SET = {"user_column": "user", "split": {"holdout": "hash"}, "max_dead_letters": "2%", "recipe": "auto",
       "token_budget": 1e6, "label_dropout": 0.1, "privacy_unit": "user", "max_examples_per_user": 4,
       "mechanism": "bandmf", "bands": 4, "guidance": 1.5, "guidance_contrast": "null", "min_p": 0.05,
       "label_distribution": "dp_histogram", "label_noise_multiplier": 10.0,
       "encoding": "cp1252", "allow_large_delta": True, "label_contrast": 0.5}


@pytest.mark.parametrize("cls", SECTIONS, ids=lambda c: c.__name__)
def test_stage_dict_drops_only_marked_settings_that_are_not_set(cls):
    marks = {f.name: f.metadata[cfgmod.UNLESS_DEFAULT] for f in dataclasses.fields(cls)
             if cfgmod.UNLESS_DEFAULT in f.metadata}
    assert set(marks) <= set(SET)
    default = cls()
    assert cfgmod.stage_dict(default) == {k: v for k, v in to_dict(default).items() if k not in marks}
    for name, mark in marks.items():
        leader = {} if mark is True else {mark: SET[mark]}
        section = dataclasses.replace(default, **leader, **{name: SET[name]})
        assert cfgmod.stage_dict(section)[name] == to_dict(section)[name]  # set: hashed
        if mark is not True:  # follows another field: dropped while that one is at its default, even if set
            section = dataclasses.replace(default, **{name: SET[name]})
            assert name not in cfgmod.stage_dict(section)


def test_follower_settings_are_hashed_at_their_own_default_once_their_leader_is_set():
    guided = cfgmod.SamplingConfig(guidance=1.5)
    assert guided.identity()["guidance_contrast"] == "others"
    assert "guidance" not in cfgmod.SamplingConfig().identity()


# DPTuneConfig defaults that deliberately differ from the tuner's (CPU-sized grid points; its
# docstring says why). Every other field named like a TuneConfig field has the tuner's default.
TUNE_DEFAULTS_DIFFER = {"batch_size": (64, 1024.0), "epochs": (1.0, 10.0), "max_tokens": (128, 512),
                        "prompt_length": (16, 20)}
# Grid axes: a tuple of the tuner's single value.
TUNE_AXES = {"modes": "mode", "epsilons": "epsilon", "learning_rates": "learning_rate", "clip_norms": "clip_norm"}


def test_dp_tune_defaults_agree_with_the_tuner_except_where_documented():
    from dpsynth.train import tune_config

    tune = {f.name: getattr(tune_config.TuneConfig(), f.name) for f in dataclasses.fields(tune_config.TuneConfig)}
    exp = cfgmod.DPTuneConfig()
    shared = [f.name for f in dataclasses.fields(exp) if f.name in tune]
    assert set(TUNE_DEFAULTS_DIFFER) <= set(shared)
    assert {name: exp_default for name, (exp_default, _) in TUNE_DEFAULTS_DIFFER.items()} == cfgmod.DP_TUNE_PRESET
    for name in shared:
        want = TUNE_DEFAULTS_DIFFER.get(name, (tune[name], tune[name]))
        assert (getattr(exp, name), tune[name]) == want, name
        doc = cfgmod.DPTuneConfig.__doc__
        assert name in doc, f"{name}: not named in DPTuneConfig's docstring"
    assert {axis: getattr(exp, axis)[0] for axis in TUNE_AXES} == {
        "modes": tune["mode"], "epsilons": tune["epsilon"], "learning_rates": 1e-3, "clip_norms": tune["clip_norm"]}
    assert tune["learning_rate"] == 3e-3  # the documented difference of the learning-rate axis
    assert exp.loss == "prefix" and tune["full_lm"] is False


def test_dp_tune_choices_are_the_tuners():
    from dpsynth.dp import accounting, plan
    from dpsynth.train import recipe, tune_config

    assert cfgmod.MODES == tune_config.MODES
    assert cfgmod.ACCOUNTANTS == accounting.ACCOUNTANTS
    assert cfgmod.RECIPES == recipe.RECIPES
    assert set(plan.PRIVACY_UNITS) == {"example", "user"}


def test_auto_length_and_time_budget_reach_the_tuner_and_generation_follows_the_model(tmp_path):
    """`dp_tune.max_tokens: auto` and `options: {time_budget: S}` are the tuner's own settings (each run chooses
    them when it starts); `generate.max_tokens: null` hands generation no length, so it samples at the model's
    tuned one."""
    from dpsynth.experiment import stages
    from dpsynth.experiment.plan import build_plan

    cfg = from_dict({"dp_tune": {"recipe": "auto", "max_tokens": "auto", "options": {"time_budget": 90}},
                     "generate": {"max_tokens": None}})
    assert (cfg.dp_tune.max_tokens, cfg.generate.max_tokens) == ("auto", None)
    assert from_dict(to_dict(cfg)) == cfg
    plan = build_plan(cfg, str(tmp_path))
    (tune,) = [n for n in plan.nodes if n.stage == "dp_tune"]
    tc = stages.tune_config(tune.config)
    assert (tc.max_tokens, tc.time_budget, tc.recipe) == ("auto", 90.0, "auto")
    (gen,) = [n for n in plan.nodes if n.stage == "generate"]
    assert gen.config["max_tokens"] is None
    assert from_dict({"dp_tune": {"max_tokens": 96}}).dp_tune.max_tokens == 96  # a number stays a number
    auto = from_dict({"generate": {"batch_size": "auto", "options": {"memory_limit": 1 << 30}}})
    (gen,) = [n for n in build_plan(auto, str(tmp_path / "b")).nodes if n.stage == "generate"]
    assert gen.config["batch_size"] == "auto" and gen.config["options"] == {"memory_limit": 1 << 30}
    with pytest.raises(ConfigError, match="dp_tune.options.time_budget: is a setting of the automatic recipe"):
        from_dict({"dp_tune": {"options": {"time_budget": 90}}})  # the tuner validates it, when the file loads
