"""The model directory (`dpsynth.models.directory`): layout, adapter-only directories, refusals."""

import json
import os

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
import pytest

from dpsynth.models import Transformer, directory, get_config
from tests.train.conftest import tiny_corpus  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def base_model(tmp_path_factory, tiny_corpus):
    _, _, tok = tiny_corpus
    config = get_config("tiny", vocab_size=384, num_layers=1)
    variables = jax.jit(Transformer(config).init)(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))
    path = str(tmp_path_factory.mktemp("models") / "base")
    directory.save_model(path, config, variables, tok, extra_manifest={"steps": 3})
    return path, config, variables, tok


def test_model_directory_roundtrip_and_layout(base_model):
    path, config, variables, tok = base_model
    assert sorted(os.listdir(path)) == ["config.json", "manifest.json", "tokenizer.model", "variables"]
    loaded = directory.load_model(path)
    assert loaded.config == config
    assert directory.variables_allclose(loaded.variables, variables)
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
    manifest = directory.save_model(tuned, lora_config, full, tok, collections=("lora", "prompt"), base_dir=path)
    assert manifest["base"]["path"] == os.path.abspath(path)
    assert manifest["num_params"] == lora_config.num_params(("lora", "prompt"))
    loaded = directory.load_model(tuned)
    assert directory.variables_allclose(loaded.variables, full)
    # The stored tree holds only the adapters.
    stored = ocp.StandardCheckpointer().restore(os.path.join(tuned, "variables"))
    assert set(stored) == {"lora", "prompt"}


def test_load_errors_say_what_to_do(base_model, tmp_path):
    path, config, variables, tok = base_model
    with pytest.raises(directory.CheckpointError, match="expected 'small'.*--preset tiny"):
        directory.load_model(path, expect_preset="small")
    with pytest.raises(directory.CheckpointError, match="not a dpsynth model directory"):
        directory.load_model(str(tmp_path))
    other = str(tmp_path / "v2")
    directory.save_model(other, config, variables, tok)
    manifest = json.load(open(os.path.join(other, "manifest.json")))
    manifest["format_version"] = 99
    json.dump(manifest, open(os.path.join(other, "manifest.json"), "w"))
    with pytest.raises(directory.CheckpointError, match="format_version 99"):
        directory.load_model(other)
    with pytest.raises(directory.CheckpointError, match="needs base_dir"):
        directory.save_model(str(tmp_path / "x"), config, {"lora": {}}, tok, collections=("lora",))


def test_adapters_refuse_a_changed_base(base_model, tmp_path):
    _, config, variables, tok = base_model
    base = str(tmp_path / "base")
    directory.save_model(base, config, variables, tok)
    lora_config = config.replace(lora_rank=2)
    full = jax.jit(Transformer(lora_config).init)(jax.random.PRNGKey(5), jnp.zeros((1, 4), jnp.int32))
    tuned = str(tmp_path / "tuned")
    directory.save_model(tuned, lora_config, full, tok, collections=("lora",), base_dir=base)
    directory.save_model(base, config, variables, tok, extra_manifest={"retrained": True})
    with pytest.raises(directory.CheckpointError, match="changed since"):
        directory.load_model(tuned)
