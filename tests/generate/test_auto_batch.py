"""`dpsynth generate --batch-size auto`: the largest batch whose compiled sampler call fits (tiny preset, CPU)."""

import dataclasses
import json
import logging
import os

import pytest

from dpsynth.generate import auto_batch
from dpsynth.generate.job import GenerateConfig, GenerateError, generate
from dpsynth.generate.postprocess import PostprocessConfig
from dpsynth.train import resources
from tests.generate.fakes import load_fake_bundle, write_fake_model_dir
from tests.generate.test_job import tiny_model_dir  # noqa: F401 (a fixture)

MAX_LEN = 40


def _config(model_dir, out, **kw):
    base = dict(model_dir=model_dir, out_dir=str(out), num_examples=10, valid_examples=3, examples_per_shard=4,
                max_len=MAX_LEN, batch_size="auto")
    return GenerateConfig(**{**base, **kw})


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def test_settings_are_validated():
    for bad in (0, -1, "big", 2.5, True):
        with pytest.raises(GenerateError, match="--batch-size must be a positive integer or 'auto'"):
            GenerateConfig(model_dir="m", out_dir="o", num_examples=1, batch_size=bad)
    with pytest.raises(GenerateError, match="--memory-limit"):
        GenerateConfig(model_dir="m", out_dir="o", num_examples=1, memory_limit=0)
    with pytest.raises(GenerateError, match="--memory-headroom"):
        GenerateConfig(model_dir="m", out_dir="o", num_examples=1, memory_headroom=1.0)
    config = GenerateConfig(model_dir="m", out_dir="o", num_examples=1, batch_size="auto")
    assert auto_batch.resolve_batch(dataclasses.replace(config, batch_size=8)).batch_size == 8  # a number: as given


def test_make_plan_needs_the_batch_resolved(tmp_path):
    from dpsynth.generate.plan import make_plan
    from dpsynth.generate.model_info import read_model_info

    model = write_fake_model_dir(str(tmp_path / "m"), max_len=24)
    with pytest.raises(GenerateError, match="resolved by `generate` first"):
        make_plan(GenerateConfig(model_dir=model, out_dir=str(tmp_path / "o"), num_examples=4, batch_size="auto"),
                  read_model_info(model))


def test_a_backend_without_memory_figures_needs_a_memory_limit_and_a_fake_model_a_real_one(tmp_path, monkeypatch):
    monkeypatch.setattr(resources, "device_memory_limit", lambda device=None: None)  # a backend that does not say
    model = write_fake_model_dir(str(tmp_path / "m"), max_len=24)
    config = GenerateConfig(model_dir=model, out_dir=str(tmp_path / "o"), num_examples=4, batch_size="auto")
    with pytest.raises(GenerateError, match=r"--batch-size auto: the cpu backend does not report its memory; pass "
                                            r"--memory-limit"):
        generate(config, loader=load_fake_bundle)
    with pytest.raises(GenerateError, match="--batch-size auto: .*dpsynth model directory"):
        generate(dataclasses.replace(config, memory_limit=10**9), loader=load_fake_bundle)
    assert not os.path.exists(tmp_path / "o")


def test_picks_the_largest_batch_that_fits(tiny_model_dir, tmp_path, caplog):  # noqa: F811
    model_dir, _ = tiny_model_dir
    config = _config(model_dir, tmp_path / "o", examples_per_shard=2, num_examples=4, valid_examples=0)
    programs = auto_batch.programs_of(config)
    assert programs.largest_shard == 2 and programs.num_contrasts == 1
    p1, p2 = programs.peak_bytes(1), programs.peak_bytes(2)
    assert p2 > p1  # the KV cache and the decode buffers grow with the batch
    # A budget between batch 1's peak and batch 2's: the search picks 1, and batch 2 (compiled) does not fit.
    headroom = 0.25
    budget = p1 + (p2 - p1) // 2
    limit = int(budget / (1 - headroom)) + 1
    choice = auto_batch.choose_batch(programs, limit_bytes=limit, headroom=headroom)
    tried = dict(choice.tried)
    assert choice.microbatch == 1 and choice.peak_bytes == p1 <= choice.budget_bytes
    assert tried[2] == p2 > choice.budget_bytes and choice.budget_bytes == int(limit * (1 - headroom))
    # resolve_batch: the same choice (the same programs: nothing compiled again), one log line, nothing written.
    with caplog.at_level(logging.INFO, logger="dpsynth.generate"):
        resolved = auto_batch.resolve_batch(dataclasses.replace(config, memory_limit=limit, memory_headroom=headroom),
                                            programs=programs)
    assert resolved.batch_size == 1 and resolved.memory_limit == limit
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("batch auto:")]
    assert line.startswith("batch auto: batch 1: compiled sampler call peak") and "tried 1: " in line and "2: " in line
    assert not os.path.exists(tmp_path / "o")
    # Every batch fits: the largest shard's examples, never more.
    assert auto_batch.choose_batch(programs, limit_bytes=10 ** 12).microbatch == 2


