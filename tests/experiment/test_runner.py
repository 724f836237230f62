"""The runner's engine with FAKE stage functions: caching, reruns, resume, parallelism, dry run."""

import json
import multiprocessing
import os
import time

import pytest
import yaml

from dpsynth.experiment import runner
from dpsynth.experiment.config import from_dict, to_dict
from dpsynth.experiment.runner import run_experiment
from tests.experiment import fakes


@pytest.fixture
def env(tmp_path, monkeypatch):
    d = tmp_path / "data"
    d.mkdir()
    (d / "train.csv").write_text("text,label\na,x\nb,y\n")
    (d / "test.csv").write_text("text,label\nc,x\n")
    (d / "public.txt").write_text("some public text\n")
    log = tmp_path / "calls.log"
    monkeypatch.setenv(fakes.LOG_ENV, str(log))
    monkeypatch.delenv(fakes.FAIL_ENV, raising=False)
    monkeypatch.delenv(fakes.BLOCK_ENV, raising=False)
    data = {
        "name": "t",
        "public": {"embedded": False, "paths": [str(d / "public.txt")]},
        "sensitive": {"embedded": False, "train": str(d / "train.csv"), "test": str(d / "test.csv")},
        "pretrain": {"preset": "tiny"},
        "dp_tune": {"modes": ["lora", "prompt"], "epsilons": [1, 3]},
        "generate": {"multiples": [1, 3]},
    }
    return {"root": str(tmp_path / "run"), "log": str(log), "data": data, "tmp": tmp_path}


def calls_since(env, start):
    return fakes.calls(env["log"])[start:]


def test_first_run_runs_everything_once_then_all_cached(env):
    cfg = from_dict(env["data"])
    result = run_experiment(cfg, root=env["root"], registry=fakes.REGISTRY)
    assert result.ok
    keys = [n.key for n in result.plan.nodes]
    assert sorted(fakes.calls(env["log"])) == sorted(keys)  # each stage instance exactly once
    assert len(result.plan.trials) == 8
    # Inputs were wired: a generate stage read its own dp_tune node's output.
    trial = result.plan.trials[0]
    with open(os.path.join(result.outputs[trial.generate].dir, "out.json")) as f:
        assert json.load(f)["read"]["model"] == [trial.dp_tune]
    assert os.path.realpath(os.path.join(env["root"], "report")) == os.path.realpath(result.report_dir)
    again = run_experiment(cfg, root=env["root"], registry=fakes.REGISTRY)
    assert again.ok and again.ran == [] and sorted(again.cached) == sorted(keys)
    assert len(fakes.calls(env["log"])) == len(keys)


@pytest.mark.parametrize(
    "section, change, expect",
    [
        ("pretrain", {"steps": 7}, lambda k: not k.startswith(("sensitive", "public", "tokenizer", "dedup"))),
        ("dp_tune", {"lora_rank": 2}, lambda k: "lora" in k or k == "evaluate"),
        ("generate", {"samplings": [{"temperature": 0.7}]}, lambda k: k.startswith("generate") or k == "evaluate"),
        ("evaluate", {"classifiers": ["wordcnn", "backbone"]}, lambda k: k == "evaluate"),
    ],
)
def test_changing_one_key_reruns_exactly_the_affected_stages(env, section, change, expect):
    cfg = from_dict(env["data"])
    first = run_experiment(cfg, root=env["root"], registry=fakes.REGISTRY)
    n = len(fakes.calls(env["log"]))
    new_cfg = cfg.replace(**{section: change})
    second = run_experiment(new_cfg, root=env["root"], registry=fakes.REGISTRY)
    assert second.ok
    expected = sorted(k for k in (node.key for node in second.plan.nodes) if expect(k))
    assert sorted(calls_since(env, n)) == expected
    assert sorted(second.ran) == expected
    # The old outputs are still there: switching back costs nothing.
    back = run_experiment(cfg, root=env["root"], registry=fakes.REGISTRY)
    assert back.ran == [] and len(back.cached) == len(first.plan.nodes)


