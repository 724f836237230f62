"""Import of Hugging Face checkpoints: parity with transformers on the committed fixtures.

The fixtures (tests/models/fixtures/hf/FAMILY) were written by `make_hf_fixtures.py` with
transformers and CPU torch; their logits and greedy continuations are the reference. Tolerance
1e-5 (float32): a wrong rotary layout changes these logits by ~1e-2.
"""

import hashlib
import json
import os
import pathlib
import re
import shutil

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from dpsynth.models import hf_files, hf_import
from dpsynth.models.decoding import greedy_decode
from dpsynth.models.hf_files import HFFormatError
from dpsynth.models.transformer import Transformer
from trainers import import_model

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "hf"
FAMILIES = ("llama", "mistral", "qwen2", "gemma", "gemma2", "gemma3", "gpt2")
TOL = dict(rtol=1e-5, atol=1e-5)


def _reference(family):
    d = FIXTURES / family
    with open(d / "reference.json") as f:
        return json.load(f), np.load(d / "logits.npz")


@pytest.fixture(scope="module", params=FAMILIES)
def imported(request):
    source = hf_import.inspect(str(FIXTURES / request.param))
    return source, hf_import.load_params(source)


def test_logits_greedy_and_tokenizer_match_transformers(imported):
    source, params = imported
    ref, logits = _reference(source.family)
    model = Transformer(source.config)
    tokenizer, _ = hf_import.load_hf_tokenizer(source)
    apply = jax.jit(lambda p, x: model.apply({"params": p}, x))
    for i, prompt in enumerate(ref["prompts"]):
        assert tokenizer.encode(prompt["text"]).tolist() == prompt["ids"]
        assert tokenizer.decode(prompt["ids"]) == prompt["text"]
        x = jnp.asarray([prompt["inputs"]], jnp.int32)
        np.testing.assert_allclose(np.asarray(apply(params, x))[0], logits[f"prompt_{i}"], **TOL)
        greedy = greedy_decode(model, {"params": params}, x, jnp.asarray([x.shape[1]]), 64, len(prompt["greedy"]))
        assert np.asarray(greedy)[0].tolist() == prompt["greedy"]


def test_family_features_are_configured():
    cfg = {f: hf_import.inspect(str(FIXTURES / f)).config for f in FAMILIES}
    assert cfg["llama"].rope_scaling == "llama3" and cfg["llama"].kv_heads == 2 and not cfg["llama"].tie_embeddings
    assert cfg["mistral"].layer_kinds == ("sliding", "sliding") and cfg["mistral"].sliding_window == 5
    assert cfg["qwen2"].qkv_bias and not cfg["qwen2"].o_bias
    assert cfg["gemma"].norm_scale_offset == 1.0 and cfg["gemma"].kv_heads == 1 and cfg["gemma"].scale_embedding
    assert cfg["gemma2"].attn_softcap == 5.0 and cfg["gemma2"].final_softcap == 3.0 and cfg["gemma2"].post_norms
    assert cfg["gemma3"].qk_norm and cfg["gemma3"].rope_local_base == 10000.0 and cfg["gemma3"].rope_scaling == "linear"
    assert cfg["gpt2"].positions == "learned" and cfg["gpt2"].norm == "layernorm" and cfg["gpt2"].mlp == "gelu"


def test_rotary_layout_matters():
    """Pairing adjacent dimensions instead of halves (the classic permutation bug) breaks parity."""
    source = hf_import.inspect(str(FIXTURES / "llama"))
    params = hf_import.load_params(source)
    ref, logits = _reference("llama")
    hd = source.config.head_dim
    perm = np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])

    def permute(kernel, heads):  # what a converter for an interleaved rotary layout would do
        k = np.asarray(kernel).reshape(kernel.shape[0], heads, hd)
        return jnp.asarray(k[:, :, perm].reshape(kernel.shape))

    bad = jax.tree.map(lambda x: x, params)
    for i in range(source.config.num_layers):
        att = bad[f"layer_{i}"]["attention"]
        att["q"]["kernel"] = permute(att["q"]["kernel"], source.config.num_heads)
        att["k"]["kernel"] = permute(att["k"]["kernel"], source.config.kv_heads)
    x = jnp.asarray([ref["prompts"][1]["inputs"]], jnp.int32)
    out = np.asarray(Transformer(source.config).apply({"params": bad}, x))[0]
    assert np.abs(out - logits["prompt_1"]).max() > 1e-3


