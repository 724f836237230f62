"""Export to the Hugging Face layout: round trips through import, merged LoRA, PEFT adapters, soft prompts."""

import json
import os
import pathlib
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpsynth.models import hf_export, hf_files, hf_import, hf_tokenizer
from dpsynth.models.hf_files import HFFormatError
from dpsynth.models.transformer import Transformer
from dpsynth.models.directory import load_model, save_model
from trainers import export_model

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "hf"
FAMILIES = ("llama", "mistral", "qwen2", "gemma", "gemma2", "gemma3", "gpt2")
TOL = dict(rtol=1e-5, atol=1e-5)
# Merged weights (W + s B A) against the adapter's own forward pass (x W + s x B A): the same function
# summed in another order, so float32 rounding differs by ~1e-5 on logits of magnitude ~5; the
# adapter's effect on the logits is checked to be > 1e-2 beside it.
MERGED_TOL = dict(rtol=1e-4, atol=1e-4)


def _logits(config, variables, tokens):
    return np.asarray(Transformer(config).apply(variables, jnp.asarray(tokens, jnp.int32)))


def _tokens(family):
    ref = json.loads((FIXTURES / family / "reference.json").read_text())
    return [ref["prompts"][1]["inputs"]]


@pytest.mark.parametrize("family", ["llama", "gemma3", "gpt2"])
def test_export_reimport_round_trip(tmp_path, family):
    hf_import.import_model(str(FIXTURES / family), str(tmp_path / "m"))
    assert export_model.main(["--model", str(tmp_path / "m"), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    exported = hf_files.read_header(str(tmp_path / "hf" / hf_files.SINGLE_FILE))
    original = hf_files.read_header(str(FIXTURES / family / hf_files.SINGLE_FILE))
    assert set(exported) == set(original)  # same tensor names as transformers wrote
    for name in original:
        np.testing.assert_array_equal(hf_files.read_tensor(exported[name]), hf_files.read_tensor(original[name]))
    source = hf_import.inspect(str(tmp_path / "hf"))
    a, b = load_model(str(tmp_path / "m")), hf_import.load_params(source)
    np.testing.assert_array_equal(_logits(a.config, a.variables, _tokens(family)),
                                  _logits(source.config, {"params": b}, _tokens(family)))
    assert json.loads((tmp_path / "hf" / "dpsynth_export.json").read_text())["mode"] == "merged"


def _lora_model(tmp_path, family, rank=2, prompt_length=0, **adapter):
    """A LoRA (or prompt) model dir over an imported fixture, with non-zero adapters."""
    hf_import.import_model(str(FIXTURES / family), str(tmp_path / "base"))
    base = load_model(str(tmp_path / "base"))
    config = base.config.replace(lora_rank=rank, prompt_length=prompt_length, **adapter)
    init = Transformer(config).init(jax.random.PRNGKey(0), jnp.zeros((1, 2), jnp.int32))
    variables = {"params": base.variables["params"]}
    for c in ("lora", "prompt"):
        if c in init:
            variables[c] = jax.tree.map(lambda x: 0.05 * jax.random.normal(jax.random.PRNGKey(1), x.shape), init[c])
    (tmp_path / "tuned").mkdir()
    (tmp_path / "tuned" / "privacy_report.json").write_text('{"epsilon": 3}\n')
    save_model(str(tmp_path / "tuned"), config, variables, base.tokenizer,
               {"base_source": base.manifest["source"]}, collections=[c for c in variables if c != "params"],
               base_dir=str(tmp_path / "base"))
    return config, variables


def test_lora_exports_merged_weights_with_the_privacy_report(tmp_path):
    config, variables = _lora_model(tmp_path, "qwen2")
    hf_export.export_model(str(tmp_path / "tuned"), str(tmp_path / "hf"))
    assert (tmp_path / "hf" / "privacy_report.json").read_text() == '{"epsilon": 3}\n'
    source = hf_import.inspect(str(tmp_path / "hf"))
    merged = hf_import.load_params(source)
    want = _logits(config, variables, _tokens("qwen2"))
    assert np.abs(want - _logits(config.base(), {"params": variables["params"]}, _tokens("qwen2"))).max() > 1e-2
    np.testing.assert_allclose(_logits(source.config, {"params": merged}, _tokens("qwen2")), want, **MERGED_TOL)


def test_adapter_only_writes_a_peft_adapter(tmp_path):
    config, variables = _lora_model(tmp_path, "llama")
    hf_export.export_model(str(tmp_path / "tuned"), str(tmp_path / "ad"), adapter_only=True)
    cfg = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 2 and cfg["lora_alpha"] == config.lora_alpha
    assert sorted(cfg["target_modules"]) == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                    "down_proj"])
    tensors = hf_files.read_header(str(tmp_path / "ad" / "adapter_model.safetensors"))
    name = "base_model.model.model.layers.1.self_attn.k_proj"
    a = np.asarray(hf_files.read_tensor(tensors[f"{name}.lora_A.weight"]))
    b = np.asarray(hf_files.read_tensor(tensors[f"{name}.lora_B.weight"]))
    assert a.shape == (2, 64) and b.shape == (32, 2)  # PEFT: A [r, in], B [out, r]
    # W_hf + scale * B @ A equals the merged export's weight.
    hf_export.export_model(str(tmp_path / "tuned"), str(tmp_path / "merged"))
    merged = hf_files.read_header(str(tmp_path / "merged" / hf_files.SINGLE_FILE))
    base = hf_files.read_header(str(FIXTURES / "llama" / hf_files.SINGLE_FILE))
    w = np.asarray(hf_files.read_tensor(base["model.layers.1.self_attn.k_proj.weight"]))
    np.testing.assert_allclose(w + config.lora_scale * b @ a,
                               hf_files.read_tensor(merged["model.layers.1.self_attn.k_proj.weight"]), **TOL)
    assert not (tmp_path / "ad" / hf_files.SINGLE_FILE).exists()


