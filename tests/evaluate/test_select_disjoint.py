"""`dpsynth select` checks that D_valid is disjoint from D_train (`dpsynth.dp.disjoint`) before any compute:
the training file itself or a shuffled copy is refused in one line; a legitimate split with natural
duplicates passes; `selection.json` states what was checked (and says so when nothing could be)."""

import json
import os

import numpy as np
import pytest

from dpsynth.dp import disjoint
from tests.evaluate.conftest import make_records
from tests.evaluate.test_dp_select import tuning_report, write_corpus

COMMON = [("Great tasty .", "great"), ("Awful .", "other"), ("Love it !", "great"), ("Bland and soggy .", "other")]


def dataset(n: int, seed: int) -> list[dict]:
    """Toy reviews of which about 10% are a few short texts repeated (natural duplicates)."""
    rng = np.random.default_rng(seed)
    out = make_records(n, seed, signal=2)
    for r in out:
        if rng.random() < 0.1:
            r["text"], r["label"] = COMMON[int(rng.integers(len(COMMON)))]
    return out


def write_jsonl(path, rows):
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("disjoint")
    records = dataset(1500, 0)
    idx = np.random.default_rng(1).permutation(len(records))
    train = [records[i] for i in idx[150:]]
    valid = [records[i] for i in idx[:150]]
    model = str(root / "model")  # the candidates' model: its D_train hashes in its private state
    cands = {}
    for i, name in enumerate(("c1", "c2")):
        d = write_corpus(str(root), name, make_records(80, 10 + i, signal=3), make_records(16, 20 + i, signal=3),
                         tuning_report())
        with open(os.path.join(d, "generation_config.json"), "w") as f:
            json.dump({"model_dir": model}, f)
        cands[name] = d
    shuffled = [train[i] for i in np.random.default_rng(2).permutation(len(train))]
    return {"root": root, "model": model, "cands": list(cands.values()),
            "train": write_jsonl(root / "train.jsonl", train), "valid": write_jsonl(root / "valid.jsonl", valid),
            "copy": write_jsonl(root / "copy.jsonl", shuffled), "train_records": train}


def run(setup, tmp_path, valid, *extra):
    from trainers import select as cli

    out = str(tmp_path / "out")
    rc = cli.main(["--candidates", *setup["cands"], "--valid", valid, "--out", out, "--epsilon", "1",
                   "--max-epochs", "1", "--seed", "0", *extra])
    return rc, out


@pytest.mark.parametrize("which", ["train", "copy"])
def test_the_training_file_or_a_shuffled_copy_is_refused(setup, tmp_path, capsys, which):
    rc, out = run(setup, tmp_path, setup[which], "--label-source", setup["train"])
    err = capsys.readouterr().err.strip().splitlines()
    n = len(setup["train_records"])
    assert rc == 2 and err[-1].startswith("dpsynth select: error: --valid: ")
    assert f"{n} of its {n} records are exact copies of records of D_train (--label-source)" in err[-1]
    assert not os.path.exists(os.path.join(out, "selection.json"))


def test_the_models_kept_hashes_catch_it_without_label_source(setup, tmp_path, capsys):
    disjoint.write_hashes(setup["model"] + ".private", setup["train_records"])
    try:
        rc, out = run(setup, tmp_path, setup["train"])
        err = capsys.readouterr().err
        assert rc == 2 and "exact copies of records of D_train (the hashes dp-tune kept for" in err
        # ... and a legitimate D_valid passes against them, stated as checked
        rc, out = run(setup, tmp_path / "ok", setup["valid"])
        assert rc == 0
        sel = json.load(open(os.path.join(out, "selection.json")))
        assert sel["disjointness"]["checked"] is True and "checked disjoint from D_train" in sel["guarantee"]
    finally:
        os.remove(os.path.join(setup["model"] + ".private", disjoint.HASHES_FILE))


def test_a_legitimate_split_with_natural_duplicates_passes_and_says_it_was_checked(setup, tmp_path, capsys):
    train = set(disjoint.record_hashes(setup["train_records"]).tolist())
    valid = [json.loads(line) for line in open(setup["valid"])]
    assert sum(disjoint.record_hash(r) in train for r in valid) > 0  # natural duplicates across the split
    rc, out = run(setup, tmp_path, setup["valid"], "--label-source", setup["train"])
    assert rc == 0
    sel = json.load(open(os.path.join(out, "selection.json")))
    assert sel["composition"] == "parallel" and sel["disjointness"]["checked"] is True
    assert "checked disjoint from D_train" in sel["guarantee"] and "NOT checked" not in sel["guarantee"]
    published = "".join(open(os.path.join(out, f)).read() for f in os.listdir(out) if f.endswith((".json", ".md")))
    assert "valid_in_train" not in published  # the counts are private state
    scores = json.load(open(os.path.join(out + ".private", "selection_scores.json")))
    [counts] = scores["valid_in_train"]
    assert counts["found"] > 0 and counts["refused"] is False and counts["valid"] == len(valid)


def test_without_hashes_the_selection_says_disjointness_was_not_checked(setup, tmp_path, capsys):
    rc, out = run(setup, tmp_path, setup["valid"])
    err = capsys.readouterr().err
    assert rc == 0 and "note: D_valid was not checked disjoint from D_train" in err
    sel = json.load(open(os.path.join(out, "selection.json")))
    assert sel["disjointness"]["checked"] is False
    assert "NOT checked" in sel["guarantee"] and "epsilon_sequential" in sel["guarantee"]
    assert not sel["guarantee"].startswith("D_valid was split from D data-independently")
