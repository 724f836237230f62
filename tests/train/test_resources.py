"""Resource figures (`dpsynth.train.resources`), the tuning plan (`dpsynth.train.tune_plan`, `dpsynth plan`),
`tune_model.compile_steps` and `--microbatch-size auto`."""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from dpsynth.models.config import get_config
from dpsynth.train import core, finetune, resources, tune_config, tune_data, tune_model, tune_plan
from tests.train.conftest import make_records

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = make_records(60, 5)
CFG = tune_config.TuneConfig(mode="lora", epsilon=4.0, batch_size=16, steps=2, microbatch_size=8, max_tokens=32,
                             lora_rank=2, learning_rate=1e-2, seed=3)


# ---------------------------------------------------------------- the automatic microbatch search


def _brute_force(peak, budget, maximum, multiple):
    fits = [m for m in range(multiple, maximum + 1, multiple) if peak(m) <= budget]
    return max(fits) if fits else None


@pytest.mark.parametrize("base,per", [(100, 7), (0, 1), (1000, 33), (5, 250)])
@pytest.mark.parametrize("multiple", [1, 2, 8])
@pytest.mark.parametrize("maximum", [1, 8, 13, 64, 1000])
def test_largest_microbatch_is_the_largest_that_fits(base, per, multiple, maximum):
    peak = lambda m: base + per * m  # noqa: E731
    for limit in (base + per * multiple, base + per * 10, base + per * 37 + 3, base + per * 5000):
        maximum_ = max(multiple, maximum // multiple * multiple)
        want = _brute_force(peak, limit, maximum_, multiple)
        if want is None:
            with pytest.raises(resources.PlanError):
                resources.largest_microbatch(peak, limit_bytes=limit, headroom=0.0, maximum=maximum, multiple=multiple)
            continue
        choice = resources.largest_microbatch(peak, limit_bytes=limit, headroom=0.0, maximum=maximum, multiple=multiple)
        assert choice.microbatch == want and choice.peak_bytes == peak(want) <= limit
        assert len(choice.tried) <= 2 * int(np.log2(maximum_ / multiple) + 2)  # O(log) compilations


def test_largest_microbatch_applies_the_headroom_and_refuses_in_one_line():
    peak = lambda m: 1000 * m  # noqa: E731
    assert resources.largest_microbatch(peak, limit_bytes=10_000, headroom=0.0, maximum=64).microbatch == 10
    assert resources.largest_microbatch(peak, limit_bytes=10_000, headroom=0.25, maximum=64).microbatch == 7
    with pytest.raises(resources.PlanError) as e:
        resources.largest_microbatch(peak, limit_bytes=999, headroom=0.0, maximum=64)
    assert "\n" not in str(e.value) and "no microbatch fits" in str(e.value)


def test_parse_bytes():
    assert resources.parse_bytes("80GB") == 80e9 and resources.parse_bytes("16GiB") == 16 * 2**30
    assert resources.parse_bytes("512 MiB") == 512 * 2**20 and resources.parse_bytes("1e9") == 10**9
    with pytest.raises(resources.PlanError, match="memory size"):
        resources.parse_bytes("lots")


# ---------------------------------------------------------------- the plan is the step training runs


def _capture_first_step(monkeypatch):
    """Records the fingerprint of the first accumulate step `dp_tune` runs (lowered on its real arguments)."""
    seen = {}
    original = core.TrainFunctions.accumulate_step

    def spy(self, state, acc, batch):
        if "fingerprint" not in seen:
            seen["fingerprint"] = resources.fingerprint(self.lower("accumulate", state, acc, batch))
            seen["rows"], seen["length"] = batch["inputs"].shape
            if "contrast_inputs" in batch:  # the label contrast's rows: (K labels, row length)
                seen["contrast"] = tuple(batch["contrast_inputs"].shape[1:])
        return original(self, state, acc, batch)

    monkeypatch.setattr(core.TrainFunctions, "accumulate_step", spy)
    return seen


@pytest.mark.parametrize("mode,mesh,fsdp", [("lora", None, False), ("lora", (2, 1), True),
                                            pytest.param("full", (2, 1), False, marks=pytest.mark.slow)])
def test_plan_compiles_the_step_dp_tune_runs(tiny_base, tmp_path, monkeypatch, mode, mesh, fsdp):
    base_dir, _ = tiny_base
    config = dataclasses.replace(CFG, mode=mode)
    seen = _capture_first_step(monkeypatch)
    finetune.dp_tune(base_dir, TRAIN, [], str(tmp_path / "out"), config, progress_interval=1e9, mesh=mesh, fsdp=fsdp)
    source = resources.resolve_model(base_dir)
    plan = tune_config.plan_run(config, len(TRAIN))
    steps = tune_model.compile_steps(source.config, config, plan, microbatch=seen["rows"], row_length=seen["length"],
                                     mesh=mesh, fsdp=fsdp, param_dtype=source.param_dtype)
    assert steps.accumulate.fingerprint == seen["fingerprint"]
    # another microbatch, mode or length is another program
    other = tune_model.compile_steps(source.config, config, plan, microbatch=seen["rows"], row_length=seen["length"] + 16,
                                     mesh=mesh, fsdp=fsdp, apply=False)
    assert other.accumulate.fingerprint != seen["fingerprint"]
    if fsdp:  # the FSDP layout is another program than the replicated one on the same mesh
        replicated = tune_model.compile_steps(source.config, config, plan, microbatch=seen["rows"],
                                              row_length=seen["length"], mesh=mesh, param_dtype=source.param_dtype,
                                              apply=False)
        assert replicated.accumulate.fingerprint != seen["fingerprint"]


@pytest.mark.slow  # compiles the step for several device counts (~35 s)
def test_plan_reports_consistent_figures_per_device():
    source = resources.resolve_model("tiny")
    config = dataclasses.replace(CFG, mode="lora", lora_rank=4, steps=None, epochs=3.0, batch_size=32, max_tokens=65)
    plan = tune_plan.plan_tuning(source, config, dataset_size=320, mesh=(2, 1), fsdp=True)
    mc = get_config("tiny").replace(lora_rank=4)
    assert plan["model"]["trainable_parameters"] == mc.num_params(("lora",))
    assert plan["model"]["parameters"] == mc.num_params(("params", "lora"))
    pd, progs = plan["per_device"], plan["programs"]
    # FSDP over 2 devices: each holds about half of the float32 base (norm scales of odd sizes stay whole)
    assert 0.5 * 4 * mc.num_params(("params",)) <= pd["parameters_bytes"] - pd["trainable_bytes"] < 0.6 * 4 * mc.num_params(("params",))
    assert pd["optimizer_bytes"] >= 2 * pd["trainable_bytes"]  # Adam: two moments
    assert pd["total_bytes"] == max(progs["accumulate"]["total_bytes"], progs["apply"]["total_bytes"])
    assert pd["step_temporary_bytes"] == progs["accumulate"]["temp_bytes"] > 0
    assert plan["flops"]["per_example_token"] > 0
    run = plan["run"]
    assert run["steps"] == tune_config.plan_run(config, 320).steps and run["microbatches_per_step"] == 4
    for row in plan["accelerators"]:
        assert row["fits"] and row["step_seconds"] > 0
        assert row["run_hours"] == pytest.approx(row["step_seconds"] * run["steps"] / 3600)
        assert row["suggested_microbatch"] % 2 == 0
    json.dumps(plan)
    assert "per device" in tune_plan.format_plan(plan)


def test_plan_command_prints_json_and_refuses_bad_input(capsys):
    from trainers import plan as plan_cmd

    assert plan_cmd.main(["--model", "tiny", "--mode", "prompt", "--prompt-length", "4", "--dataset-size", "100",
                          "--batch-size", "10", "--microbatch-size", "4", "--max-tokens", "33", "--generation-batch",
                          "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["programs"]["sample"]["flops"] > 0 and out["accelerators"][0]["sample_fits"]
    assert out["model"]["trainable_parameters"] == 4 * get_config("tiny").d_model
    assert plan_cmd.main(["--model", "no-such-model", "--dataset-size", "10"]) == 2
    assert "dpsynth plan: error: no-such-model: not a preset" in capsys.readouterr().err
    assert plan_cmd.main(["--model", "tiny", "--dataset-size", "10", "--mesh-data", "64"]) == 2
    assert "--virtual-cpu" in capsys.readouterr().err


def test_hf_config_alone_is_a_model_source():
    src = resources.resolve_model(os.path.join(FIXTURES, "gemma2_2b"), dtype="bfloat16")
    assert src.param_dtype == "bfloat16" and src.config.d_model == 2304 and src.config.post_norms
    assert 2.5e9 < src.config.num_params(("params",)) < 2.7e9  # Gemma-2-2B: 2.61B parameters


@pytest.mark.parametrize("form, labels, rows", [("auto", 2, 2), ("sampled", 5, 2), ("auto", 5, 2),
                                               pytest.param("full", 5, 5, marks=pytest.mark.slow)])
def test_plan_compiles_the_label_contrast_step_dp_tune_runs(tiny_base, tmp_path, monkeypatch, form, labels, rows):
    """With `label_contrast` the compiled step is the one dp_tune runs on its K rows per example, or the
    sampled form's 2 (what `--microbatch-size auto` searches over, `tune_model.contrast_shape`), and it
    costs more memory than the plain step."""
    base_dir, _ = tiny_base
    names = ["great", "other", "meh", "fine", "bad"][:labels]
    train = [dict(r, label=names[i % labels]) for i, r in enumerate(TRAIN)]
    config = dataclasses.replace(CFG, label_contrast=1.0, label_contrast_form=form)
    seen = _capture_first_step(monkeypatch)
    finetune.dp_tune(base_dir, train, [], str(tmp_path / "out"), config, progress_interval=1e9)
    source = resources.resolve_model(base_dir)
    plan = tune_config.plan_run(config, len(train))
    common = dict(microbatch=seen["rows"], row_length=seen["length"], param_dtype=source.param_dtype)
    assert seen["contrast"][0] == rows == config.contrast_rows(labels)
    steps = tune_model.compile_steps(source.config, config, plan, contrast=seen["contrast"], **common)
    assert steps.accumulate.fingerprint == seen["fingerprint"]
    plain = tune_model.compile_steps(source.config, CFG, plan, apply=False, **common)
    assert steps.accumulate.total_bytes > plain.accumulate.total_bytes
    with pytest.raises(tune_config.TuneError, match="contrast"):
        tune_model.compile_steps(source.config, config, plan, apply=False, **common)


@pytest.mark.slow  # make test-slow: ~20 s; test_plan_compiles_the_label_contrast_step_dp_tune_runs stays
def test_plan_command_compiles_the_label_contrast_rows(capsys):
    """`dpsynth plan --label-contrast L --labels K`: K rows per example, compiled (more FLOPs and memory)."""
    from trainers import plan as plan_cmd

    argv = ["--model", "tiny", "--dataset-size", "100", "--batch-size", "10", "--microbatch-size", "4",
            "--max-tokens", "33", "--no-suggest", "--json"]
    figures = {}
    for extra in ([], ["--label-contrast", "1", "--labels", "3"]):
        assert plan_cmd.main(argv + extra) == 0
        figures[bool(extra)] = json.loads(capsys.readouterr().out)
    plain, contrast = figures[False], figures[True]
    assert contrast["run"]["labels"] == 3 and "labels" not in plain["run"]
    assert contrast["run"]["label_contrast_form"] == "full" and contrast["run"]["contrast_rows"] == 3
    assert contrast["programs"]["accumulate"]["flops"] > 2.5 * plain["programs"]["accumulate"]["flops"]
    assert plan_cmd.main(argv + ["--label-contrast", "1"]) == 2
    assert "give K >= 2 (--labels)" in capsys.readouterr().err


@pytest.mark.slow  # make test-slow: ~22 s
def test_plan_counts_two_rows_for_the_sampled_contrast_whatever_k(capsys):
    """`dpsynth plan --labels K`: the sampled form (auto above 4 labels) compiles 2 rows per example, the
    same program for any K; the full form K rows. The FLOPs of a row are the same on every row, so
    8 rows cost more than 2.5 x 2 (the rest of the step, clipping and the update, is shared)."""
    from trainers import plan as plan_cmd

    argv = ["--model", "tiny", "--dataset-size", "100", "--batch-size", "10", "--microbatch-size", "4",
            "--max-tokens", "33", "--no-suggest", "--json", "--label-contrast", "1"]
    figures = {}
    for name, extra in (("auto8", ["--labels", "8"]), ("auto40", ["--labels", "40"]),
                        ("sampled3", ["--labels", "3", "--label-contrast-form", "sampled"]),
                        ("full8", ["--labels", "8", "--label-contrast-form", "full"])):
        assert plan_cmd.main(argv + extra) == 0
        figures[name] = json.loads(capsys.readouterr().out)
    runs = {name: f["run"] for name, f in figures.items()}
    assert [runs[n]["contrast_rows"] for n in ("auto8", "auto40", "sampled3", "full8")] == [2, 2, 2, 8]
    assert [runs[n]["label_contrast_form"] for n in ("auto8", "auto40", "sampled3", "full8")] == ["sampled"] * 3 + ["full"]
    flops = {name: f["programs"]["accumulate"]["flops"] for name, f in figures.items()}
    assert flops["auto8"] == flops["auto40"] == flops["sampled3"]  # the same compiled step: no K in it
    assert figures["auto8"]["fingerprint"] == figures["auto40"]["fingerprint"]
    assert flops["full8"] > 2.5 * flops["auto8"]


# ---------------------------------------------------------------- --microbatch-size auto in dp_tune


@pytest.mark.slow  # compiles and runs the step at several microbatches (~75 s)
def test_auto_microbatch_picks_the_largest_that_fits_and_refuses(tiny_base, tmp_path, monkeypatch, caplog):
    base_dir, tok = tiny_base
    config = dataclasses.replace(CFG, microbatch_size="auto", batch_size=4)
    seen = _capture_first_step(monkeypatch)
    plan = tune_config.plan_run(config, len(TRAIN))
    labels = sorted({r["label"] for r in TRAIN})
    length = tune_data.encode_data(TRAIN, [], tok, labels, config).train_arrays["inputs"].shape[1]  # dp_tune's rows
    limit = tune_model.compile_steps(get_config("tiny", max_len=128), config, plan, microbatch=2, row_length=length,
                                     apply=False).accumulate.total_bytes  # 2 fits (exactly), 3 does not
    with caplog.at_level("INFO", logger="dpsynth.train.finetune"):
        res = finetune.dp_tune(base_dir, TRAIN, [], str(tmp_path / "auto"), config, progress_interval=1e9,
                               memory_limit=limit, memory_headroom=0.0)
    manifest = json.load(open(os.path.join(res.out_dir, "manifest.json")))
    assert manifest["dp_tune"]["config"]["microbatch_size"] == 2 == seen["rows"]
    assert any("microbatch auto: microbatch 2" in r.getMessage() and "3: " in r.getMessage() for r in caplog.records)
    monkeypatch.setattr(resources, "device_memory_limit", lambda device=None: None)  # a backend that does not say
    with pytest.raises(resources.PlanError, match="--memory-limit"):
        finetune.dp_tune(base_dir, TRAIN, [], str(tmp_path / "cpu"), config, progress_interval=1e9)


# ---------------------------------------------------------------- real model shapes, no weights


@pytest.mark.slow
@pytest.mark.parametrize("model,expect_params", [("gemma2_2b", 2.61e9), ("llama3_8b", 8.03e9)])
def test_real_shapes_lora_on_8_virtual_devices_with_fsdp(model, expect_params):
    cmd = [sys.executable, "-m", "dpsynth.cli", "plan", "--model", os.path.join(FIXTURES, model), "--dtype", "bfloat16",
           "--mode", "lora", "--lora-rank", "8", "--batch-size", "1024", "--microbatch-size", "8", "--max-tokens", "512",
           "--epochs", "10", "--dataset-size", "25000", "--mesh-data", "8", "--fsdp", "--virtual-cpu", "--json"]
    env = {**os.environ, "PYTHONPATH": REPO}
    env.pop("XLA_FLAGS", None)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=1200)
    assert out.returncode == 0, out.stderr[-2000:]
    plan = json.loads(out.stdout)
    assert plan["model"]["parameters"] == pytest.approx(expect_params, rel=0.01)
    assert plan["mesh"]["devices"] == 8
    base_bytes = plan["per_device"]["parameters_bytes"] - plan["per_device"]["trainable_bytes"]
    assert base_bytes == pytest.approx(2 * expect_params / 8, rel=0.02)  # bf16, split over 8 devices
    assert 0 < plan["per_device"]["total_bytes"] < 80e9


def test_every_process_takes_process_0s_size_or_all_stop_together():
    """Several processes: the automatic size is process 0's; a search that fails on one process makes
    every process raise (none is left waiting in a collective for it)."""
    from tests import multiprocess

    agree = multiprocess.run("tests.train.multihost_cases:agreed_size_case", num_processes=2, devices=1,
                             kwargs={"sizes": [8, 4]}, timeout=120)
    assert [r["size"] for r in agree] == [8, 8]
    fail = multiprocess.run("tests.train.multihost_cases:agreed_size_case", num_processes=2, devices=1,
                            kwargs={"sizes": [8, 0]}, timeout=120)
    assert fail[1]["error"] == "no microbatch fits on process 1"
    assert "failed on process(es) [1]" in fail[0]["error"]
    one = resources.agreed_size(lambda: resources.MicrobatchChoice(3, 1, 2, 2, 0.0, ((3, 1),)))
    assert one[0] == 3 and one[1].microbatch == 3


def test_the_cpu_memory_limit_is_the_hosts_available_memory_shared_by_its_cpu_devices(monkeypatch):
    host = resources.host_memory_bytes()
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert host is not None and 0 < host <= physical  # what is available now, never more than the machine has
    monkeypatch.setattr(resources, "host_memory_bytes", lambda: 8 * resources.GIB)
    cpus = jax.local_devices(backend="cpu")
    assert resources.device_memory_limit(cpus[0]) == 8 * resources.GIB // len(cpus)
    assert resources.memory_limit(None, cpus[0]) == 8 * resources.GIB // len(cpus)  # --microbatch-size auto: no flag
    assert resources.memory_limit(12345, cpus[0]) == 12345  # --memory-limit wins
    monkeypatch.setattr(resources, "host_memory_bytes", lambda: None)
    assert resources.device_memory_limit(cpus[0]) is None
    with pytest.raises(resources.PlanError, match="pass --memory-limit"):
        resources.memory_limit(None, cpus[0])


def test_host_memory_is_meminfos_available_bounded_by_the_cgroups_room(monkeypatch):
    import builtins
    import io

    real_open = builtins.open
    gib = resources.GIB

    def files(meminfo, limit=None, usage=None):
        table = {"/proc/meminfo": meminfo, "/sys/fs/cgroup/memory.max": limit, "/sys/fs/cgroup/memory.current": usage}

        def opener(path, *a, **k):
            path = str(path)
            if path in table or path.startswith("/sys/fs/cgroup/"):
                if table.get(path) is None:
                    raise FileNotFoundError(path)
                return io.StringIO(table[path])
            return real_open(path, *a, **k)
        return opener

    meminfo = f"MemTotal: {24 * gib // 1024} kB\nMemFree: 1000 kB\nMemAvailable: {10 * gib // 1024} kB\n"
    for opener, expected in ((files(meminfo), 10 * gib),  # no cgroup limit
                             (files(meminfo, "max", str(gib)), 10 * gib),  # v2 without a limit
                             (files(meminfo, str(6 * gib), str(2 * gib)), 4 * gib),  # the cgroup's room is less
                             (files(meminfo, str(30 * gib), str(2 * gib)), 10 * gib),
                             (files(meminfo, str(gib), str(2 * gib)), 0)):  # over its limit: nothing
        monkeypatch.setattr(builtins, "open", opener)
        assert resources.host_memory_bytes() == expected
