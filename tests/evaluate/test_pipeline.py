import json

import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline

from beam_jobs import metrics as job
from dpsynth import binding
from tests.evaluate.conftest import make_records


def _write(path, rows):
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def test_beam_job_scores_every_corpus_and_marks_bad_ones(tmp_path):
    for s, seed in (("train", 1), ("test", 2)):
        _write(tmp_path / f"real_{s}.jsonl", make_records(120, seed, prefix=s))
    root = tmp_path / "corpora"
    for name, seed in (("a", 3), ("b", 4)):
        d = root / "sweep" / name
        d.mkdir(parents=True)
        _write(d / "train.jsonl", make_records(100, seed))
        _write(d / "valid.jsonl", make_records(30, seed + 10))
    bad = root / "sweep" / "empty"
    bad.mkdir()
    _write(bad / "train.jsonl", [{"text": " ", "label": "great"}])
    _write(bad / "valid.jsonl", make_records(5, 1))
    out = tmp_path / "out"
    argv = ["--synthetic-root", str(root), "--real-train", str(tmp_path / "real_train.jsonl"), "--real-test",
            str(tmp_path / "real_test.jsonl"), "--out", str(out), "--classifiers", "none", "--embedder", "hashing:64",
            "--mauve-seeds", "1", "--no-perplexity"]
    res = job.run(argv, test_pipeline=BeamTestPipeline)
    assert res["corpora"] == 3
    saved = json.loads((out / "metrics.json").read_text())
    rows = {r["corpus"]: r for r in saved["corpora"]}
    assert set(rows) == {"a", "b", "empty"}
    assert rows["a"]["status"] == "ok" and 0 < rows["a"]["mauve"] <= 1 and rows["a"]["private"] is False
    assert rows["empty"]["status"] == "error" and "no valid row" in rows["empty"]["error"]
    assert (out / "report.html").exists() and (out / "metrics.csv").exists()
    # The majority-class predictor comes from the real test labels; without classifiers there is no verdict.
    assert saved["majority"]["n_test"] == 120 and saved["majority"]["balanced_accuracy"] == 0.5
    assert saved["verdicts"] == [] and "no downstream classifier was trained" in res["summary"]
    assert "No classifier was trained: no verdict." in (out / "report.html").read_text()


def test_cli_errors_are_clear(tmp_path, capsys):
    _write(tmp_path / "t.jsonl", make_records(10, 1))
    rc = job.main(["--synthetic", str(tmp_path), "--real-train", str(tmp_path / "missing.jsonl"), "--real-test",
                   str(tmp_path / "t.jsonl"), "--out", str(tmp_path / "o"), "--classifiers", "none"])
    assert rc == 2 and "missing.jsonl" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        job.parser().parse_args(["--out", "x"])


def test_cli_flags_of_config_fields_come_from_the_config():
    """`dpsynth evaluate`'s flags that are `EvaluateConfig` fields as they are: the config's defaults,
    choices and help (one declaration), read back into the config; the DP selection of DP-on-real too."""
    import dataclasses

    from dpsynth.evaluate.scoring import EvaluateConfig

    base = ["--synthetic", "s", "--real-train", "t", "--real-test", "x", "--out", "o"]
    args = job.parser().parse_args(base)
    default = EvaluateConfig()
    assert {n: getattr(args, n) for n in job.BOUND} == {n: getattr(default, n) for n in job.BOUND}
    fields = {f.name: f for f in dataclasses.fields(EvaluateConfig)}
    actions = {a.dest: a for a in job.parser()._actions}
    for name in job.BOUND:
        assert actions[name].help == binding.with_default(fields[name].metadata["help"], actions[name].default)
    assert tuple(actions["dp_valid_split"].choices) == ("files", "hash", "positional")
    args = job.parser().parse_args(base + ["--model", "m", "--dp-select-epsilon", "0.5", "--dp-valid-split", "hash",
                                           "--sweep-accounting", "selected-only"])
    config = job.config_from_flags(**{n: getattr(args, n) for n in job.BOUND})
    assert (config.model_dir, config.dp_select_epsilon, config.dp_valid_split, config.dp_sweep_accounting) == (
        "m", 0.5, "hash", "selected-only")
    with pytest.raises(TypeError, match="unknown"):
        job.config_from_flags(pooling_mode="mean")
