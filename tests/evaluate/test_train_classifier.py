import math

import numpy as np
import pytest

from dpsynth.dp import accounting
from dpsynth.evaluate import classifiers
from dpsynth.evaluate import train_classifier as tc
from tests.evaluate.conftest import make_records

CNN = classifiers.WordCNNConfig(vocab_words=200, embed_dim=16, filters=16, hidden=16, max_len=16)
SPEC = tc.ClassifierSpec(wordcnn=CNN)


def test_wordcnn_learns_and_sweep_selects_by_valid_mean():
    train, valid, test = make_records(240, 1), make_records(80, 2), make_records(200, 3)
    sweep = tc.SweepConfig(learning_rates=(1e-4, 1e-2), repeats=2, train=tc.TrainConfig(max_epochs=4, patience=2))
    res = tc.classify(train, valid, {"real": test}, SPEC, sweep)
    assert len(res.trials) == 4
    means = {lr: np.mean([t["valid_accuracy"] for t in res.trials if t["learning_rate"] == lr]) for lr in (1e-4, 1e-2)}
    assert res.selected["learning_rate"] == max(means, key=means.get)
    chosen = [t["real_accuracy"] for t in res.trials if t["learning_rate"] == res.selected["learning_rate"]]
    assert res.test_mean["real"] == pytest.approx(np.mean(chosen)) and res.test_std["real"] == pytest.approx(np.std(chosen))
    assert res.test_mean["real"] > 0.85  # far above chance (0.5) on the toy task
    assert all(1 <= t["best_epoch"] <= 4 for t in res.trials)


def test_dp_trial_is_accounted_at_the_target_epsilon():
    train, valid = make_records(200, 4), make_records(50, 5)
    dp = tc.DPConfig(epsilon=2.0, expected_batch_size=40, microbatch_size=20, epochs=2)
    res = tc.classify(train, valid, {"real": valid}, SPEC,
                      tc.SweepConfig(learning_rates=(1e-2,), clip_norms=(0.5,), repeats=1), dp=dp)
    assert [t["clip_norm"] for t in res.trials] == [0.5] and res.selected["clip_norm"] == 0.5
    for t in res.trials:
        assert t["epsilon"] <= 2.0 + 1e-6 and t["epsilon"] == pytest.approx(2.0, rel=0.01)
        q, steps = 40 / 200, accounting.steps_for_epochs(2, 40 / 200)
        assert accounting.epsilon(q, steps, t["noise_multiplier"], 1 / 200) == pytest.approx(t["epsilon"])


def test_bad_input_is_rejected_with_names():
    good = make_records(20, 1)
    with pytest.raises(ValueError, match="label sets differ"):
        tc.classify(good, [dict(r, label="x") for r in good], {"real": good}, SPEC)
    with pytest.raises(ValueError, match="record 1 .* empty"):
        tc.classify([good[0], dict(good[1], text="  ")], good, {"real": good}, SPEC)
    with pytest.raises(ValueError, match="finite"):
        tc.DPConfig(epsilon=math.inf)
    with pytest.raises(ValueError, match="model_dir"):
        tc.ClassifierSpec(kind="backbone")


def test_classify_entry_point_writes_trials(tmp_path, capsys):
    import json

    from trainers import classify

    for name, seed in (("train", 1), ("valid", 2), ("test", 3)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in make_records(60, seed)))
    out = tmp_path / "result.json"
    rc = classify.main(["--train", str(tmp_path / "train.jsonl"), "--valid", str(tmp_path / "valid.jsonl"), "--test",
                        str(tmp_path / "test.jsonl"), "--cnn", "small", "--learning-rates", "0.01", "--repeats", "1",
                        "--max-epochs", "1", "--out", str(out)])
    assert rc == 0
    saved = json.loads(out.read_text())
    assert len(saved["trials"]) == 1 and 0 <= saved["test_mean"]["real_test"] <= 1 and saved["dp"] is None
    assert classify.main(["--train", str(tmp_path / "nope.jsonl"), "--valid", "x", "--test", "y", "--out", str(out)]) == 2
