"""The real stage adapters that run in seconds (data, public corpus, tokenizer) and helpers."""

import dataclasses
import json
import os

import pytest

from dpsynth.data.readers import InputError
from dpsynth.experiment import stages
from dpsynth.experiment.config import from_dict
from dpsynth.experiment.plan import build_plan
from dpsynth.experiment.runner import run_plan

REVIEW = "this is a long review of a product that I bought " * 12  # > PLANT_MIN_WORDS words


def write_csv(path, rows):
    import csv

    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows(rows)


@pytest.fixture
def files(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    write_csv(d / "train.csv", [(f"{REVIEW} number {i}", i % 2) for i in range(20)])
    write_csv(d / "test.csv", [(f"test text {i}", i % 2) for i in range(6)])
    pub = d / "public"
    pub.mkdir()
    for i in range(3):
        (pub / f"doc{i}.txt").write_text(("Public prose line %d about the weather and the sea.\n\n" % i) * 40)
    return d


def sens_config(files, **kw):
    base = {"embedded": False, "train": str(files / "train.csv"), "test": str(files / "test.csv")}
    return from_dict({"sensitive": {**base, **kw}, "public": {"embedded": False, "paths": [str(files / "public")]}})


def test_sensitive_splits_valid_tail_label_names_and_limits(files):
    cfg = sens_config(files, label_names={0: "negative", 1: "positive"}, max_test=4)
    node = build_plan(cfg, "/tmp/unused").node("sensitive")
    splits, dead = stages.load_sensitive_splits(node.config)
    assert [len(splits[s]) for s in ("train", "valid", "test")] == [18, 2, 4]
    assert splits["valid"][0]["text"].endswith("number 18")  # the last 10% of train, in order
    assert {r["label"] for r in splits["train"]} == {"negative", "positive"}
    assert dead == [] and stages.count_train(node.config) == 18


def test_sensitive_errors(files):
    node = build_plan(sens_config(files, label_names={0: "negative"}), "/tmp/unused").node("sensitive")
    with pytest.raises(ValueError, match=r"label_names: no name for label\(s\) \['1'\]"):
        stages.load_sensitive_splits(node.config)
    node = build_plan(sens_config(files, format="jsonl"), "/tmp/unused").node("sensitive")
    with pytest.raises(ValueError, match="sensitive.format is 'jsonl' but the file is csv"):
        stages.load_sensitive_splits(node.config)


def test_plant_documents():
    docs = [{"id": f"d{i}", "text": "para one\n\npara two\n\npara three"} for i in range(4)]
    cands = [{"id": f"s{i}", "text": f"{REVIEW} {i}"} for i in range(5)] + [{"id": "short", "text": "too short"}]
    new, ids = stages.plant_documents(docs, cands, 3, seed=1)
    assert len(ids) == 3 and "short" not in ids and len(set(ids)) == 3
    joined = "\n".join(d["text"] for d in new)
    for i in ids:
        assert f"{REVIEW} {i[1:]}" in joined
    assert docs[0]["text"] == "para one\n\npara two\n\npara three"  # input untouched
    assert stages.plant_documents(docs, cands, 3, seed=1) == (new, ids)  # deterministic
    with pytest.raises(ValueError, match="only 5 sensitive training texts"):
        stages.plant_documents(docs, cands, 6, seed=1)


RARE = "zorblaxquuxian"  # appears only in the sensitive reviews (and so, once planted, in the public corpus)


def _pieces(path):
    from dpsynth.data.tokenizers import Tokenizer

    tok = Tokenizer.load(path)
    return [tok._sp.id_to_piece(i) for i in range(tok.vocab_size)]


def test_released_tokenizer_never_sees_the_planted_reviews(files, tmp_path, capsys):
    from dpsynth.data.tokenizer_training import TokenizerConfig, train_public_tokenizer

    write_csv(files / "train.csv", [(f"number {i} {REVIEW}{(RARE + ' ') * 12}".strip(), i % 2) for i in range(20)])
    cfg = sens_config(files).replace(public={"plant": 2}, tokenizer={"vocab_size": 400, "max_sentences": 1000})
    plan = build_plan(cfg, str(tmp_path / "run"))
    result = run_plan(plan, until="tokenizer")
    assert result.ok, result.failed
    sens, pub, dedup, tok = (result.outputs[k] for k in ("sensitive", "public", "dedup", "tokenizer"))
    assert sens.summary["num_train"] == 18 and sens.summary["labels"] == ["0", "1"]
    with open(pub.path("corpus", "public.jsonl")) as f:
        docs = [json.loads(line) for line in f]
    assert len(docs) == 3 and len(pub.summary["planted_ids"]) == 2
    planted_train = {r["id"]: r["text"] for r in map(json.loads, open(sens.path("data", "train.jsonl")))}
    for i in pub.summary["planted_ids"]:
        assert any(planted_train[i] in d["text"] for d in docs)
    assert dedup.summary["planted_found"] == 2
    # Control: a tokenizer trained on the public corpus as it is before dedup (the order this
    # replaced) learns the rare string of the planted reviews as a piece...
    before = train_public_tokenizer([pub.path("corpus")], out=str(tmp_path / "before.model"),
                                    config=TokenizerConfig(vocab_size=400, max_sentences=1000, seed=0))
    assert any(RARE in p for p in _pieces(str(tmp_path / "before.model"))), before.sha256
    # ... while the released tokenizer, trained on the deduplicated corpus only, does not.
    released = _pieces(tok.path("tokenizer.model"))
    assert not any(RARE in p for p in released) and not any(p.strip("\u2581") and p.strip("\u2581") in RARE
                                                            and len(p.strip("\u2581")) >= 8 for p in released)
    from dpsynth.data.token_shards import read_manifest
    from dpsynth.data.tokenizers import Tokenizer

    assert Tokenizer.load(tok.path("tokenizer.model")).sha256 == tok.summary["sha256"]
    assert read_manifest(tok.path("clean_tokens"))["tokenizer_sha256"] == tok.summary["sha256"]  # re-tokenized
    assert not os.path.exists(dedup.path("clean_tokens"))  # the temporary tokenizer's ids are not kept
    temporary = tmp_path / "run" / "private" / "dedup" / dedup.hash[:16] / stages.DEDUP_TOKENIZER
    assert os.stat(temporary).st_mode & 0o777 == 0o600 and not any(
        f.endswith(".model") for f in os.listdir(dedup.dir))  # the dedup's tokenizer stays private
    # ... and so do the token corpora (the public one is the corpus before the cut) and the index.
    assert not os.path.exists(dedup.path("tokens")) and not os.path.exists(dedup.path("index"))
    assert os.path.isfile(temporary.parent / "dedup" / "index")
    assert os.path.isfile(temporary.parent / "dedup" / "tokens" / "public" / "manifest.json")
    out = capsys.readouterr().out
    assert "DEMO: planted 2 sensitive training reviews" in out
    assert REVIEW.strip() not in out and RARE not in out  # private text never printed
    # A new vocabulary size reruns the dedup (its temporary tokenizer) and the tokenizer only.
    again = run_plan(build_plan(cfg.replace(tokenizer={"vocab_size": 390}), str(tmp_path / "run")), until="tokenizer")
    assert again.ran == ["dedup", "tokenizer"]


def test_dp_label_histogram_is_drawn_once_per_model(tmp_path):
    import dataclasses as dc

    from dpsynth.experiment.cache import StageContext
    from dpsynth.generate.labels import dp_label_histogram

    calls = []

    class FakeLib:
        @staticmethod
        def dp_label_distribution(model_dir, label_source, *, noise_multiplier):
            calls.append((model_dir, label_source, noise_multiplier))
            return dp_label_histogram(["a"] * 30 + ["b"] * 10, ["a", "b"], noise_multiplier=noise_multiplier)

    def out(key):
        from dpsynth.experiment.cache import StageOutput

        return StageOutput(key=key, stage=key, hash="0" * 64, dir=str(tmp_path / key), summary={}, seconds=0.0, cached=True)


    (tmp_path / "work").mkdir()
    ctx = StageContext(key="labels[x]", stage="labels", hash="1" * 64, config={"noise_multiplier": 2.0},
                       out_dir=str(tmp_path / "work"), inputs={"model": out("model"), "sensitive": out("sensitive")})
    mp = pytest.MonkeyPatch()
    from dpsynth.generate import job

    mp.setattr(job, "dp_label_distribution", FakeLib.dp_label_distribution)
    try:
        first = stages.labels(ctx)
        again = stages.labels(dc.replace(ctx, resume=True))  # an interrupted stage: the saved draw, no second release
    finally:
        mp.undo()
    assert first == again and len(calls) == 1
    assert calls[0] == (str(tmp_path / "model" / "model"), str(tmp_path / "sensitive" / "data" / "train.jsonl"), 2.0)
    # Every generate node of the model reads that one draw.
    gen = StageContext(key="generate[x]", stage="generate", hash="2" * 64, config={}, out_dir=str(tmp_path / "g"),
                       inputs={"labels": out("work")})
    assert list(stages._label_distribution(gen).weights) == first["weights"]


def test_sensitive_split_options_split_column_hash_and_label_text(tmp_path):
    import csv

    one = tmp_path / "sentences.csv"  # Yelp-sentences layout: split,label,text in one file
    with open(one, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["split", "label", "text"])
        w.writerows([("dev" if i < 40 else "test", i % 2, f"sentence {i} .") for i in range(400)])
    split = {"split_column": "split", "split_values": {"train": "test", "test": "dev"}, "holdout": "hash",
             "subsample": "hash", "seed": 1}
    cfg = from_dict({"sensitive": {"embedded": False, "train": str(one), "test": str(one), "split": split,
                                   "max_train": 100}})
    splits, _ = stages.load_sensitive_splits(build_plan(cfg, "/tmp/unused").node("sensitive").config)
    assert len(splits["test"]) == 40 and len(splits["train"]) == 100 and 15 < len(splits["valid"]) < 60
    assert all(int(r["text"].split()[1]) >= 40 for s in ("train", "valid") for r in splits[s])
    assert {r["label"] for r in splits["train"]} == {"0", "1"}  # a hash subsample, not the first rows
    sst = tmp_path / "stsa.binary.train"  # SST-2 layout, test carved by hash (AG News style)
    sst.write_text("".join(f"{i % 2} sentence number {i}\n" for i in range(200)))
    cfg = from_dict({"sensitive": {"embedded": False, "train": str(sst), "format": "label_text",
                                   "split": {"holdout": "hash", "test_fraction": 0.2}}})
    splits, _ = stages.load_sensitive_splits(build_plan(cfg, "/tmp/unused").node("sensitive").config)
    assert sum(len(v) for v in splits.values()) == 200 and 20 < len(splits["test"]) < 60
    # the default split leaves the stage hash of older configs unchanged
    assert "split" not in build_plan(sens_config_plain(tmp_path), "/tmp/unused").node("sensitive").config


def test_sensitive_format_tsv_reads_tab_separated_exports_and_refuses_other_files(tmp_path):
    tsv = tmp_path / "export.tsv"
    tsv.write_text("text\tlabel\n" + "".join(f"row {i}, with a comma\t{i % 2}\n" for i in range(50)), encoding="utf-8")
    cfg = from_dict({"sensitive": {"embedded": False, "train": str(tsv), "test": str(tsv), "format": "tsv"}})
    splits, _ = stages.load_sensitive_splits(build_plan(cfg, "/tmp/unused").node("sensitive").config)
    assert len(splits["train"]) + len(splits["valid"]) == 50 and splits["test"][0]["text"] == "row 0, with a comma"
    other = tmp_path / "other.csv"
    other.write_text("text,label\nx,0\n", encoding="utf-8")
    cfg = from_dict({"sensitive": {"embedded": False, "train": str(other), "test": str(tsv), "format": "tsv"}})
    with pytest.raises(InputError, match="sensitive.format is 'tsv' but the file is csv"):
        stages.load_sensitive_splits(build_plan(cfg, "/tmp/unused").node("sensitive").config)


def sens_config_plain(tmp_path):
    return from_dict({"sensitive": {"embedded": False, "train": str(tmp_path / "sentences.csv"),
                                    "test": str(tmp_path / "sentences.csv")}})


# ----------------------------------------------------------------------------- private state


def _output(tmp_path, key, stage, summary=None):
    from dpsynth.experiment.cache import StageOutput

    d = tmp_path / "inputs" / key
    d.mkdir(parents=True, exist_ok=True)
    return StageOutput(key=key, stage=stage, hash=key[0] * 64, dir=str(d), summary=summary or {}, seconds=0.0, cached=True)


def _sensitive_output(tmp_path):
    sens = _output(tmp_path, "sensitive", "sensitive", {"num_train": 4, "labels": ["a", "b"]})
    os.makedirs(sens.path("data"))
    for split in ("train", "valid"):
        with open(sens.path("data", f"{split}.jsonl"), "w") as f:
            for i in range(4):
                f.write(json.dumps({"id": str(i), "text": f"secret review {i}", "label": "ab"[i % 2]}) + "\n")
    return sens


def _tree_bytes(root):
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(dirpath, name), "rb") as f:
                out[os.path.join(dirpath, name)] = f.read()
    return out


