"""`bench/accelerator.py` at tiny sizes on CPU: every figure is in its JSON, finite and positive.

No timing is asserted: only that each figure exists, is finite and positive, and that the byte
and token counts behind the ratios are the ones the docstring defines. The full run is a
subprocess (the command as a user types it) with XLA's CPU optimisation turned down, which
halves the compile time that is most of a tiny run.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import types

import pytest

from tests.conftest import FAST_COMPILE, REPO

SCRIPT = REPO / "bench" / "accelerator.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_accelerator", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


acc = _load()


def _run(*args: str, timeout: float = 240) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu", XLA_FLAGS=FAST_COMPILE)
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT_JSON ")]
    assert len(lines) == 1, proc.stdout[-3000:]
    return json.loads(lines[0][len("RESULT_JSON "):]), proc.stdout


def _positive(figures: dict, keys: list[str], where: str) -> None:
    for key in keys:
        value = figures.get(key)
        assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, f"{where}.{key} = {value!r}"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("accelerator") / "accelerator.json"
    report, stdout = _run("--tiny", "--peak-tflops", "1", "--peak-gbps", "50", "--json", str(path))
    with open(path) as f:
        assert json.loads(f.read()) == report  # the file holds the same single JSON line
    return report, stdout


@pytest.mark.slow  # make test-slow: the benchmark harness end to end (~75 s)
def test_tiny_run_reports_every_figure(tiny_run):
    rep, stdout = tiny_run
    assert rep["sizes"] == "tiny" and not rep["errors"] and not rep["skipped"]
    assert rep["peaks"] == {"tflops": 1.0, "gbps": 50.0, "source": "flags"}
    _positive(rep["ceilings"], ["matmul_tflops", "copy_gbps", "matmul_of_peak", "copy_of_peak"], "ceilings")
    size = acc.SIZES["tiny"]["tiny"]

    p = rep["pretrain"]["tiny"]
    _positive(p, ["tokens_per_s", "tflops", "mfu", "of_matmul", "step_s", "compile_s", "flops_per_token", "loss",
                  "xla_mib", "params", "steps"], "pretrain")
    # tiny runs 1b's settings: bf16, remat, Adafactor
    assert p["dtype"] == "bfloat16" and p["remat"] and p["optimizer"] == "adafactor" and p["steps"] <= p["steps_asked"]
    assert p["mfu"] == pytest.approx(p["tflops"] / 1.0)

    d = rep["dp_lora"]["tiny"]
    for variant in ("nonprivate", "dp"):
        _positive(d[variant], ["tokens_per_s", "step_s", "compile_s", "xla_mib", "rows", "microbatches",
                               "trainable_params", "loss"], f"dp_lora.{variant}")
    assert d["dp"]["strategy"] == "DPSGDStrategy" and d["nonprivate"]["strategy"] == "MeanGradient"
    # Same Poisson batches for both variants: the same rows and microbatches.
    assert d["dp"]["rows"] == d["nonprivate"]["rows"] and d["dp"]["microbatches"] == d["nonprivate"]["microbatches"]
    assert d["dp"]["trainable_params"] == d["nonprivate"]["trainable_params"]
    _positive(d, ["ratio_time_per_token", "ratio_xla_memory"], "dp_lora")

    s = rep["sampler"]["tiny"]
    for variant in ("unguided", "guided"):
        v = s[variant]
        _positive(v, ["tokens_per_s", "call_s", "compile_s", "gbps_min", "gbps_full", "bound_fraction",
                      "bound_fraction_full_cache", "of_copy", "generated_tokens", "bytes_min", "bytes_full"],
                  f"sampler.{variant}")
        # EOS is disabled: every row generates max_len - prompt tokens.
        assert v["generated_tokens"] == size.sampler.batch * (size.sampler.max_len - size.sampler.prompt)
        assert v["bytes_full"] > v["bytes_min"]
    assert s["guided"]["streams"] == 2 and s["guided"]["guidance"] > 0 and s["unguided"]["guidance"] == 0
    assert s["guided"]["bytes_min"] > s["unguided"]["bytes_min"]  # twice the KV streams, the same weights
    _positive(s, ["guided_vs_unguided"], "sampler")

    # Device memory statistics: none on CPU, so every peak says so ("n/a" in the table).
    assert rep["device"]["memory_stats"] is False
    assert p["peak_mib"] is None and s["peak_mib"] is None and d["ratio_peak_memory"] is None
    for section in ("pretrain", "dp-lora", "sampler", "ceilings"):
        assert f"\n{section}" in stdout


def test_isolated_units_run_in_child_processes(tmp_path):
    rep, stdout = _run("--tiny", "--isolate", "on", "--sections", "ceilings", "--json", str(tmp_path / "r.json"))
    assert rep["isolated"] is True and not rep["errors"]
    assert rep["peaks"]["source"] == "no peak known" and rep["ceilings"]["matmul_of_peak"] is None
    _positive(rep["ceilings"], ["matmul_tflops", "copy_gbps"], "ceilings")
    assert "no peak known" in stdout


def test_max_seconds_skips_what_does_not_fit(tmp_path):
    path = tmp_path / "r.json"
    # A budget of 0: the deadline has passed before the first unit, however fast the machine is.
    assert acc.main(["--tiny", "--max-seconds", "0", "--json", str(path)]) == 0
    rep = json.loads(path.read_text())
    assert [s["unit"] for s in rep["skipped"]] == acc.plan_units(acc.SECTIONS, ["tiny"])
    assert all("--max-seconds" in s["reason"] for s in rep["skipped"])
    assert rep["pretrain"] == rep["dp_lora"] == rep["sampler"] == {} and rep["ceilings"] is None


def test_budget_fits_steps_before_the_deadline():
    import time

    b = acc.Budget(time.time() + 10.0)
    assert b.fit(100, per_step_s=1.0, reserve_s=0.0) in (9, 10)
    assert b.fit(3, per_step_s=1.0) == 3
    assert acc.Budget(time.time() - 1.0).fit(5, per_step_s=1.0) == 1  # at least one timed step
    assert acc.unit_floor("dp/1b/dp", "full") > acc.unit_floor("dp/small/dp", "full") > 0
    assert acc.unit_floor("sampler/1b", "tiny") == 0


def test_plan_runs_ceilings_then_each_preset_in_order():
    assert acc.plan_units(acc.SECTIONS, ["1b", "small"]) == [
        "ceilings", "pretrain/1b", "dp/1b/nonprivate", "dp/1b/dp", "sampler/1b",
        "pretrain/small", "dp/small/nonprivate", "dp/small/dp", "sampler/small"]
    assert acc.plan_units(["sampler"], ["1b"]) == ["sampler/1b"]
    assert list(acc.SIZES["full"]) == ["1b", "small"]  # the presets issue 26 names, 1b first
    assert acc.SIZES["full"]["1b"].sampler.batch == acc.SIZES["full"]["small"].sampler.batch == 256


@pytest.mark.parametrize("kind, name", [
    ("NVIDIA H200", "NVIDIA H200 SXM"), ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"), ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 SXM 80GB"),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 40GB"), ("NVIDIA GH200 480GB", "NVIDIA GH200 (96 GB HBM3)"),
    ("NVIDIA L4", "NVIDIA L4"), ("NVIDIA L40S", "NVIDIA L40S"), ("TPU v4", "TPU v4"), ("TPU v5 lite", "TPU v5e"),
    ("TPU v5", "TPU v5p"), ("TPU v6 lite", "TPU v6e")])
def test_known_devices(kind, name):
    peaks = acc.device_peaks(kind)
    assert peaks.source == f"table: {name}" and peaks.tflops > 0 and peaks.gbps > 0


def test_peaks_from_flags_and_unknown_devices():
    assert acc.device_peaks("cpu") == acc.Peaks(None, None, "no peak known")
    assert acc.device_peaks("cpu", 2.0, 30.0) == acc.Peaks(2.0, 30.0, "flags")
    mixed = acc.device_peaks("NVIDIA H200", tflops=700.0)  # a measured matmul rate, the table's bandwidth
    assert (mixed.tflops, mixed.gbps, mixed.source) == (700.0, 4800.0, "flags, table: NVIDIA H200 SXM")


@pytest.mark.parametrize("kind", ["NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "TPU v4",
                                  "TPU v5 lite"])
def test_table_agrees_with_the_pretraining_mfu_table(kind):
    from dpsynth.train.pretrain import peak_flops_per_device

    assert acc.device_peaks(kind).tflops * 1e12 == peak_flops_per_device(types.SimpleNamespace(device_kind=kind))


def test_sampler_bytes_by_hand():
    from dpsynth.models import get_config

    config = get_config("tiny", num_kv_heads=2)  # 2 layers, 2 KV heads x 16
    b = acc.sampler_bytes(config, weight_bytes=1000, rows=3, prompt=2, max_len=5, cache_itemsize=2)
    per_slot = 2 * 2 * 2 * 16 * 2  # K and V x layers x KV heads x head_dim x bytes
    assert b["decode_steps"] == 3
    assert b["weights"] == 1000 * 4  # the prefill and 3 decode steps each read every weight
    assert b["kv_min"] == 3 * per_slot * (3 + 4 + 5)  # step t attends over prompt + t + 1 slots
    assert b["kv_full"] == 3 * per_slot * 5 * 3  # one phase (3 steps < cache_block): the whole cache every step
    assert b["min"] == b["weights"] + b["kv_min"] and b["full"] == b["weights"] + b["kv_full"]
    # phases of 2 steps: steps 0-1 over a cache of prompt + 2 = 4 slots, then 5 (max_len) for step 2
    assert acc.sampler_bytes(config, weight_bytes=1000, rows=3, prompt=2, max_len=5, cache_itemsize=2,
                             cache_block=2)["kv_full"] == 3 * per_slot * (4 + 4 + 5)


def test_make_training_is_pretrainings_step():
    from dpsynth.train import core, pretrain

    cfg = pretrain.PretrainConfig(preset="tiny", seq_len=16, batch_size=2, model_overrides={"num_layers": 1})
    model_config = cfg.model_config(512)
    _, fns, state = pretrain.make_training(cfg, model_config)
    assert isinstance(fns.strategy, core.MeanGradient) and int(state.step) == 0
    import jax

    assert sum(x.size for x in jax.tree.leaves(state.params)) == model_config.num_params(("params",))


def test_full_size_report_judges_the_targets(tiny_run, capsys):
    """The table of a device run (full sizes, isolated units, memory statistics), from the tiny
    run's figures relabelled: every branch that run prints, without a device."""
    import copy

    rep = copy.deepcopy(tiny_run[0])
    raw = {"ceilings": rep["ceilings"], "pretrain/1b": rep["pretrain"]["tiny"], "sampler/1b": rep["sampler"]["tiny"],
           **{f"dp/1b/{v}": rep["dp_lora"]["tiny"][v] for v in ("nonprivate", "dp")}}
    for i, r in enumerate((raw["pretrain/1b"], raw["dp/1b/nonprivate"], raw["dp/1b/dp"], raw["sampler/1b"])):
        r["peak_mib"] = 1000.0 + i
    device = {**rep["device"], "platform": "gpu", "device_kind": "NVIDIA H200", "memory_stats": True}
    opts = types.SimpleNamespace(sizes="full", isolate_on=True, max_seconds=460.0)
    full = acc.assemble(raw, device, acc.device_peaks("NVIDIA H200"), opts, [{"unit": "pretrain/small",
                        "reason": "1 s left"}], {"dp/small/dp": "OOM"}, 400.0)
    acc.print_report(full)
    out = capsys.readouterr().out
    assert full["dp_lora"]["1b"]["ratio_peak_memory"] == pytest.approx(1002.0 / 1001.0)
    assert full["pretrain"]["1b"]["mfu"] == pytest.approx(full["pretrain"]["1b"]["tflops"] / 989.0)
    assert out.count("MISSED") + out.count("MET") == 4  # MFU, DP ratio, and the bound for both sampler rows
    assert "table: NVIDIA H200 SXM" in out and "per unit (isolated processes)" in out and "(device peak)" in out
    assert "skipped pretrain/small: 1 s left" in out and "FAILED dp/small/dp: OOM" in out
    json.dumps(full)  # the JSON line


