import dataclasses
import math

import jax
import numpy as np
import pytest

from dpsynth.dp import accounting
from dpsynth.evaluate import classifiers, registry
from dpsynth.evaluate import train_classifier as tc
from dpsynth.evaluate import trainer as tr
from tests.evaluate.conftest import make_records
from tests.dp.ledgers import without_run

CNN = classifiers.WordCNNConfig(vocab_words=200, embed_dim=16, filters=16, hidden=16, max_len=16)
SPEC = tc.ClassifierSpec(wordcnn=CNN)


def test_wordcnn_learns_and_sweep_selects_by_valid_mean():
    train, valid, test = make_records(240, 1), make_records(80, 2), make_records(200, 3)
    sweep = tc.SweepConfig(learning_rates=(1e-4, 1e-2), repeats=2, train=tr.TrainConfig(max_epochs=4, patience=2))
    res = tc.classify(train, valid, {"real": test}, SPEC, sweep)
    assert len(res.trials) == 4
    means = {lr: np.mean([t["valid_accuracy"] for t in res.trials if t["learning_rate"] == lr]) for lr in (1e-4, 1e-2)}
    assert res.selected["learning_rate"] == max(means, key=means.get)
    chosen = [t["real_accuracy"] for t in res.trials if t["learning_rate"] == res.selected["learning_rate"]]
    assert res.test_mean["real"] == pytest.approx(np.mean(chosen)) and res.test_std["real"] == pytest.approx(np.std(chosen))
    assert res.test_mean["real"] > 0.85  # far above chance (0.5) on the toy task
    assert all(1 <= t["best_epoch"] <= 4 for t in res.trials)
    # Balanced accuracy and macro-F1 per trial, and their means / stds over the selected repeats.
    for t in res.trials:
        assert 0 <= t["real_balanced_accuracy"] <= 1 and 0 <= t["real_macro_f1"] <= 1
    assert res.score_mean["real"]["accuracy"] == res.test_mean["real"]
    assert res.score_std["real"]["accuracy"] == res.test_std["real"]
    for m in ("balanced_accuracy", "macro_f1"):
        chosen = [t[f"real_{m}"] for t in res.trials if t["learning_rate"] == res.selected["learning_rate"]]
        assert res.score_mean["real"][m] == pytest.approx(np.mean(chosen)) and res.score_std["real"][m] == pytest.approx(np.std(chosen))
    assert res.score_mean["real"]["balanced_accuracy"] > 0.85


@pytest.mark.parametrize("batch_size", [7, 64, 500])
def test_trainer_scores_its_predictions_like_scikit_learn(batch_size):
    from sklearn.metrics import balanced_accuracy_score, f1_score

    model, split = _splits(150, 12)
    # A skewed test set (about 80% of one class), where accuracy and balanced accuracy differ.
    keep = np.flatnonzero((split.y == 0) | (np.arange(len(split.y)) % 4 == 0))
    split = tr.Split(split.x[keep], split.y[keep])
    trainer = tr.Trainer(model)
    pred = trainer.predict(model.params, model.frozen, split, batch_size)
    assert pred.shape == split.y.shape
    got = trainer.score(model.params, model.frozen, split, batch_size)
    assert got.accuracy == trainer.accuracy(model.params, model.frozen, split, batch_size) == np.mean(pred == split.y)
    assert got.balanced_accuracy == pytest.approx(balanced_accuracy_score(split.y, pred), abs=1e-12)
    assert got.macro_f1 == pytest.approx(f1_score(split.y, pred, average="macro"), abs=1e-12)


def test_dp_trial_is_accounted_at_the_target_epsilon():
    train, valid = make_records(200, 4), make_records(50, 5)
    dp = tr.DPConfig(epsilon=2.0, expected_batch_size=40, microbatch_size=20, epochs=2)
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
        tr.DPConfig(epsilon=math.inf)
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
    assert saved["test_scores_mean"]["real_test"]["accuracy"] == saved["test_mean"]["real_test"]
    assert 0 <= saved["test_scores_mean"]["real_test"]["balanced_accuracy"] <= 1
    assert saved["trials"][0]["real_test_macro_f1"] == saved["test_scores_mean"]["real_test"]["macro_f1"]
    assert "test_scores_mean" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert classify.main(["--train", str(tmp_path / "nope.jsonl"), "--valid", "x", "--test", "y", "--out", str(out)]) == 2


# ----------------------------------------------------------------------------- DP-on-real as labelled