def test_soft_prompt_exports_as_an_extra_tensor_file(tmp_path):
    config, variables = _lora_model(tmp_path, "gemma", rank=0, prompt_length=3)
    hf_export.export_model(str(tmp_path / "tuned"), str(tmp_path / "hf"))
    prompt = hf_files.read_header(str(tmp_path / "hf" / "soft_prompt.safetensors"))["prompt_embedding"]
    np.testing.assert_array_equal(hf_files.read_tensor(prompt), np.asarray(variables["prompt"]["embedding"]))


def test_gpt2_adapter_fuses_q_k_v_at_three_times_the_rank(tmp_path):
    """GPT-2's c_attn adapter: A = [A_q A_k A_v], B = diag(B_q, B_k, B_v), rank 3r at scale alpha / r."""
    config, variables = _lora_model(tmp_path, "gpt2", rank=2, lora_alpha=5.0)
    hf_export.export_model(str(tmp_path / "tuned"), str(tmp_path / "ad"), adapter_only=True)
    hf_export.export_model(str(tmp_path / "tuned"), str(tmp_path / "merged"))
    cfg = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    assert cfg["r"] == 2 and cfg["lora_alpha"] == 5.0 and cfg["fan_in_fan_out"] is True
    assert cfg["rank_pattern"] == {"attn.c_attn": 6} and cfg["alpha_pattern"] == {"attn.c_attn": 15.0}
    assert cfg["target_modules"] == ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
    adapter = hf_files.read_header(str(tmp_path / "ad" / "adapter_model.safetensors"))
    merged = hf_files.read_header(str(tmp_path / "merged" / hf_files.SINGLE_FILE))
    base = hf_files.read_header(str(FIXTURES / "gpt2" / hf_files.SINGLE_FILE))
    checked = 0
    for i in range(config.num_layers):
        for module in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
            name = f"transformer.h.{i}.{module}"
            a = np.asarray(hf_files.read_tensor(adapter[f"base_model.model.{name}.lora_A.weight"]))
            b = np.asarray(hf_files.read_tensor(adapter[f"base_model.model.{name}.lora_B.weight"]))
            rank = 6 if module == "attn.c_attn" else 2
            assert a.shape[0] == rank and b.shape[1] == rank
            scale = (3 * 5.0 if module == "attn.c_attn" else 5.0) / rank
            w = np.asarray(hf_files.read_tensor(base[f"{name}.weight"]))  # Conv1D: [in, out]
            np.testing.assert_allclose(w + scale * (b @ a).T, hf_files.read_tensor(merged[f"{name}.weight"]), **TOL)
            checked += 1
    assert checked == 4 * config.num_layers


