"""Crash-safe trainers (issue 23, finding 10): the releasable directory is complete only when its
manifest, written last, is there; a half-written one is never loaded and a rerun says what
happened; SIGKILL after a checkpoint + `--resume` equals an uninterrupted run."""

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from dpsynth import fileio
from dpsynth.dp import report
from dpsynth.models.directory import load_model
from dpsynth.train import finetune, release, sweep, tune_config, tune_resume
from tests.train.conftest import make_records
from tests.dp.ledgers import without_runs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN, VALID = make_records(120, 1), make_records(30, 2, "v")
CFG = tune_config.TuneConfig(mode="lora", epsilon=4.0, batch_size=24, steps=4, microbatch_size=16, max_tokens=32,
                             checkpoint_every=2, lora_rank=2, learning_rate=1e-2, seed=99)



def _lora(out):
    return jax.tree.leaves(load_model(out).variables["lora"])


def _same_model(a, b):
    for x, y in zip(_lora(a), _lora(b)):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
    assert without_runs(report.load_report(a))["ledger"] == without_runs(report.load_report(b))["ledger"]


@pytest.fixture(scope="module")
def finished(tiny_base, tmp_path_factory):
    base_dir, _ = tiny_base
    out = str(tmp_path_factory.mktemp("finished") / "lora")
    finetune.dp_tune(base_dir, TRAIN, VALID, out, CFG, progress_interval=1e9)
    return base_dir, out


class Killed(BaseException):
    """Stands for the process dying at that point (not an Exception: nothing catches it)."""


def test_status_of_directories(tmp_path):
    d = tmp_path / "m"
    assert release.status(str(d)) is None  # absent
    d.mkdir()
    (d / "privacy_report.json").write_text("{}")
    assert release.status(str(d)) is None  # a run in progress: a report, no model yet
    (d / "variables").mkdir()
    assert "no manifest.json" in release.status(str(d)) and not release.is_complete(str(d))
    fileio.write_json(str(d / "manifest.json"), {"format": "x", release.REPORT_SHA256: "0" * 64})
    assert "not the one its manifest was released with" in release.status(str(d))
    fileio.write_json(str(d / "manifest.json"), {"format": "x", **release.report_fields(str(d))})
    assert release.status(str(d)) is None and release.is_complete(str(d))
    with pytest.raises(release.ReleaseError, match="finished model"):
        release.check_fresh_run(str(d))


def test_the_manifest_is_written_last_and_ties_the_report(finished):
    _, out = finished
    manifest = fileio.read_json(os.path.join(out, "manifest.json"))
    assert manifest[release.REPORT_SHA256] == fileio.sha256_file(os.path.join(out, "privacy_report.json"))
    assert release.is_complete(out)


def test_a_crash_while_writing_outputs_leaves_no_complete_looking_directory(finished, tmp_path, monkeypatch, caplog):
    """Killed as the final privacy report is written (after the last checkpoint): there must be no
    manifest (the old order wrote the model's manifest first, then the report); killed as the
    manifest is written: none either, nothing loads it, and `--resume` says so and rewrites it."""
    from dpsynth.generate.model_info import GenerateError, read_model_info

    base_dir, reference = finished
    real_write_report, real_write_json = report.write_report, fileio.write_json
    for victim in ("final report", "manifest"):
        out = str(tmp_path / victim.replace(" ", "_"))
        calls = []

        def write_report(directory, rep):
            calls.append(rep["training"]["steps"])
            if victim == "final report" and calls.count(CFG.steps) == 2:  # the checkpoint's at step 4, then the final
                raise Killed()
            return real_write_report(directory, rep)

        def write_json(path, value, **kw):
            if victim == "manifest" and path == os.path.join(out, "manifest.json"):
                raise Killed()
            return real_write_json(path, value, **kw)

        monkeypatch.setattr(report, "write_report", write_report)
        monkeypatch.setattr(fileio, "write_json", write_json)
        with pytest.raises(Killed):
            finetune.dp_tune(base_dir, TRAIN, VALID, out, CFG, progress_interval=1e9)
        monkeypatch.setattr(report, "write_report", real_write_report)
        monkeypatch.setattr(fileio, "write_json", real_write_json)
        assert not os.path.exists(os.path.join(out, "manifest.json")), victim
        assert not release.is_complete(out)
        if victim == "manifest":
            assert "no manifest.json" in release.status(out)
            with pytest.raises(GenerateError, match="no manifest.json"):
                read_model_info(out)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="dpsynth"):
            finetune.dp_tune(base_dir, TRAIN, VALID, out, CFG, resume=True, progress_interval=1e9)
        if victim == "manifest":  # the rerun says what it found
            assert any("no manifest.json" in r.getMessage() and "this run rewrites it" in r.getMessage()
                       for r in caplog.records)
        assert release.is_complete(out)
        _same_model(out, reference)


