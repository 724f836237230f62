"""Resume after a kill with the REAL stages on the tiny preset (slow: minutes)."""

import glob
import json
import multiprocessing
import os
import time

import pytest

SMALL_UNTIL_PRETRAIN = {
    "public": {"plant": 0},
    "sensitive": {"max_train": 300, "max_valid": 50, "max_test": 100},
    "tokenizer": {"vocab_size": 1000},
    "pretrain": {"steps": 40, "seq_len": 64, "batch_size": 8, "options": {"checkpoint_every": 5, "eval_every": 20}},
}


def _run(root: str) -> None:
    from dpsynth import demo
    from dpsynth.experiment.plan import build_plan
    from dpsynth.experiment.runner import run_plan

    run_plan(build_plan(demo.demo_config(SMALL_UNTIL_PRETRAIN), root), until="pretrain")


@pytest.mark.slow
def test_kill_during_pretraining_then_resume(tmp_path):
    from dpsynth import demo
    from dpsynth.data import embedded
    from dpsynth.experiment.plan import build_plan
    from dpsynth.experiment.runner import run_plan

    try:
        embedded.austen_documents()
    except embedded.EmbeddedDataMissing as e:
        pytest.skip(str(e))
    root = str(tmp_path / "run")
    proc = multiprocessing.get_context("spawn").Process(target=_run, args=(root,))
    proc.start()
    pattern = os.path.join(root, "stages", "pretrain", ".work-*", "model", "checkpoints", "*")
    deadline = time.monotonic() + 600
    while not glob.glob(pattern) and time.monotonic() < deadline and proc.is_alive():
        time.sleep(0.5)
    assert glob.glob(pattern), "pretraining never wrote a checkpoint"
    time.sleep(1.0)
    proc.kill()
    proc.join()
    assert not [d for d in os.listdir(os.path.join(root, "stages", "pretrain")) if not d.startswith(".")]

    result = run_plan(build_plan(demo.demo_config(SMALL_UNTIL_PRETRAIN), root), until="pretrain")
    assert result.ok, result.failed
    assert result.ran == ["pretrain"]  # data, tokenizer and dedup were finished and cached
    with open(os.path.join(result.outputs["pretrain"].dir, "stage.json")) as f:
        marker = json.load(f)
    assert marker["resumed"] is True and marker["summary"]["step"] == 40
