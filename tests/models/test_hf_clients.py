"""Round trips through the real clients: what transformers and peft make of an export.

`make test-hf` runs these in their own environment (`.venv-hf`: CPU torch, transformers, peft
and dpsynth); torch, transformers and peft are never dependencies of dpsynth, and the plain
`make test` deselects the `hf` marker (and without the packages the module skips).

For every family the import supports: import the fixture -> `dpsynth dp-tune` LoRA with
non-default rank, alpha and targets -> `dpsynth export-model` merged ->
`AutoModelForCausalLM` logits equal the tuned model's (1e-4); `--adapter-only` ->
`PeftModel.from_pretrained` on the source model -> equal logits; `AutoTokenizer` encodes sample
text to the same ids and reports the same special ids, all inside the vocabulary; greedy
`generate()` equals dpsynth's greedy sampler. The tuned logits must differ from the base's, or
the comparisons prove nothing.
"""

import json
import pathlib
import shutil

import numpy as np
import pytest

pytestmark = pytest.mark.hf
torch = pytest.importorskip("torch", reason="torch not installed: run `make test-hf` (its own venv)")
transformers = pytest.importorskip("transformers", reason="transformers not installed: run `make test-hf`")
peft = pytest.importorskip("peft", reason="peft not installed: run `make test-hf`")

import jax.numpy as jnp  # noqa: E402

from dpsynth.models import hf_import, hf_tokenizer  # noqa: E402
from dpsynth.models.transformer import Transformer  # noqa: E402
from dpsynth.models.directory import load_model  # noqa: E402
from tests.train.conftest import make_records  # noqa: E402
from trainers import dp_tune, export_model  # noqa: E402

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "hf"
FAMILIES = ("llama", "mistral", "qwen2", "gemma", "gemma2", "gemma3", "gpt2")
TOL = 1e-4
TARGETS = {"llama": "attention", "mistral": "mlp", "qwen2": "attention", "gemma": "mlp", "gemma2": "attention",
           "gemma3": "mlp", "gpt2": "attention"}  # both non-default values, spread over the families
TUNE = ["--mode", "lora", "--lora-rank", "3", "--lora-alpha", "6", "--epsilon", "8", "--batch-size", "8", "--steps",
        "2", "--microbatch-size", "8", "--max-tokens", "24", "--learning-rate", "0.1", "--labels", "great", "other",
        "--seed", "5"]
TEXTS = ["the quick brown fox", "Hello, world! 42", "privacy is a property of the mechanism, not of the output",
         "  two  spaces and\ttabs\nand lines  ", "naïve café, 日本語 and 😀", "great coffee, would buy again"]
PROMPTS = ["the quick brown fox", "Hello, world!", "privacy is"]
GREEDY_STEPS = 10


@pytest.fixture(scope="module", params=FAMILIES)
def exported(request, tmp_path_factory):
    """(family, tuned dir, merged export, adapter export, base dir) for one family."""
    family = request.param
    root = tmp_path_factory.mktemp(family)
    base, tuned = root / "base", root / "tuned"
    hf_import.import_model(str(FIXTURES / family), str(base))
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in make_records(24, 7)))
    assert dp_tune.main(["--base", str(base), "--train", str(data), "--out", str(tuned), *TUNE,
                         "--lora-targets", TARGETS[family]]) == 0
    for out, flags in ((root / "hf", []), (root / "peft", ["--adapter-only"])):
        assert export_model.main(["--model", str(tuned), "--format", "hf", "--out", str(out), *flags]) == 0
    return family, tuned, root / "hf", root / "peft", base


def _inputs(loaded):
    tok = loaded.tokenizer
    return [[tok.bos_id, *tok.encode(text).tolist()] for text in TEXTS[:3]]


def _batch(rows, pad):
    """Rows right-padded into one batch (causal models: the padding never reaches a row's logits)."""
    return np.asarray([row + [pad] * (max(map(len, rows)) - len(row)) for row in rows], np.int32)


def _ours(loaded, rows):
    logits = np.asarray(Transformer(loaded.config).apply(loaded.variables, jnp.asarray(_batch(rows, 0))))
    return [logits[i, :len(row)] for i, row in enumerate(rows)]


def _theirs(model, rows):
    with torch.no_grad():
        logits = model(torch.tensor(_batch(rows, 0), dtype=torch.long)).logits.float().numpy()
    return [logits[i, :len(row)] for i, row in enumerate(rows)]


def _max_diff(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def _load(path):
    return transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32,
                                                             attn_implementation="eager").eval()


def test_merged_export_loads_in_transformers_with_the_tuned_logits(exported):
    family, tuned_dir, hf_dir, _, base_dir = exported
    tuned, base = load_model(str(tuned_dir)), load_model(str(base_dir))
    rows = _inputs(tuned)
    want = _ours(tuned, rows)
    assert _max_diff(want, _ours(base, rows)) > 1e-2  # the adapters changed the model
    diff = _max_diff(_theirs(_load(hf_dir), rows), want)
    print(f"{family}: merged export vs tuned model, max |logit difference| = {diff:.2e}")
    assert diff <= TOL


