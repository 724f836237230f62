"""`base_model:` in an experiment: an imported model replaces public/dedup/tokenizer/pretrain.

The model directories here are manifest-only stand-ins (what the config, plan and stage read);
the stage's link is followed by the real DP tuning in the Gemma smoke run (docs/hf.md).
"""

import json
import os

import pytest

from dpsynth.experiment import cache, privacy, runner, stages
from dpsynth.experiment.config import ConfigError, from_dict
from dpsynth.experiment.plan import build_plan
from dpsynth.experiment.runner import run_experiment
from tests.experiment import fakes

SOURCE = {"family": "gemma3_text", "path": "/models/gemma.gguf", "config_sha256": "c0ffee", "hf_config": {"x": 1}}


def _model_dir(path, manifest=None, weights=b"w0"):
    os.makedirs(path / "variables", exist_ok=True)
    (path / "manifest.json").write_text(json.dumps(manifest or {"format": "dpsynth.model", "format_version": 1,
                                                                 "base": None, "pretraining_data_checked": False,
                                                                 "source": SOURCE}))
    (path / "variables" / "w.bin").write_bytes(weights)
    return str(path)


@pytest.fixture
def env(tmp_path, monkeypatch):
    d = tmp_path / "data"
    d.mkdir()
    (d / "train.csv").write_text("text,label\na,x\nb,y\n")
    (d / "test.csv").write_text("text,label\nc,x\n")
    monkeypatch.setenv(fakes.LOG_ENV, str(tmp_path / "calls.log"))
    data = {"name": "b", "base_model": _model_dir(tmp_path / "gemma"),
            "sensitive": {"embedded": False, "train": str(d / "train.csv"), "test": str(d / "test.csv")},
            "dp_tune": {"modes": ["lora"], "epsilons": [3]}}
    return {"root": str(tmp_path / "run"), "data": data, "tmp": tmp_path, "log": str(tmp_path / "calls.log")}


def test_the_base_model_replaces_the_public_dedup_tokenizer_and_pretrain_stages(env):
    plan = build_plan(from_dict(env["data"]), env["root"])
    stages_run = [n.stage for n in plan.nodes]
    assert not {"public", "dedup", "tokenizer", "pretrain"} & set(stages_run)
    assert stages_run[:2] == ["sensitive", "base_model"]
    tune = plan.node(plan.trials[0].dp_tune)
    assert tune.inputs["pretrain"] == "base_model"  # DP tuning starts from it
    assert plan.node("evaluate").inputs["pretrain"] == "base_model"


def test_the_cache_key_is_the_directory_content_not_its_path(env):
    def keys():
        plan = build_plan(from_dict(env["data"]), env["root"])
        return plan.node("base_model").hash, plan.node(plan.trials[0].dp_tune).hash

    before = keys()
    path = env["tmp"] / "gemma"
    _model_dir(path, weights=b"w1")  # same path, other weights
    changed_weights = keys()
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").write_text(json.dumps({**manifest, "source": {**SOURCE, "config_sha256": "other"}}))
    changed_manifest = keys()
    # The base node and every DP tuning downstream of it are new nodes each time.
    for i in (0, 1):
        assert len({before[i], changed_weights[i], changed_manifest[i]}) == 3


@pytest.mark.parametrize("change, message", [
    (lambda t: {"base_model": str(t / "nope")}, "no such directory"),
    (lambda t: {"base_model": str(t)}, "not a dpsynth model directory"),
    (lambda t: {"base_model": _model_dir(t / "m", manifest={"format": "dpsynth.tokens"})}, "not a dpsynth.model manifest"),
    (lambda t: {"base_model": _model_dir(t / "m", manifest={"format": "dpsynth.model", "base": {"path": "/b"}})},
     "a DP-tuned model"),
    (lambda t: {"pretrain": {"steps": 10}}, "pretrain: not used with base_model"),
    (lambda t: {"public": {"plant": 2}}, "public: not used with base_model"),
])
def test_bad_base_model_settings_are_one_line_errors_naming_the_key(env, change, message):
    with pytest.raises(ConfigError) as e:
        from_dict({**env["data"], **change(env["tmp"])})
    assert message in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).split(":")[0] in ("base_model", "pretrain", "public")


