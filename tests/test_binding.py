"""Tests of dpsynth.binding: config dataclasses bound to flags and plain mappings."""

import argparse
import dataclasses
import math

import pytest

from dpsynth import binding
from dpsynth.binding import make_config


@dataclasses.dataclass(frozen=True, kw_only=True)
class Small:
    rate: float = 0.5
    count: int | None = None
    name: str = "a"
    verbose: bool = False


def test_add_flags_derives_names_types_and_defaults():
    p = argparse.ArgumentParser()
    names = binding.add_flags(p, Small, overrides={"name": {"choices": ("a", "b"), "help": "which"}})
    assert names == ["rate", "count", "name", "verbose"]
    assert binding.from_args(Small, p.parse_args([])) == Small()
    got = binding.from_args(Small, p.parse_args(["--rate", "2", "--count", "3", "--name", "b", "--verbose"]))
    assert got == Small(rate=2.0, count=3, name="b", verbose=True) and isinstance(got.rate, float)
    with pytest.raises(SystemExit):
        p.parse_args(["--name", "c"])
    with pytest.raises(ValueError, match="does not have"):
        binding.add_flags(argparse.ArgumentParser(), Small, overrides={"nope": {}})


def test_add_flags_defaults_from_an_instance_and_skip():
    p = argparse.ArgumentParser()
    assert binding.add_flags(p, Small, defaults=Small(rate=3.0), skip=("verbose",)) == ["rate", "count", "name"]
    args = p.parse_args([])
    assert args.rate == 3.0 and not hasattr(args, "verbose")


def test_make_config_builds_nested_dataclasses():
    @dataclasses.dataclass(frozen=True)
    class Inner:
        a: int = 1
        b: tuple = ()

    @dataclasses.dataclass(frozen=True)
    class Outer:
        x: float = 0.0
        inner: Inner = Inner()

    got = make_config(Outer, {"x": 2.0, "inner": {"b": [1, 2]}}, "evaluate.options")
    assert got == Outer(x=2.0, inner=Inner(a=1, b=(1, 2)))
    with pytest.raises(ValueError, match=r"evaluate.options.inner.c: not an option of Inner"):
        make_config(Outer, {"inner": {"c": 1}}, "evaluate.options")


def test_make_config_builds_optional_nested_dataclasses():
    from dpsynth.evaluate.scoring import EvaluateConfig
    from dpsynth.evaluate.train_classifier import SweepConfig

    got = make_config(EvaluateConfig, {"classifiers": ["wordcnn"], "backbone_sweep": {"learning_rates": [0.01], "repeats": 1}},
                             "evaluate.options")
    assert got.backbone_sweep == SweepConfig(learning_rates=(0.01,), repeats=1)
    assert got.sweep_for("backbone") is got.backbone_sweep and got.sweep_for("wordcnn") == SweepConfig()
    assert make_config(EvaluateConfig, {}, "evaluate.options").sweep_for("backbone") == SweepConfig()




# Every TuneConfig field with a non-default value the tuner accepts (with the settings it needs
# in NEEDS); a new field must be added here, so that it gets a flag and an experiment key by
# construction (checked below).
TUNE_VALUES = dict(
    mode="prompt", epsilon=2.0, delta=1e-6, accountant="pld", batch_size=256.0, microbatch_size=8, steps=7,
    epochs=3.0, learning_rate=0.01, clip_norm=0.5, optimizer="adafactor", lora_rank=4, lora_alpha=8.0,
    lora_targets="mlp", prompt_length=5, prompt_init="vocab", template="x {label}", max_tokens=64, full_lm=True,
    z_loss=1e-4, max_batch_size=512, seed=7, checkpoint_every=10, privacy_unit="user", max_examples_per_user=3,
    mechanism="bandmf", bands=2, label_dropout=0.2, recipe="auto", token_budget=1e6, allow_large_delta=True,
    clipping="ghost", time_budget=60.0, reserve_selection_epsilon=0.3, label_contrast=0.5,
    label_contrast_form="sampled", reserve_label_noise_multiplier=30.0)
NEEDS = {"max_batch_size": {"accountant": "pld"}, "privacy_unit": {"max_examples_per_user": 3},
         "token_budget": {"recipe": "auto"}, "time_budget": {"recipe": "auto"}, "clipping": {"mode": "full"},
         "max_examples_per_user": {"privacy_unit": "user"}, "mechanism": {"bands": 2}, "bands": {"mechanism": "bandmf"}}


def _changes(name):
    return {name: TUNE_VALUES[name], **NEEDS.get(name, {})}


