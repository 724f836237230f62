"""The generation job on a fake model: outputs, label prompts, determinism, resume, bad input."""

import dataclasses
import json
import os

import numpy as np
import pytest

from dpsynth.generate.job import GenerateConfig, GenerateError, generate, read_model_info
from dpsynth.generate.labels import LabelDistribution
from dpsynth.generate.sampler_config import SamplingOptions
from tests.generate.fakes import (
    FailOnShard,
    FakeTokenizer,
    greedy_reference,
    load_fake_bundle,
    make_tables,
    write_fake_model_dir,
)

MAX_LEN = 24
TABLE_SEED = 11  # greedy continuations of the two label prompts differ


def _config(model, out, **kw):
    base = dict(model_dir=str(model), out_dir=str(out), num_examples=37, valid_examples=11, examples_per_shard=8,
                batch_size=4, seed=5)
    options = {f.name for f in dataclasses.fields(SamplingOptions)}
    base.update({k: v for k, v in kw.items() if k not in options})
    return GenerateConfig(**base, sampling=SamplingOptions(**{k: v for k, v in kw.items() if k in options}))


def _read(path):
    with open(path, "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_fake_model_dir(str(tmp_path_factory.mktemp("model")), max_len=MAX_LEN, seed=TABLE_SEED)


@pytest.fixture(scope="module")
def reference_run(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    manifest = generate(_config(model_dir, out), loader=load_fake_bundle)
    return out, manifest


def test_outputs_manifest_and_report(reference_run, model_dir):
    out, manifest = reference_run
    train = [json.loads(l) for l in _read(out / "train.jsonl").decode().splitlines()]
    valid = [json.loads(l) for l in _read(out / "valid.jsonl").decode().splitlines()]
    assert len(train) == 37 and len(valid) == 11
    assert all(set(r) == {"text", "label"} for r in train + valid)
    # Uniform labels: exact largest-remainder counts.
    assert sorted(np.unique([r["label"] for r in train], return_counts=True)[1]) == [18, 19]
    assert manifest["splits"]["train"]["num_examples"] == 37
    assert len(manifest["splits"]["train"]["shards"]) == 5 and len(manifest["splits"]["valid"]["shards"]) == 2
    assert manifest["private"] is True
    assert _read(out / "privacy_report.json") == _read(os.path.join(model_dir, "privacy_report.json"))
    assert (out / "privacy_report.md").exists()
    config = json.loads(_read(out / "generation_config.json"))
    assert config["config_hash"] == manifest["config_hash"]
    assert config["sampler"]["max_len"] == MAX_LEN  # min(512, the model's max_len)
    report = json.loads(_read(out / "generation_report.json"))
    texts = [r["text"] for r in train]
    assert report["splits"]["train"]["duplicates"]["num_duplicates"] == len(texts) - len(set(texts))
    assert report["splits"]["train"]["label_balance"]["counts"] == dict(
        zip(*np.unique([r["label"] for r in train], return_counts=True))
    )
    lengths = report["splits"]["train"]["length_tokens"]
    assert lengths["num_examples"] == 37 and lengths["max"] <= MAX_LEN
    assert "memorisation" not in report and report["dp"] is True
    assert not os.path.exists(str(out).rstrip("/") + ".private")  # the audit is off by default


def test_memorisation_audit_is_owner_only_and_outside_the_corpus(model_dir, tmp_path):
    from dpsynth.generate.job import MEMORISATION_AUDIT_FILE, default_audit_dir

    pytest.importorskip("dpsynth._native")
    secret = "abcdefgh" * 4  # D_train text; the fake tokenizer maps letters a..h to ids
    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps({"text": secret, "label": "great"}) + "\n")
    out = tmp_path / "synth"
    old = os.umask(0o022)
    try:
        generate(_config(model_dir, out, num_examples=6, valid_examples=2), loader=load_fake_bundle,
                 tokenizer=FakeTokenizer(), train_path=str(train), min_shared_tokens=4)
    finally:
        os.umask(old)
    audit_dir = default_audit_dir(str(out))
    path = os.path.join(audit_dir, MEMORISATION_AUDIT_FILE)
    assert not os.path.commonpath([audit_dir, str(out)]) == str(out)
    assert os.stat(audit_dir).st_mode & 0o777 == 0o700 and os.stat(path).st_mode & 0o777 == 0o600
    with open(path) as f:
        audit = json.load(f)
    assert audit["dp"] is False and audit["num_train_examples"] == 1 and "longest_shared_tokens" in audit
    # Nothing in the synthetic corpus directory mentions the audit or holds D_train's text.
    for dirpath, _, files in os.walk(out):
        for name in files:
            data = _read(os.path.join(dirpath, name))
            assert b"memorisation" not in data and secret.encode() not in data and str(train).encode() not in data
    # An audit directory inside the corpus directory is refused before anything runs.
    with pytest.raises(GenerateError, match="inside the released directory"):
        generate(_config(model_dir, tmp_path / "other"), loader=load_fake_bundle, tokenizer=FakeTokenizer(),
                 train_path=str(train), audit_dir=str(tmp_path / "other" / "audit"))
    assert not (tmp_path / "other").exists()


def test_label_prompts_respected_under_greedy(model_dir, tmp_path):
    manifest = generate(_config(model_dir, tmp_path, temperature=0.0, valid_examples=0), loader=load_fake_bundle)
    table, pos_bias = make_tables(12, MAX_LEN, seed=TABLE_SEED)
    tok = FakeTokenizer()
    expected = {}
    for label in ("great", "other"):
        prompt = np.concatenate([[2], tok.encode(label)])  # BOS + "{label}"
        ids, _, _ = greedy_reference(table, pos_bias, prompt, MAX_LEN)
        expected[label] = tok.decode(ids)
    assert expected["great"] != expected["other"]
    rows = [json.loads(l) for l in _read(tmp_path / "train.jsonl").decode().splitlines()]
    assert {r["label"] for r in rows} == {"great", "other"}
    for r in rows:
        assert r["text"] == expected[r["label"]]
    assert manifest["splits"]["train"]["num_examples"] == 37


@pytest.mark.parametrize("cores_per_worker", [0, 1])
def test_same_bytes_with_two_worker_processes(reference_run, model_dir, tmp_path, cores_per_worker):
    ref, _ = reference_run
    generate(
        _config(model_dir, tmp_path, cores_per_worker=cores_per_worker),  # 1: each worker pins itself
        loader=load_fake_bundle,
        beam_args=["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
    )
    for name in ("train.jsonl", "valid.jsonl", "manifest.json", "generation_report.json"):
        assert _read(tmp_path / name) == _read(ref / name), name


def test_resume_regenerates_only_missing_shards(reference_run, model_dir, tmp_path):
    ref, _ = reference_run
    with pytest.raises(Exception, match="injected failure"):
        generate(_config(model_dir, tmp_path), loader=FailOnShard("train-00002-of-00005"))
    shard_dir = tmp_path / "shards"
    before = {p.name: os.stat(p).st_ino for p in shard_dir.iterdir() if p.suffix == ".jsonl"}
    assert "train-00002-of-00005.jsonl" not in before
    assert not (tmp_path / "train.jsonl").exists()
    generate(_config(model_dir, tmp_path), loader=load_fake_bundle)
    after = {p.name: os.stat(p).st_ino for p in shard_dir.iterdir() if p.suffix == ".jsonl"}
    assert len(after) == 7 and all(after[n] == ino for n, ino in before.items())  # untouched
    assert not [p for p in shard_dir.iterdir() if ".tmp" in p.name]
    for name in ("train.jsonl", "valid.jsonl", "manifest.json"):
        assert _read(tmp_path / name) == _read(ref / name), name


def test_texts_with_unicode_line_separators_survive_the_merge(model_dir, tmp_path):
    # json.dumps(ensure_ascii=False) leaves U+2028, U+2029 and U+0085 unescaped; a merge that
    # split shard files with str.splitlines() cut such a record in two (seen at 100k examples).
    with pytest.raises(Exception, match="injected failure"):
        generate(_config(model_dir, tmp_path), loader=FailOnShard("train-00002-of-00005"))
    shard = tmp_path / "shards" / "train-00000-of-00005.jsonl"
    rows = [json.loads(line) for line in _read(shard).split(b"\n") if line]
    rows[0]["text"] = "a\u2028b\u2029c\x85d"
    shard.write_bytes("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows).encode())
    assert len(_read(shard).decode().splitlines()) > len(rows)  # the trap is set
    generate(_config(model_dir, tmp_path), loader=load_fake_bundle)
    train = [json.loads(line) for line in _read(tmp_path / "train.jsonl").split(b"\n") if line]
    assert len(train) == 37 and rows[0]["text"] in [r["text"] for r in train]


def test_parquet_output(model_dir, tmp_path):
    import pyarrow.parquet as pq

    generate(_config(model_dir, tmp_path, num_examples=6, valid_examples=0, formats=("jsonl", "parquet")),
             loader=load_fake_bundle)
    table = pq.read_table(tmp_path / "train.parquet").to_pylist()
    rows = [json.loads(l) for l in _read(tmp_path / "train.jsonl").decode().splitlines()]
    assert table == rows


def test_dp_label_distribution_counts(model_dir, tmp_path):
    dist = LabelDistribution(labels=("great", "other"), weights=(0.75, 0.25), source="dp_histogram",
                             noise_multiplier=2.0, noisy_counts=(30.0, 10.0))
    generate(_config(model_dir, tmp_path, num_examples=40, valid_examples=0, label_distribution=dist),
             loader=load_fake_bundle)
    rows = [json.loads(l) for l in _read(tmp_path / "train.jsonl").decode().splitlines()]
    assert sum(r["label"] == "great" for r in rows) == 30
    # The histogram's cost is composed into the output's privacy report (the model's is unchanged).
    model_report = json.loads(_read(os.path.join(model_dir, "privacy_report.json")))
    out_report = json.loads(_read(tmp_path / "privacy_report.json"))
    assert [e["mechanism"] for e in out_report["ledger"]["entries"]] == ["dpsgd", "gaussian"]
    assert out_report["ledger"]["entries"][1]["noise_multiplier"] == 2.0
    for acc in ("rdp", "pld"):
        assert out_report["epsilon"][acc] > model_report["epsilon"][acc]
    assert "label_histogram" in _read(tmp_path / "privacy_report.md").decode()


def test_refuses_model_without_privacy_report(tmp_path):
    model = write_fake_model_dir(str(tmp_path / "m"), private=False)
    with pytest.raises(GenerateError, match="--allow-non-private"):
        generate(_config(model, tmp_path / "o"), loader=load_fake_bundle)
    manifest = generate(_config(model, tmp_path / "o2", num_examples=3, valid_examples=0, allow_non_private=True),
                        loader=load_fake_bundle)
    assert manifest["private"] is False
    marker = json.loads(_read(tmp_path / "o2" / "privacy_report.json"))
    assert marker["private"] is False
    # A report that says the model is not private (epsilon = inf) is refused the same way.
    model2 = write_fake_model_dir(str(tmp_path / "m2"))
    report = json.loads(_read(os.path.join(model2, "privacy_report.json")))
    report["private"] = False
    with open(os.path.join(model2, "privacy_report.json"), "w") as f:
        json.dump(report, f)
    with pytest.raises(GenerateError, match="NOT private"):
        generate(_config(model2, tmp_path / "o3"), loader=load_fake_bundle)


def test_bad_input_errors(model_dir, tmp_path):
    with pytest.raises(GenerateError, match="num-examples"):
        _config(model_dir, tmp_path, num_examples=0)
    with pytest.raises(GenerateError, match="num-examples"):
        _config(model_dir, tmp_path, num_examples=-3)
    with pytest.raises(GenerateError, match="cores-per-worker"):
        _config(model_dir, tmp_path, cores_per_worker=-1)
    with pytest.raises(ValueError, match="unknown label"):
        generate(_config(model_dir, tmp_path, labels=("great", "bogus")), loader=load_fake_bundle)
    with pytest.raises(GenerateError, match="max_len"):
        generate(_config(model_dir, tmp_path, max_len=MAX_LEN + 1), loader=load_fake_bundle)
    with pytest.raises(GenerateError, match="not found"):
        read_model_info(str(tmp_path / "nope"))


def test_refuses_out_dir_of_another_job(model_dir, tmp_path):
    generate(_config(model_dir, tmp_path, num_examples=4, valid_examples=0), loader=load_fake_bundle)
    with pytest.raises(GenerateError, match="another generation job"):
        generate(_config(model_dir, tmp_path, num_examples=4, valid_examples=0, seed=99), loader=load_fake_bundle)
    # The same job again is a no-op resume.
    generate(_config(model_dir, tmp_path, num_examples=4, valid_examples=0), loader=load_fake_bundle)


# ----------------------------------------------------------------------------- tiny preset, real decoding

WORDS = "good great tasty fresh awful bland stale sweet salty coffee tea bread the a it was is and but not".split()


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A randomly initialised `tiny` model with a privacy report (no training needed)."""
    import random

    import jax
    import jax.numpy as jnp

    from dpsynth.models import Transformer, get_config
    from dpsynth.data.tokenizer_training import train_tokenizer
    from dpsynth.models.directory import save_model
    from tests.generate.fakes import write_fake_model_dir

    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(10)) for _ in range(300)] + ["[great] [other]"] * 10
    tok = train_tokenizer(texts, vocab_size=320)
    config = get_config("tiny", max_len=128)
    variables = Transformer(config).init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))
    d = str(tmp_path_factory.mktemp("tiny") / "model")
    save_model(d, config, {"params": variables["params"]}, tok, extra_manifest={"labels": ["great", "other"]})
    os.remove(os.path.join(d, "fake_tables.npz")) if os.path.exists(os.path.join(d, "fake_tables.npz")) else None
    tmp = str(tmp_path_factory.mktemp("report"))
    write_fake_model_dir(tmp)  # borrow its privacy report (a real dpsynth.dp report)
    for name in ("privacy_report.json", "privacy_report.md"):
        os.replace(os.path.join(tmp, name), os.path.join(d, name))
    return d, tok


def test_tiny_preset_end_to_end_cli(tiny_model_dir, tmp_path, capsys):
    from apache_beam.testing.test_pipeline import TestPipeline

    from beam_jobs.generate import main, run
    from dpsynth.models import Transformer
    from dpsynth.models.directory import load_model

    model_dir, tok = tiny_model_dir
    argv = ["--model", model_dir, "--num-examples", "10", "--valid-examples", "3", "--out", str(tmp_path / "a"),
            "--max-len", "40", "--examples-per-shard", "4", "--batch-size", "4", "--temperature", "0.0"]
    manifest = run(argv, test_pipeline=TestPipeline)
    assert manifest["private"] and manifest["splits"]["train"]["num_examples"] == 10
    rows = [json.loads(l) for l in _read(tmp_path / "a" / "train.jsonl").decode().splitlines()]
    assert len(rows) == 10 and {r["label"] for r in rows} == {"great", "other"}
    # Greedy texts equal an independent greedy decode of "[BOS] [label] " that recomputes the
    # whole prefix with the full forward pass (no KV cache) at every step.
    import jax

    loaded = load_model(model_dir)
    model = Transformer(loaded.config)
    forward = jax.jit(lambda v, t: model.apply(v, t))
    banned = np.ones(loaded.config.vocab_size, bool)
    banned[3:tok.vocab_size] = False
    banned[2] = True  # BOS (PAD = 0 is banned too)
    expected = {}
    for label in ("great", "other"):
        buf = np.zeros((1, 40), np.int32)
        prompt = np.concatenate([[2], tok.encode(f"[{label}] ")]).astype(np.int32)
        buf[0, : len(prompt)] = prompt
        out = []
        for pos in range(len(prompt), 40):
            logits = np.asarray(forward(loaded.variables, buf))[0, pos - 1]
            nxt = int(np.argmax(np.where(banned, -np.inf, logits)))
            if nxt == 3:
                break
            out.append(nxt)
            buf[0, pos] = nxt
        expected[label] = tok.decode(out)
    assert all(r["text"] == expected[r["label"]] for r in rows)
    # The shell entry point: a rerun of the same job is a no-op resume.
    before = _read(tmp_path / "a" / "train.jsonl")
    assert main(argv) == 0
    assert _read(tmp_path / "a" / "train.jsonl") == before
    # Bad input exits with 2 and a clear message.
    assert main(["--model", model_dir, "--num-examples", "0", "--out", str(tmp_path / "c")]) == 2


@pytest.mark.slow
@pytest.mark.tf
def test_tfrecord_output(model_dir, tmp_path):
    tf = pytest.importorskip("tensorflow")
    generate(_config(model_dir, tmp_path, num_examples=5, valid_examples=0, formats=("jsonl", "tfrecord")),
             loader=load_fake_bundle)
    rows = [json.loads(l) for l in _read(tmp_path / "train.jsonl").decode().splitlines()]
    got = []
    for raw in tf.data.TFRecordDataset(str(tmp_path / "train.tfrecord")):
        ex = tf.train.Example.FromString(raw.numpy())
        got.append({k: ex.features.feature[k].bytes_list.value[0].decode() for k in ("text", "label")})
    assert got == rows


@pytest.mark.slow
def test_killed_process_then_rerun_equals_uninterrupted(reference_run, model_dir, tmp_path):
    """SIGKILL a generating process midway (no cleanup at all), rerun, compare byte for byte."""
    import signal
    import subprocess
    import sys
    import time

    ref, _ = reference_run
    out = tmp_path / "out"
    code = (
        "from dpsynth.generate.job import GenerateConfig, generate\n"
        "from tests.generate.fakes import SlowFake\n"
        f"generate(GenerateConfig(model_dir={str(model_dir)!r}, out_dir={str(out)!r}, num_examples=37, valid_examples=11,"
        " examples_per_shard=8, batch_size=4, seed=5), loader=SlowFake(1.0))\n"
    )
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=repo, env=dict(os.environ, PYTHONPATH=repo),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    shard_dir = out / "shards"
    deadline = time.time() + 240
    while time.time() < deadline:
        done = [p for p in shard_dir.glob("*.jsonl")] if shard_dir.exists() else []
        if len(done) >= 2:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = sorted(p.name for p in shard_dir.glob("*.jsonl"))
    assert 2 <= len(partial) < 7, partial
    generate(_config(model_dir, out), loader=load_fake_bundle)
    for name in ("train.jsonl", "valid.jsonl", "manifest.json", "generation_report.json"):
        assert _read(out / name) == _read(ref / name), name


def test_killed_worker_fails_the_job_then_rerun_resumes_exactly(reference_run, model_dir, tmp_path):
    """2 worker processes; SIGKILL the one holding an unfinished shard once a first shard is
    finished: the job fails promptly (not a hang), keeps its finished shards, and a rerun
    regenerates only the others, every shard once, byte-identical to an uninterrupted run."""
    import hashlib
    import signal
    import subprocess
    import sys
    import time

    from dpsynth.beam.workers import WORKER_LOST, worker_processes

    HOOK_SECONDS = 2.0
    ref, ref_manifest = reference_run
    out, markers = tmp_path / "out", tmp_path / "markers"
    code = (
        "from dpsynth.generate.job import GenerateConfig, generate\n"
        "from tests.generate.fakes import MarkShards\n"
        f"generate(GenerateConfig(model_dir={str(model_dir)!r}, out_dir={str(out)!r}, num_examples=37, valid_examples=11,"
        f" examples_per_shard=8, batch_size=4, seed=5), loader=MarkShards({str(markers)!r}, {HOOK_SECONDS}),"
        " beam_args=['--direct_running_mode=multi_processing', '--direct_num_workers=2'])\n"
    )
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(tmp_path / "job.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=repo, env=dict(os.environ, PYTHONPATH=repo),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    shard_dir = out / "shards"
    try:
        victim, deadline = None, time.time() + 240
        while victim is None and proc.poll() is None and time.time() < deadline:
            finished = {p.stem for p in shard_dir.glob("*.jsonl")} if shard_dir.exists() else set()
            # A shard whose marker is younger than half the hook's sleep is surely unfinished
            # when the kill lands (an older one may finish in between).
            now = time.time()
            started = [(m.name.rsplit(".", 1), m.stat().st_mtime) for m in markers.iterdir()] if markers.exists() else []
            unfinished = [(name, int(pid)) for (name, pid), t in started
                          if name not in finished and now - t < HOOK_SECONDS / 2]
            if finished and unfinished:
                victim = unfinished[0]
            time.sleep(0.02)
        assert victim is not None, (tmp_path / "job.log").read_text()[-3000:]
        assert victim[1] in worker_processes(proc.pid)
        os.kill(victim[1], signal.SIGKILL)
        rc = proc.wait(timeout=120)  # before dpsynth.beam.workers, the job waited forever
    finally:
        try:  # whatever is left of the job
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    assert rc != 0 and WORKER_LOST in (tmp_path / "job.log").read_text()
    kept = {p.name: os.stat(p).st_ino for p in shard_dir.glob("*.jsonl")}
    assert 1 <= len(kept) < 7 and victim[0] + ".jsonl" not in kept, kept
    planned = {e["name"] + ".jsonl": e for split in ref_manifest["splits"].values() for e in split["shards"]}
    for name in kept:  # a visible shard file is always the whole shard
        data = _read(shard_dir / name)
        assert len(data.splitlines()) == planned[name]["num_examples"]
        assert hashlib.sha256(data).hexdigest() == planned[name]["sha256"]
    assert not (out / "train.jsonl").exists()
    generate(_config(model_dir, out), loader=load_fake_bundle)
    after = {p.name: os.stat(p).st_ino for p in shard_dir.iterdir()}
    assert len(after) == 7 and all(after[n] == ino for n, ino in kept.items())  # kept shards untouched
    for name in ("train.jsonl", "valid.jsonl", "manifest.json", "generation_report.json"):
        assert _read(out / name) == _read(ref / name), name
    manifest = json.loads(_read(out / "manifest.json"))
    assert [e["name"] for e in manifest["splits"]["train"]["shards"]] == [f"train-{i:05d}-of-00005" for i in range(5)]
    assert (manifest["splits"]["train"]["num_examples"], manifest["splits"]["valid"]["num_examples"]) == (37, 11)


def test_dp_label_distribution_from_training_file(model_dir, tmp_path):
    from dpsynth.generate.job import dp_label_distribution

    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"text": f"t{i}", "label": "great" if i < 90 else "other"}) + "\n"
                             for i in range(100)))
    dist = dp_label_distribution(model_dir, str(train), noise_multiplier=0.5, seed=0)
    assert dist.source == "dp_histogram" and dist.labels == ("great", "other")
    assert abs(dist.noisy_counts[0] - 90) < 3 and abs(dist.noisy_counts[1] - 10) < 3
    with pytest.raises(GenerateError, match="label-source"):
        dp_label_distribution(model_dir, None, noise_multiplier=1.0)
    with pytest.raises(GenerateError, match="exactly one"):
        dp_label_distribution(model_dir, str(train))
    with pytest.raises(ValueError, match="unknown label"):
        dp_label_distribution(model_dir, str(train), labels=("great", "nope"), noise_multiplier=1.0)


def test_generate_draws_the_dp_label_histogram(model_dir, tmp_path, capsys):
    from beam_jobs.generate import main
    from dpsynth.generate.job import DpLabelHistogram, dp_label_distribution

    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"text": f"t{i}", "label": "great" if i < 90 else "other"}) + "\n"
                             for i in range(100)))
    request = DpLabelHistogram(source=str(train), noise_multiplier=0.5, seed=0)
    generate(_config(model_dir, tmp_path / "out", num_examples=20, valid_examples=0), loader=load_fake_bundle,
             label_histogram=request)
    drawn = dp_label_distribution(model_dir, str(train), noise_multiplier=0.5, seed=0)
    config = json.loads(_read(tmp_path / "out" / "generation_config.json"))
    used = LabelDistribution.from_json(config["label_distribution"])
    assert used.run and used.run != drawn.run and dataclasses.replace(used, run=drawn.run) == drawn  # a draw each
    # The release is accounted: composed into the output's privacy report, the model's unchanged.
    model_report = json.loads(_read(os.path.join(model_dir, "privacy_report.json")))
    out_report = json.loads(_read(tmp_path / "out" / "privacy_report.json"))
    assert [e["mechanism"] for e in out_report["ledger"]["entries"]] == ["dpsgd", "gaussian"]
    assert out_report["ledger"]["entries"][1]["noise_multiplier"] == 0.5
    assert out_report["ledger"]["entries"][1]["run"] == used.run  # the draw's id: one release per draw
    assert all(out_report["epsilon"][a] > model_report["epsilon"][a] for a in ("rdp", "pld"))
    with pytest.raises(GenerateError, match="not both"):
        generate(_config(model_dir, tmp_path / "o2", label_distribution=drawn), loader=load_fake_bundle,
                 label_histogram=request)
    # The CLI asks the library for the draw: its checks surface as a clean exit 2.
    assert main(["--model", model_dir, "--num-examples", "4", "--out", str(tmp_path / "o3"),
                 "--label-distribution", "dp-histogram", "--label-noise-multiplier", "1"]) == 2
    assert "--label-source" in capsys.readouterr().err
    assert not (tmp_path / "o3").exists()


# ------------------------------------------------------------------ label-guided sampling


def test_guidance_zero_keeps_the_unguided_job_and_its_hash(reference_run, model_dir, tmp_path):
    ref, ref_manifest = reference_run
    manifest = generate(_config(model_dir, tmp_path, guidance=0.0, guidance_contrast="null"), loader=load_fake_bundle)
    assert manifest["config_hash"] == ref_manifest["config_hash"]
    for name in ("train.jsonl", "valid.jsonl", "generation_config.json"):
        assert _read(tmp_path / name) == _read(ref / name), name


def test_min_p_is_a_flag_recorded_in_generation_config_and_zero_keeps_the_hash(reference_run, model_dir, tmp_path):
    from beam_jobs.generate import build_parser
    from dpsynth import binding

    ref, ref_manifest = reference_run
    assert generate(_config(model_dir, tmp_path / "zero", min_p=0.0), loader=load_fake_bundle)["config_hash"] \
        == ref_manifest["config_hash"]
    args, _ = build_parser().parse_known_args(["--model", "m", "--num-examples", "1", "--out", "o", "--min-p", "0.3"])
    options = binding.from_args(SamplingOptions, args)
    assert options.min_p == 0.3 and options.temperature == 1.0
    manifest = generate(_config(model_dir, tmp_path / "p", min_p=options.min_p), loader=load_fake_bundle)
    config = json.loads(_read(tmp_path / "p" / "generation_config.json"))
    assert config["sampler"]["min_p"] == 0.3 and manifest["config_hash"] != ref_manifest["config_hash"]
    with pytest.raises(GenerateError, match="--min-p"):
        _config(model_dir, tmp_path / "x", min_p=1.5)


def test_guided_greedy_job_contrasts_the_other_labels(model_dir, tmp_path):
    from tests.generate.test_sampler import _guided_reference

    w = 2.5
    generate(_config(model_dir, tmp_path, temperature=0.0, valid_examples=0, guidance=w), loader=load_fake_bundle)
    config = json.loads(_read(tmp_path / "generation_config.json"))
    assert config["sampler"]["guidance"] == w and config["guidance_contrast"] == "others"
    assert config["contrast_labels"] == ["great", "other"]
    table, pos_bias = make_tables(12, MAX_LEN, seed=TABLE_SEED)
    tok = FakeTokenizer()
    prompt = {l: np.concatenate([[2], tok.encode(l)]) for l in ("great", "other")}
    allowed = np.ones(12, bool)
    allowed[[0, 2]] = False
    rows = [json.loads(l) for l in _read(tmp_path / "train.jsonl").decode().splitlines()]
    for r in rows:
        other = "other" if r["label"] == "great" else "great"
        ids, _, _ = _guided_reference(table, pos_bias, prompt[r["label"]], [prompt[other]], MAX_LEN, w, allowed)
        assert r["text"] == tok.decode(ids)


def test_guided_job_same_bytes_at_any_batching_and_worker_count(model_dir, tmp_path):
    kw = dict(guidance=1.5, valid_examples=5)
    generate(_config(model_dir, tmp_path / "a", **kw), loader=load_fake_bundle)
    generate(_config(model_dir, tmp_path / "b", batch_size=16, **kw), loader=load_fake_bundle,
             beam_args=["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    for name in ("train.jsonl", "valid.jsonl"):  # (the batch size is in the config hash, so not the manifest)
        assert _read(tmp_path / "a" / name) == _read(tmp_path / "b" / name), name
    unguided = generate(_config(model_dir, tmp_path / "c", valid_examples=5), loader=load_fake_bundle)
    assert _read(tmp_path / "a" / "train.jsonl") != _read(tmp_path / "c" / "train.jsonl")
    assert unguided["config_hash"] != json.loads(_read(tmp_path / "a" / "manifest.json"))["config_hash"]


def test_null_contrast_needs_a_model_tuned_with_label_dropout(model_dir, tmp_path):
    with pytest.raises(GenerateError, match="label dropout"):
        generate(_config(model_dir, tmp_path / "o", guidance=1.0, guidance_contrast="null"), loader=load_fake_bundle)
    dropped = write_fake_model_dir(str(tmp_path / "m"), max_len=MAX_LEN, seed=TABLE_SEED)
    manifest = json.loads(_read(os.path.join(dropped, "manifest.json")))
    manifest["label_dropout"] = 0.1
    with open(os.path.join(dropped, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    generate(_config(dropped, tmp_path / "n", temperature=0.0, valid_examples=0, guidance=2.0,
                     guidance_contrast="null"), loader=load_fake_bundle)
    from tests.generate.test_sampler import _guided_reference

    table, pos_bias = make_tables(12, MAX_LEN, seed=TABLE_SEED)
    tok = FakeTokenizer()
    allowed = np.ones(12, bool)
    allowed[[0, 2]] = False
    for r in [json.loads(l) for l in _read(tmp_path / "n" / "train.jsonl").decode().splitlines()]:
        own = np.concatenate([[2], tok.encode(r["label"])])
        ids, _, _ = _guided_reference(table, pos_bias, own, [np.array([2], np.int32)], MAX_LEN, 2.0, allowed)
        assert r["text"] == tok.decode(ids)
    with pytest.raises(GenerateError, match="guidance-contrast"):
        _config(dropped, tmp_path / "x", guidance=1.0, guidance_contrast="bogus")
    with pytest.raises(GenerateError, match="--guidance"):
        _config(dropped, tmp_path / "x", guidance=-1.0)


def test_label_histogram_on_a_user_level_model_is_refused_before_drawing_or_writing(tmp_path, monkeypatch):
    """Issue 23, finding 4: the histogram was drawn over all rows and the corpus written before the
    composition into the user-level report was refused, leaving a corpus without a privacy report."""
    from dpsynth.dp.ledger import PrivacyLedger
    from dpsynth.dp.report import build_report, write_report
    from dpsynth.generate import labels as labels_lib
    from dpsynth.generate.job import DpLabelHistogram, dp_label_distribution

    model = write_fake_model_dir(str(tmp_path / "user_model"), max_len=MAX_LEN, seed=TABLE_SEED)
    ledger = PrivacyLedger(delta=1e-3, target_epsilon=3.0)
    ledger.record_dpsgd(sampling_probability=0.05, noise_multiplier=1.0, steps=100, clip_norm=1.0, dataset_size=600,
                        unit="user")
    write_report(model, build_report(ledger, training={"mode": "lora"}, contamination_sha256=None,
                                     privacy_unit="user", max_examples_per_user=4))
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"text": f"t{i}", "label": "great" if i < 9 else "other"}) + "\n"
                             for i in range(12)))
    drawn = []
    real_draw = labels_lib.dp_label_histogram
    monkeypatch.setattr(labels_lib, "dp_label_histogram", lambda *a, **k: drawn.append(1) or real_draw(*a, **k))
    out = tmp_path / "out"
    with pytest.raises(GenerateError, match="user-level"):
        generate(_config(model, out), loader=load_fake_bundle,
                 label_histogram=DpLabelHistogram(source=str(train), noise_multiplier=1.0, seed=0))
    with pytest.raises(GenerateError, match="user-level"):
        dp_label_distribution(model, str(tmp_path / "never_read.jsonl"), noise_multiplier=1.0)
    hist = LabelDistribution(labels=("great", "other"), weights=(0.5, 0.5), source="dp_histogram",
                             noise_multiplier=1.0, noisy_counts=(5.0, 5.0))
    with pytest.raises(GenerateError, match="user-level"):  # a histogram drawn elsewhere: refused the same way
        generate(_config(model, out, label_distribution=hist), loader=load_fake_bundle)
    assert drawn == [] and not out.exists()  # nothing drawn, nothing written


def test_length_defaults_to_what_the_model_was_tuned_on(tmp_path):
    """Without --max-len a DP-tuned model samples at its privacy report's `max_tokens_per_example` (what
    `dp-tune --max-tokens auto` chose), capped by the model; --max-len overrides; no report: min(512, model)."""
    from dpsynth.generate.plan import make_plan

    tuned = write_fake_model_dir(str(tmp_path / "tuned"), max_len=MAX_LEN, tuned_len=16)
    info = read_model_info(tuned)
    assert info.tuned_len == 16
    assert make_plan(_config(tuned, tmp_path / "a"), info).sampler.max_len == 16
    assert make_plan(_config(tuned, tmp_path / "b", max_len=20), info).sampler.max_len == 20
    long = write_fake_model_dir(str(tmp_path / "long"), max_len=MAX_LEN, tuned_len=512)
    assert make_plan(_config(long, tmp_path / "c"), read_model_info(long)).sampler.max_len == MAX_LEN
    public = write_fake_model_dir(str(tmp_path / "public"), max_len=MAX_LEN, private=False)
    info = read_model_info(public)
    assert info.tuned_len is None
    assert make_plan(_config(public, tmp_path / "d", allow_non_private=True), info).sampler.max_len == MAX_LEN
