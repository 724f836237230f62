"""The evaluation with a saved dpsynth checkpoint: LM features, backbone classifier, perplexity."""

import json
import math

import numpy as np

from dpsynth.evaluate import embed, lm, mauve, report, scoring
from dpsynth.evaluate import train_classifier as tc
from dpsynth.evaluate import trainer as tr
from tests.evaluate.conftest import make_records


def test_checkpoint_drives_embedder_backbone_and_perplexity(tiny_lm, tmp_path):
    from dpsynth.models.directory import save_model

    cfg, variables, tok = tiny_lm
    model_dir = str(tmp_path / "model")
    save_model(model_dir, cfg, variables, tok)
    corpus = tmp_path / "synth"
    corpus.mkdir()
    for split, n, seed in (("train", 60, 1), ("valid", 20, 2)):
        (corpus / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in make_records(n, seed)))
    (corpus / "generation_config.json").write_text(json.dumps({"model_dir": model_dir}))
    real = scoring.RealData(make_records(60, 3), make_records(60, 4))
    config = scoring.EvaluateConfig(
        classifiers=("backbone",), model_dir=model_dir, backbone_max_len=32, real_baseline=False,
        mauve=mauve.MauveConfig(kmeans_num_redo=1), mauve_seeds=(0,),
        sweep=tc.SweepConfig(learning_rates=(1e-3,), repeats=1, train=tr.TrainConfig(max_epochs=1)))
    out = report.evaluate([str(corpus)], real, str(tmp_path / "out"), config)
    (row,) = out["rows"]
    assert row["status"] == "ok", row.get("error")
    assert row["embedder"] == f"lm:{model_dir}" and 0 < row["mauve"] <= 1
    direct = lm.LanguageModel.load(model_dir).perplexity(real.test, ["great", "other"])
    assert math.isfinite(row["perplexity"]) and row["perplexity"] == direct["perplexity"]
    assert 0 <= row["backbone_accuracy"] <= 1
    feats = embed.make_embedder(f"lm:{model_dir}").embed(["great tea"])
    assert feats.shape == (1, cfg.d_model) and np.all(np.isfinite(feats))