def test_peft_adapter_on_the_source_model_gives_the_tuned_logits(exported):
    family, tuned_dir, _, peft_dir, _ = exported
    tuned = load_model(str(tuned_dir))
    cfg = json.loads((peft_dir / "adapter_config.json").read_text())
    assert cfg["r"] == 3 and cfg["lora_alpha"] == 6.0
    model = peft.PeftModel.from_pretrained(_load(cfg["base_model_name_or_path"]), str(peft_dir)).eval()
    rows = _inputs(tuned)
    diff = _max_diff(_theirs(model, rows), _ours(tuned, rows))
    print(f"{family}: PEFT adapter on the source vs tuned model, max |logit difference| = {diff:.2e}")
    assert diff <= TOL


@pytest.mark.parametrize("which", ["merged", "adapter"])
def test_autotokenizer_encodes_and_names_the_special_tokens_as_the_model(exported, which):
    family, tuned_dir, hf_dir, peft_dir, _ = exported
    ours = load_model(str(tuned_dir))
    tok = transformers.AutoTokenizer.from_pretrained(str(hf_dir if which == "merged" else peft_dir))
    for text in TEXTS + list(hf_tokenizer.SELF_CHECK_TEXTS):
        assert tok(text, add_special_tokens=False).input_ids == ours.tokenizer.encode(text).tolist(), text
    ids = ours.tokenizer.special_ids
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id) == (
        ids["bos"], ids["eos"], ids["pad"], ids["unk"])
    assert max(ids.values()) < ours.config.vocab_size and len(tok) <= ours.config.vocab_size
    gen = json.loads((hf_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == ids["eos"]


def test_greedy_generate_equals_dpsynths_greedy_sampler(exported):
    from dpsynth.generate.sampler import Sampler, SamplerConfig, TransformerDecodeModel

    family, tuned_dir, hf_dir, _, _ = exported
    ours = load_model(str(tuned_dir))
    tok = ours.tokenizer
    prompts = [np.asarray([tok.bos_id, *tok.encode(p).tolist()], np.int32) for p in PROMPTS]
    banned = tuple(sorted({tok.pad_id, tok.bos_id} - {tok.eos_id}))
    longest = max(len(p) for p in prompts)
    sampler = Sampler(TransformerDecodeModel(ours.config), SamplerConfig(
        temperature=0.0, max_len=longest + GREEDY_STEPS, batch_size=len(prompts), eos_id=tok.eos_id,
        pad_id=tok.pad_id, banned_ids=banned, vocab_limit=tok.vocab_size))
    out = sampler.sample(ours.variables, prompts, np.zeros((len(prompts), 2), np.uint32))
    model = _load(hf_dir)
    suppress = [*banned, *range(tok.vocab_size, ours.config.vocab_size)]
    for i, prompt in enumerate(prompts):
        steps = longest + GREEDY_STEPS - len(prompt)
        with torch.no_grad():
            seq = model.generate(torch.tensor([prompt.tolist()]), do_sample=False, max_new_tokens=steps,
                                 eos_token_id=tok.eos_id, pad_token_id=tok.pad_id, suppress_tokens=suppress,
                                 attention_mask=torch.ones((1, len(prompt)), dtype=torch.long))[0, len(prompt):]
        theirs = seq.tolist()
        if tok.eos_id in theirs:  # dpsynth returns the text before EOS
            theirs = theirs[: theirs.index(tok.eos_id)]
        assert out.tokens[i, : out.lengths[i]].tolist() == theirs, (family, PROMPTS[i])


def test_a_source_tokenizer_config_survives_the_round_trip(tmp_path):
    """A source saved by transformers itself (tokenizer_config.json, generation_config.json)."""
    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "llama", src)
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(src / "tokenizer.json"), bos_token="<bos>",
                                               eos_token="<eos>", pad_token="<pad>", model_max_length=128)
    tok.save_pretrained(str(src))
    transformers.GenerationConfig(bos_token_id=0, eos_token_id=1, pad_token_id=2, do_sample=True,
                                  temperature=0.7).save_pretrained(str(src))
    hf_import.import_model(str(src), str(tmp_path / "m"))
    assert export_model.main(["--model", str(tmp_path / "m"), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    back = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert (back.bos_token, back.eos_token, back.pad_token) == ("<bos>", "<eos>", "<pad>")
    assert back("Hello, world! 42").input_ids == tok("Hello, world! 42").input_ids
    gen = transformers.GenerationConfig.from_pretrained(str(tmp_path / "hf"))
    assert gen.do_sample and gen.temperature == 0.7 and gen.eos_token_id == 1


def test_a_sentencepiece_source_with_a_llama_tokenizer_config(tmp_path):
    """tokenizer.model plus a config naming LlamaTokenizer: the export's converted tokenizer.json
    is read as is, and encodes as SentencePiece, bos first as the source asked."""
    import sentencepiece as spm

    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "mistral", src)
    (src / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer", "legacy": False,
                                                           "add_bos_token": True, "model_max_length": 128}))
    hf_import.import_model(str(src), str(tmp_path / "m"))
    assert export_model.main(["--model", str(tmp_path / "m"), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    back = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    sp = spm.SentencePieceProcessor(model_file=str(src / "tokenizer.model"))
    for text in TEXTS + list(hf_tokenizer.SELF_CHECK_TEXTS):
        assert back(text).input_ids == [sp.bos_id()] + sp.encode(text), text