def test_refuses_in_one_line_when_nothing_fits(tiny_model_dir, tmp_path):  # noqa: F811
    model_dir, _ = tiny_model_dir
    with pytest.raises(GenerateError) as e:
        generate(_config(model_dir, tmp_path / "o", memory_limit=100_000))
    message = str(e.value)
    assert "\n" not in message and message.startswith("--batch-size auto: no batch fits: batch 1 needs ")
    assert "--memory-limit" in message
    assert not os.path.exists(tmp_path / "o")


def test_guided_off_label_job_compiles_its_contrast_streams_and_scoring_pass(tiny_model_dir, tmp_path):  # noqa: F811
    from dpsynth.generate.sampler_config import SamplingOptions

    model_dir, _ = tiny_model_dir
    post = PostprocessConfig(drop=("off_label",))
    programs = auto_batch.programs_of(_config(model_dir, tmp_path / "o", postprocess=post,
                                              sampling=SamplingOptions(guidance=1.5)))
    assert programs.num_contrasts == 1 and programs.sampler_config.guided  # two labels: the other one
    costs = programs.costs(2)
    assert set(costs) == {"sample", "score"} and programs.score_width % auto_batch.SCORE_BUCKET == 0
    assert programs.peak_bytes(2) == max(c.total_bytes for c in costs.values())


def test_cli_refusals_exit_2_in_one_line_and_leave_no_out(tiny_model_dir, tmp_path, capsys, monkeypatch):  # noqa: F811
    from beam_jobs.generate import main

    monkeypatch.setattr(resources, "device_memory_limit", lambda device=None: None)  # a backend that does not say

    model_dir, _ = tiny_model_dir
    base = ["--model", model_dir, "--num-examples", "4", "--max-len", str(MAX_LEN), "--batch-size", "auto"]
    assert main(base + ["--out", str(tmp_path / "a")]) == 2  # no memory figure and no --memory-limit
    assert "--batch-size auto: the cpu backend does not report its memory; pass --memory-limit" in capsys.readouterr().err
    assert main(base + ["--out", str(tmp_path / "b"), "--memory-limit", "100kB"]) == 2
    err = capsys.readouterr().err
    assert "no batch fits: batch 1 needs" in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")
    with pytest.raises(SystemExit):  # a bad value: argparse's usage error
        main(base[:-1] + ["lots", "--out", str(tmp_path / "c")])


@pytest.mark.slow
def test_cli_end_to_end_logs_the_choice_records_it_and_keeps_it_on_rerun(tiny_model_dir, tmp_path, capsys):  # noqa: F811
    from apache_beam.testing.test_pipeline import TestPipeline

    from beam_jobs.generate import main, run
    from dpsynth.outdir import RUN_FILE

    model_dir, _ = tiny_model_dir
    base = ["--model", model_dir, "--num-examples", "10", "--valid-examples", "3", "--max-len", str(MAX_LEN),
            "--examples-per-shard", "4", "--temperature", "1.0", "--seed", "3"]
    auto = base + ["--out", str(tmp_path / "auto"), "--batch-size", "auto", "--memory-limit", "8GiB"]
    assert main(auto) == 0
    err = capsys.readouterr().err
    [line] = [l for l in err.splitlines() if l.startswith("batch auto:")]
    assert line.startswith("batch auto: batch 4: compiled sampler call peak") and "at most 4" in line
    recorded = json.loads(_read(tmp_path / "auto" / "generation_config.json"))
    assert recorded["sampler"]["batch_size"] == 4
    # An explicit --batch-size 4 is the same job: the same generation_config.json, corpus and manifest.
    explicit = base + ["--out", str(tmp_path / "four"), "--batch-size", "4"]
    run(explicit, test_pipeline=TestPipeline)
    for name in ("generation_config.json", "train.jsonl", "valid.jsonl", "manifest.json"):
        assert _read(tmp_path / "auto" / name) == _read(tmp_path / "four" / name), name
    # The run record holds the flag as given ("auto"), not the memory budget; a default run's has neither new flag.
    records = {d: json.loads(_read(tmp_path / d / RUN_FILE))["config"] for d in ("auto", "four")}
    assert records["auto"]["batch_size"] != records["four"]["batch_size"]
    assert not {"memory_limit", "memory_headroom"} & (set(records["auto"]) | set(records["four"]))
    # A rerun keeps the recorded batch (a smaller --memory-limit is not another run), and is a no-op resume.
    before = _read(tmp_path / "auto" / "train.jsonl")
    assert main(auto[:-1] + ["6GiB"]) == 0
    assert "batch auto: batch 4, the run's own (generation_config.json" in capsys.readouterr().err
    assert _read(tmp_path / "auto" / "train.jsonl") == before
    # ... unless it does not fit here: one line, exit 2, the corpus untouched.
    assert main(auto[:-1] + ["100kB"]) == 2
    assert "holds this job at batch 4 (generation_config.json), which needs" in capsys.readouterr().err
    assert _read(tmp_path / "auto" / "train.jsonl") == before
    # An explicit batch into the auto run's directory is another configuration (the run record differs).
    assert main(base + ["--out", str(tmp_path / "auto"), "--batch-size", "4"]) == 2
    assert "differs in --batch-size" in capsys.readouterr().err
