"""One declaration per setting (issue 36): no config field, config class or constant declared twice.

Walks the source of `dpsynth/` (nothing imported but the configs compared):

* every config dataclass (`class XConfig` / `XSpec` / `XSettings` with annotated fields) declared
  by a `class` statement: two of them with one name fail;
* every pair of configs where one is built from the other (`FLOWS`: the experiment's sections
  into the library's configs, a job's config into its sampler, ...): a field name declared in
  both fails;
* every module-level constant assigned a literal: the same name with the same value in two
  modules fails (import it from the one that owns it).

Deliberate exceptions are listed below, each with its reason; one that no longer occurs fails
too, so the lists shrink as the declarations are merged.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import functools
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dpsynth"
CONFIG_SUFFIXES = ("Config", "Spec", "Settings", "Options")

# Class name -> why two config classes carry it.
SAME_CLASS_NAME: dict[str, str] = {}

# (upstream, downstream) where the downstream config is built from the upstream one.
FLOWS = (
    ("dpsynth.generate.plan.GenerateConfig", "dpsynth.generate.sampler_config.SamplerConfig"),
    ("dpsynth.evaluate.scoring.EvaluateConfig", "dpsynth.evaluate.train_classifier.ClassifierSpec"),
    ("dpsynth.evaluate.train_classifier.ClassifyConfig", "dpsynth.evaluate.train_classifier.ClassifierSpec"),
    ("dpsynth.evaluate.scoring.EvaluateConfig", "dpsynth.evaluate.backbone.BackboneSettings"),
    ("dpsynth.evaluate.train_classifier.ClassifyConfig", "dpsynth.evaluate.backbone.BackboneSettings"),
)
# (upstream, downstream) -> {field: why it is declared in both}.
SHARED_FIELDS = {
    FLOWS[0]: {"max_len": "the job's None means the length the model was tuned on, resolved per model into the sampler's",
               "batch_size": "the job's batch is the sampler's compiled batch; the job has no other"},
    FLOWS[1]: {"model_dir": "the pretrained LM is the evaluation's too (the MAUVE embedder, perplexity), not only "
                            "a classifier's",
               "wordcnn": "the WordCNN's sizes: a nested `WordCNNConfig` preset (paper | small), which the families' "
                          "flat settings (one flag each) cannot hold"},
}
# Constant name -> why the same value is declared in several modules.
SAME_CONSTANT = {
    "FORMAT_VERSION": "each file format has its own version (token shards, index, reports, ledger, ...); all are 1",
    "MANIFEST": "two different files that share a name (a token corpus's and a released model's manifest)",
    "NAMESPACE": "the Beam metrics namespace of two pipelines",
    "VALID_FRACTION": "two data sources' own validation split (the embedded reviews, TFDS), both the paper's 10%",
    "EXAMPLE_CHARS": "the experiment's stage report and the evaluation report each cut examples to a width",
    "AUTO": "the value 'auto' of two unrelated settings (the MAUVE embedder, dp-tune's example length)",
}
# Constants found declared twice (issue 36; FORMATS with different contents): at most one literal
# declaration each now, every other module imports it or derives it (FORMATS from the readers' REGISTRY).
ONE_DECLARATION = ("MODES", "ACCOUNTANTS", "FORMATS", "LOSSES_FILE", "GUIDANCE_CONTRASTS", "PRIVACY_FILES",
                   "REPORT_JSON")


@functools.cache
def _modules() -> tuple:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append((".".join(parts), ast.parse(path.read_text(), filename=str(path))))
    return tuple(out)


def declared_configs() -> dict[str, list[str]]:
    """"module.Class" -> its annotated field names, for every config class statement."""
    out = {}
    for module, tree in _modules():
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name.endswith(CONFIG_SUFFIXES):
                fields = [n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
                if fields:
                    out[f"{module}.{node.name}"] = fields
    return out


def literal_constants() -> dict[str, list[tuple[str, str]]]:
    """Constant name -> (module, repr of its literal value) for every module-level literal assignment."""
    out = collections.defaultdict(list)
    for module, tree in _modules():
        for node in tree.body:
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            for t in targets:
                if isinstance(t, ast.Name) and t.id.isupper() and not t.id.startswith("_"):
                    try:
                        out[t.id].append((module, repr(ast.literal_eval(value))))
                    except ValueError:
                        pass  # derived (an import, an expression): not a declaration
    return dict(out)


def test_no_two_config_classes_share_a_name_except_the_listed_ones():
    by_name = collections.defaultdict(list)
    for qualified in declared_configs():
        by_name[qualified.rsplit(".", 1)[1]].append(qualified)
    twice = {name: sorted(where) for name, where in by_name.items() if len(where) > 1}
    assert set(twice) == set(SAME_CLASS_NAME), twice


@pytest.mark.parametrize("flow", FLOWS, ids=lambda f: f"{f[0].rsplit('.', 1)[1]}->{f[1].rsplit('.', 1)[1]}")
def test_a_setting_is_declared_on_one_side_of_each_flow(flow):
    configs = declared_configs()
    up, down = flow
    assert up in configs and down in configs, flow
    shared = set(configs[up]) & set(configs[down])
    assert shared == set(SHARED_FIELDS.get(flow, {})), f"{up} and {down} both declare {sorted(shared)}"


def test_every_flow_is_a_real_flow_and_every_config_is_walked():
    """The derived configs are derived (no class statement of their own), and the walk finds every config."""
    from dpsynth.experiment import config as experiment_config
    from dpsynth.generate import sampler_config

    assert experiment_config.SamplingConfig is sampler_config.SamplingOptions  # the experiment's sampling entry
    assert "dpsynth.generate.sampler_config.SamplingOptions" not in declared_configs()
    names = {f.name for f in dataclasses.fields(sampler_config.SamplingOptions)}
    assert names <= {f.name for f in dataclasses.fields(sampler_config.SamplerConfig)}
    # The experiment's `pretrain` section is the library's PretrainConfig at a preset (`binding.subconfig`).
    from dpsynth.train import pretrain

    assert "dpsynth.experiment.config.PretrainConfig" not in declared_configs()
    section = {f.name for f in dataclasses.fields(experiment_config.PretrainConfig)}
    assert section - {"options"} <= {f.name for f in dataclasses.fields(pretrain.PretrainConfig)}
    assert set(experiment_config.PRETRAIN_PRESET) == section - {"options"}
    # ... and `dp_tune` the tuner's TuneConfig settings at a preset, plus the grid axes.
    from dpsynth.train import tune_config

    assert "dpsynth.experiment.config.DPTuneConfig" not in declared_configs()
    tuner = {f.name for f in dataclasses.fields(tune_config.TuneConfig)}
    section = {f.name for f in dataclasses.fields(experiment_config.DPTuneConfig)}
    assert section & tuner == set(experiment_config.DP_TUNE_SETTINGS) >= set(experiment_config.DP_TUNE_PRESET)
    assert section - tuner == {"modes", "epsilons", "learning_rates", "mode_learning_rates", "clip_norms",
                               "replicates", "loss", "options"}  # the grid axes and the experiment's own keys
    # ... and `generate` the job's batch_size at a preset, plus the grid axes and the experiment's own keys.
    from dpsynth.generate import plan as generate_plan

    assert "dpsynth.experiment.config.GenerateConfig" not in declared_configs()
    job = {f.name for f in dataclasses.fields(generate_plan.GenerateConfig)}
    section = {f.name for f in dataclasses.fields(experiment_config.GenerateConfig)}
    # label_distribution: the same name, another setting (the section names a kind, uniform | dp_histogram,
    # whose draw its own stage makes; the job takes the drawn distribution), set by the stage, never an option.
    assert section & job == {"batch_size", "label_distribution"}
    assert "label_distribution" in experiment_config.GENERATE_STAGE_SET
    # ... and `evaluate` the library's classifier list plus `baselines` and `options`.
    from dpsynth.evaluate import scoring

    assert "dpsynth.experiment.config.EvaluateConfig" not in declared_configs()
    section = {f.name for f in dataclasses.fields(experiment_config.EvaluateConfig)}
    assert section & {f.name for f in dataclasses.fields(scoring.EvaluateConfig)} == {"classifiers"}
    assert section - {"classifiers"} == {"baselines", "options"}
    # ... and `select` the library's dp_select.SelectConfig (epsilon null: no selection).
    from dpsynth.evaluate import dp_select

    assert "dpsynth.experiment.config.SelectConfig" not in declared_configs()
    assert {f.name for f in dataclasses.fields(experiment_config.SelectConfig)} - {"options"} <= {
        f.name for f in dataclasses.fields(dp_select.SelectConfig)}
    assert len(declared_configs()) >= 22


def test_no_constant_is_declared_twice_with_one_value_except_the_listed_ones():
    twice = {}
    for name, where in literal_constants().items():
        values = collections.Counter(value for _, value in where)
        if any(n > 1 for n in values.values()):
            twice[name] = sorted(m for m, _ in where)
    assert set(twice) == set(SAME_CONSTANT), twice


@pytest.mark.parametrize("name", ONE_DECLARATION)
def test_the_constants_once_declared_twice_have_one_declaration(name):
    where = [m for m, _ in literal_constants().get(name, [])]
    assert len(where) <= 1, f"{name} is declared in {where}"
