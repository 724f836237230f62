"""Every LoRA and prompt-tuning flag, off its default: `dpsynth dp-tune` tunes, `load_model` loads,
generation runs and `dpsynth export-model` exports (merged and, for LoRA, as a PEFT adapter).

Issue 24: a model tuned with a non-default `--lora-alpha` or `--lora-targets` could not be loaded
(`ModelConfig.base()` kept the adapter's alpha/targets, so the base looked like another model).
Each case below runs the real command-line entry points on an imported fixture (or a native
`tiny` model), one optimizer step with DP noise, so the adapters are non-zero. Together the
cases set every flag off its default: --lora-rank, --lora-alpha, --lora-targets (attention, mlp
and the default all), --prompt-length and --prompt-init vocab.
"""

import json
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

from dpsynth.models import hf_files, hf_import
from dpsynth.models.transformer import Transformer
from dpsynth.models.directory import load_model
from tests.train.conftest import make_records
from trainers import dp_tune, export_model

FIXTURES = pathlib.Path(__file__).parents[1] / "models" / "fixtures" / "hf"
TRAIN = make_records(24, 11)
COMMON = ["--epsilon", "8", "--batch-size", "8", "--steps", "1", "--microbatch-size", "8", "--max-tokens", "20",
          "--learning-rate", "0.05", "--labels", "great", "other", "--seed", "3"]
# (base: a fixture family or "native", flags off their defaults, the ModelConfig fields they set)
CASES = {
    "native-lora-attention": ("native", ["--mode", "lora", "--lora-rank", "3", "--lora-alpha", "8",
                                         "--lora-targets", "attention"],
                              dict(lora_rank=3, lora_alpha=8.0, lora_targets="attention", prompt_length=0)),
    "llama-lora-attention": ("llama", ["--mode", "lora", "--lora-rank", "3", "--lora-alpha", "8",
                                       "--lora-targets", "attention"],
                             dict(lora_rank=3, lora_alpha=8.0, lora_targets="attention", prompt_length=0)),
    "qwen2-lora-mlp": ("qwen2", ["--mode", "lora", "--lora-rank", "2", "--lora-alpha", "4.5", "--lora-targets", "mlp"],
                       dict(lora_rank=2, lora_alpha=4.5, lora_targets="mlp", prompt_length=0)),
    "gpt2-lora-all": ("gpt2", ["--mode", "lora", "--lora-rank", "5", "--lora-alpha", "32"],
                      dict(lora_rank=5, lora_alpha=32.0, lora_targets="all", prompt_length=0)),
    "mistral-prompt-vocab": ("mistral", ["--mode", "prompt", "--prompt-length", "3", "--prompt-init", "vocab"],
                             dict(lora_rank=0, prompt_length=3)),
}
PEFT_NAMES = {"attention": {"q_proj", "k_proj", "v_proj", "o_proj"}, "mlp": {"gate_proj", "up_proj", "down_proj"}}


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in TRAIN))
    return path


@pytest.fixture(scope="module", params=sorted(CASES))
def tuned(request, tmp_path_factory, train_file, tiny_base):
    """(case, base_dir, tuned_dir): `dpsynth dp-tune` with the case's flags."""
    family, flags, _ = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    if family == "native":
        base = tiny_base[0]
    else:
        base = str(root / "base")
        hf_import.import_model(str(FIXTURES / family), base)
    out = root / "tuned"
    assert dp_tune.main(["--base", base, "--train", str(train_file), "--out", str(out), *COMMON, *flags]) == 0
    return request.param, base, out


def _logits(loaded, tokens):
    return np.asarray(Transformer(loaded.config).apply(loaded.variables, jnp.asarray(tokens, jnp.int32)))


def _tokens(loaded):
    tok = loaded.tokenizer
    return [[tok.bos_id, *tok.encode("good coffee, would buy again").tolist()]]