def _copy(family, tmp_path) -> pathlib.Path:
    out = tmp_path / family
    shutil.copytree(FIXTURES / family, out)
    return out


def _split_into_shards(directory: pathlib.Path, dtype=None) -> None:
    """Rewrites model.safetensors as two shards plus an index (optionally cast to `dtype`)."""
    infos = hf_files.read_header(str(directory / hf_files.SINGLE_FILE))
    names = sorted(infos)
    weight_map = {}
    for k, part in enumerate((names[: len(names) // 2], names[len(names) // 2:])):
        file = f"model-{k + 1:05d}-of-00002.safetensors"
        tensors = {n: np.asarray(hf_files.read_tensor(infos[n])) for n in part}
        if dtype is not None:
            tensors = {n: t.astype(dtype) for n, t in tensors.items()}
        hf_files.write_safetensors(str(directory / file), tensors)
        weight_map.update({n: file for n in part})
    os.remove(directory / hf_files.SINGLE_FILE)
    with open(directory / hf_files.INDEX_FILE, "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def test_sharded_bfloat16_checkpoint_loads_into_an_8_device_mesh(tmp_path):
    from dpsynth.train.sharding import make_mesh

    assert len(jax.devices()) == 8
    d = _copy("gemma2", tmp_path)
    _split_into_shards(d, dtype=ml_dtypes.bfloat16)
    source = hf_import.inspect(str(d), dtype="bfloat16")
    assert len(source.files) == 2
    mesh = make_mesh(data=2, model=4)
    params = hf_import.load_params(source, param_dtype="bfloat16", mesh=mesh)
    leaves = jax.tree.leaves(params)
    assert all(x.dtype == jnp.bfloat16 for x in leaves)
    q = params["layer_0"]["attention"]["q"]["kernel"]  # [embed, heads]: heads split over "model"
    assert q.sharding.spec == jax.sharding.PartitionSpec(None, "model")
    assert len({s.device for s in q.addressable_shards}) == 8
    # Equal to the float32 fixture rounded to bfloat16, tensor by tensor.
    ref = hf_import.load_params(hf_import.inspect(str(FIXTURES / "gemma2")))
    for a, b in zip(leaves, jax.tree.leaves(ref)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b).astype(ml_dtypes.bfloat16))
    ref_json, logits = _reference("gemma2")
    x = jnp.asarray([ref_json["prompts"][0]["inputs"]], jnp.int32)
    out = np.asarray(Transformer(source.config).apply({"params": params}, x))[0]
    np.testing.assert_allclose(out, logits["prompt_0"], atol=0.1)  # bfloat16 compute


def test_import_model_writes_a_loadable_model_dir(tmp_path):
    from dpsynth.models.directory import load_model

    out = tmp_path / "model"
    assert import_model.main(["--hf", str(FIXTURES / "qwen2"), "--out", str(out)]) == 0
    loaded = load_model(str(out))
    src = loaded.manifest["source"]
    assert src["family"] == "qwen2" and src["pretraining_data_checked"] is False
    assert src["weights_sha256"]["model.safetensors"] == hashlib.sha256(
        (FIXTURES / "qwen2" / "model.safetensors").read_bytes()).hexdigest()
    assert len(src["config_sha256"]) == 64 and loaded.config.preset == "hf:qwen2"
    hf_cfg = json.loads((FIXTURES / "qwen2" / "config.json").read_text())
    assert loaded.tokenizer.kind == "hf" and loaded.tokenizer.eos_id == hf_cfg["eos_token_id"]
    assert loaded.tokenizer.pad_id == hf_cfg["pad_token_id"]
    ref, logits = _reference("qwen2")
    x = jnp.asarray([ref["prompts"][0]["inputs"]], jnp.int32)
    out_logits = np.asarray(Transformer(loaded.config).apply(loaded.variables, x))[0]
    np.testing.assert_allclose(out_logits, logits["prompt_0"], **TOL)
    assert loaded.tokenizer.encode(ref["prompts"][0]["text"]).tolist() == ref["prompts"][0]["ids"]


def test_sentencepiece_special_ids_come_from_the_config(tmp_path):
    from dpsynth.models.directory import load_model

    hf_import.import_model(str(FIXTURES / "gemma"), str(tmp_path / "m"))
    tok = load_model(str(tmp_path / "m")).tokenizer
    assert (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 1, 2) and tok.kind == "sentencepiece"
    hf_import.import_model(str(FIXTURES / "mistral"), str(tmp_path / "m2"))
    tok = load_model(str(tmp_path / "m2")).tokenizer
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 2)  # no pad in the config: eos pads


# ------------------------------------------------------------------------------ bad input


def _edit_config(d: pathlib.Path, **changes):
    path = d / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


@pytest.mark.parametrize("changes, message", [
    (dict(model_type="falcon", architectures=["FalconForCausalLM"]), "model_type 'falcon'"),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}), "rope_type 'yarn' is not implemented"),
    (dict(hidden_act="relu"), "activation 'relu' is not implemented"),
    (dict(hidden_size=None), "required field 'hidden_size'"),
    (dict(num_key_value_heads=4), "self_attn.k_proj.weight' has shape [32, 64]"),
    (dict(tie_word_embeddings=True), "tensor 'lm_head.weight' differs from 'model.embed_tokens.weight'"),
])
def test_bad_config_names_file_and_field(tmp_path, changes, message):
    d = _copy("llama", tmp_path)
    _edit_config(d, **changes)
    with pytest.raises(HFFormatError) as e:
        hf_import.inspect(str(d))
    assert message in str(e.value)
    assert str(d) in str(e.value)