TINY = classifiers.WordCNNConfig(vocab_words=64, embed_dim=8, filters=8, hidden=8, max_len=12)
TINY_SPEC = tc.ClassifierSpec(wordcnn=TINY)


def _splits(n: int, seed: int):
    model = registry.make(TINY_SPEC, None, 2, private=True)
    labels = classifiers.LabelMap(("great", "other"))
    recs = make_records(n, seed)
    return model, tr.Split(model.featurize([r["text"] for r in recs]), labels.encode([r["label"] for r in recs]))


def _fixed_sigma_plan():
    from dpsynth.dp.plan import plan_privacy

    return plan_privacy(dataset_size=60, expected_batch_size=20, steps=3, noise_multiplier=1.0)


_PLAN = _fixed_sigma_plan()  # a given sigma: no calibration needed where only the randomness is tested


def _spy_dp_randomness(monkeypatch):
    """Records every Poisson batch drawn and the base key of every training state."""
    from dpsynth.dp import sampling

    drawn, keys = [], []
    real_batches, real_init = sampling.PoissonSampler.microbatches, tr.Trainer._init_state

    def microbatches(self, step):
        out = real_batches(self, step)
        drawn.append(np.concatenate(out).tolist())
        return out

    def init_state(self, fns, config, rng=None):
        state = real_init(self, fns, config, rng)
        keys.append(np.asarray(state.rng).tolist())
        return state

    monkeypatch.setattr(sampling.PoissonSampler, "microbatches", microbatches)
    monkeypatch.setattr(tr.Trainer, "_init_state", init_state)
    return drawn, keys


def test_dp_sampling_and_noise_seed_is_secret_unless_fixed(monkeypatch):
    drawn, keys = _spy_dp_randomness(monkeypatch)
    model, train = _splits(60, 1)
    trainer = tr.Trainer(model)
    cfg = tr.TrainConfig(seed=0)  # the same public configuration every time
    dp = tr.DPConfig(epsilon=4.0, expected_batch_size=20, microbatch_size=20, epochs=1)
    runs = []
    for d in (dp, dp, dataclasses.replace(dp, seed=123), dataclasses.replace(dp, seed=123)):
        drawn.clear(), keys.clear()
        trainer.train_dp(train, train, {}, cfg, d, plan=_PLAN)
        runs.append((list(drawn), list(keys)))
    (b1, k1), (b2, k2), (b3, k3), (b4, k4) = runs
    assert len(b1) == 3 and b1 != b2 and k1 != k2  # default: a fresh secret seed per run
    assert b3 == b4 and k3 == k4  # a fixed seed reproduces batches and noise
    assert k1[0] != np.asarray(jax.random.PRNGKey(cfg.seed)).tolist()  # not the public repeat index


def test_seed_never_reaches_any_output(tmp_path, monkeypatch, capsys, caplog):
    import json
    import struct

    from dpsynth.dp import seeds
    from trainers import classify

    secret = 0x5EC7E7_0DD_BA5E
    monkeypatch.setattr(seeds, "secret_seed", lambda: secret)
    for name, s in (("train", 1), ("valid", 2), ("test", 3)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in make_records(40, s)))
    args = ["--train", str(tmp_path / "train.jsonl"), "--valid", str(tmp_path / "valid.jsonl"), "--test",
            str(tmp_path / "test.jsonl"), "--cnn", "small", "--learning-rates", "0.01", "--repeats", "1",
            "--clip-norms", "1", "--epsilon", "4", "--expected-batch-size", "20", "--dp-epochs", "1"]
    fixed = 987654321123
    (tmp_path / "secret").mkdir(), (tmp_path / "fixed").mkdir()
    assert classify.main(args + ["--out", str(tmp_path / "secret" / "r.json")]) == 0
    assert classify.main(args + ["--seed", str(fixed), "--out", str(tmp_path / "fixed" / "r.json")]) == 0
    seeds_used = [secret, fixed, tc.trial_seed(secret, 0), tc.trial_seed(fixed, 0)]
    files = sorted(p for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".jsonl")
    assert {p.name for p in files} == {"r.json", "privacy_report.json", "privacy_report.md"}
    printed = capsys.readouterr()
    blobs = [p.read_bytes() for p in files] + [(printed.out + printed.err + caplog.text).encode()]
    for value in seeds_used:
        for blob in blobs:
            assert str(value).encode() not in blob and struct.pack("<q", value - (1 << 64) * (value >= 1 << 63)) not in blob
    saved = json.loads((tmp_path / "fixed" / "r.json").read_text())
    assert saved["dp"]["fixed_seed"] is True and "seed" not in saved["dp"]
    assert "fixed seed" in {c["name"] for c in saved["privacy"]["side_channels"]}


