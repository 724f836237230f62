"""Canaries through the release: planting, the attacker's scores, the replayed configs, and
(slow) the whole loop testing the test: memorisation seen at epsilon = inf, bounds below epsilon."""

import math

import numpy as np
import pytest

from dpsynth.release_audit import canaries as C
from dpsynth.release_audit.run import AuditError
from tests.release_audit.conftest import WordTokenizer
from tests.train.conftest import make_records


def test_plant_inserts_each_canary_repeats_times_under_labels_in_turn():
    train = [{"id": "a", "text": "x", "label": "great"}]
    out = C.plant(train, ["c0", "c1", "c2"], ["great", "other"], repeats=2)
    assert out[:1] == train and len(out) == 7
    assert [(r["text"], r["label"]) for r in out[1:]] == [("c0", "great")] * 2 + [("c1", "other")] * 2 + [("c2", "great")] * 2
    assert len({r["id"] for r in out}) == 7
    with pytest.raises(ValueError, match="label"):
        C.plant(train, ["c"], [], 1)


def test_scores_rank_canaries_that_the_corpus_repeats_first():
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(150)]
    canaries = [" ".join(rng.choice(words, 8)) for _ in range(20)]
    corpus = [" ".join(rng.choice(words[:40], 12)) for _ in range(60)]
    corpus += [canaries[i] for i in range(5)] + [" ".join(canaries[i].split()[2:6]) for i in range(5, 10)]
    scores, runs = C.score_canaries(corpus, canaries, WordTokenizer())
    assert runs[:5].tolist() == [8] * 5 and all(runs[5:10] >= 4)  # verbatim and partial copies (suffix arrays)
    assert scores[:10].min() > scores[10:].max()  # copied canaries are likelier under the corpus's n-gram LM


def test_canary_verdict_reads_the_p_value_and_the_bounds():
    from dpsynth.dp import audit

    same = audit.canary_statistics(np.arange(32.0) + 0.5, np.arange(32.0), delta=1e-4)
    sep = audit.canary_statistics(np.arange(32.0) + 100.0, np.arange(32.0), delta=1e-4)
    assert C.canary_verdict(same, accounted_epsilon=3.0, repeats=1) == C.AT_CHANCE
    assert C.canary_verdict(sep, accounted_epsilon=3.0, repeats=1) == C.DISTINGUISHED
    assert C.canary_verdict(sep, accounted_epsilon=math.inf, repeats=1) == C.DISTINGUISHED
    # Perfect separation of 32 + 32 certifies about 1.8 (docs/audit.md): above an accounted 1,
    # a contradiction with one-time canaries, group privacy's to answer for with 4 copies.
    assert min(sep["epsilon_lb_clopper_pearson"], sep["epsilon_lb_one_run"]) > 1.0
    assert C.canary_verdict(sep, accounted_epsilon=1.0, repeats=1) == C.CONTRADICTED
    assert C.canary_verdict(sep, accounted_epsilon=1.0, repeats=4) == C.DISTINGUISHED