def test_missing_and_unexpected_tensors_are_named(tmp_path):
    d = _copy("gpt2", tmp_path)
    infos = hf_files.read_header(str(d / hf_files.SINGLE_FILE))
    tensors = {n: np.asarray(hf_files.read_tensor(i)) for n, i in infos.items()}
    del tensors["transformer.h.1.mlp.c_fc.bias"]
    hf_files.write_safetensors(str(d / hf_files.SINGLE_FILE), tensors)
    with pytest.raises(HFFormatError, match=r"model.safetensors: tensor 'transformer.h.1.mlp.c_fc.bias' is missing"):
        hf_import.inspect(str(d))
    tensors["transformer.h.1.mlp.c_fc.bias"] = np.zeros(64, np.float32)
    tensors["transformer.h.0.attn.extra"] = np.zeros(3, np.float32)
    hf_files.write_safetensors(str(d / hf_files.SINGLE_FILE), tensors)
    with pytest.raises(HFFormatError, match=r"model.safetensors: unexpected tensor 'transformer.h.0.attn.extra'"):
        hf_import.inspect(str(d))


def test_truncated_weights_and_missing_shard_are_named(tmp_path):
    d = _copy("gemma", tmp_path)
    data = (d / hf_files.SINGLE_FILE).read_bytes()
    (d / hf_files.SINGLE_FILE).write_bytes(data[:-100])
    with pytest.raises(HFFormatError, match=r"model.safetensors: tensor .* truncated"):
        hf_import.inspect(str(d))
    d2 = _copy("gemma3", tmp_path)
    _split_into_shards(d2)
    os.remove(d2 / "model-00002-of-00002.safetensors")
    with pytest.raises(HFFormatError, match=r"index.json: lists shard 'model-00002-of-00002.safetensors', which is "
                                            r"missing"):
        hf_import.inspect(str(d2))


def test_tokenizer_larger_than_embedding_is_refused(tmp_path):
    d = _copy("gemma3", tmp_path)
    _edit_config(d, vocab_size=200)
    infos = hf_files.read_header(str(d / hf_files.SINGLE_FILE))
    tensors = {n: np.asarray(hf_files.read_tensor(i)) for n, i in infos.items()}
    tensors["model.embed_tokens.weight"] = tensors["model.embed_tokens.weight"][:200]
    hf_files.write_safetensors(str(d / hf_files.SINGLE_FILE), tensors)
    with pytest.raises(HFFormatError, match=r"tokenizer.json: the tokenizer has 300 ids but tensor "
                                            r"'model.embed_tokens.weight' .* has only 200 rows"):
        hf_import.import_model(str(d), str(tmp_path / "out"))


@pytest.mark.hf
def test_live_transformers_parity(tmp_path):
    """Regenerates one fixture with transformers and compares (only where torch/transformers are installed)."""
    pytest.importorskip("torch", reason="torch/transformers not installed: the committed fixtures are the reference")
    pytest.importorskip("transformers", reason="transformers not installed: the committed fixtures are the reference")
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_hf_fixtures", FIXTURES.parent / "make_hf_fixtures.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    for family in ("llama", "gemma3", "gpt2"):
        gen.make(family, str(tmp_path))
        source = hf_import.inspect(str(tmp_path / family))
        params = hf_import.load_params(source)
        ref = json.loads((tmp_path / family / "reference.json").read_text())
        logits = np.load(tmp_path / family / "logits.npz")
        x = jnp.asarray([ref["prompts"][1]["inputs"]], jnp.int32)
        np.testing.assert_allclose(np.asarray(Transformer(source.config).apply({"params": params}, x))[0],
                                   logits["prompt_1"], **TOL)


