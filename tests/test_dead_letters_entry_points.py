"""Every entry point that reads data accounts for its dead letters (issue 23, finding 8).

Measured by the audit: a 400-row CSV with one row of invalid UTF-8, one with an empty label and
one with an empty text trained `dp-tune` on 397 rows and the CLI said nothing about the 3. At
every entry point (dp-tune, classify, evaluate, generate's label source, the experiment's
sensitive stage): the count and reasons are printed (never the text), the dead letters (file,
record number, reason) are written owner-only, the run fails past `--max-dead-letters`, and
records in = records used + dead-lettered.
"""

import json
import os
import types

import pytest

from tests.data.bad_inputs import SECRET, bad_csv
from tests.train.conftest import tiny_base  # noqa: F401 (fixture)


def _letters(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def _says_three_of_400(err, name):
    assert f"{name}: 3 of 400 records dead-lettered, 397 used (" in err, err
    assert "empty document: 1" in err and "invalid UTF-8" in err and "is empty: 1" in err
    assert SECRET not in err


DP_FLAGS = ["--mode", "lora", "--epsilon", "4", "--batch-size", "8", "--steps", "1", "--microbatch-size", "8",
            "--max-tokens", "32", "--lora-rank", "2", "--labels", "great", "other", "--checkpoint-every", "1"]


def test_dp_tune(tiny_base, tmp_path, capsys):  # noqa: F811
    from dpsynth.dp import report
    from dpsynth.train import tune_resume
    from trainers import dp_tune

    base_dir, _ = tiny_base
    data = bad_csv(tmp_path / "train.csv")
    refused = tmp_path / "refused"
    assert dp_tune.main(["--base", base_dir, "--train", str(data), "--out", str(refused), *DP_FLAGS,
                         "--max-dead-letters", "2"]) == 2
    err = capsys.readouterr().err
    assert "more than --max-dead-letters 2" in err and SECRET not in err
    state = tune_resume.default_state_dir(str(refused))
    assert len(_letters(os.path.join(state, "dead_letters.jsonl"))) == 3  # listed even when refused
    assert not os.path.exists(os.path.join(state, "checkpoints")) and not refused.exists()  # before any compute
    out = tmp_path / "out"
    assert dp_tune.main(["--base", base_dir, "--train", str(data), "--out", str(out), *DP_FLAGS]) == 0
    err = capsys.readouterr().err
    _says_three_of_400(err, "D_train (--train)")
    letters = _letters(os.path.join(tune_resume.default_state_dir(str(out)), "dead_letters.jsonl"))
    assert sorted(d["record"] for d in letters) == [11, 21, 31] and all(d["file"] == str(data) for d in letters)
    used = report.load_report(str(out))["training"]["dataset_size"]
    assert used == 397 and used + len(letters) == 400  # records in = used + dead-lettered
    for root, _, files in os.walk(out):  # the released directory holds no dead letter
        assert "dead_letters.jsonl" not in files


def test_classify(tmp_path, capsys, monkeypatch):
    from dpsynth.evaluate import corpora
    from dpsynth.evaluate import train_classifier as tc
    from trainers import classify

    data = bad_csv(tmp_path / "train.csv")
    clean = tmp_path / "test.jsonl"
    clean.write_text("".join(json.dumps({"text": f"t {i}", "label": "great"}) + "\n" for i in range(5)))
    used = {}

    def fake_classify_files(train, valid, test, max_dead_letters=0, **kw):  # the library's read, not its training
        for name, path in (("train", train), ("valid", valid), ("test", test)):
            used[name] = len(corpora.read_real(path, name, max_dead_letters=max_dead_letters))
        return types.SimpleNamespace(selected={}, test_mean=0.5, test_std=0.0, score_mean={}, privacy=None)

    monkeypatch.setattr(tc, "classify_files", fake_classify_files)
    out = str(tmp_path / "m.json")
    args = ["--train", str(data), "--valid", str(clean), "--test", str(clean), "--out", out]
    assert classify.main(args + ["--max-dead-letters", "0"]) == 2
    assert "more than --max-dead-letters 0" in capsys.readouterr().err and not used
    assert classify.main(args) == 0
    _says_three_of_400(capsys.readouterr().err, "train (--train)")
    letters = _letters(os.path.join(out + ".private", "dead_letters.jsonl"))
    assert used["train"] == 397 and used["train"] + len(letters) == 400


def test_evaluate(tmp_path, capsys, monkeypatch):
    from beam_jobs import metrics
    from dpsynth.evaluate import pipeline, scoring

    data = bad_csv(tmp_path / "test.csv")
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"text": f"t {i}", "label": "great"}) + "\n" for i in range(5)))
    (tmp_path / "syn").mkdir()
    used = {}

    def fake_run_job(dirs, real_paths, out_dir, config, max_dead_letters=0, **kw):
        real = scoring.load_real(*real_paths, max_dead_letters=max_dead_letters)
        used.update(train=len(real.train), test=len(real.test))

    monkeypatch.setattr(pipeline, "run_job", fake_run_job)
    out = str(tmp_path / "eval")
    args = ["--synthetic", str(tmp_path / "syn"), "--real-train", str(train), "--real-test", str(data), "--out", out,
            "--classifiers", "none"]
    assert metrics.main(args + ["--max-dead-letters", "0.5%"]) == 2
    assert "more than --max-dead-letters 0.5%" in capsys.readouterr().err and not used
    assert metrics.main(args) == 0
    _says_three_of_400(capsys.readouterr().err, "real test (--real-test)")
    letters = _letters(os.path.join(out + ".private", "dead_letters.jsonl"))
    assert used["test"] == 397 and used["test"] + len(letters) == 400 and used["train"] == 5
    assert not os.path.exists(os.path.join(out, "dead_letters.jsonl"))


