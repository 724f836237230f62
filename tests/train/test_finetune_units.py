"""The DP tuner at user level and with BandMF: reports, missing user column, exact resume; the
names `dpsynth.train.finetune` keeps for user code."""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest

from dpsynth.dp import report
from dpsynth.models.directory import load_model
from dpsynth.train import finetune, tune_config, tune_report, tune_resume
from dpsynth.train.checkpoint import TrainCheckpointer
from tests.train.conftest import make_records
from tests.dp.ledgers import same_epsilon, without_runs


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
USER_CFG = tune_config.TuneConfig(mode="lora", epsilon=4.0, batch_size=6, steps=3, microbatch_size=16, max_tokens=32,
                                  checkpoint_every=2, lora_rank=2, learning_rate=1e-2, privacy_unit="user",
                                  max_examples_per_user=4)
BANDMF_CFG = tune_config.TuneConfig(mode="lora", epsilon=4.0, batch_size=12, steps=4, microbatch_size=16, max_tokens=32,
                                    checkpoint_every=2, lora_rank=2, learning_rate=1e-2, mechanism="bandmf", bands=2)


@pytest.fixture(autouse=True)
def _strategy_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DPSYNTH_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def user_run(tiny_base, tmp_path_factory):
    """A user-level run on one device (seed 3): the report test's and the mesh test's reference."""
    base_dir, _ = tiny_base
    out = str(tmp_path_factory.mktemp("user") / "one")
    return finetune.dp_tune(base_dir, TRAIN, VALID, out, dataclasses.replace(USER_CFG, seed=3), progress_interval=1e9)


def test_user_level_run_reports_users(user_run):
    res, out = user_run, user_run.out_dir
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
    # The exact count is not released (one user with m > K rows moves it by m - K): the private state has it.
    assert bounding and str(dropped) not in bounding[0]["detail"] and "private state" in bounding[0]["detail"]
    with open(os.path.join(res.state_dir, tune_report.COUNTS_FILE)) as f:
        counts_kept = json.load(f)
    assert counts_kept["rows_dropped"] == dropped and counts_kept["rows_kept"] == len(TRAIN) - dropped
    assert counts_kept["dp"] is False and os.stat(os.path.join(res.state_dir, tune_report.COUNTS_FILE)).st_mode & 0o077 == 0
    released = "".join(open(os.path.join(out, f)).read() for f in ("privacy_report.json", "privacy_report.md"))
    assert "rows_dropped" not in released and f"{dropped} rows" not in released
    # The same leak, for the number of examples cut to max_tokens: named as a side channel, counted privately.
    [trunc] = [c for c in rep["side_channels"] if c["name"] == "truncation count"]
    assert not any(ch.isdigit() for ch in trunc["detail"].replace(str(USER_CFG.max_tokens), ""))
    assert counts_kept["truncated_train"] == res.truncated_train
    assert all(e["unit"] == "user" and e["dataset_size"] == USERS for e in rep["ledger"]["entries"])
    assert "(users)" in open(os.path.join(out, "privacy_report.md")).read()
    # D_train's record hashes (for `dpsynth select`'s disjointness check): owner-only private state, never in --out.
    from dpsynth.dp import disjoint

    kept = os.path.join(res.state_dir, disjoint.HASHES_FILE)
    assert os.stat(kept).st_mode & 0o077 == 0
    assert np.array_equal(disjoint.read_hashes(kept), np.sort(disjoint.record_hashes(TRAIN)))
    assert not any(disjoint.HASHES_FILE in files for _, _, files in os.walk(out))


def test_missing_user_ids_fail_before_compute(tiny_base, tmp_path, monkeypatch, capsys):
    base_dir, _ = tiny_base
    from dpsynth.models import directory as checkpoint  # where dp_tune loads the base model from

    no_users = [{k: v for k, v in r.items() if k != "user"} for r in TRAIN]
    monkeypatch.setattr(checkpoint, "load_model", lambda *a, **k: pytest.fail("model loaded before the check"))
    with pytest.raises(tune_config.TuneError, match="no user id.*--user-column"):
        finetune.dp_tune(base_dir, no_users, VALID, str(tmp_path / "o"), USER_CFG)
    with pytest.raises(tune_config.TuneError, match="max_examples_per_user"):
        dataclasses.replace(USER_CFG, max_examples_per_user=None)
    with pytest.raises(tune_config.TuneError, match="bands"):
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
    seed = TrainCheckpointer(os.path.join(tune_resume.default_state_dir(out), "checkpoints")).read_meta()["sampling_seed"]
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
    assert rep["epsilon"] == same_epsilon(report.load_report(out_full)) and rep["epsilon"]["rdp"] <= 4.0
    assert "BandMF" in open(os.path.join(out, "privacy_report.md")).read()