def test_replay_of_reads_the_recorded_configs(tmp_path):
    import json

    model, corpus = tmp_path / "model", tmp_path / "corpus"
    model.mkdir()
    corpus.mkdir()
    (model / "manifest.json").write_text(json.dumps({
        "labels": ["a", "b"], "base": {"path": "/base", "manifest_sha256": "0"},
        "dp_tune": {"config": {"mode": "lora", "epsilon": "inf", "delta": 1e-6, "steps": 7, "seed": "fixed (value withheld)",
                               "learning_rate": 0.01}}}))
    (corpus / "generation_config.json").write_text(json.dumps({
        "model_dir": str(model), "seed": 3, "examples_per_shard": 50, "num_examples": {"train": 90, "valid": 10},
        "label_distribution": {"labels": ["a", "b"]}, "postprocess": {"drop": ["empty"], "oversample": 1.2},
        "sampler": {"temperature": 0.8, "top_k": 5, "num_decodes": 1, "max_len": 40, "batch_size": 8}}))
    r = C.replay_of(str(corpus))
    assert r.base_dir == "/base" and r.labels == ("a", "b") and (r.num_examples, r.valid_examples) == (90, 10)
    assert r.tune_config.mode == "lora" and math.isinf(r.tune_config.epsilon) and r.tune_config.seed is None
    assert r.tune_config.steps == 7 and r.tune_config.delta == 1e-6
    assert r.tune_config.label_contrast == 0.0  # a record leaves out an unused contrast: off, not "auto"
    assert r.generate_options["sampling"].temperature == 0.8 and r.generate_options["seed"] == 3
    assert r.generate_options["postprocess"].drop == ("empty",)
    from dpsynth.generate.job import GenerateConfig

    replayed = GenerateConfig(model_dir=str(model), out_dir=str(tmp_path / "o"), num_examples=1, **r.generate_options)
    assert (replayed.sampling.top_k, replayed.max_len, replayed.batch_size, replayed.seed) == (5, 40, 8, 3)
    # A record leaves out the "full" form (the one form of older records): a replay on 5 labels keeps
    # it full, not the "auto" that would sample; a sampled run records its form.
    for recorded, form in (({}, "full"), ({"label_contrast_form": "sampled"}, "sampled")):
        (model / "manifest.json").write_text(json.dumps({
            "labels": ["a", "b", "c", "d", "e"], "base": {"path": "/base", "manifest_sha256": "0"},
            "dp_tune": {"config": {"mode": "lora", "epsilon": 3.0, "label_contrast": 1.0, **recorded}}}))
        replayed = C.replay_of(str(corpus)).tune_config
        assert replayed.label_contrast == 1.0 and replayed.label_contrast_form == form
    (model / "manifest.json").write_text(json.dumps({"labels": ["a"]}))
    with pytest.raises(AuditError, match="no dp-tune config"):
        C.replay_of(str(corpus))


def _run(tiny_base, tmp_path, epsilon, repeats, steps):
    from dpsynth.train.tune_config import TuneConfig

    base_dir, _ = tiny_base
    cfg = TuneConfig(mode="full", epsilon=epsilon, delta=1e-5, batch_size=16, steps=steps, microbatch_size=16,
                     max_tokens=32, learning_rate=1e-2, checkpoint_every=10**6, seed=1)
    return C.release_canary_audit(base_dir, make_records(48, 1), [], str(tmp_path / f"eps{epsilon}"), cfg,
                                  num_examples=200, canaries=C.CanaryConfig(num_canaries=24, repeats=repeats, length=10),
                                  generate_options={"max_len": 32, "examples_per_shard": 1000, "batch_size": 32})


@pytest.mark.slow
def test_the_release_audit_sees_memorisation_without_dp_and_stays_below_epsilon_with_it(tiny_base, tmp_path):
    """~2 minutes on 2 CPU cores: dp-tune and generate twice."""
    control = _run(tiny_base, tmp_path, math.inf, repeats=4, steps=100)
    assert control["accounted_epsilon"] == "inf"
    assert control["auroc"] > 0.9 and control["mean_exposure"] > control["chance_exposure"] + 2
    assert control["auroc_p_value"] < 0.01 and control["verdict"] == C.DISTINGUISHED
    assert control["epsilon_lb_clopper_pearson"] > 0.5 and control["epsilon_lb_one_run"] > 0.5
    assert control["longest_run_in_corpus"]["inserted_mean"] > control["longest_run_in_corpus"]["held_out_mean"] + 2
    private = _run(tiny_base, tmp_path, 2.0, repeats=1, steps=100)
    assert private["accounted_epsilon"] <= 2.0 + 1e-6
    assert private["epsilon_lb_clopper_pearson"] < private["accounted_epsilon"]
    assert private["epsilon_lb_one_run"] < private["accounted_epsilon"]
    assert private["auroc"] < 0.85 and private["verdict"] != C.CONTRADICTED
