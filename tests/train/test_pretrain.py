import dataclasses
import json
import os
import shutil

import jax
import numpy as np
import pytest

from dpsynth.data import token_shards
from dpsynth.data.tokenizer_training import train_tokenizer
from dpsynth.data.tokenizers import EOS_ID
from dpsynth.models import directory
from dpsynth.train import pretrain

SMALL = dict(preset="tiny", model_overrides={"num_layers": 1, "d_ff": 64}, seq_len=32, batch_size=4, steps=6,
             eval_every=3, checkpoint_every=2, log_every=2, eval_batches=2, tensorboard=False, progress_interval=1e9)


def test_packing_keeps_documents_apart():
    docs = [np.arange(10, 10 + n, dtype=np.int32) for n in (5, 40, 3, 70)]
    ids = [f"d{i}" for i in range(4)]
    train, valid = pretrain.pack_documents(docs, ids, seq_len=16, valid_fraction=0.0)
    assert valid.num_rows == 0
    total = sum(len(d) + 2 for d in docs)
    assert train.num_rows == (total - 1) // 16
    # A target is trained on iff it continues the same document as its input.
    seg = train.segment_ids.reshape(-1)
    np.testing.assert_array_equal(train.weights.reshape(-1)[:-1].astype(bool), seg[:-1] == seg[1:])
    flat_in, flat_w = train.inputs.reshape(-1), train.weights.reshape(-1)
    # EOS is never followed by a trained target (the next document's BOS).
    assert not np.any(flat_w[flat_in == EOS_ID])
    np.testing.assert_array_equal(train.targets.reshape(-1)[:-1], flat_in[1:])


def test_hold_out_is_deterministic_and_disjoint():
    rng = np.random.default_rng(0)
    docs = [rng.integers(4, 50, int(rng.integers(5, 60))).astype(np.int32) for _ in range(200)]
    ids = [f"doc{i}" for i in range(200)]
    t1, v1 = pretrain.pack_documents(docs, ids, 16, 0.1)
    t2, v2 = pretrain.pack_documents(docs, ids, 16, 0.1)
    np.testing.assert_array_equal(v1.inputs, v2.inputs)
    assert 0 < v1.num_rows < 0.3 * t1.num_rows
    held = {(i, b) for i in ids for b in range(8) if pretrain._held_out(i, b, 0.1)}
    assert 0.05 < len(held) / (200 * 8) < 0.15


def test_document_hold_out_and_valid_groups():
    rng = np.random.default_rng(1)
    docs = [rng.integers(4, 50, int(rng.integers(20, 60))).astype(np.int32) for _ in range(300)]
    ids = [("hotels/" if i % 2 else "enwiki:") + str(i) for i in range(300)]
    train, valid, groups = pretrain.pack_documents(docs, ids, 16, 0.2, "document", ("hotels/", "enwiki:"))
    held = [i for i in ids if pretrain._held_out(i, 0, 0.2, "document")]
    assert 30 < len(held) < 100
    # every block of a held-out document is held out: its tokens are all in valid, none in train
    n_held_tokens = sum(len(d) + 2 for d, i in zip(docs, ids) if i in held)
    assert abs(valid.num_rows * 16 - n_held_tokens) <= 16
    assert groups["hotels/"].num_rows + groups["enwiki:"].num_rows >= valid.num_rows - 1
    hotel_tokens = sum(len(d) + 2 for d, i in zip(docs, ids) if i in held and i.startswith("hotels/"))
    assert abs(groups["hotels/"].num_rows * 16 - hotel_tokens) <= 16
    with pytest.raises(pretrain.PretrainError, match="valid_unit"):
        pretrain.PretrainConfig(valid_unit="row")
    with pytest.raises(pretrain.PretrainError, match="valid_groups"):
        pretrain.PretrainConfig(valid_groups="hotels/")


def test_batch_indices_are_epoch_permutations():
    idx = pretrain.batch_indices(10, 0, 25, seed=1)
    assert sorted(idx[:10]) == list(range(10)) and sorted(idx[10:20]) == list(range(10))
    np.testing.assert_array_equal(pretrain.batch_indices(10, 7, 5, seed=1), idx[7:12])