def _composition_epsilon(q, steps, sigma, k, delta, accountant):
    import dp_accounting
    from dp_accounting import pld, rdp

    one = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    acc = rdp.RdpAccountant() if accountant == "rdp" else pld.PLDAccountant(value_discretization_interval=1e-4)
    return acc.compose(dp_accounting.ComposedDpEvent([one] * k)).get_epsilon(delta)


def _forbid_vocabulary_from_data(monkeypatch):
    from dpsynth.evaluate import text as text_lib

    def forbidden(*a, **k):
        raise AssertionError("the DP vocabulary read D_train")

    monkeypatch.setattr(text_lib.Vocabulary, "build", forbidden)
    monkeypatch.setattr(classifiers.WordFeaturizer, "fit", forbidden)


# One real DP sweep per accounting (a sweep costs a calibration and a compile): the composed one
# also runs with the default vocabulary under a guard that fails on any vocabulary fitted on
# data; the selected-only one opts into a D_train vocabulary, which must be a side channel.
@pytest.mark.parametrize("accounting,vocabulary", [("composed", "auto"), ("selected-only", "train")])
def test_sweep_ledger_is_the_plan_and_the_k_trials_meet_the_target(accounting, vocabulary, monkeypatch):
    from dpsynth.dp import ledger as ledger_lib
    from dpsynth.dp import report as report_lib
    from dpsynth.dp.plan import plan_privacy

    if vocabulary == "auto":
        _forbid_vocabulary_from_data(monkeypatch)
    n, eps = 60, 3.0
    train, valid = make_records(n, 4), make_records(30, 5)
    dp = tr.DPConfig(epsilon=eps, expected_batch_size=20, microbatch_size=20, epochs=1, sweep_accounting=accounting)
    sweep = tc.SweepConfig(learning_rates=(1e-2, 3e-2), clip_norms=(1.0,), repeats=2)
    spec = tc.ClassifierSpec(wordcnn=TINY, options={"vocabulary": vocabulary})
    res = tc.classify(train, valid, {"real": valid}, spec, sweep, dp=dp)
    k = 4
    plan = plan_privacy(dataset_size=n, expected_batch_size=20, epochs=1, epsilon=eps,
                        compositions=k if accounting == "composed" else 1)
    rep = report_lib.check_report(res.privacy)
    ledger = report_lib.ledger_of(rep)
    accounted = range(k) if accounting == "composed" else [next(i for i, t in enumerate(res.trials)
                                                                if t["learning_rate"] == res.selected["learning_rate"])]
    assert [without_run(e) for e in ledger.entries] == [
        plan.ledger_entry(steps=plan.steps, clip_norm=1.0, name=f"dp_on_real trial {i}") for i in accounted]
    assert len({e["run"] for e in ledger.entries}) == 1  # one sweep, one run
    assert all(t["noise_multiplier"] == plan.noise_multiplier and t["steps"] == plan.steps for t in res.trials)
    assert ledger.epsilon() <= eps * (1 + ledger_lib.BUDGET_SLACK) and rep["epsilon"]["rdp"] == ledger.epsilon()
    # Everything that was computed: k trials of the same plan, checked against dp-accounting directly.
    q, steps, sigma = plan.sampling_probability, plan.steps, plan.noise_multiplier
    everything = _composition_epsilon(q, steps, sigma, k, 1 / n, "rdp")
    names = {c["name"] for c in rep["side_channels"]}
    assert {"label set", "dataset sizes"} <= names and "fixed seed" not in names
    if accounting == "composed":
        assert everything <= eps * (1 + 1e-6) and everything == pytest.approx(eps, rel=0.02)
        assert _composition_epsilon(q, steps, sigma, k, 1 / n, "pld") <= eps
        assert res.trials[0]["epsilon"] < eps / 1.5  # one trial alone spends far less
        assert "validation-based selection" in names
        assert rep["vocabulary"]["source"] == "hashing" and not any("vocabulary" in c for c in names)
    else:
        assert everything > 1.5 * eps  # the paper's accounting covers one trial, not the sweep
        assert _composition_epsilon(q, steps, sigma, 1, 1 / n, "rdp") <= eps * (1 + 1e-6)
        assert {"selected-only accounting", "vocabulary from D_train"} <= names
        summary = tc.privacy_summary(rep)
        assert summary["vocabulary"] == "train" and summary["trials_accounted"] == 1
        assert "vocabulary from D_train" in {c["name"] for c in summary["side_channels"]}
    assert rep["sweep_accounting"] == accounting and rep["plan"]["compositions"] == plan.compositions


