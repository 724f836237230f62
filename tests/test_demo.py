"""`make demo`: its config and plan (fast), its control flow with fake stages (fast), and the
real pipeline end to end on a shrunken config (slow)."""

import os

import pytest

from dpsynth import demo
from dpsynth.experiment import runner
from dpsynth.experiment.config import load_config
from dpsynth.experiment.plan import build_plan
from tests.experiment import fakes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_configs_demo_yaml_is_the_demo_config():
    assert load_config(os.path.join(REPO, "configs", "demo.yaml")) == demo.demo_config()


def test_demo_plan_is_one_dp_lora_trial_at_epsilon_3(tmp_path):
    cfg = demo.demo_config()
    plan = build_plan(cfg, str(tmp_path))
    # uniform labels: no histogram; no select stage (one corpus, nothing to choose among: cfg.select.epsilon unset)
    assert cfg.select.epsilon is None
    assert [n.stage for n in plan.nodes] == [s for s in runner.STAGES if s not in ("labels", "select", "base_model")]
    (trial,) = plan.trials
    assert (trial.mode, trial.epsilon) == ("lora", 3.0)
    assert cfg.public.plant > 0 and cfg.pretrain.preset in ("tiny", "small")
    rows = runner.privacy_budgets(plan, cfg, num_train=3600)
    pytest.importorskip("dpsynth.dp.accounting")
    assert rows[0]["delta"] == pytest.approx(1 / 3600) and rows[0]["noise_multiplier"] > 0


def test_demo_prints_each_stage_and_the_report_path(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(fakes.LOG_ENV, str(tmp_path / "log"))
    code = demo.run_demo(out=str(tmp_path / "run"), registry=fakes.REGISTRY)
    out = capsys.readouterr().out
    assert code == 0
    for stage in runner.STAGES:
        if stage not in ("labels", "select", "base_model"):  # the demo draws no DP label histogram, selects nothing, imports no model
            assert f"fake report of {stage}" in out
    assert "[8/8] evaluation" in out and "report: " in out
    assert "no plain summary" in out  # the fake evaluate stage writes no metrics.json: said, not a crash
    # The last line names the report where it stays, never the stage's temporary .work-<hash> directory.
    last = out.strip().splitlines()[-1]
    assert last == f"report: {tmp_path / 'run' / 'report' / 'report.html'}" and ".work-" not in out
    assert os.path.isdir(tmp_path / "run" / "report")  # the link to the completed evaluate stage
    # Second run: everything cached, the stored reports are shown again.
    code = demo.run_demo(out=str(tmp_path / "run"), registry=fakes.REGISTRY)
    out = capsys.readouterr().out
    assert code == 0 and out.count("cached") >= len(runner.STAGES) - 2 and "fake report of pretrain" in out


def test_demo_stops_naming_a_missing_stage(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(fakes.LOG_ENV, str(tmp_path / "log"))
    registry = {k: v for k, v in fakes.REGISTRY.items() if k != "pretrain"}
    code = demo.run_demo(out=str(tmp_path / "run"), registry=registry)
    captured = capsys.readouterr()
    assert code == runner.EXIT_UNAVAILABLE
    assert "stage 'pretrain' is not available" in captured.err
    assert fakes.calls(str(tmp_path / "log")) == ["sensitive", "public", "dedup", "tokenizer"]


# A shrunken demo: same stages and code paths, minutes instead of 20.
SMALL = {
    "public": {"plant": 2},
    "sensitive": {"max_train": 400, "max_valid": 100, "max_test": 200},
    "tokenizer": {"vocab_size": 1000},
    "pretrain": {"steps": 20, "seq_len": 64, "batch_size": 8},
    "dp_tune": {"token_budget": 400 * 64, "max_tokens": 64},  # the recipe: 1 pass, 25 steps at batch 16
    "generate": {"max_tokens": 48, "multiples": [0.25]},
}


@pytest.mark.slow
def test_demo_end_to_end_on_a_shrunken_config(tmp_path, capsys):
    from dpsynth.data import embedded

    try:
        embedded.austen_documents()
    except embedded.EmbeddedDataMissing as e:
        pytest.skip(str(e))
    out = str(tmp_path / "run")
    code = demo.run_demo(out=out, config=demo.demo_config(SMALL))
    text = capsys.readouterr()
    assert code == 0, text.err[-3000:]
    assert "planted 2 sensitive training reviews" in text.out
    assert "How good is the synthetic data?" in text.out and "always answering the majority class" in text.out
    # The summary ends with the plain verdict (the lora corpus at epsilon 3 against DP-on-real at 3),
    # then the report's path.
    verdict = [line for line in text.out.splitlines() if line.strip()][-2]
    assert "eps 3, lora, wordcnn: synthetic " in verdict and " vs DP-on-real " in verdict
    assert verdict.endswith(": beats DP-on-real") or ": does NOT beat DP-on-real" in verdict
    assert os.path.exists(os.path.join(out, "report"))
    last = text.out.strip().splitlines()[-1]  # the report where it stays, which exists
    assert last == f"report: {os.path.join(os.path.abspath(out), 'report', 'report.html')}" and ".work-" not in last
    assert os.path.exists(last.split(": ", 1)[1])
    # Rerun: nothing recomputed.
    result = runner.run_plan(build_plan(demo.demo_config(SMALL), out))
    assert result.ok and result.ran == []
    # The dedup found and cut every planted review; its temporary tokenizer (it saw them) and
    # that tokenizer's ids are not in its stage directory; the released tokenizer came after
    # the dedup and re-tokenized the clean corpus.
    from dpsynth.data.token_shards import read_manifest

    dedup, tok = result.outputs["dedup"], result.outputs["tokenizer"]
    assert dedup.summary["planted"] == 2 and dedup.summary["planted_found"] == 2
    assert not os.path.exists(dedup.path("dedup_tokenizer.model")) and not os.path.exists(dedup.path("clean_tokens"))
    assert read_manifest(tok.path("clean_tokens"))["tokenizer_sha256"] == tok.summary["sha256"]