@pytest.mark.parametrize("family", FAMILIES)
def test_num_params_counts_every_family(family):
    config = hf_import.inspect(str(FIXTURES / family)).config
    shapes = hf_import.abstract_params(config)
    assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes)) == config.num_params(("params",))
    lora = config.replace(lora_rank=2, prompt_length=3)
    shapes = jax.eval_shape(Transformer(lora).init, jax.random.PRNGKey(0), jnp.zeros((1, 2), jnp.int32))
    assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes["lora"])) == lora.num_params(("lora",))


def _broken_source(tmp_path, how):
    """(hf_dir, out) broken in one foreseeable way."""
    d, out = _copy("mistral", tmp_path), tmp_path / "out"
    if how == "missing dir":
        return tmp_path / "nowhere", out
    if how == "config not json":
        (d / "config.json").write_text("{not json")
    elif how == "unsupported family":
        _edit_config(d, model_type="falcon", architectures=["FalconForCausalLM"])
    elif how == "eos outside vocabulary":
        _edit_config(d, eos_token_id=10_000)
    elif how == "no tokenizer":
        os.remove(d / "tokenizer.model")
    elif how == "tokenizer corrupt":
        (d / "tokenizer.model").write_bytes(b"\x0a\x05ab")
    elif how == "weights truncated":
        data = (d / hf_files.SINGLE_FILE).read_bytes()
        (d / hf_files.SINGLE_FILE).write_bytes(data[:-10])
    elif how == "out is a file":
        out.write_text("x")
    elif how == "out holds other files":
        out.mkdir()
        (out / "manifest.json").write_text('{"created_by": "dpsynth dp-tune"}')
    elif how == "out under a file":
        (tmp_path / "f").write_text("x")
        out = tmp_path / "f" / "out"
    return d, out


@pytest.mark.parametrize("how, message", [
    ("missing dir", "nowhere/config.json: missing"),
    ("config not json", "config.json: not valid JSON"),
    ("unsupported family", "model_type 'falcon'"),
    ("eos outside vocabulary", "eos_token_id=10000 is outside the vocabulary"),
    ("no tokenizer", "has neither tokenizer.json nor tokenizer.model"),
    ("tokenizer corrupt", "tokenizer.model: cannot be loaded as a tokenizer"),
    ("weights truncated", "model.safetensors: tensor .* truncated"),
    ("out is a file", "out: exists and is not a directory"),
    ("out holds other files", "out: a non-empty directory that no dpsynth run wrote"),  # (`dpsynth.outdir.claim`)
    ("out under a file", "--out .*f/out: cannot be created .*f is a file"),  # checked before any work
])
def test_cli_failures_are_one_line(tmp_path, capsys, how, message):
    hf_dir, out = _broken_source(tmp_path, how)
    capsys.readouterr()
    assert import_model.main(["--hf", str(hf_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dpsynth import-model: error: ") and "Traceback" not in err
    assert re.search(message, err), err


def test_reimport_of_another_model_into_an_import_is_refused_and_a_rerun_is_idempotent(tmp_path, capsys):
    """An --out belongs to one import (`dpsynth.outdir`): another --hf is one line and changes nothing (a
    mixed directory could load the earlier tokenizer); the same flags rerun."""
    from dpsynth.models.directory import load_model

    out = tmp_path / "m"
    assert import_model.main(["--hf", str(FIXTURES / "qwen2"), "--out", str(out)]) == 0
    tree = lambda: {p.name: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}  # noqa: E731
    before = tree()
    capsys.readouterr()
    assert import_model.main(["--hf", str(FIXTURES / "gemma"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another configuration (differs in --hf)" in err[0], err
    assert tree() == before
    assert import_model.main(["--hf", str(FIXTURES / "qwen2"), "--out", str(out)]) == 0
    loaded = load_model(str(out))
    assert loaded.tokenizer.kind != "sentencepiece" and loaded.manifest["source"]["family"] == "qwen2"