def _modes(path):
    return os.stat(path).st_mode & 0o777


TRAIN_LOSS, VALID_LOSS = 1.2345678, 2.3456789


TRUNCATED = 48613  # a distinctive exact count


def test_dp_tune_losses_stay_in_private_state(tmp_path, monkeypatch, capsys):
    from types import SimpleNamespace

    from dpsynth.dp import ledger as ledger_lib
    from dpsynth.dp import report as report_lib
    from dpsynth.experiment import cache
    from dpsynth.experiment.plan import StageNode

    ledger = ledger_lib.PrivacyLedger(delta=1e-3, target_epsilon=3.0)
    ledger.record_dpsgd(sampling_probability=0.1, noise_multiplier=1.0, steps=10, clip_norm=1.0, dataset_size=4)
    privacy = report_lib.build_report(ledger, training={"mode": "lora"}, contamination_sha256=None)

    calls = []

    def fake_tune(base, train, valid, model_dir, config, **kw):
        calls.append(kw)
        os.makedirs(model_dir)
        return SimpleNamespace(report=privacy, epsilon=ledger.epsilons(), steps=10, noise_multiplier=1.0, delta=1e-3,
                               train_loss=TRAIN_LOSS, valid_loss=VALID_LOSS, truncated_train=TRUNCATED)

    from dpsynth.train import finetune

    monkeypatch.setattr(stages, "tune_config", lambda c: SimpleNamespace(mode="lora", epsilon=3.0))
    monkeypatch.setattr(finetune, "dp_tune", fake_tune)
    node = StageNode(key="dp_tune[x]", stage="dp_tune", config={"mode": "lora"}, inputs={}, hash="d" * 64)
    root = tmp_path / "root"
    out = cache.run_stage(str(root), node, stages.dp_tune, {
        "pretrain": _output(tmp_path, "pretrain", "pretrain"), "sensitive": _sensitive_output(tmp_path)})
    printed = capsys.readouterr().out
    for path, data in _tree_bytes(out.dir).items():  # report.txt, stage.json, the model directory
        for loss in (TRAIN_LOSS, VALID_LOSS):
            assert f"{loss:.3f}".encode() not in data and repr(loss).encode() not in data, path
    assert "train_loss" not in out.summary and "valid_loss" not in out.summary
    # The exact truncation count is not DP either (one long example moves it): private state only.
    assert "truncated_train" not in out.summary
    assert all(str(TRUNCATED).encode() not in data for data in _tree_bytes(out.dir).values())
    assert f"{TRAIN_LOSS:.3f}" not in printed  # nor in the logs
    private = root / "private" / "dp_tune" / ("d" * 16) / stages.LOSSES_FILE
    with open(private) as f:
        kept = json.load(f)
    assert kept["valid_loss"] == VALID_LOSS and kept["truncated_train"] == TRUNCATED
    assert _modes(private) == 0o600
    assert {_modes(p) for p in (private.parent, private.parent.parent, root / "private")} == {0o700}
    # The tuner's own private state (checkpoints, secret seed) goes to the stage's private state too.
    assert calls[0]["state_dir"] == str(private.parent / stages.TUNE_STATE_DIR)