def test_pretrain_learns_and_resume_is_exact(tiny_corpus, tmp_path):
    corpus, tok_path, _ = tiny_corpus
    cfg = pretrain.PretrainConfig(**SMALL, eval_at_start=True)
    full = pretrain.run_pretrain(corpus, tok_path, str(tmp_path / "full"),
                                 pretrain.PretrainConfig(**{**SMALL, "tensorboard": True}, eval_at_start=True))
    assert full["finished"] and full["valid"]["perplexity"] < full["initial_valid"]["perplexity"]
    grouped = pretrain.run_pretrain(corpus, tok_path, str(tmp_path / "grouped"), pretrain.PretrainConfig(
        **{**SMALL, "steps": 2, "valid_fraction": 0.3}, valid_unit="document", valid_groups=("doc-",)))
    assert grouped["valid_groups"]["doc-"]["perplexity"] > 1 and grouped["valid_groups"]["doc-"]["rows"] > 0
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(tmp_path / "full" / "tb"))
    lines = [json.loads(x) for x in open(tmp_path / "full" / "metrics.jsonl")]
    assert {x["split"] for x in lines} == {"train", "valid"}
    # Killed after step 3 (checkpoint at step 2 + the stop), then resumed to the end.
    part = str(tmp_path / "part")
    first = pretrain.run_pretrain(corpus, tok_path, part, cfg, stop_after=3)
    assert not first["finished"] and not os.path.exists(os.path.join(part, "manifest.json"))
    with pytest.raises(pretrain.PretrainError, match="--resume"):
        pretrain.run_pretrain(corpus, tok_path, part, cfg)
    pretrain.run_pretrain(corpus, tok_path, part, cfg, resume=True)
    a, b = directory.load_model(str(tmp_path / "full")), directory.load_model(part)
    for x, y in zip(jax.tree.leaves(a.variables), jax.tree.leaves(b.variables)):
        np.testing.assert_array_equal(x, y)
    assert a.manifest["steps"] == 6 and a.config.preset == "tiny"
    # A default run records no microbatch of its own (its manifest and checkpoint metadata are as before).
    assert "microbatch_size" not in a.manifest and "microbatch_size" not in full
    assert set(_checkpoint_meta(part)) == DEFAULT_META_KEYS
    # Resuming with another preset / other flags is refused with a clear message.
    with pytest.raises(directory.CheckpointError, match="preset"):
        pretrain.run_pretrain(corpus, tok_path, part, pretrain.PretrainConfig(
            **{**SMALL, "model_overrides": {"num_layers": 2, "d_ff": 64}}), resume=True)
    with pytest.raises(directory.CheckpointError, match="seq_len"):
        pretrain.run_pretrain(corpus, tok_path, part, pretrain.PretrainConfig(**{**SMALL, "seq_len": 16}),
                              resume=True)


@pytest.mark.slow  # make test-slow: ~33 s; FSDP on a mesh stays in test_finetune_units.py
def test_fsdp_on_a_mesh_equals_one_device_and_resumes(tiny_corpus, tmp_path):
    """Parameters and optimizer state sharded over the data axis (FSDP, 4 x 2): the same losses, validation
    perplexity and parameters as one device; its sharded checkpoint resumes to the same model; the layout
    really splits the parameters over `data`; without a data axis it is refused."""
    from dpsynth.data.tokenizers import Tokenizer
    from dpsynth.train import sharding

    corpus, tok_path, _ = tiny_corpus
    base = {**SMALL, "batch_size": 8, "steps": 4, "log_every": 1, "checkpoint_every": 2}
    one = pretrain.run_pretrain(corpus, tok_path, str(tmp_path / "one"), pretrain.PretrainConfig(**base))
    cfg = pretrain.PretrainConfig(**base, mesh_data=4, mesh_model=2, fsdp=True)
    fsdp = pretrain.run_pretrain(corpus, tok_path, str(tmp_path / "fsdp"), cfg)
    assert fsdp["valid"]["perplexity"] == pytest.approx(one["valid"]["perplexity"], rel=1e-5)
    ref, got = _losses(str(tmp_path / "one")), _losses(str(tmp_path / "fsdp"))
    assert {2, 3, 4} <= set(ref) & set(got)  # (a window holding only the compilation logs no loss)
    assert all(abs(got[k] - ref[k]) < 1e-5 for k in set(ref) & set(got))
    fsdp_vars = directory.load_model(str(tmp_path / "fsdp")).variables
    assert _max_diff(fsdp_vars, directory.load_model(str(tmp_path / "one")).variables) < 1e-4
    # Killed after step 2 (a sharded checkpoint), resumed: the uninterrupted FSDP run's model.
    part = str(tmp_path / "part")
    pretrain.run_pretrain(corpus, tok_path, part, cfg, stop_after=2)
    pretrain.run_pretrain(corpus, tok_path, part, cfg, resume=True)
    assert _max_diff(directory.load_model(part).variables, fsdp_vars) < 1e-6
    # The layout: with fsdp some parameter is split over the data axis; without it none is.
    model_config = cfg.model_config(Tokenizer.load(tok_path).vocab_size)
    mesh = sharding.make_mesh(4, 2)

    def data_sharded(c):
        state = pretrain.make_training(c, model_config, mesh)[2]
        return [x.sharding.spec for x in jax.tree.leaves(state.params) if "data" in str(x.sharding.spec)]

    assert data_sharded(cfg) and not data_sharded(dataclasses.replace(cfg, fsdp=False))
    with pytest.raises(pretrain.PretrainError, match="fsdp shards the parameters over the mesh's data axis"):
        pretrain.PretrainConfig(**base, mesh_model=2, fsdp=True)