def test_library_real_split_without_a_limit_is_strict(tmp_path):
    from dpsynth.evaluate import corpora

    with pytest.raises(corpora.CorpusError, match="3 of 400 records dead-lettered"):
        corpora.read_real(str(bad_csv(tmp_path / "t.csv")), "real test")


def test_generate_label_source(tmp_path, capsys):
    from beam_jobs.generate import main
    from dpsynth.data import dead_letters
    from dpsynth.generate.job import DpLabelHistogram, GenerateConfig, generate
    from tests.generate.fakes import load_fake_bundle, write_fake_model_dir

    model = write_fake_model_dir(str(tmp_path / "model"), max_len=24, seed=11)
    data = bad_csv(tmp_path / "train.csv")
    out = tmp_path / "out"
    assert main(["--model", model, "--num-examples", "4", "--out", str(out), "--label-distribution", "dp-histogram",
                 "--label-source", str(data), "--label-noise-multiplier", "1", "--max-dead-letters", "2"]) == 2
    assert "more than --max-dead-letters 2" in capsys.readouterr().err and not out.exists()
    policy = dead_letters.Policy.of("1%", dead_letters.default_path(str(out)), prefix="dpsynth generate: ")
    request = DpLabelHistogram(source=str(data), noise_multiplier=0.3, seed=0, dead_letters=policy)
    config = GenerateConfig(model_dir=model, out_dir=str(out), num_examples=8, valid_examples=0, examples_per_shard=8,
                            batch_size=4, seed=5)
    generate(config, loader=load_fake_bundle, label_histogram=request)
    _says_three_of_400(capsys.readouterr().err, "--label-source")
    letters = _letters(dead_letters.default_path(str(out)))
    drawn = json.loads((out / "generation_config.json").read_text())["label_distribution"]
    counted = sum(drawn["noisy_counts"])  # sigma 0.3 on each of the 2 counts (seed 0): 397, not 400
    assert abs(counted - 397) < 1.5 and 397 + len(letters) == 400  # the histogram counts the used records
    assert not (out / "dead_letters.jsonl").exists()


def test_experiment_sensitive_stage(tmp_path, capsys):
    from dpsynth.experiment import cache, stages
    from dpsynth.experiment.config import from_dict
    from dpsynth.experiment.plan import build_plan

    data = bad_csv(tmp_path / "train.csv")
    test = tmp_path / "test.csv"
    test.write_text("text,label\na b,great\nc d,other\n")

    def node(**kw):
        cfg = from_dict({"sensitive": {"embedded": False, "train": str(data), "test": str(test), **kw},
                         "public": {"embedded": False, "paths": [str(test)]}})
        return build_plan(cfg, str(tmp_path / "root")).node("sensitive")

    with pytest.raises(cache.StageFailed, match="more than --max-dead-letters 2"):
        cache.run_stage(str(tmp_path / "root"), node(max_dead_letters="2"), stages.sensitive_data, {})
    out = cache.run_stage(str(tmp_path / "root"), node(), stages.sensitive_data, {})
    _says_three_of_400(capsys.readouterr().out, f"sensitive.train ({data})")
    letters = _letters(out.path("dead_letters.jsonl"))
    s = out.summary
    assert s["dead_lettered"] == len(letters) == 3 and s["num_train"] + s["num_valid"] + len(letters) == 400
    assert SECRET not in out.report and "3 of 400" in out.report