def _fake_generate(calls):
    """Stands in for `dpsynth.generate.job.generate`: writes a one-example corpus and its report."""
    from dpsynth.owner_only import write_private_json

    def generate(config, train_path=None, audit_dir=None):
        calls.append((train_path, audit_dir))
        with open(os.path.join(config.out_dir, "train.jsonl"), "w") as f:
            f.write(json.dumps({"text": "synthetic text", "label": "a"}) + "\n")
        with open(os.path.join(config.out_dir, "generation_report.json"), "w") as f:
            json.dump({"splits": {}, "dp": True}, f)
        if train_path is not None:
            write_private_json(os.path.join(audit_dir, "memorisation_audit.json"), {"longest_shared_tokens": 7654321})

    return generate


@pytest.mark.parametrize("audit", [False, True])
def test_memorisation_audit_is_opt_in_and_private(tmp_path, monkeypatch, audit):
    from dpsynth.experiment import cache
    from dpsynth.experiment.config import GenerateConfig
    from dpsynth.experiment.plan import StageNode

    assert GenerateConfig().audit_memorisation is False  # off by default
    calls = []
    from dpsynth.generate import job

    monkeypatch.setattr(job, "generate", _fake_generate(calls))
    cfg = {"multiple": 1, "valid_fraction": 0.5, "sampling": {"temperature": 1.0, "top_k": 0, "num_decodes": 1},
           "seed": 0, "max_tokens": 16, "batch_size": 2, "audit_memorisation": audit}
    node = StageNode(key="generate[x]", stage="generate", config=cfg, inputs={}, hash="e" * 64)
    root = tmp_path / "root"
    sens = _sensitive_output(tmp_path)
    out = cache.run_stage(str(root), node, stages.generate, {
        "model": _output(tmp_path, "model", "dp_tune", {"target_epsilon": 3.0}), "sensitive": sens})
    private = root / "private" / "generate" / ("e" * 16)
    if not audit:
        assert calls == [(None, None)] and not private.exists()
        return
    assert calls == [(sens.path("data", "train.jsonl"), str(private))]
    assert _modes(private / "memorisation_audit.json") == 0o600 and _modes(private) == 0o700
    for path, data in _tree_bytes(out.dir).items():
        assert b"longest_shared" not in data and b"7654321" not in data, path