def test_bad_input_errors(tiny_corpus, tmp_path):
    corpus, tok_path, tok = tiny_corpus
    cfg = pretrain.PretrainConfig(**SMALL)
    out = str(tmp_path / "out")
    with pytest.raises(pretrain.PretrainError, match="max_len"):
        pretrain.run_pretrain(corpus, tok_path, out, pretrain.PretrainConfig(**{**SMALL, "seq_len": 4096}))
    other_tok = train_tokenizer(["completely different words here"] * 20, vocab_size=280)
    other_path = str(tmp_path / "other.model")
    other_tok.save(other_path)
    with pytest.raises(pretrain.PretrainError, match="tokenized with tokenizer"):
        pretrain.run_pretrain(corpus, other_path, out, cfg)
    broken = str(tmp_path / "broken")
    shutil.copytree(corpus, broken)
    with open(os.path.join(broken, "shard-00001.tokens"), "r+b") as f:
        f.write(b"\xff\xff")
    with pytest.raises(token_shards.FormatError, match="shard-00001.tokens.*SHA-256"):
        pretrain.run_pretrain(broken, tok_path, out, cfg)
    os.remove(os.path.join(broken, "shard-00000.offsets"))
    with pytest.raises(token_shards.FormatError, match="shard-00000.offsets.*missing"):
        pretrain.run_pretrain(broken, tok_path, out, cfg)
    manifest = json.load(open(os.path.join(broken, "manifest.json")))
    manifest["format_version"] = 7
    json.dump(manifest, open(os.path.join(broken, "manifest.json"), "w"))
    with pytest.raises(token_shards.FormatError, match="format_version 7"):
        pretrain.run_pretrain(broken, tok_path, out, cfg)
    with pytest.raises(pretrain.PretrainError, match="batch_size"):
        pretrain.PretrainConfig(**{**SMALL, "batch_size": 3, "mesh_data": 2})
    with pytest.raises(pretrain.PretrainError, match="fewer than --batch-size"):
        pretrain.run_pretrain(corpus, tok_path, out, pretrain.PretrainConfig(**{**SMALL, "batch_size": 4096}))


def test_cli_runs_and_reports_errors(tiny_corpus, tmp_path, capsys):
    from trainers import pretrain as cli

    corpus, tok_path, _ = tiny_corpus
    rc = cli.main(["--corpus", corpus, "--tokenizer", tok_path, "--out", str(tmp_path / "o"), "--seq-len", "9999"])
    assert rc == 2 and "max_len" in capsys.readouterr().err
    rc = cli.main(["--corpus", corpus, "--tokenizer", tok_path, "--out", str(tmp_path / "o"), "--num-processes", "2"])
    assert rc == 2 and "need --distributed" in capsys.readouterr().err
    rc = cli.main(["--corpus", corpus, "--tokenizer", tok_path, "--out", str(tmp_path / "o"), "--distributed",
                   "--process-id", "1"])
    assert rc == 2 and "all of --coordinator-address, --num-processes and --process-id" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--corpus", corpus, "--tokenizer", tok_path, "--out", str(tmp_path / "g"), "--valid-unit", "page"])