@pytest.mark.parametrize("stage, resumable", [("dedup", False), ("dp_tune", True)])
def test_failure_keeps_finished_stages_and_rerun_resumes(env, monkeypatch, stage, resumable):
    cfg = from_dict(env["data"])
    monkeypatch.setenv(fakes.FAIL_ENV, stage)
    failed = run_experiment(cfg, root=env["root"], registry=fakes.REGISTRY)
    assert failed.failed is not None and f"stage {stage}" in str(failed.failed)
    assert runner.report_result(failed) == runner.EXIT_FAILED
    before = [n.key for n in failed.plan.nodes if runner.STAGES.index(n.stage) < runner.STAGES.index(stage)]
    assert sorted(failed.ran) == sorted(before)
    first = [k for k in fakes.calls(env["log"]) if k.startswith(stage)]
    assert len(first) == 1
    n = len(fakes.calls(env["log"]))
    monkeypatch.delenv(fakes.FAIL_ENV)
    resumed = run_experiment(cfg, root=env["root"], registry=fakes.REGISTRY)
    assert resumed.ok
    ran = calls_since(env, n)
    assert not set(ran) & set(before)
    assert sorted(ran) == sorted(k.key for k in resumed.plan.nodes if k.key not in before)
    # A resumable stage gets the failed attempt's partial output back; the others start empty.
    with open(os.path.join(resumed.outputs[first[0]].dir, "out.json")) as f:
        assert json.load(f)["preexisting"] == (["partial"] if resumable else [])
    assert not [p for p in os.listdir(os.path.join(env["root"], "stages", stage)) if p.startswith(".work-")]


def test_resume_after_kill(env):
    """A process killed (SIGKILL) inside pretraining: the rerun starts at pretraining."""
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=fakes.run_in_child, args=(env["data"], env["root"], env["log"], "pretrain"))
    proc.start()
    blocked = env["log"] + ".blocked"
    deadline = time.monotonic() + 60
    while not os.path.exists(blocked) and time.monotonic() < deadline and proc.is_alive():
        time.sleep(0.05)
    assert os.path.exists(blocked), "the child never reached the pretrain stage"
    proc.kill()
    proc.join()
    assert fakes.calls(env["log"]) == ["sensitive", "public", "dedup", "tokenizer", "pretrain"]
    assert not os.path.exists(os.path.join(env["root"], "stages", "pretrain")) or not [
        p for p in os.listdir(os.path.join(env["root"], "stages", "pretrain")) if not p.startswith(".")
    ]
    result = run_experiment(from_dict(env["data"]), root=env["root"], registry=fakes.REGISTRY)
    assert result.ok
    ran = calls_since(env, 5)
    assert ran[0] == "pretrain" and not set(ran) & {"sensitive", "public", "tokenizer", "dedup"}
    assert sorted(result.ran) == sorted(ran)
    # pretrain is resumable: it got its partial output back.
    with open(os.path.join(result.outputs["pretrain"].dir, "out.json")) as f:
        record = json.load(f)
    assert record["resume"] is True and record["preexisting"] == ["partial"]


def test_parallel_jobs_give_the_same_outputs(env, tmp_path):
    cfg = from_dict(env["data"])
    serial = run_experiment(cfg, root=str(tmp_path / "serial"), registry=fakes.REGISTRY)
    n = len(fakes.calls(env["log"]))
    parallel = run_experiment(cfg, root=str(tmp_path / "par"), registry=fakes.REGISTRY, jobs=2)
    assert parallel.ok
    assert sorted(calls_since(env, n)) == sorted(serial.outputs)  # each instance once
    for key, out in serial.outputs.items():
        other = parallel.outputs[key]
        assert out.hash == other.hash
        with open(out.path("out.json")) as f, open(other.path("out.json")) as g:
            assert json.load(f)["read"] == json.load(g)["read"]