def test_select_stage_releases_one_corpus_and_keeps_the_counts_private(tmp_path, capsys):
    """The `select` stage: the winner's corpus with its composed privacy report in the stage dir,
    the non-DP counts in the owner-only private state."""
    from dpsynth.experiment.cache import StageContext, StageOutput
    from tests.evaluate.conftest import make_records
    from tests.evaluate.test_dp_select import tuning_report, write_corpus

    rep = tuning_report()
    outs = []
    for name, seed in (("a", 1), ("b", 2)):
        write_corpus(str(tmp_path), name, make_records(40, seed), make_records(10, seed + 10), rep)
        outs.append(StageOutput(key=name, stage="generate", hash="0" * 64, dir=str(tmp_path / name), summary={},
                                seconds=0.0, cached=True))
    sens = tmp_path / "sens"
    (sens / "data").mkdir(parents=True)
    with open(sens / "data" / "valid.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in make_records(30, 7, prefix="v"))
    with open(sens / "data" / "train.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in make_records(200, 8, prefix="t"))
    sens_out = StageOutput(key="sensitive", stage="sensitive", hash="1" * 64, dir=str(sens), summary={}, seconds=0.0,
                           cached=True)
    (tmp_path / "work").mkdir()
    ctx = StageContext(key="select[lora-eps3]", stage="select", hash="2" * 64, out_dir=str(tmp_path / "work"),
                       config={"epsilon": 1.0, "mechanism": "exponential", "split": "files", "candidates": ["a", "b"],
                               "options": {"max_epochs": 1}},
                       inputs={"synthetic": tuple(outs), "sensitive": sens_out}, private_dir=str(tmp_path / "priv" / "x"))
    summary = stages.select(ctx)
    assert summary["selected"] in ("a", "b") and summary["composition"] == "parallel"
    assert os.path.exists(tmp_path / "work" / "train.jsonl") and os.path.exists(tmp_path / "work" / "selection.json")
    scores = json.load(open(tmp_path / "priv" / "x" / "selection_scores.json"))
    assert scores["candidates"] == ["a", "b"] and not os.path.exists(tmp_path / "work.private")
    assert "DP selection among 2 corpora" in capsys.readouterr().out
    assert json.load(open(tmp_path / "work" / "selection.json"))["disjointness"]["checked"] is True
    # A D_valid that is D_train (here: the sensitive stage's train split copied over it) is refused before any compute.
    import shutil

    from dpsynth.dp import disjoint

    shutil.copy(sens / "data" / "train.jsonl", sens / "data" / "valid.jsonl")
    (tmp_path / "work2").mkdir()
    with pytest.raises(disjoint.OverlapError, match="200 of its 200 records are exact copies"):
        stages.select(dataclasses.replace(ctx, out_dir=str(tmp_path / "work2")))
    assert os.listdir(tmp_path / "work2") == []
