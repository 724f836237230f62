import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpsynth.models import Transformer, get_config
from dpsynth.train import checkpoint, core, lm


@pytest.fixture(scope="module")
def base_model(tmp_path_factory, tiny_corpus):
    _, _, tok = tiny_corpus
    config = get_config("tiny", vocab_size=384, num_layers=1)
    variables = jax.jit(Transformer(config).init)(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))
    path = str(tmp_path_factory.mktemp("models") / "base")
    checkpoint.save_model(path, config, variables, tok, extra_manifest={"steps": 3})
    return path, config, variables, tok


def test_model_directory_roundtrip_and_layout(base_model):
    path, config, variables, tok = base_model
    assert sorted(os.listdir(path)) == ["config.json", "manifest.json", "tokenizer.model", "variables"]
    loaded = checkpoint.load_model(path)
    assert loaded.config == config
    assert checkpoint.variables_allclose(loaded.variables, variables)
    assert loaded.tokenizer.sha256 == tok.sha256
    assert loaded.manifest["format"] == "dpsynth.model" and loaded.manifest["steps"] == 3
    assert loaded.manifest["preset"] == "tiny"


def test_adapter_only_directory_resolves_base(base_model, tmp_path):
    path, config, variables, tok = base_model
    lora_config = config.replace(lora_rank=2, prompt_length=2)
    full = jax.jit(Transformer(lora_config).init)(jax.random.PRNGKey(5), jnp.zeros((1, 4), jnp.int32))
    full["params"] = variables["params"]
    full["lora"] = jax.tree.map(lambda x: x + 1.0, full["lora"])
    tuned = str(tmp_path / "tuned")
    manifest = checkpoint.save_model(tuned, lora_config, full, tok, collections=("lora", "prompt"), base_dir=path)
    assert manifest["base"]["path"] == os.path.abspath(path)
    assert manifest["num_params"] == lora_config.num_params(("lora", "prompt"))
    loaded = checkpoint.load_model(tuned)
    assert checkpoint.variables_allclose(loaded.variables, full)
    # The stored tree holds only the adapters.
    stored = checkpoint.ocp.StandardCheckpointer().restore(os.path.join(tuned, "variables"))
    assert set(stored) == {"lora", "prompt"}


def test_load_errors_say_what_to_do(base_model, tmp_path):
    path, config, variables, tok = base_model
    with pytest.raises(checkpoint.CheckpointError, match="expected 'small'.*--preset tiny"):
        checkpoint.load_model(path, expect_preset="small")
    with pytest.raises(checkpoint.CheckpointError, match="not a dpsynth model directory"):
        checkpoint.load_model(str(tmp_path))
    other = str(tmp_path / "v2")
    checkpoint.save_model(other, config, variables, tok)
    manifest = json.load(open(os.path.join(other, "manifest.json")))
    manifest["format_version"] = 99
    json.dump(manifest, open(os.path.join(other, "manifest.json"), "w"))
    with pytest.raises(checkpoint.CheckpointError, match="format_version 99"):
        checkpoint.load_model(other)
    with pytest.raises(checkpoint.CheckpointError, match="needs base_dir"):
        checkpoint.save_model(str(tmp_path / "x"), config, {"lora": {}}, tok, collections=("lora",))


def test_adapters_refuse_a_changed_base(base_model, tmp_path):
    _, config, variables, tok = base_model
    base = str(tmp_path / "base")
    checkpoint.save_model(base, config, variables, tok)
    lora_config = config.replace(lora_rank=2)
    full = jax.jit(Transformer(lora_config).init)(jax.random.PRNGKey(5), jnp.zeros((1, 4), jnp.int32))
    tuned = str(tmp_path / "tuned")
    checkpoint.save_model(tuned, lora_config, full, tok, collections=("lora",), base_dir=base)
    checkpoint.save_model(base, config, variables, tok, extra_manifest={"retrained": True})
    with pytest.raises(checkpoint.CheckpointError, match="changed since"):
        checkpoint.load_model(tuned)


def test_train_checkpointer_roundtrip(tmp_path):
    params = {"w": jnp.arange(6.0).reshape(2, 3)}
    opt = optax.adafactor(0.01)
    fns = core.make_train_functions(lambda p, f, b, k: (jnp.sum(p["w"]) * b["mask"], {}), opt)
    state = fns.init_state(params, {}, rng=11)
    state, _ = fns.train_step(state, {"mask": jnp.ones((2,))})
    ck = checkpoint.TrainCheckpointer(str(tmp_path / "ckpt"))
    assert ck.latest_step() is None
    ck.save(state, {"rows_consumed": 4})
    fresh = fns.init_state(params, {}, rng=0)
    restored, meta = ck.restore(fresh)
    assert meta == {"rows_consumed": 4} and ck.read_meta() == meta
    assert int(restored.step) == 1
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
        np.testing.assert_array_equal(a, b)