def test_parallel_failure_stops_and_reports(env, tmp_path, monkeypatch):
    monkeypatch.setenv(fakes.FAIL_ENV, "generate")
    result = run_experiment(from_dict(env["data"]), root=env["root"], registry=fakes.REGISTRY, jobs=2)
    assert result.failed is not None and "generate[" in str(result.failed)
    assert "evaluate" not in result.outputs
    assert all(k in result.outputs for k in ("pretrain",))


def test_one_job_runs_in_this_process_in_plan_order_with_the_data_dir(env, tmp_path):
    """jobs=1 is the scheduler with one slot: plan order, this process (a closure registry
    works: nothing is pickled), a failure stops it at once; `data_dir` reaches every stage as
    `ctx.data_dir`, and the environment is left alone."""
    from dpsynth.data.embedded import ENV_DIR

    seen = []

    def record(ctx):
        seen.append((ctx.key, os.getpid(), ctx.data_dir))
        return fakes._fake(ctx)

    registry = {stage: record for stage in fakes.REGISTRY}
    env_before = os.environ.get(ENV_DIR)
    result = run_experiment(from_dict(env["data"]), root=env["root"], registry=registry, data_dir=str(tmp_path / "emb"))
    assert result.ok and os.environ.get(ENV_DIR) == env_before
    assert [k for k, _, _ in seen] == [n.key for n in result.plan.nodes] == result.ran
    assert {(pid, d) for _, pid, d in seen} == {(os.getpid(), str(tmp_path / "emb"))}
    # A failure: nothing after the failed stage starts.
    seen.clear()
    fail_at = next(n for n in result.plan.nodes if n.stage == "dp_tune")
    failed = run_experiment(from_dict(env["data"]), root=str(tmp_path / "other"), registry={
        **registry, "dp_tune": lambda ctx: (_ for _ in ()).throw(RuntimeError("boom"))})
    assert failed.failed is not None and fail_at.key in str(failed.failed)
    keys = [n.key for n in failed.plan.nodes]
    assert [k for k, _, _ in seen] == keys[: keys.index(fail_at.key)]


def test_missing_stage_stops_with_its_name(env, capsys):
    registry = {k: v for k, v in fakes.REGISTRY.items() if k != "dp_tune"}
    result = run_experiment(from_dict(env["data"]), root=env["root"], registry=registry)
    assert result.missing is not None and result.missing.stage == "dp_tune"
    assert set(result.outputs) == {"sensitive", "public", "tokenizer", "dedup", "pretrain"}
    assert runner.report_result(result) == runner.EXIT_UNAVAILABLE
    assert "stage 'dp_tune' is not available" in capsys.readouterr().err


def test_until_stops_after_a_stage(env):
    result = run_experiment(from_dict(env["data"]), root=env["root"], registry=fakes.REGISTRY, until="dedup")
    assert result.ok and set(result.outputs) == {"sensitive", "public", "dedup"}