def test_a_fresh_run_never_mixes_its_report_into_a_finished_model(finished, tmp_path):
    """With another --state-dir, a new run in the same --out used to overwrite the finished model's
    privacy report at its first checkpoint while that model's manifest and weights stayed."""
    base_dir, out = finished
    before = open(os.path.join(out, "privacy_report.json"), "rb").read()
    with pytest.raises(tune_config.TuneError, match="holds a finished model"):
        finetune.dp_tune(base_dir, TRAIN, VALID, out, dataclasses.replace(CFG, steps=6), stop_after=2,
                         state_dir=str(tmp_path / "other_state"), progress_interval=1e9)
    assert open(os.path.join(out, "privacy_report.json"), "rb").read() == before and release.is_complete(out)


@pytest.mark.slow  # make test-slow: ~18 s; the single-run crash test above stays
def test_a_crash_while_releasing_a_sweep_leaves_no_complete_looking_directory(tiny_base, tmp_path, monkeypatch):
    """The sweep copied the selected trial's manifest into --out before writing the composed report:
    killed in between, --out looked complete with ONE trial's epsilon (the composition of all k is the cost)."""
    base_dir, _ = tiny_base
    out = str(tmp_path / "sweep")
    real_write_report = report.write_report

    def write_report(directory, rep):
        if os.path.abspath(directory) == os.path.abspath(out):
            raise Killed()
        return real_write_report(directory, rep)

    monkeypatch.setattr(report, "write_report", write_report)
    with pytest.raises(Killed):
        sweep.sweep(base_dir, TRAIN, VALID, out, dataclasses.replace(CFG, steps=2, seed=None),
                    learning_rates=[1e-2, 3e-2], clip_norms=[1.0], progress_interval=1e9)
    assert not os.path.exists(os.path.join(out, "manifest.json")) and not release.is_complete(out)


# ----------------------------------------------------------------------------- SIGKILL, then --resume

DP_FLAGS = ["--mode", "lora", "--epsilon", "4", "--batch-size", "24", "--steps", "40", "--microbatch-size", "16",
            "--max-tokens", "32", "--checkpoint-every", "4", "--lora-rank", "2", "--learning-rate", "0.01",
            "--labels", "great", "other", "--seed", "1234"]


def _kill_after_first_checkpoint(cmd, checkpoints, timeout=600):
    """Starts `cmd`, SIGKILLs it once `checkpoints` holds a finished checkpoint; returns that step."""
    env = {**os.environ, "PYTHONPATH": REPO}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            steps = [int(n) for n in os.listdir(checkpoints) if n.isdigit()] if os.path.isdir(checkpoints) else []
            if steps:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.02)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read().decode()
    assert rc == -signal.SIGKILL, f"not killed mid-run (rc {rc}): {err}"
    return max(int(n) for n in os.listdir(checkpoints) if n.isdigit())


@pytest.mark.slow  # make test-slow: ~73 s; resume exactness stays in test_finetune.py::test_resume_is_exact_for_params_and_ledger
def test_sigkill_dp_tune_after_a_checkpoint_then_resume_equals_an_uninterrupted_run(tiny_base, tmp_path):
    from trainers import dp_tune

    base_dir, _ = tiny_base
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in TRAIN))
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "dpsynth.cli", "dp-tune", "--base", base_dir, "--train", str(data), "--out", str(out),
           *DP_FLAGS]
    step = _kill_after_first_checkpoint(cmd, os.path.join(tune_resume.default_state_dir(str(out)), "checkpoints"))
    assert 0 < step < 40 and not os.path.exists(out / "manifest.json")
    assert dp_tune.main(["--base", base_dir, "--train", str(data), "--out", str(out), *DP_FLAGS, "--resume"]) == 0
    ref = tmp_path / "uninterrupted"
    assert dp_tune.main(["--base", base_dir, "--train", str(data), "--out", str(ref), *DP_FLAGS]) == 0
    _same_model(str(out), str(ref))
    assert report.load_report(str(out))["training"]["steps"] == 40 and release.is_complete(str(out))


@pytest.mark.slow  # two pretraining runs in subprocesses
def test_sigkill_pretrain_after_a_checkpoint_then_resume_equals_an_uninterrupted_run(tiny_corpus, tmp_path):
    from dpsynth.models import directory
    from trainers import pretrain

    corpus, tok_path, _ = tiny_corpus
    flags = ["--corpus", corpus, "--tokenizer", tok_path, "--preset", "tiny", "--set", "num_layers=1", "--set",
             "d_ff=64", "--seq-len", "32", "--batch-size", "4", "--steps", "60", "--checkpoint-every", "5",
             "--eval-every", "1000", "--log-every", "10", "--no-tensorboard"]
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "dpsynth.cli", "pretrain", *flags, "--out", str(out)]
    step = _kill_after_first_checkpoint(cmd, os.path.join(out, "checkpoints"))
    assert 0 < step < 60 and not os.path.exists(out / "manifest.json")
    assert pretrain.main([*flags, "--out", str(out), "--resume"]) == 0
    ref = tmp_path / "uninterrupted"
    assert pretrain.main([*flags, "--out", str(ref)]) == 0
    a, b = directory.load_model(str(out)), directory.load_model(str(ref))
    assert directory.variables_allclose(a.variables, b.variables, atol=1e-6)
    assert a.manifest["steps"] == b.manifest["steps"] == 60 and release.is_complete(str(out))