# ---------------------------------------------------------------------------------- on a device mesh


def _lora_diff(a_dir, b_dir):
    a, b = load_model(a_dir).variables["lora"], load_model(b_dir).variables["lora"]
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _same_run(one, on_mesh):
    """The properties a mesh must keep: losses (1e-5), trainable parameters (1e-4), ledger and report."""
    assert on_mesh.steps == one.steps
    assert abs(on_mesh.train_loss - one.train_loss) < 1e-5 and abs(on_mesh.valid_loss - one.valid_loss) < 1e-5
    assert on_mesh.epsilon == one.epsilon and on_mesh.noise_multiplier == one.noise_multiplier
    assert _lora_diff(one.out_dir, on_mesh.out_dir) < 1e-4
    ra, rb = report.load_report(one.out_dir), report.load_report(on_mesh.out_dir)
    assert without_runs(ra) == without_runs(rb)


@pytest.mark.slow  # make test-slow: ~31 s; the user-level run on one device stays
def test_user_level_on_a_mesh_equals_one_device(tiny_base, tmp_path, user_run):
    """User-level DP-SGD under an 8 x 1 mesh: the 4 users of a microbatch are padded with empty
    users to the data axis (8); each user is still clipped once and the noise added once."""
    base_dir, _ = tiny_base
    on_mesh = finetune.dp_tune(base_dir, TRAIN, VALID, str(tmp_path / "mesh"), dataclasses.replace(USER_CFG, seed=3),
                               mesh=(8, 1), progress_interval=1e9)
    _same_run(user_run, on_mesh)
    assert report.load_report(on_mesh.out_dir)["privacy_unit"] == "user"


@pytest.mark.slow  # make test-slow: ~63 s; BandMF on a mesh stays in tests/dp/test_bandmf.py::test_on_a_mesh_noise_state_and_resume_equal_one_device
def test_bandmf_on_a_mesh_equals_one_device(tiny_base, tmp_path):
    """BandMF under a 4 x 2 mesh (LoRA kernels split over `model`): the same correlated noise as on
    one device, so the same losses, parameters, ledger and report."""
    base_dir, _ = tiny_base
    records = [{k: v for k, v in r.items() if k != "user"} for r in TRAIN]
    cfg = dataclasses.replace(BANDMF_CFG, seed=3)
    one = finetune.dp_tune(base_dir, records, VALID, str(tmp_path / "one"), cfg, progress_interval=1e9)
    on_mesh = finetune.dp_tune(base_dir, records, VALID, str(tmp_path / "mesh"), cfg, mesh=(4, 2),
                               progress_interval=1e9)
    _same_run(one, on_mesh)
    assert report.load_report(on_mesh.out_dir)["mechanism"] == "bandmf"


def test_fsdp_on_a_mesh_equals_one_device_and_needs_a_data_axis(tiny_base, tmp_path):
    """Full DP fine-tuning with the parameters and optimizer state sharded over the data axis (FSDP,
    4 x 2): the same losses, parameters, ledger and report as one device; without a data axis to
    shard over it is refused before any compute."""
    base_dir, _ = tiny_base
    records = [{k: v for k, v in r.items() if k != "user"} for r in TRAIN]
    cfg = tune_config.TuneConfig(mode="full", epsilon=4.0, batch_size=12, steps=2, microbatch_size=8, max_tokens=32,
                                 learning_rate=1e-3, seed=3)
    one = finetune.dp_tune(base_dir, records, VALID, str(tmp_path / "one"), cfg, progress_interval=1e9)
    on_mesh = finetune.dp_tune(base_dir, records, VALID, str(tmp_path / "fsdp"), cfg, mesh=(4, 2), fsdp=True,
                               progress_interval=1e9)
    assert on_mesh.steps == one.steps and on_mesh.epsilon == one.epsilon
    assert abs(on_mesh.train_loss - one.train_loss) < 1e-5 and abs(on_mesh.valid_loss - one.valid_loss) < 1e-5
    a, b = load_model(one.out_dir).variables["params"], load_model(on_mesh.out_dir).variables["params"]
    assert max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in
               zip(jax.tree.leaves(a), jax.tree.leaves(b))) < 1e-4
    assert without_runs(report.load_report(one.out_dir)) == without_runs(report.load_report(on_mesh.out_dir))
    for mesh in (None, (1, 2)):
        with pytest.raises(tune_config.TuneError, match="fsdp shards the parameters over the mesh's data axis"):
            finetune.dp_tune(base_dir, records, VALID, str(tmp_path / "no"), cfg, mesh=mesh, fsdp=True)
    assert not os.path.exists(tmp_path / "no")