@pytest.mark.parametrize("split", ["files", "positional"])
def test_dp_selected_sweep_accounts_the_selection_on_valid(split):
    """`select_epsilon`: the setting is chosen by the exponential mechanism on D_valid counts, the trials
    keep their last epoch, the ledger holds the selection (dataset D_valid) and the report's epsilon is
    the parallel (max) or sequential composition; the non-DP selection channel is gone."""
    from dpsynth.dp import private_selection as ps
    from dpsynth.dp import report as report_lib

    n, eps = 60, 3.0
    train, valid = make_records(n, 4), make_records(30, 5)
    dp = tr.DPConfig(epsilon=eps, expected_batch_size=20, microbatch_size=20, epochs=1, select_epsilon=0.5,
                     valid_split=split, seed=3)
    res = tc.classify(train, valid, {"real": valid}, tc.ClassifierSpec(wordcnn=TINY),
                      tc.SweepConfig(learning_rates=(1e-2, 3e-2), clip_norms=(1.0,), repeats=1), dp=dp)
    rep = report_lib.check_report(res.privacy)
    entries = rep["ledger"]["entries"]
    assert [e["mechanism"] for e in entries] == ["dpsgd", "dpsgd", "exponential"]
    group = 1 if split == "files" else 2  # positional: one record of D may change two of D_valid
    assert entries[-1]["run"] and without_run(entries[-1]) == {"mechanism": "exponential", "name": "dp_on_real selection", "epsilon": 0.5 * group,
                           "candidates": 2, "dataset": "D_valid", **({"group": 2} if group == 2 else {})}
    g = ps.guarantee(entries, rep["delta"], ps.PARALLEL if split == "files" else ps.SEQUENTIAL)
    assert rep["epsilon"]["rdp"] == g["epsilon"]["rdp"] and rep["selection"]["composition"] == g["composition"]
    if split == "files":
        assert rep["epsilon"]["rdp"] <= eps * (1 + 1e-6)  # the selection (0.5) stays within the training's epsilon
    else:
        assert rep["epsilon"]["rdp"] > g["epsilon_by_dataset"]["D_train"]["rdp"]
    assert not any(c["name"].startswith("validation-based") for c in rep["side_channels"])
    with pytest.raises(ValueError):
        tr.DPConfig(epsilon=1.0, select_epsilon=0.0)
    with pytest.raises(ValueError):
        tr.DPConfig(epsilon=1.0, valid_split="last10")


def test_early_stopping_keep_last_keeps_the_last_epoch():
    accs = iter([0.9, 0.5, 0.7])
    stopper = tr._EarlyStopping(lambda state: next(accs), 1, None, keep_last=True)
    for done in (1, 2, 3):
        stopper.evaluate(done, _State(done))
    assert stopper.best_epoch == 3 and stopper.best_params == 3 and stopper.best_acc == 0.7


class _State:
    def __init__(self, params):
        self.params = params


@pytest.mark.parametrize("k", [1, 3, 12])
@pytest.mark.parametrize("eps", [0.5, 4.0])
def test_composed_plan_meets_the_target_over_k_trials(k, eps):
    plan = tr.DPConfig(epsilon=eps, expected_batch_size=50, epochs=2).plan(1000, k)
    assert plan.compositions == k
    got = _composition_epsilon(plan.sampling_probability, plan.steps, plan.noise_multiplier, k, plan.delta, "rdp")
    assert got <= eps * (1 + 1e-6) and got == pytest.approx(eps, rel=0.02)


def test_dp_vocabulary_is_public_by_default(monkeypatch, tmp_path, tiny_lm):
    _forbid_vocabulary_from_data(monkeypatch)
    hashed = registry.make(TINY_SPEC, None, 2, private=True)
    assert hashed.vocabulary["source"] == "hashing" and hashed.vocabulary["size"] == TINY.vocab_words + 2
    # With a model directory: the pieces of its (public) tokenizer, whatever D_train holds.
    _, _, tok = tiny_lm
    tok.save(str(tmp_path / "tokenizer.model"))
    spec = tc.ClassifierSpec(wordcnn=TINY, model_dir=str(tmp_path))
    a, b = (registry.make(spec, None, 2, private=True) for _ in range(2))
    probe = [r["text"] for r in make_records(5, 8)]
    assert a.vocabulary["source"] == "tokenizer" and a.vocabulary["size"] == tok.vocab_size
    np.testing.assert_array_equal(a.featurize(probe), b.featurize(probe))
    np.testing.assert_array_equal(a.featurize(probe)[:, 1:4], np.stack([tok.encode(t)[:3] for t in probe]))
    # Non-private training keeps the paper's protocol (its own training set).
    monkeypatch.undo()
    train = [r["text"] for r in make_records(60, 6)]
    assert registry.make(TINY_SPEC, train, 2).vocabulary["source"] == "train"
    assert registry.make(dataclasses.replace(TINY_SPEC, options={"vocabulary": "train"}), train, 2,
                         private=True).vocabulary["source"] == "train"  # only when asked for


