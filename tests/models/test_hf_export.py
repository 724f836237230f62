"""Export to the Hugging Face layout: round trips through import, merged LoRA, PEFT adapters, soft prompts."""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpsynth.models import hf_export, hf_files, hf_import
from dpsynth.models.hf_files import HFFormatError
from dpsynth.models.transformer import Transformer
from dpsynth.train.checkpoint import load_model, save_model
from trainers import export_model

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "hf"
TOL = dict(rtol=1e-5, atol=1e-5)


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


def _lora_model(tmp_path, family, rank=2, prompt_length=0):
    """A LoRA (or prompt) model dir over an imported fixture, with non-zero adapters."""
    hf_import.import_model(str(FIXTURES / family), str(tmp_path / "base"))
    base = load_model(str(tmp_path / "base"))
    config = base.config.replace(lora_rank=rank, prompt_length=prompt_length)
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
    np.testing.assert_allclose(_logits(source.config, {"params": merged}, _tokens("qwen2")), want, **TOL)


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


def test_refusals_name_the_model(tmp_path):
    _lora_model(tmp_path, "gpt2")
    with pytest.raises(HFFormatError, match="GPT-2's fused c_attn"):
        hf_export.export_model(str(tmp_path / "tuned"), str(tmp_path / "x"), adapter_only=True)
    with pytest.raises(HFFormatError, match="needs a LoRA-tuned model"):
        hf_export.export_model(str(tmp_path / "base"), str(tmp_path / "x"), adapter_only=True)


def test_transformers_loads_the_export(tmp_path):
    """Where torch/transformers are installed, they load the export and agree on the logits."""
    torch = pytest.importorskip("torch", reason="torch not installed: round trip through import covers the layout")
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    config, variables = _lora_model(tmp_path, "gemma2")
    hf_export.export_model(str(tmp_path / "tuned"), str(tmp_path / "hf"))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    with torch.no_grad():
        got = model(torch.tensor(_tokens("gemma2"))).logits.float().numpy()
    np.testing.assert_allclose(got, _logits(config, variables, _tokens("gemma2")), **TOL)