def test_cli_valid_unit_and_groups_reach_the_config(tiny_corpus, tmp_path, capsys):
    from trainers import pretrain as cli

    corpus, tok_path, _ = tiny_corpus
    rc = cli.main(["--corpus", corpus, "--tokenizer", tok_path, "--out", str(tmp_path / "o"), "--preset", "tiny",
                   "--set", "num_layers=1", "--set", "d_ff=64", "--seq-len", "32", "--batch-size", "4", "--steps", "2",
                   "--valid-fraction", "0.3", "--valid-unit", "document", "--valid-group", "doc-", "--no-tensorboard"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["valid_groups"]["doc-"]["rows"] > 0
    assert "microbatch_size" not in out
    # A run recorded by a dpsynth without --microbatch-size (its record lacks the flag) is this run: the rerun
    # continues (dpsynth.outdir: flags added since count only when set).
    from dpsynth import outdir

    path = tmp_path / "o" / "dpsynth_run.json"
    record = json.load(open(path))
    assert "microbatch_size" in record["config"] and not {"memory_limit", "memory_headroom"} & set(record["config"])
    older = {k: v for k, v in record["config"].items() if k != "microbatch_size"}
    path.write_text(json.dumps({**record, "config": older, "config_sha256": outdir._digest(older)}))
    argv_o = ["--corpus", corpus, "--tokenizer", tok_path, "--out", str(tmp_path / "o"), "--preset", "tiny", "--set",
              "num_layers=1", "--set", "d_ff=64", "--seq-len", "32", "--batch-size", "4", "--steps", "2",
              "--valid-fraction", "0.3", "--valid-unit", "document", "--valid-group", "doc-", "--no-tensorboard"]
    assert cli.main([*argv_o, "--resume"]) == 0  # (the run is finished: the resume has nothing to do)
    capsys.readouterr()
    assert cli.main([*argv_o, "--microbatch-size", "2"]) == 2
    assert "differs in --microbatch-size" in capsys.readouterr().err


# The checkpoint metadata of a run with the default settings (before --microbatch-size existed, and now).
DEFAULT_META_KEYS = {"preset", "model_config", "seq_len", "batch_size", "grad_accum", "seed", "valid_fraction",
                     "valid_unit", "optimizer", "steps", "rows_consumed", "corpus_manifest_sha256", "tokenizer_sha256"}


def _checkpoint_meta(out: str) -> dict:
    from dpsynth.train.checkpoint import TrainCheckpointer

    ckpt = TrainCheckpointer(os.path.join(out, "checkpoints"))
    try:
        return ckpt.read_meta()
    finally:
        ckpt.close()


def _losses(out: str) -> dict[int, float]:
    return {x["step"]: x["loss"] for x in map(json.loads, open(os.path.join(out, "metrics.jsonl")))
            if x["split"] == "train"}


def _max_diff(a: dict, b: dict) -> float:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(jax.tree.leaves(a),
                                                                                     jax.tree.leaves(b)))


@pytest.mark.slow
def test_two_processes_match_one_and_resume_across_processes(tiny_corpus, tmp_path):
    """2 processes x 4 CPU devices == 1 process x 8 devices (losses 1e-5, parameters 1e-4);
    a checkpoint written by 2 processes resumes in 2 processes and in 1."""
    from tests import multiprocess

    corpus, tok_path, _ = tiny_corpus
    cfg = {**SMALL, "batch_size": 8, "steps": 4, "log_every": 1, "checkpoint_every": 2, "mesh_data": 8}

    def launch(n, out, **kw):
        results = multiprocess.run("tests.train.multihost_cases:pretrain_case", num_processes=n, devices=8 // n,
                                   kwargs=dict(corpus=corpus, tokenizer=tok_path, out=str(tmp_path / out),
                                               config=cfg, **kw), timeout=600)
        assert [r["process"] for r in results] == list(range(n))
        assert all(r["processes"] == n and r["devices"] == 8 for r in results)
        return results[0]["summary"]

    ref = launch(1, "one")
    # The same run through `dpsynth pretrain --distributed --coordinator-address ... --process-id I`.
    argv = ["--corpus", corpus, "--tokenizer", tok_path, "--out", str(tmp_path / "two"), "--preset", "tiny",
            "--set", "num_layers=1", "--set", "d_ff=64", "--seq-len", "32", "--batch-size", "8", "--steps", "4",
            "--eval-every", "3", "--eval-batches", "2", "--checkpoint-every", "2", "--log-every", "1",
            "--mesh-data", "8", "--no-tensorboard"]
    cli = multiprocess.run("tests.train.multihost_cases:pretrain_cli_case", num_processes=2, devices=4,
                           kwargs={"argv": argv}, timeout=600, initialize=False)
    assert [(r["rc"], r["process"], r["processes"], r["devices"]) for r in cli] == [(0, 0, 2, 8), (0, 1, 2, 8)]
    two = directory.load_model(str(tmp_path / "two"))
    assert two.manifest["valid_perplexity"] == pytest.approx(ref["valid"]["perplexity"], rel=1e-5)
    ref_losses, two_losses = _losses(str(tmp_path / "one")), _losses(str(tmp_path / "two"))
    assert sorted(two_losses) == sorted(ref_losses) == [2, 3, 4]  # step 1's window holds the compilation
    for step, loss in ref_losses.items():
        assert abs(two_losses[step] - loss) < 1e-5
    ref_vars = directory.load_model(str(tmp_path / "one")).variables
    assert _max_diff(two.variables, ref_vars) < 1e-4
    # Killed at step 2 in 2 processes; resumed in 2 processes, and (a copy) in 1 process x 8 devices.
    first = launch(2, "part", stop_after=2)
    assert not first["finished"] and first["step"] == 2
    shutil.copytree(tmp_path / "part", tmp_path / "part1")
    resumed = launch(2, "part", resume=True)
    assert resumed["finished"] and resumed["step"] == 4
    assert abs(_losses(str(tmp_path / "part"))[4] - ref_losses[4]) < 1e-5
    assert _max_diff(directory.load_model(str(tmp_path / "part")).variables, ref_vars) < 1e-4
    launch(1, "part1", resume=True)
    assert _max_diff(directory.load_model(str(tmp_path / "part1")).variables, ref_vars) < 1e-4


def test_cli_flags_are_bound_from_pretrain_config():
    """`dpsynth pretrain` binds PretrainConfig (one declaration per setting); its flags are as before."""
    from dpsynth import binding
    from trainers import pretrain as cli

    p = cli.build_parser()
    options = {s for a in p._actions for s in a.option_strings}
    assert options == {"-h", "--help", "--corpus", "--tokenizer", "--out", "--preset", "--set", "--seq-len",
                       "--batch-size", "--grad-accum", "--microbatch-size", "--memory-limit", "--memory-headroom",
                       "--steps", "--optimizer", "--learning-rate", "--warmup-steps",
                       "--weight-decay", "--z-loss", "--valid-fraction", "--valid-unit", "--valid-group",
                       "--eval-every", "--eval-batches", "--checkpoint-every", "--log-every", "--seed", "--mesh-data",
                       "--mesh-model", "--fsdp", "--peak-tflops", "--no-tensorboard", "--resume", "--stop-after",
                       "--distributed", "--coordinator-address", "--num-processes", "--process-id", "--verbose"}
    names = [f.name for f in dataclasses.fields(pretrain.PretrainConfig) if f.name not in cli._NOT_FLAGS]
    req = ["--corpus", "c", "--tokenizer", "t", "--out", "o"]
    assert binding.from_args(pretrain.PretrainConfig, p.parse_args(req), names) == pretrain.PretrainConfig()
    got = binding.from_args(pretrain.PretrainConfig, p.parse_args(req + [
        "--set", "d_model=128", "--set", "name=x", "--set", "d_model=64", "--valid-group", "h/", "--valid-group", "e:",
        "--no-tensorboard", "--preset", "small", "--learning-rate", "0.01", "--seq-len", "64",
        "--microbatch-size", "auto", "--memory-limit", "2GiB", "--memory-headroom", "0.2"]), names)
    assert got == pretrain.PretrainConfig(model_overrides={"d_model": 64, "name": "x"}, valid_groups=("h/", "e:"),
                                          tensorboard=False, preset="small", learning_rate=0.01, seq_len=64,
                                          microbatch_size="auto", memory_limit=2 * 2**30, memory_headroom=0.2)
    assert binding.from_args(pretrain.PretrainConfig, p.parse_args(req + ["--microbatch-size", "4"]),
                             names).microbatch_size == 4
    for bad in (["--microbatch-size", "four"], ["--memory-limit", "lots"]):
        with pytest.raises(SystemExit):
            p.parse_args(req + bad)


# ---------------------------------------------------------------- --microbatch-size N|auto

# A step of 8 rows (2 x 4): microbatches 1, 2, 4 (accumulate + apply) or 8 (the fused step).
MICRO = {**SMALL, "grad_accum": 2, "steps": 2, "log_every": 1}


def test_microbatch_setting_is_validated():
    cfg = pretrain.PretrainConfig(**MICRO)
    assert cfg.step_rows == 8 and cfg.microbatch == 4 and pretrain.microbatch_candidates(cfg) == [1, 2, 4, 8]
    assert pretrain.PretrainConfig(**MICRO, microbatch_size=8).microbatch == 8
    assert pretrain.microbatch_candidates(pretrain.PretrainConfig(**{**MICRO, "batch_size": 6}, mesh_data=2)) == [
        2, 4, 6, 12]
    for bad, match in ((3, "must divide"), (0, "positive integer"), ("big", "positive integer"), (True, "positive")):
        with pytest.raises(pretrain.PretrainError, match=match):
            pretrain.PretrainConfig(**MICRO, microbatch_size=bad)
    with pytest.raises(pretrain.PretrainError, match="multiple of the mesh data axis 2"):
        pretrain.PretrainConfig(**MICRO, microbatch_size=1, mesh_data=2)
    with pytest.raises(pretrain.PretrainError, match="memory_headroom"):
        pretrain.PretrainConfig(**MICRO, microbatch_size="auto", memory_headroom=1.0)
    with pytest.raises(pretrain.PretrainError, match="resolved"):
        pretrain.PretrainConfig(**MICRO, microbatch_size="auto").microbatch
    # Resuming: another microbatch than the checkpoint's is refused; auto keeps the checkpoint's.
    meta = {"preset": "tiny", "model_config": {}, "seq_len": 32, "batch_size": 4, "grad_accum": 2, "seed": 0,
            "valid_fraction": 0.02, "valid_unit": "block", "optimizer": "adam", "steps": 2,
            "corpus_manifest_sha256": "c", "tokenizer_sha256": "t"}
    pretrain._check_resume_meta(meta, {**meta, "microbatch_size": 4}, "ckpt")  # a default run's checkpoint: 4 rows
    pretrain._check_resume_meta({**meta, "microbatch_size": 2}, {**meta, "microbatch_size": "auto"}, "ckpt")
    with pytest.raises(directory.CheckpointError, match="microbatch_size=2 but this run has 4"):
        pretrain._check_resume_meta({**meta, "microbatch_size": 2}, meta, "ckpt")
    resolved = pretrain.resolve_microbatch(pretrain.PretrainConfig(**MICRO, microbatch_size="auto"), None,
                                           resumed={**meta, "microbatch_size": 2})
    assert resolved.microbatch_size == 2


def test_auto_microbatch_needs_a_memory_limit_where_the_backend_says_none_and_refuses_when_none_fits(
        tiny_corpus, tmp_path, capsys, monkeypatch):
    from dpsynth.train import resources
    from trainers import pretrain as cli

    monkeypatch.setattr(resources, "device_memory_limit", lambda device=None: None)  # a backend that does not say

    corpus, tok_path, _ = tiny_corpus
    argv = ["--corpus", corpus, "--tokenizer", tok_path, "--preset", "tiny", "--set", "num_layers=1", "--set",
            "d_ff=64", "--seq-len", "32", "--batch-size", "4", "--grad-accum", "2", "--steps", "2", "--no-tensorboard",
            "--microbatch-size", "auto"]
    rc = cli.main(argv + ["--out", str(tmp_path / "cpu")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "--memory-limit" in err and "does not report its memory" in err and "\n" not in err
    rc = cli.main(argv + ["--out", str(tmp_path / "none"), "--memory-limit", "100KB"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "no microbatch fits: microbatch 1 needs" in err[0] and "--seq-len" in err[0]
    assert not os.path.exists(tmp_path / "none") and not os.path.exists(tmp_path / "cpu")  # refused before training


@pytest.mark.slow  # ~6 step compilations (~25 s on 2 loaded cores)
def test_auto_microbatch_is_the_largest_that_fits(tiny_corpus):
    _, _, tok = tiny_corpus
    cfg = pretrain.PretrainConfig(**MICRO, microbatch_size="auto")
    model_config = cfg.model_config(tok.vocab_size)
    costs = pretrain.compile_steps(cfg, model_config, microbatch=4)
    assert set(costs) == {"accumulate", "apply"}
    assert set(pretrain.compile_steps(cfg, model_config, microbatch=8)) == {"train"}  # one microbatch: the fused step
    limit = max(c.total_bytes for c in costs.values())  # microbatch 4 fits exactly
    choice = pretrain.auto_microbatch(cfg, model_config, limit_bytes=limit, headroom=0.0)
    tried = dict(choice.tried)
    assert choice.microbatch == 4 and choice.peak_bytes == limit == choice.budget_bytes
    assert tried[8] > choice.budget_bytes  # the next larger candidate was compiled and does not fit
    assert all(b <= limit for m, b in tried.items() if m <= 4)
    # The headroom is taken off the limit: half of twice that peak is the same budget.
    halved = pretrain.auto_microbatch(cfg, model_config, limit_bytes=2 * limit, headroom=0.5)
    assert halved.microbatch == 4 and halved.budget_bytes == limit
    with pytest.raises(Exception, match="no microbatch fits") as e:
        pretrain.auto_microbatch(cfg, model_config, limit_bytes=tried[1] - 1, headroom=0.0)
    assert "\n" not in str(e.value)


@pytest.mark.slow  # four short runs and a search (~60 s)
def test_cli_microbatch_auto_runs_logs_records_and_resumes(tiny_corpus, tmp_path, capsys):
    from trainers import pretrain as cli

    corpus, tok_path, tok = tiny_corpus
    cfg = pretrain.PretrainConfig(**MICRO)
    costs = pretrain.compile_steps(cfg, cfg.model_config(tok.vocab_size), microbatch=4)
    limit = max(c.total_bytes for c in costs.values())
    argv = ["--corpus", corpus, "--tokenizer", tok_path, "--preset", "tiny", "--set", "num_layers=1", "--set",
            "d_ff=64", "--seq-len", "32", "--batch-size", "4", "--grad-accum", "2", "--steps", "2", "--log-every", "1",
            "--checkpoint-every", "1", "--no-tensorboard"]
    auto = argv + ["--microbatch-size", "auto", "--memory-limit", str(limit), "--memory-headroom", "0"]
    # Killed after step 1, resumed with another memory limit: the checkpoint's microbatch is kept.
    assert cli.main(auto + ["--out", str(tmp_path / "auto"), "--stop-after", "1"]) == 0
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("microbatch auto:"))
    assert "microbatch 4:" in line and "8: " in line and "2 microbatch(es) per step of 8 rows" in line
    assert _checkpoint_meta(str(tmp_path / "auto"))["microbatch_size"] == 4
    resumed = auto[:-4] + ["--memory-limit", "1GiB", "--memory-headroom", "0.5"]
    assert cli.main(resumed + ["--out", str(tmp_path / "auto"), "--resume"]) == 0
    captured = capsys.readouterr()
    assert "microbatch auto: microbatch 4, the checkpoint's" in captured.err
    assert json.loads(captured.out)["microbatch_size"] == 4
    model = directory.load_model(str(tmp_path / "auto"))
    assert model.manifest["microbatch_size"] == 4
    record = json.load(open(tmp_path / "auto" / "dpsynth_run.json"))
    assert "microbatch_size" in record["config"] and "memory_limit" not in record["config"]
    # The same microbatch given by hand: the same run, bit for bit; the default split (2 x 4) too.
    assert cli.main(argv + ["--out", str(tmp_path / "four"), "--microbatch-size", "4"]) == 0
    assert cli.main(argv + ["--out", str(tmp_path / "default")]) == 0
    # The whole step as one microbatch (the fused step): the same mean gradient up to float rounding.
    assert cli.main(argv + ["--out", str(tmp_path / "eight"), "--microbatch-size", "8"]) == 0
    capsys.readouterr()
    for name, tol in (("four", 0.0), ("default", 0.0), ("eight", 1e-5)):
        assert _max_diff(directory.load_model(str(tmp_path / name)).variables, model.variables) <= tol, name
    # Resuming with another microbatch than the checkpoint's is refused.
    with pytest.raises(directory.CheckpointError, match="microbatch_size=4 but this run has 2"):
        pretrain.run_pretrain(corpus, tok_path, str(tmp_path / "auto"),
                              pretrain.PretrainConfig(**MICRO, microbatch_size=2), resume=True)