def test_adapter_only_is_refused_without_lora(tmp_path):
    _lora_model(tmp_path, "gemma", rank=0, prompt_length=2)
    for model in ("tuned", "base"):
        with pytest.raises(HFFormatError, match="--adapter-only needs a LoRA-tuned model"):
            hf_export.export_model(str(tmp_path / model), str(tmp_path / "x"), adapter_only=True)
    assert not (tmp_path / "x").exists()  # refused before writing anything


@pytest.mark.parametrize("family", FAMILIES)
def test_export_writes_a_tokenizer_that_agrees_with_the_model(tmp_path, family):
    """tokenizer.json encodes as the model's tokenizer; tokenizer_config.json names its special
    tokens, generation_config.json its eos; every special id lies inside the vocabulary."""
    from tokenizers import Tokenizer as HF

    hf_import.import_model(str(FIXTURES / family), str(tmp_path / "m"))
    model = load_model(str(tmp_path / "m"))
    hf_export.export_model(str(tmp_path / "m"), str(tmp_path / "hf"))
    out = tmp_path / "hf"
    tok = HF.from_file(str(out / "tokenizer.json"))
    for text in hf_tokenizer.SELF_CHECK_TEXTS:
        assert tok.encode(text, add_special_tokens=False).ids == model.tokenizer.encode(text).tolist()
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and cfg["model_max_length"] == model.config.max_len
    ids = model.tokenizer.special_ids
    for name in ("bos", "eos", "pad", "unk"):
        assert tok.token_to_id(cfg[f"{name}_token"]) == ids[name] < model.config.vocab_size
    gen = json.loads((out / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["pad_token_id"]) == (ids["bos"], ids["eos"], ids["pad"])
    hf_cfg = json.loads((FIXTURES / family / "config.json").read_text())
    assert ids["eos"] == hf_cfg["eos_token_id"] and ids["bos"] == hf_cfg["bos_token_id"]
    if (FIXTURES / family / "tokenizer.model").exists():  # SentencePiece: kept, and bos added like its HF classes
        assert (out / "tokenizer.model").read_bytes() == (FIXTURES / family / "tokenizer.model").read_bytes()
        assert tok.encode("privacy").ids == [ids["bos"]] + model.tokenizer.encode("privacy").tolist()
        assert ids["unk"] == spm_unk(FIXTURES / family / "tokenizer.model")  # its own unk, not a fallback
    else:
        assert (out / "tokenizer.json").read_bytes() == (FIXTURES / family / "tokenizer.json").read_bytes()


def spm_unk(path):
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(path)).unk_id()


def test_source_tokenizer_and_generation_configs_are_kept(tmp_path):
    d = tmp_path / "src"
    shutil.copytree(FIXTURES / "llama", d)
    source_tok = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": "{{ messages }}",
                  "model_max_length": 131072, "bos_token": "<bos>", "eos_token": "<bos>",
                  "clean_up_tokenization_spaces": True}
    (d / "tokenizer_config.json").write_text(json.dumps(source_tok))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 1], "temperature": 0.6, "top_p": 0.9,
                                                          "do_sample": True, "bos_token_id": 0}))
    hf_import.import_model(str(d), str(tmp_path / "m"))
    manifest = load_model(str(tmp_path / "m")).manifest
    assert manifest["source"]["hf_tokenizer_config"] == source_tok
    hf_export.export_model(str(tmp_path / "m"), str(tmp_path / "hf"))
    cfg = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert cfg == {**source_tok, "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<pad>"}  # the model's ids
    gen = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert gen == {"eos_token_id": [0, 1], "temperature": 0.6, "top_p": 0.9, "do_sample": True, "bos_token_id": 0,
                   "pad_token_id": 2}
    record = json.loads((tmp_path / "hf" / "dpsynth_export.json").read_text())
    assert not any(k.startswith("hf_") for k in record["source"])


