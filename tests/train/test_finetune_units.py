"""The DP tuner at user level and with BandMF: reports, missing user column, exact resume."""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest

from dpsynth.dp import report
from dpsynth.train import finetune
from dpsynth.train.checkpoint import TrainCheckpointer, load_model
from tests.train.conftest import make_records


def with_users(records, heavy=30, seed=0):
    """Gives the records users: the first `heavy` rows belong to one person, the rest to people with 1-4 rows."""
    rng = np.random.default_rng(seed)
    out, u, i = [], 1, heavy
    for r in records[:heavy]:
        out.append({**r, "user": "heavy"})
    while i < len(records):
        k = int(rng.integers(1, 5))
        out += [{**r, "user": f"p{u}"} for r in records[i:i + k]]
        u, i = u + 1, i + k
    return out


TRAIN = with_users(make_records(120, 1))
VALID = make_records(20, 2, "v")
USERS = len({r["user"] for r in TRAIN})
USER_CFG = finetune.TuneConfig(mode="lora", epsilon=4.0, batch_size=6, steps=3, microbatch_size=16, max_tokens=32,
                               checkpoint_every=2, lora_rank=2, learning_rate=1e-2, privacy_unit="user",
                               max_examples_per_user=4)
BANDMF_CFG = finetune.TuneConfig(mode="lora", epsilon=4.0, batch_size=12, steps=4, microbatch_size=16, max_tokens=32,
                                 checkpoint_every=2, lora_rank=2, learning_rate=1e-2, mechanism="bandmf", bands=2)


@pytest.fixture(autouse=True)
def _strategy_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DPSYNTH_CACHE_DIR", str(tmp_path / "cache"))


def test_user_level_run_reports_users(tiny_base, tmp_path):
    base_dir, _ = tiny_base
    out = str(tmp_path / "user")
    res = finetune.dp_tune(base_dir, TRAIN, VALID, out, USER_CFG, progress_interval=1e9)
    rep = report.load_report(out)
    assert res.steps == 3 and rep["private"] and rep["epsilon"]["rdp"] <= 4.0
    assert rep["privacy_unit"] == "user" and "one user" in rep["unit_of_privacy"] and "user" in rep["adjacency"]
    assert rep["delta"] == pytest.approx(1 / USERS) and res.delta == pytest.approx(1 / USERS)
    assert rep["training"]["dataset_size"] == USERS and rep["training"]["num_users"] == USERS
    assert rep["max_examples_per_user"] == 4 and rep["training"]["max_examples_per_user"] == 4
    counts = {}
    for r in TRAIN:
        counts[r["user"]] = counts.get(r["user"], 0) + 1
    dropped = sum(max(0, c - 4) for c in counts.values())
    bounding = [c for c in rep["side_channels"] if c["name"] == "contribution bounding"]
    assert bounding and f"{dropped} rows were dropped" in bounding[0]["detail"]
    assert all(e["unit"] == "user" and e["dataset_size"] == USERS for e in rep["ledger"]["entries"])
    assert "(users)" in open(os.path.join(out, "privacy_report.md")).read()


def test_missing_user_ids_fail_before_compute(tiny_base, tmp_path, monkeypatch, capsys):
    base_dir, _ = tiny_base
    from dpsynth.train import checkpoint

    no_users = [{k: v for k, v in r.items() if k != "user"} for r in TRAIN]
    monkeypatch.setattr(checkpoint, "load_model", lambda *a, **k: pytest.fail("model loaded before the check"))
    with pytest.raises(finetune.TuneError, match="no user id.*--user-column"):
        finetune.dp_tune(base_dir, no_users, VALID, str(tmp_path / "o"), USER_CFG)
    with pytest.raises(finetune.TuneError, match="max_examples_per_user"):
        dataclasses.replace(USER_CFG, max_examples_per_user=None)
    with pytest.raises(finetune.TuneError, match="bands"):
        dataclasses.replace(BANDMF_CFG, bands=None)
    # Through the CLI: a file without the user column is refused, naming the file.
    from trainers import dp_tune as cli

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in no_users))
    flags = ["--base", base_dir, "--train", str(data), "--out", str(tmp_path / "o"), "--privacy-unit", "user",
             "--max-examples-per-user", "4", "--batch-size", "6", "--steps", "3"]
    assert cli.main(flags + ["--user-column", "author"]) == 2
    err = capsys.readouterr().err
    assert str(data) in err and "author" in err
    assert cli.main(flags) == 2 and "--user-column" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "o")


@pytest.mark.slow  # three tuner runs (the core's BandMF resume through a checkpoint is in tests/dp/test_bandmf.py)
def test_bandmf_run_and_exact_resume(tiny_base, tmp_path):
    base_dir, _ = tiny_base
    records = [{k: v for k, v in r.items() if k != "user"} for r in TRAIN]
    out = str(tmp_path / "resumed")
    part = finetune.dp_tune(base_dir, records, VALID, out, BANDMF_CFG, stop_after=2, progress_interval=1e9)
    assert part.steps == 2
    seed = TrainCheckpointer(os.path.join(out, "checkpoints")).read_meta()["sampling_seed"]
    res = finetune.dp_tune(base_dir, records, VALID, out, BANDMF_CFG, resume=True, progress_interval=1e9)
    assert res.steps == 4
    out_full = str(tmp_path / "uninterrupted")
    finetune.dp_tune(base_dir, records, VALID, out_full, dataclasses.replace(BANDMF_CFG, seed=seed),
                     progress_interval=1e9)
    a, b = load_model(out), load_model(out_full)
    for x, y in zip(jax.tree.leaves(a.variables["lora"]), jax.tree.leaves(b.variables["lora"])):
        np.testing.assert_array_equal(x, y)
    rep = report.load_report(out)
    assert rep["mechanism"] == "bandmf" and rep["bands"] == 2 and len(rep["strategy_sha256"]) == 64
    assert rep["training"]["sampling"].startswith("cyclic Poisson")
    [entry] = rep["ledger"]["entries"]
    assert entry["mechanism"] == "bandmf" and entry["steps"] == 4 and entry["strategy_sha256"] == rep["strategy_sha256"]
    assert rep["epsilon"] == report.load_report(out_full)["epsilon"] and rep["epsilon"]["rdp"] <= 4.0
    assert "BandMF" in open(os.path.join(out, "privacy_report.md")).read()