def test_the_config_reads_the_library_names_it_cannot_import(env):
    from dpsynth.dp.report import REPORT_JSON
    from dpsynth.models.directory import MANIFEST, MODEL_FORMAT

    assert (MANIFEST, MODEL_FORMAT, REPORT_JSON) == ("manifest.json", "dpsynth.model", "privacy_report.json")
    with pytest.raises(ConfigError, match="a DP-tuned model"):
        path = env["tmp"] / "gemma"
        (path / REPORT_JSON).write_text("{}")
        from_dict(env["data"])


def test_the_run_and_its_dry_run_say_what_dp_does_not_cover(env, capsys):
    registry = {**fakes.REGISTRY, "base_model": fakes._fake}
    cfg = from_dict(env["data"])
    result = run_experiment(cfg, root=env["root"], registry=registry)
    assert result.ok and "base_model" in fakes.calls(env["log"]) and "pretrain" not in fakes.calls(env["log"])
    text = runner.describe_plan(build_plan(cfg, env["root"]), cfg, budgets=False)
    assert "base_model" in text and "cached" in text
    pytest.importorskip("dp_accounting")
    text = runner.describe_plan(build_plan(cfg, env["root"]), cfg)
    assert "NOT checked against the sensitive data" in text and "covers the fine-tuning data" in text


def test_the_stage_links_the_model_and_carries_the_caveat(env):
    plan = build_plan(from_dict(env["data"]), env["root"])
    node = plan.node("base_model")
    out = cache.run_stage(plan.root, node, stages.base_model, {})
    assert os.path.realpath(out.path("model")) == os.path.realpath(env["data"]["base_model"])
    assert "NOT checked against the sensitive data" in out.summary["caveat"] and out.summary["imported"]
    assert "gemma3_text" in out.report
    # The composition of the whole root says it too (the evaluate stage passes the stage's caveat).
    root = privacy.completed_releases(eval_cfg={"trials": []}, models=[], labels=[], baselines=[],
                                      out_dir=env["root"], num_train=2, base_caveat=out.summary["caveat"])
    assert any(n.startswith(privacy.BASE_MODEL_NOTE) and "covers the fine-tuning data" in n for n in root.notes)


def test_the_stage_refuses_a_directory_changed_after_planning(env):
    plan = build_plan(from_dict(env["data"]), env["root"])
    _model_dir(env["tmp"] / "gemma", manifest={"format": "dpsynth.model", "source": {**SOURCE, "path": "/other"}})
    with pytest.raises(cache.StageFailed, match="changed since the plan was made"):
        cache.run_stage(plan.root, plan.node("base_model"), stages.base_model, {})


@pytest.mark.slow
def test_the_real_stages_tune_from_an_imported_model(tmp_path):
    """The real `base_model` and `dp_tune` stages on the imported Llama fixture: the DP model's privacy
    report names the imported base and its side channel (the wording the experiment's caveat reuses)."""
    import csv
    import pathlib

    from dpsynth.models import hf_import
    from tests.train.conftest import make_records

    base = tmp_path / "llama"
    hf_import.import_model(str(pathlib.Path(__file__).parents[1] / "models" / "fixtures" / "hf" / "llama"), str(base))
    for name, n in (("train", 48), ("test", 8)):
        with open(tmp_path / f"{name}.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["text", "label"])
            w.writeheader()
            w.writerows({"text": r["text"], "label": r["label"]} for r in make_records(n, len(name)))
    cfg = from_dict({"name": "imported", "base_model": str(base),
                     "sensitive": {"embedded": False, "train": str(tmp_path / "train.csv"),
                                   "test": str(tmp_path / "test.csv")},
                     "dp_tune": {"modes": ["lora"], "epsilons": [3], "batch_size": 8, "steps": 2, "epochs": None,
                                 "max_tokens": 16, "lora_rank": 2, "options": {"microbatch_size": 8}}})
    result = run_experiment(cfg, root=str(tmp_path / "run"), until="dp_tune")
    assert result.ok, result.failed
    tune = result.outputs[result.plan.trials[0].dp_tune]
    report = json.loads(open(tune.path("model", "privacy_report.json")).read())
    assert report["private"] and report["training"]["base_source"]["family"] == "llama"
    channel = next(c for c in report["side_channels"] if c["name"] == "pretrained base model")
    assert channel["detail"] == result.outputs["base_model"].summary["caveat"]