def test_load_and_generate(tuned, tmp_path):
    from dpsynth.generate.job import GenerateConfig, generate

    case, base_dir, out = tuned
    loaded = load_model(str(out))
    for field, value in CASES[case][2].items():
        assert getattr(loaded.config, field) == value, field
    assert loaded.config.base() == load_model(base_dir).config
    base = load_model(base_dir)
    assert np.abs(_logits(loaded, _tokens(loaded)) - _logits(base, _tokens(loaded))).max() > 1e-4  # tuned: it differs
    generate(GenerateConfig(model_dir=str(out), out_dir=str(tmp_path / "synth"), num_examples=4, valid_examples=0,
                            examples_per_shard=4, batch_size=4, seed=1, max_len=20))
    rows = [json.loads(line) for f in sorted((tmp_path / "synth").rglob("train-*.jsonl")) for line in open(f)]
    assert len(rows) == 4 and {r["label"] for r in rows} <= {"great", "other"}


def _export(out, dest, *flags, capsys):
    capsys.readouterr()
    rc = export_model.main(["--model", str(out), "--format", "hf", "--out", str(dest), *flags])
    return rc, capsys.readouterr().err


def test_export_merged(tuned, tmp_path, capsys):
    case, _, out = tuned
    rc, err = _export(out, tmp_path / "hf", capsys=capsys)
    if CASES[case][0] == "native":
        assert rc == 2 and err.count("\n") == 1 and "not imported from Hugging Face" in err
        return
    assert rc == 0, err
    loaded = load_model(str(out))
    exported = hf_import.inspect(str(tmp_path / "hf"))
    params = hf_import.load_params(exported)
    if loaded.config.prompt_length:  # weights unchanged, the soft prompt beside them
        prompt = hf_files.read_header(str(tmp_path / "hf" / "soft_prompt.safetensors"))["prompt_embedding"]
        np.testing.assert_array_equal(hf_files.read_tensor(prompt), np.asarray(loaded.variables["prompt"]["embedding"]))
        for a, b in zip(jax_leaves(params), jax_leaves(loaded.variables["params"])):
            np.testing.assert_array_equal(a, b)
        return
    tokens = _tokens(loaded)
    got = np.asarray(Transformer(exported.config).apply({"params": params}, jnp.asarray(tokens, jnp.int32)))
    np.testing.assert_allclose(got, _logits(loaded, tokens), rtol=1e-5, atol=1e-5)


def jax_leaves(tree):
    import jax

    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_export_adapter_only(tuned, tmp_path, capsys):
    case, _, out = tuned
    family, _, fields = CASES[case]
    rc, err = _export(out, tmp_path / "ad", "--adapter-only", capsys=capsys)
    if family == "native" or not fields["lora_rank"]:
        assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
        assert ("not imported" if family == "native" else "--adapter-only needs a LoRA-tuned model") in err
        return
    assert rc == 0, err
    cfg = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    assert cfg["r"] == fields["lora_rank"] and cfg["lora_alpha"] == fields["lora_alpha"]
    if family != "gpt2":
        kinds = ("attention", "mlp") if fields["lora_targets"] == "all" else (fields["lora_targets"],)
        assert set(cfg["target_modules"]) == set().union(*(PEFT_NAMES[k] for k in kinds))
    # W + alpha/r * B @ A, tensor by tensor, equals the merged export.
    assert _export(out, tmp_path / "merged", capsys=capsys)[0] == 0
    adapter = hf_files.read_header(str(tmp_path / "ad" / "adapter_model.safetensors"))
    merged = hf_files.read_header(str(tmp_path / "merged" / hf_files.SINGLE_FILE))
    base = hf_files.read_header(str(FIXTURES / family / hf_files.SINGLE_FILE))
    names = sorted(n[len("base_model.model."):-len(".lora_A.weight")] for n in adapter if n.endswith("lora_A.weight"))
    assert names
    for name in names:
        a = np.asarray(hf_files.read_tensor(adapter[f"base_model.model.{name}.lora_A.weight"]))
        b = np.asarray(hf_files.read_tensor(adapter[f"base_model.model.{name}.lora_B.weight"]))
        module = name.split(".", 3)[-1]
        rank, alpha = cfg.get("rank_pattern", {}).get(module, cfg["r"]), cfg.get("alpha_pattern", {}).get(
            module, cfg["lora_alpha"])
        delta = alpha / rank * (b @ a)
        w = np.asarray(hf_files.read_tensor(base[f"{name}.weight"]))
        want = w + (delta.T if cfg["fan_in_fan_out"] else delta)
        np.testing.assert_allclose(hf_files.read_tensor(merged[f"{name}.weight"]), want, rtol=1e-5, atol=1e-6)