def test_training_loops_report_step_progress(capsys):
    model, train = _splits(60, 1)
    trainer = tr.Trainer(model, progress_interval=0.0)
    trainer.train_dp(train, train, {}, tr.TrainConfig(), tr.DPConfig(epsilon=4.0, expected_batch_size=20,
                                                                     microbatch_size=20, epochs=1),
                     plan=_PLAN, desc="dp trial")
    trainer.train(train, train, {}, tr.TrainConfig(batch_size=20, max_epochs=1), desc="plain trial")
    err = capsys.readouterr().err
    assert "dp trial: 1/3 step" in err and "dp trial: 3/3 step (100.0%)" in err and "ETA" in err
    assert "plain trial: 3/3 step" in err and "step/s" in err


def test_classify_flags_are_bound_from_classify_config():
    """`dpsynth classify` binds ClassifyConfig (one declaration per setting); flags and defaults as before."""
    from dpsynth import binding
    from trainers import classify

    p = classify.parser()
    options = {s for a in p._actions for s in a.option_strings}
    assert options == {"-h", "--help", "--train", "--valid", "--test", "--classifier", "--model", "--cnn",
                       "--learning-rates", "--weight-decays", "--repeats", "--max-epochs", "--epsilon", "--delta",
                       "--clip-norms", "--expected-batch-size", "--dp-epochs", "--accountant", "--sweep-accounting",
                       "--seed", "--select-epsilon", "--valid-split", "--privacy-report", "--out",
                       "--max-dead-letters", "--verbose", "--encoding",
                       "--wordcnn-vocabulary",  # the WordCNN family's own setting (`wordcnn.WordCNNSettings`)
                       "--backbone-pooling", "--backbone-freeze", "--backbone-truncate"}  # `backbone.BackboneSettings`
    args = p.parse_args(["--train", "a", "--valid", "b", "--test", "c", "--out", "d"])
    assert vars(args) == {
        "train": "a", "valid": "b", "test": "c", "classifier": "wordcnn", "model": None,
        "cnn": "paper", "learning_rates": None, "weight_decays": None, "repeats": 3, "max_epochs": 10,
        "epsilon": None, "delta": None, "clip_norms": (0.5, 1.0), "expected_batch_size": 64, "dp_epochs": 5.0,
        "accountant": "rdp", "sweep_accounting": "composed", "seed": None,
        "select_epsilon": None, "valid_split": "files", "privacy_report": None, "out": "d", "max_dead_letters": "1%",
        "verbose": False, "encoding": "utf-8", "wordcnn_vocabulary": "auto", "backbone_pooling": "mean",
        "backbone_freeze": False, "backbone_truncate": "head"}
    assert binding.from_args(tc.ClassifyConfig, args) == tc.ClassifyConfig()
    got = binding.from_args(tc.ClassifyConfig, p.parse_args(
        ["--train", "a", "--valid", "b", "--test", "c", "--out", "d", "--learning-rates", "0.1,0.2", "--epsilon", "2",
         "--seed", "7", "--classifier", "backbone", "--model", "m"]))
    assert got == tc.ClassifyConfig(learning_rates=(0.1, 0.2), epsilon=2.0, seed=7, classifier="backbone", model="m")
    assert classify._config(p.parse_args(["--train", "a", "--valid", "b", "--test", "c", "--out", "d"])) \
        == tc.ClassifyConfig()
    got = classify._config(p.parse_args(["--train", "a", "--valid", "b", "--test", "c", "--out", "d",
                                         "--classifier", "backbone", "--model", "m", "--backbone-truncate", "tail",
                                         "--backbone-pooling", "last", "--backbone-freeze",
                                         "--wordcnn-vocabulary", "hashing"]))
    assert got.classifier_options == {"backbone": {"truncate": "tail", "pooling": "last", "freeze": True},
                                      "wordcnn": {"vocabulary": "hashing"}}