def _in_processes(n, base_dir, out, config, train, mesh, **kw):
    from tests import multiprocess

    results = multiprocess.run("tests.train.multihost_cases:finetune_case", num_processes=n, devices=8 // n,
                               kwargs=dict(base_dir=base_dir, out=out, modes=["lora"], config=config, train=train,
                                           valid=VALID, mesh=list(mesh), **kw), timeout=900, with_stderr=True)
    assert [(r["process"], r["processes"]) for r in results] == [(i, n) for i in range(n)]
    return [r["modes"]["lora"] for r in results]


@pytest.mark.slow  # three multi-process tuner runs
def test_two_processes_match_one_device_at_user_level_and_with_bandmf(tiny_base, tmp_path, user_run):
    """2 processes x 4 CPU devices: user-level DP-SGD (each process feeds 4 of the 8 padded users
    of a microbatch) equals one device; BandMF stopped at step 2 and resumed in 2 processes (its
    noise state restored from the multi-host checkpoint) equals an uninterrupted run on one device."""
    from dpsynth.dp import bandmf

    base_dir, _ = tiny_base
    fields = ("epsilon", "batch_size", "steps", "microbatch_size", "max_tokens", "checkpoint_every", "lora_rank",
              "learning_rate")
    user_cfg = {**{f: getattr(USER_CFG, f) for f in fields}, "privacy_unit": "user", "max_examples_per_user": 4,
                "seed": 3}
    two = _in_processes(2, base_dir, str(tmp_path / "user"), user_cfg, TRAIN, (8, 1))
    for r in two:
        assert r["steps"] == 3 and r["epsilon"] == user_run.epsilon
        assert abs(r["train_loss"] - user_run.train_loss) < 1e-5 and abs(r["valid_loss"] - user_run.valid_loss) < 1e-5
    assert two[0]["report_writes"] > 0 and two[1]["report_writes"] == 0
    out = str(tmp_path / "user" / "lora")
    assert _lora_diff(user_run.out_dir, out) < 1e-4
    assert report.load_report(user_run.out_dir) == report.load_report(out)

    records = [{k: v for k, v in r.items() if k != "user"} for r in TRAIN]
    bandmf.optimized_coefs(BANDMF_CFG.steps, BANDMF_CFG.bands)  # cached before the processes start
    one = finetune.dp_tune(base_dir, records, VALID, str(tmp_path / "one"), dataclasses.replace(BANDMF_CFG, seed=3),
                           progress_interval=1e9)
    band_cfg = {**{f: getattr(BANDMF_CFG, f) for f in fields}, "mechanism": "bandmf", "bands": 2, "seed": 3}
    part = _in_processes(2, base_dir, str(tmp_path / "band"), band_cfg, records, (4, 2), stop_after=2)
    assert [r["steps"] for r in part] == [2, 2]
    rest = _in_processes(2, base_dir, str(tmp_path / "band"), band_cfg, records, (4, 2), resume=True)
    for r in rest:  # (the resumed run's train loss covers steps 2..4 only)
        assert r["steps"] == 4 and abs(r["valid_loss"] - one.valid_loss) < 1e-5 and r["epsilon"] == one.epsilon
    out = str(tmp_path / "band" / "lora")
    assert _lora_diff(one.out_dir, out) < 1e-4
    assert report.load_report(one.out_dir) == report.load_report(out)


def _other_strategy_cache(directory, steps, bands):
    """A valid cache entry for (steps, bands) holding another strategy than the optimiser's (another cache,
    or another jax-privacy version, at resume time)."""
    from dpsynth import fileio
    from dpsynth.dp import bandmf

    coefs = np.linspace(1.0, 0.5, bands)
    coefs = (coefs / np.linalg.norm(coefs)).tolist()
    os.makedirs(os.path.join(directory, "bandmf"))
    fileio.write_json(os.path.join(directory, "bandmf", f"toeplitz_n{steps}_b{bands}.json"), {
        "format": bandmf.CACHE_FORMAT, "steps": steps, "bands": bands, "coefs": coefs,
        "sha256": bandmf.strategy_sha256(steps, bands, coefs)})
    return bandmf.strategy_sha256(steps, bands, coefs)


