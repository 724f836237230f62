"""DP tuning of an imported Hugging Face model: all three modes, the sparse path of its untied
embedding, the base model's provenance in the report, then generation, evaluation and export."""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpsynth.dp import clipping, sparse
from dpsynth.models import hf_export, hf_import
from dpsynth.train import finetune, lm, tune_config, tune_model, tune_report
from dpsynth.models.directory import load_model
from tests.train.conftest import make_records

FIXTURES = pathlib.Path(__file__).parents[1] / "models" / "fixtures" / "hf"
TRAIN, VALID = make_records(40, 1), make_records(8, 2, "v")
CFG = dict(epsilon=4.0, batch_size=16, steps=2, microbatch_size=16, max_tokens=24, checkpoint_every=2, lora_rank=2,
           prompt_length=2, learning_rate=1e-2)


@pytest.fixture(scope="module")
def llama_base(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "llama"
    hf_import.import_model(str(FIXTURES / "llama"), str(out))
    return str(out)


def test_sparse_embedding_clipping_equals_dense_on_the_untied_model(llama_base):
    base = load_model(llama_base)
    config = tune_config.TuneConfig(mode="full", **CFG)
    assert not base.config.tie_embeddings
    spec = tune_model.embedding_spec(base.config, config)
    assert spec is not None
    sparse_loss = tune_model.make_loss_fn(base.config, config)
    assert isinstance(sparse_loss, sparse.EmbeddedLoss)
    dense_loss = lm.make_lm_loss(__import__("dpsynth.models", fromlist=["Transformer"]).Transformer(base.config),
                                 z_loss=config.z_loss)
    rng = np.random.default_rng(0)
    n, t = 4, 10
    batch = {"inputs": rng.integers(0, 300, (n, t)).astype(np.int32), "targets": rng.integers(0, 300, (n, t)).astype(
        np.int32), "weights": np.ones((n, t), np.float32), "mask": np.array([1, 1, 1, 0], np.float32)}
    params, frozen = {"params": base.variables["params"]}, {}
    clip = 0.05
    want, _, want_norms = clipping.clipped_grad_sum(dense_loss, params, frozen, batch, jax.random.PRNGKey(0), clip)
    got, _, norms = sparse.clipped_grad_sum_sparse_embedding(sparse_loss, params, frozen, batch, jax.random.PRNGKey(0),
                                                             clip)
    np.testing.assert_allclose(norms, want_norms, rtol=1e-4)
    assert float(jnp.min(norms[:3])) > clip  # clipping is active
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-7)
    # A tied model (Gemma) keeps the dense path: its table is also the output layer.
    gemma = hf_import.inspect(str(FIXTURES / "gemma")).config
    assert tune_model.embedding_spec(gemma, config) is None


@pytest.mark.parametrize("mode", [pytest.param("full", marks=pytest.mark.slow), "prompt", "lora"])  # full: ~21 s
def test_dp_tune_every_mode_records_the_base_provenance(llama_base, tmp_path, mode):
    out = str(tmp_path / mode)
    res = finetune.dp_tune(llama_base, TRAIN, VALID, out, tune_config.TuneConfig(mode=mode, **CFG),
                           progress_interval=1e9)
    assert res.steps == 2 and np.isfinite(res.valid_loss)
    rep = json.loads((tmp_path / mode / "privacy_report.json").read_text())
    src = rep["training"]["base_source"]
    assert src["family"] == "llama" and src["pretraining_data_checked"] is False and "hf_config" not in src
    assert rep["training"]["embedding_clipping"] == ("sparse (exact, untied input table)" if mode == "full" else "dense")
    channel = next(c for c in rep["side_channels"] if c["name"] == "pretrained base model")
    assert "NOT checked against the sensitive data" in channel["detail"] and src["config_sha256"] in channel["detail"]
    # No contamination probe was recorded (`dp-tune --contamination-probe`: tests/evaluate/test_contamination.py),
    # and no claim that the base was pretrained on a corpus deduplicated against D.
    assert tune_report.PROBE_NOT_RUN in channel["detail"] and rep["training"]["contamination_probe_run"] is False
    assert "public pretraining corpus" not in {c["name"] for c in rep["side_channels"]}
    assert "its pretraining data was not deduplicated against D" in (tmp_path / mode / "privacy_report.md").read_text()
    tuned = load_model(out)
    assert tuned.manifest["base_source"]["hf_config"]["model_type"] == "llama"
    assert tuned.tokenizer.eos_id == 1  # the imported model's own special ids


def test_imported_model_tune_generate_evaluate_export(llama_base, tmp_path):
    from beam_jobs.metrics import config_from_flags
    from dpsynth.evaluate.report import evaluate
    from dpsynth.evaluate.scoring import RealData
    from dpsynth.generate.job import GenerateConfig, generate

    tuned = str(tmp_path / "lora")
    finetune.dp_tune(llama_base, TRAIN, VALID, tuned, tune_config.TuneConfig(mode="lora", **CFG), progress_interval=1e9)
    synth = str(tmp_path / "synth")
    manifest = generate(GenerateConfig(model_dir=tuned, out_dir=synth, num_examples=6, valid_examples=2,
                                       examples_per_shard=4, batch_size=4, seed=1, max_len=24))
    rows = [json.loads(line) for f in sorted((tmp_path / "synth").rglob("train-*.jsonl")) for line in open(f)]
    assert len(rows) == 6 and {r["label"] for r in rows} <= {"great", "other"} and manifest["splits"]
    config = config_from_flags(classifiers="wordcnn", model_dir=llama_base, repeats=1, max_epochs=1, cnn="small",
                               mauve_seeds=1, real_baseline=False)
    result = evaluate([synth], RealData(TRAIN, VALID, None), str(tmp_path / "eval"), config)
    row = result["rows"][0]
    assert row["status"] == "ok", row.get("error")
    assert np.isfinite(row["perplexity"]) and 0.0 <= row["mauve"] <= 1.0
    record = hf_export.export_model(tuned, str(tmp_path / "hf"))
    assert record["mode"] == "merged" and record["privacy_report"]
    assert (tmp_path / "hf" / "privacy_report.json").exists()