def test_every_tune_config_field_has_a_cli_flag():
    from dpsynth.train.tune_config import TuneConfig
    from trainers import dp_tune

    assert set(TUNE_VALUES) == {f.name for f in dataclasses.fields(TuneConfig)}
    parser = dp_tune.build_parser()
    required = ["--base", "b", "--train", "t", "--out", "o"]
    assert binding.from_args(TuneConfig, parser.parse_args(required)) == TuneConfig()
    for name in TUNE_VALUES:
        argv = list(required)
        for key, value in _changes(name).items():
            argv += [binding.flag_name(key)] if value is True else [binding.flag_name(key), str(value)]
        assert binding.from_args(TuneConfig, parser.parse_args(argv)) == TuneConfig(**_changes(name)), name
    assert math.isinf(parser.parse_args(required + ["--epsilon", "inf"]).epsilon)
    assert parser.parse_args(required + ["--label-contrast", "auto"]).label_contrast == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(required + ["--label-contrast", "strong"])


def test_every_tune_config_field_has_an_experiment_key():
    from dpsynth.experiment import stages
    from dpsynth.experiment.config import DPTuneConfig
    from dpsynth.train.tune_config import TuneConfig

    trial = {"mode": "lora", "epsilon": 3.0, "learning_rate": 1e-3, "clip_norm": 1.0}
    node = {**trial, "loss": "prefix", "seed": 0}  # a dp_tune node's config: one point of each grid axis
    named = {f.name for f in dataclasses.fields(DPTuneConfig)} | set(trial)
    assert named >= {"delta", "accountant", "batch_size", "epochs", "steps", "max_tokens", "lora_rank", "prompt_length",
                     "privacy_unit", "max_examples_per_user", "mechanism", "bands"}
    for name in TUNE_VALUES:  # (a node without label_contrast trains without it: `plan.label_contrast_key`)
        want = TuneConfig(**{**trial, "label_contrast": 0.0, **_changes(name)})
        assert stages.tune_config({**node, "options": _changes(name)}) == want, name  # any field, through options
        if name == "full_lm":
            assert stages.tune_config({**node, "loss": "full"}) == want
        elif set(_changes(name)) <= named:  # a key of the dp_tune section named like the field is that field
            assert stages.tune_config({**node, **_changes(name)}) == want, name
    assert stages.tune_config(node).seed is None  # the experiment's seed never fixes the DP noise


def test_add_flags_other_option_strings_keep_the_field_as_dest():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Run:
        tensorboard: bool = True
        groups: tuple[str, ...] = ()

    p = argparse.ArgumentParser()
    binding.add_flags(p, Run, overrides={"tensorboard": {"flags": ("--no-tensorboard",), "action": "store_false"},
                                         "groups": {"flags": ("--group", "-g"), "nargs": "*", "type": str}})
    assert {s for a in p._actions for s in a.option_strings} == {"-h", "--help", "--no-tensorboard", "--group", "-g"}
    assert binding.from_args(Run, p.parse_args([])) == Run()
    assert binding.from_args(Run, p.parse_args(["--no-tensorboard", "-g", "a", "b"])) == Run(tensorboard=False,
                                                                                             groups=["a", "b"])


def test_subconfig_keeps_the_library_declaration_with_a_preset_retype_and_hash_marks():
    """`subconfig` copies the kept fields (names, types, metadata) from the library config; `preset`
    replaces their defaults, `retype` their types, `unless_default` marks them hashed only when set,
    `extra` appends the caller's own fields; a preset for a field it does not keep is refused."""
    Sub = binding.subconfig("Sub", Small, lambda f: f.name in ("rate", "count", "name"), module=__name__,
                            preset={"rate": 0.25}, retype={"count": int | str | None}, unless_default=("name",),
                            extra=[("options", dict, dataclasses.field(default_factory=dict))])
    assert [f.name for f in dataclasses.fields(Sub)] == ["rate", "count", "name", "options"]
    assert Sub() == Sub(rate=0.25, count=None, name="a", options={})
    assert Small().rate == 0.5  # the library's default is untouched
    hints = {f.name: f.type for f in dataclasses.fields(Sub)}
    assert hints["count"] == (int | str | None) and hints["rate"] is float
    assert binding.stage_dict(Sub()) == {"rate": 0.25, "count": None, "options": {}}  # name: hashed only when set
    assert binding.stage_dict(Sub(name="b"))["name"] == "b"
    with pytest.raises(dataclasses.FrozenInstanceError):
        Sub().rate = 1.0
    with pytest.raises(TypeError, match="preset names fields it does not keep"):
        binding.subconfig("Bad", Small, lambda f: f.name == "rate", module=__name__, preset={"verbose": True})