def test_out_must_be_new_empty_or_an_earlier_export(tmp_path):
    _lora_model(tmp_path, "qwen2", rank=2)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(HFFormatError, match="busy: is not empty and holds no dpsynth_export.json"):
        hf_export.export_model(str(tmp_path / "tuned"), str(tmp_path / "busy"))
    assert os.listdir(tmp_path / "busy") == ["notes.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(HFFormatError, match="file: exists and is not a directory"):
        hf_export.export_model(str(tmp_path / "tuned"), str(tmp_path / "file"))
    # An adapter export replaced by a merged one: no adapter file may remain (transformers would load it).
    hf_export.export_model(str(tmp_path / "tuned"), str(tmp_path / "out"), adapter_only=True)
    (tmp_path / "out" / "README.md").write_text("kept")
    hf_export.export_model(str(tmp_path / "tuned"), str(tmp_path / "out"))
    assert sorted(os.listdir(tmp_path / "out")) == sorted(
        ["README.md", "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
         "generation_config.json", "privacy_report.json", "dpsynth_export.json"])
    hf_export.export_model(str(tmp_path / "tuned"), str(tmp_path / "out"), adapter_only=True)
    assert not (tmp_path / "out" / "model.safetensors").exists() and (tmp_path / "out" / "adapter_config.json").exists()


def _break(tmp_path, how):
    """A model directory (or --out) broken in one foreseeable way; returns (model, out)."""
    _lora_model(tmp_path, "llama", rank=2)
    tuned, out = tmp_path / "tuned", tmp_path / "out"
    if how == "missing model":
        return tmp_path / "nowhere", out
    if how == "native model":
        manifest = json.loads((tmp_path / "base" / "manifest.json").read_text())
        del manifest["source"]
        (tmp_path / "base" / "manifest.json").write_text(json.dumps(manifest))
        return tmp_path / "base", out
    if how == "base moved":
        shutil.move(tmp_path / "base", tmp_path / "elsewhere")
    elif how == "base changed":
        (tmp_path / "base" / "manifest.json").write_text((tmp_path / "base" / "manifest.json").read_text() + " ")
    elif how == "bad config":
        (tuned / "config.json").write_text('{"vocab_size": "many"}')
    elif how == "tokenizer gone":
        os.remove(tuned / "tokenizer.json")
    elif how == "variables damaged":
        shutil.rmtree(tuned / "variables")
        (tuned / "variables").mkdir()
    elif how == "out under a file":
        (tmp_path / "f").write_text("x")
        out = tmp_path / "f" / "out"
    elif how == "adapter-only without lora":
        return tmp_path / "base", out
    return tuned, out


@pytest.mark.parametrize("how, message", [
    ("missing model", "manifest.json: missing"),
    ("native model", "not imported from Hugging Face"),
    ("base moved", "its base model .* is missing"),
    ("base changed", "changed since these adapters were trained"),
    ("bad config", "config.json: not a model config"),
    ("tokenizer gone", "its tokenizer cannot be loaded"),
    ("variables damaged", "variables: cannot be read"),
    ("out under a file", "--out .*f/out: cannot be created .*f is a file"),  # checked before any work
    ("adapter-only without lora", "--adapter-only needs a LoRA-tuned model"),
])
def test_cli_failures_are_one_line(tmp_path, capsys, how, message):
    model, out = _break(tmp_path, how)
    argv = ["--model", str(model), "--format", "hf", "--out", str(out)]
    capsys.readouterr()
    assert export_model.main(argv + (["--adapter-only"] if "adapter-only" in how else [])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dpsynth export-model: error: ") and "Traceback" not in err
    assert re.search(message, err), err


@pytest.mark.hf
def test_transformers_loads_the_export(tmp_path):
    """Where torch/transformers are installed, they load the export and agree on the logits."""
    torch = pytest.importorskip("torch", reason="torch not installed: round trip through import covers the layout")
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    config, variables = _lora_model(tmp_path, "gemma2")
    hf_export.export_model(str(tmp_path / "tuned"), str(tmp_path / "hf"))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    with torch.no_grad():
        got = model(torch.tensor(_tokens("gemma2"))).logits.float().numpy()
    np.testing.assert_allclose(got, _logits(config, variables, _tokens("gemma2")), **MERGED_TOL)