def test_study_imports_the_model_when_missing_then_runs_the_cells_in_priority_order(tmp_path):
    """`--study`: bench/paper.py at the cpu scale with the generator's and the cpu preset's v3 cells, set by set;
    the GGUF import first when the model directory is missing, and a one-line refusal without a file to import."""
    model = tmp_path / "gemma"
    args = acc.parse_args(["--study", "--study-model", str(model), "--study-sets", "sst2,ag_news",
                           "--study-probe", "P", "--study-data", "D"])
    with pytest.raises(SystemExit, match="make gemma3-gguf"):
        acc.study_commands(args)
    args.study_gguf = "g.gguf"
    imp, paper = acc.study_commands(args)
    assert imp[-5:] == ["import-model", "--gguf", "g.gguf", "--out", str(model)]
    assert paper[paper.index("--only") + 1:paper.index("--only") + 5] == ["gen_sst2", "v3_sst2", "gen_ag_news", "v3_ag_news"]
    assert paper[paper.index("--base-model") + 1] == str(model) and paper[paper.index("--scale") + 1] == "cpu"
    assert paper[paper.index("--probe") + 1] == "P" and paper[paper.index("--data") + 1] == "D"
    model.mkdir()
    (model / "manifest.json").write_text("{}")
    assert [c[1] for c in acc.study_commands(args)] == [str(acc.REPO) + "/bench/paper.py"]  # imported: paper only