@pytest.mark.slow  # make test-slow: ~29 s
def test_bandmf_resume_with_another_strategy_is_refused_and_epochs_are_steps_b_over_n(tiny_base, tmp_path,
                                                                                      monkeypatch):
    """Issue 23, findings 5 and 6: a resume whose BandMF strategy differs from the checkpoint's is refused
    before the model is loaded (the noise so far came from the checkpoint's C^-1); the report's epochs are
    steps x B / N, not steps x q (q = B / floor(N / b) is b times larger)."""
    from dpsynth.models import directory as checkpoint  # where dp_tune loads the base model from

    base_dir, _ = tiny_base
    records = [{k: v for k, v in r.items() if k != "user"} for r in TRAIN]
    out = str(tmp_path / "out")
    part = finetune.dp_tune(base_dir, records, VALID, out, BANDMF_CFG, stop_after=2, progress_interval=1e9)
    rep = report.load_report(out)
    n, b = len(records), BANDMF_CFG.bands
    assert part.steps == 2 and rep["training"]["sampling_probability"] == pytest.approx(12 / (n // b))
    assert rep["training"]["epochs"] == pytest.approx(2 * 12 / n)  # was 2 x q = 0.4 (b times too high)
    recorded = rep["strategy_sha256"]
    other = tmp_path / "other_cache"
    sha = _other_strategy_cache(str(other), BANDMF_CFG.steps, b)
    assert sha != recorded
    monkeypatch.setenv("DPSYNTH_CACHE_DIR", str(other))
    real_load = checkpoint.load_model
    monkeypatch.setattr(checkpoint, "load_model", lambda *a, **k: pytest.fail("the model was loaded before the check"))
    with pytest.raises(tune_config.TuneError) as e:
        finetune.dp_tune(base_dir, records, VALID, out, BANDMF_CFG, resume=True, progress_interval=1e9)
    assert f"strategy_sha256: checkpoint {recorded!r}, this run {sha!r}" in str(e.value)
    assert "refusing to resume" in str(e.value)
    monkeypatch.setattr(checkpoint, "load_model", real_load)
    monkeypatch.setenv("DPSYNTH_CACHE_DIR", str(tmp_path / "cache"))  # the run's own cache: resumes
    res = finetune.dp_tune(base_dir, records, VALID, out, BANDMF_CFG, resume=True, progress_interval=1e9)
    rep = report.load_report(out)
    assert res.steps == 4 and rep["strategy_sha256"] == recorded
    assert rep["training"]["epochs"] == pytest.approx(4 * 12 / n)



def test_a_mechanism_registered_outside_the_library_runs_in_the_tuner(tiny_base, tmp_path):
    """Locality of the mechanism registry: full-batch DP-GD, defined in tests only, is planned, run,
    accounted and reported by `dp_tune` with no change to the library."""
    from dpsynth.dp import mechanisms
    from tests.dp.mechanism_fakes import FullBatchDPGD

    base_dir, _ = tiny_base
    train = [{k: v for k, v in r.items() if k != "user"} for r in TRAIN]
    with mechanisms.registered(FullBatchDPGD()):
        cfg = tune_config.TuneConfig(mode="lora", epsilon=4.0, batch_size=len(train), steps=2, microbatch_size=64,
                                     max_tokens=32, lora_rank=2, learning_rate=1e-2, mechanism="dpgd", seed=1)
        res = finetune.dp_tune(base_dir, train, VALID, str(tmp_path / "m"), cfg, progress_interval=1e9)
        plan = tune_config.plan_run(cfg, len(train))
        rep = report.load_report(res.out_dir)  # its ledger is read through the registry
    assert res.steps == 2 and rep["mechanism"] == "dpgd" and rep["training"]["mechanism"] == "dpgd"
    assert [(e["mechanism"], e["steps"], e["sampling_probability"]) for e in rep["ledger"]["entries"]] == [("dpgd", 2, 1.0)]
    assert res.noise_multiplier == plan.noise_multiplier > 0 and rep["epsilon"]["rdp"] <= 4.0 * (1 + 1e-6)
    with open(os.path.join(res.out_dir, "privacy_report.md"), encoding="utf-8") as f:
        assert "2 full-batch DP-GD steps, q = 1" in f.read()


def test_finetune_keeps_the_public_entry_points_of_its_split_modules():
    """User code imports the tuner's entry points from `dpsynth.train.finetune`: the split (issue 36) keeps
    them there (`__all__` names just these), the same objects as in their new home."""
    assert finetune.TuneConfig is tune_config.TuneConfig and finetune.TuneError is tune_config.TuneError
    assert finetune.plan_run is tune_config.plan_run
    assert set(finetune.__all__) == {"TuneConfig", "TuneError", "TuneResult", "dp_tune", "plan_run"}