def test_dry_run_prints_plan_cache_status_and_budgets(env, capsys):
    path = env["tmp"] / "exp.yaml"
    data = {**env["data"], "out": env["root"], "dp_tune": {"modes": ["lora", "prompt"], "epsilons": [3]}}
    path.write_text(yaml.safe_dump(data))
    assert runner.main([str(path), "--dry-run"]) == 0
    text = capsys.readouterr().out
    cfg = from_dict(data)
    plan = runner.build_plan(cfg, env["root"])
    for node in plan.nodes:
        assert node.key in text and node.hash[:12] in text
    assert f"0 cached, {len(plan.nodes)} to run" in text
    assert not os.path.exists(os.path.join(env["root"], "stages"))  # nothing ran
    assert fakes.calls(env["log"]) == []
    # The data stage's summary is used for |train| once it is cached.
    run_experiment(cfg, root=env["root"], registry=fakes.REGISTRY, until="pretrain")
    assert runner.main([str(path), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert f"5 cached, {len(plan.nodes) - 5} to run" in text
    assert "|train| = 1000, cached data stage" in text


def test_dry_run_says_a_dp_label_histogram_adds_to_the_budget(env):
    cfg = from_dict({**env["data"], "generate": {"label_distribution": "dp_histogram", "label_noise_multiplier": 8}})
    text = runner.describe_plan(runner.build_plan(cfg, env["root"]), cfg)
    assert "DP label histogram of D_train (Gaussian, sigma 8" in text
    plain = from_dict(env["data"])
    assert "label histogram" not in runner.describe_plan(runner.build_plan(plain, env["root"]), plain)


def test_dry_run_budget_matches_the_accountant(env):
    accounting = pytest.importorskip("dpsynth.dp.accounting")
    cfg = from_dict({**env["data"], "dp_tune": {"modes": ["lora", "prompt"], "epsilons": [3, "inf"], "batch_size": 50, "epochs": 2}})
    plan = runner.build_plan(cfg, env["root"])
    rows = runner.privacy_budgets(plan, cfg, num_train=1000)
    assert [(r["mode"], r["epsilon"]) for r in rows] == [("lora", 3.0), ("lora", float("inf")), ("prompt", 3.0), ("prompt", float("inf"))]
    assert rows[2]["noise_multiplier"] == rows[0]["noise_multiplier"]  # same budget, one calibration
    q, steps = 0.05, 40
    assert rows[0]["q"] == q and rows[0]["steps"] == steps and rows[0]["delta"] == 1e-3
    sigma = rows[0]["noise_multiplier"]
    assert sigma == pytest.approx(accounting.calibrate_noise_multiplier(3.0, 1e-3, q, steps), rel=1e-6)
    # Independent check: the calibrated sigma spends (at most, and close to) the target epsilon.
    assert accounting.epsilon(q, steps, sigma, 1e-3) == pytest.approx(3.0, abs=0.02)
    assert rows[1]["noise_multiplier"] == 0.0


def test_cli_config_error_exit_code(env, tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"out": env["root"], "dp_tune": {"epsilons": [0]}}))
    assert runner.main([str(path)]) == runner.EXIT_CONFIG
    assert "dp_tune.epsilons[0]: must be > 0" in capsys.readouterr().err


def test_experiment_json_lists_trials(env):
    cfg = from_dict(env["data"])
    result = run_experiment(cfg, root=env["root"], registry=fakes.REGISTRY, until="tokenizer")
    with open(os.path.join(env["root"], "experiment.json")) as f:
        record = json.load(f)
    assert record["config"] == json.loads(json.dumps(to_dict(cfg)))
    assert [t["id"] for t in record["trials"]] == [t.id for t in result.plan.trials]


def test_dry_run_budget_at_user_level_counts_users(env, tmp_path):
    pytest.importorskip("dpsynth.dp.accounting")
    from dpsynth.dp.plan import plan_privacy

    train = tmp_path / "users.csv"
    train.write_text("text,label,author\n" + "".join(f"review {i},{'xy'[i % 2]},u{i % 40}\n" for i in range(200)))
    test = tmp_path / "test.csv"
    test.write_text("text,label\nc,x\nd,y\n")
    cfg = from_dict({**env["data"], "sensitive": {"embedded": False, "train": str(train), "test": str(test),
                                                  "user_column": "author"},
                     "dp_tune": {"epsilons": [3], "batch_size": 5, "steps": 20, "epochs": None, "privacy_unit": "user",
                                 "max_examples_per_user": 4},
                     "evaluate": {"baselines": False}})  # example-level DP-on-real: refused at user level
    plan = runner.build_plan(cfg, env["root"])
    [row] = runner.privacy_budgets(plan, cfg, num_train=180)
    ref = plan_privacy(dataset_size=40, expected_batch_size=5, steps=20, epsilon=3.0, privacy_unit="user")
    assert row["delta"] == 1 / 40 and row["q"] == 5 / 40 and row["noise_multiplier"] == ref.noise_multiplier
    assert "add-or-remove one user" in runner.describe_plan(plan, cfg)
