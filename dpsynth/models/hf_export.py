"""Export a dpsynth model that was imported from Hugging Face (and DP-tuned) back to that layout.

`export_model(model_dir, out_dir)` writes a directory `transformers` loads
(`AutoModelForCausalLM.from_pretrained(out_dir)`, `AutoTokenizer.from_pretrained(out_dir)`):

    OUT/config.json            the source model's config (dtype float32)
    OUT/model.safetensors      the weights; LoRA adapters merged (`W + alpha/r * A @ B`)
    OUT/tokenizer.json         the model's tokenizer (converted from tokenizer.model for a
                               SentencePiece model, which is kept beside it; `hf_tokenizer`)
    OUT/tokenizer_config.json  tokenizer class and the model's bos/eos/pad/unk tokens
    OUT/generation_config.json the model's eos (and bos/pad) ids
    OUT/soft_prompt.safetensors   (prompt-tuned models) "prompt_embedding" [P, d_model]: prepend
                               it to the (already scaled) input embeddings, at positions 0..P-1
    OUT/privacy_report.json, .md   the DP-tuned model's privacy report, unchanged
    OUT/dpsynth_export.json    what was exported (model directory, manifest SHA-256, mode); written last

tokenizer_config.json and generation_config.json are the source checkpoint's when it had them,
with the model's special tokens set (`hf_tokenizer`).

With `adapter_only=True` a LoRA model is written as a PEFT adapter instead of merged weights:
`adapter_config.json` (r, lora_alpha, target_modules, base_model_name_or_path = the imported
source) and `adapter_model.safetensors` (`...q_proj.lora_A.weight` [r, in] = A^T,
`lora_B.weight` [out, r] = B^T); PEFT's scale `lora_alpha / r` is ours. GPT-2's q/k/v are one
fused `Conv1D` (`c_attn`): its adapter has rank 3r, A = [A_q A_k A_v] and B = diag(B_q, B_k, B_v)
(so `x @ A @ B` is the three updates side by side), declared through PEFT's `rank_pattern` and
`alpha_pattern` (alpha 3 alpha, the same scale alpha / r).

`--out` must be a new or empty directory, or an earlier export (whose files are replaced; a
stale `adapter_config.json` would make transformers load an adapter instead of the model).
Exporting is post-processing of a DP-tuned model: it releases nothing the model directory
does not already release (the report travels with it).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from dpsynth import fileio, outdir
from dpsynth.data import tokenizers
from dpsynth.dp import report as report_lib
from dpsynth.models import hf_files, hf_tokenizer
from dpsynth.models.hf_files import HFFormatError

EXPORT_RECORD, SOFT_PROMPT, ADAPTER_CONFIG, ADAPTER_WEIGHTS = (
    "dpsynth_export.json", "soft_prompt.safetensors", "adapter_config.json", "adapter_model.safetensors")
PRIVACY_FILES = report_lib.PRIVACY_FILES
# Every file an export may write: what an earlier export in --out may have left.
EXPORT_FILES = (hf_files.CONFIG_FILE, hf_files.SINGLE_FILE, hf_tokenizer.TOKENIZER_JSON, tokenizers.SP_FILE,
                hf_tokenizer.TOKENIZER_CONFIG, hf_tokenizer.GENERATION_CONFIG, SOFT_PROMPT, ADAPTER_CONFIG,
                ADAPTER_WEIGHTS, *PRIVACY_FILES, EXPORT_RECORD)
# Our projection -> the PEFT module name (relative to the decoder layer) per family.
_HF_PROJ = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
            "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
_GPT2_PROJ = {"q": "attn.c_attn", "k": "attn.c_attn", "v": "attn.c_attn", "o": "attn.c_proj", "up": "mlp.c_fc",
              "down": "mlp.c_proj"}


def source_of(manifest: dict[str, Any], where: str) -> dict[str, Any]:
    """The Hugging Face provenance of a model directory (its own, or its base's for tuned models)."""
    source = manifest.get("source") or manifest.get("base_source")
    if not source or "hf_config" not in source:
        raise HFFormatError(f"{where}: not imported from Hugging Face (no 'source' in its manifest); only models "
                            "made by `dpsynth import-model` (and tuned from one) export to the HF layout")
    return source


def _tree_get(tree: dict, path: tuple[str, ...]):
    for p in path:
        tree = tree[p]
    return tree


def merged_params(variables: dict, config) -> dict:
    """Host float32 copy of "params" with every LoRA update folded into its kernel."""
    import jax

    params = jax.tree.map(lambda x: np.asarray(x, np.float32), jax.device_get(variables["params"]))
    for layer, blocks in (jax.device_get(variables.get("lora")) or {}).items():
        for block, projs in blocks.items():
            for proj, ab in projs.items():
                kernel = params[layer][block][proj]["kernel"]
                a, b = np.asarray(ab["a"], np.float32), np.asarray(ab["b"], np.float32)
                params[layer][block][proj]["kernel"] = kernel + np.float32(config.lora_scale) * (a @ b)
    return params


def hf_tensors(family: str, config, params: dict, prefix: str) -> dict[str, np.ndarray]:
    """Our params in Hugging Face names and layouts (the inverse of `hf_files.to_ours`)."""
    out: dict[str, np.ndarray] = {}
    fused: dict[str, list] = {}
    for entry in hf_files.tensor_map(family, config):
        value = np.asarray(_tree_get(params, entry.path), np.float32)
        if entry.kind == "linear":
            out[prefix + entry.hf] = np.ascontiguousarray(value.T)
        elif entry.kind == "fused":
            fused.setdefault(prefix + entry.hf, [None] * 3)[entry.part] = value
        else:
            out[prefix + entry.hf] = value
    out.update({name: np.concatenate(parts, axis=-1) for name, parts in fused.items()})
    if not config.tie_embeddings:
        out["lm_head.weight"] = np.ascontiguousarray(np.asarray(params["lm_head"], np.float32).T)
    return out


def _hf_config(source: dict[str, Any]) -> dict[str, Any]:
    hf = dict(source["hf_config"])
    if isinstance(hf.get("text_config"), dict):  # a multimodal Gemma 3: export its text model
        hf = {**hf["text_config"], "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"]}
    hf.pop("torch_dtype", None)
    hf["dtype"] = "float32"
    return hf


def _prepare_out(out_dir: str) -> None:
    """Creates `out_dir`, or clears the files of an earlier export from it (module docstring)."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise HFFormatError(f"{out_dir}: exists and is not a directory; choose another --out")
    if os.path.isdir(out_dir) and outdir.without_run_files(os.listdir(out_dir)):
        if not os.path.exists(os.path.join(out_dir, EXPORT_RECORD)):
            raise HFFormatError(f"{out_dir}: is not empty and holds no {EXPORT_RECORD} (not an earlier export); "
                                "choose a new or empty --out directory")
        for name in EXPORT_FILES:
            if os.path.isfile(os.path.join(out_dir, name)):
                os.remove(os.path.join(out_dir, name))
    os.makedirs(out_dir, exist_ok=True)


def export_model(model_dir: str, out_dir: str, *, adapter_only: bool = False) -> dict[str, Any]:
    """Writes the HF directory (layout in the module docstring); returns the export record.

    Raises:
      HFFormatError: the model was not imported from Hugging Face, --adapter-only without LoRA,
        an --out that is neither new, empty nor an earlier export, or a tokenizer that cannot
        be converted.
      CheckpointError: the model directory cannot be loaded (`dpsynth.models.directory.load_model`).
    """
    from dpsynth.models.directory import load_model  # Orbax (~0.5 s to import): only when a model is loaded

    loaded = load_model(model_dir)
    model_root = os.path.abspath(model_dir)
    manifest_path = os.path.join(model_root, "manifest.json")
    source = source_of(loaded.manifest, manifest_path)
    family, config = source["family"], loaded.config
    prefix = "transformer." if family == "gpt2" else "model."
    if adapter_only and not config.lora_rank:
        raise HFFormatError(f"{manifest_path}: --adapter-only needs a LoRA-tuned model (this one has no LoRA "
                            "adapters); drop --adapter-only to export its weights (and soft prompt)")
    tokenizer_json = _tokenizer_json(loaded, os.path.join(model_root, loaded.tokenizer.filename))
    _prepare_out(out_dir)
    if adapter_only:
        _write_adapter(loaded, source, family, prefix, out_dir)
        mode = "lora-adapter"
    else:
        params = merged_params(loaded.variables, config)
        hf_files.write_safetensors(os.path.join(out_dir, hf_files.SINGLE_FILE),
                                   hf_tensors(family, config.base(), params, prefix))
        fileio.write_json(os.path.join(out_dir, hf_files.CONFIG_FILE), _hf_config(source))
        mode = "merged"
        if config.prompt_length:
            prompt = np.asarray(loaded.variables["prompt"]["embedding"], np.float32)
            hf_files.write_safetensors(os.path.join(out_dir, SOFT_PROMPT), {"prompt_embedding": prompt},
                                       {"format": "pt", "usage": "prepend to the scaled input embeddings"})
            mode = "merged+soft-prompt"
    _write_tokenizer(loaded, source, tokenizer_json, out_dir)
    for name in PRIVACY_FILES:
        if os.path.exists(os.path.join(model_root, name)):
            fileio.copy_file(os.path.join(model_root, name), os.path.join(out_dir, name))
    manifest_sha = fileio.sha256_file(manifest_path)
    record = {"exported_from": model_root, "manifest_sha256": manifest_sha, "mode": mode, "family": family,
              "source": {k: v for k, v in source.items() if not k.startswith("hf_")},
              "privacy_report": os.path.exists(os.path.join(model_root, PRIVACY_FILES[0]))}
    fileio.write_json(os.path.join(out_dir, EXPORT_RECORD), record)
    return record


def _tokenizer_json(loaded, where: str) -> str | None:
    """The converted tokenizer.json of a SentencePiece tokenizer (None for a tokenizer.json one)."""
    if loaded.tokenizer.kind != "sentencepiece":
        return None
    return hf_tokenizer.sentencepiece_tokenizer_json(loaded.tokenizer.model_proto, loaded.tokenizer.bos_id, where)


def _write_tokenizer(loaded, source: dict[str, Any], tokenizer_json: str | None, out_dir: str) -> None:
    tok, ids = loaded.tokenizer, loaded.tokenizer.special_ids
    tok.save(os.path.join(out_dir, tok.filename))
    if tokenizer_json is not None:
        fileio.write_bytes(os.path.join(out_dir, hf_tokenizer.TOKENIZER_JSON), tokenizer_json.encode("utf-8"))
    fileio.write_json(os.path.join(out_dir, hf_tokenizer.TOKENIZER_CONFIG),
                      hf_tokenizer.tokenizer_config(tok, ids, loaded.config.max_len, source.get("hf_tokenizer_config")))
    fileio.write_json(os.path.join(out_dir, hf_tokenizer.GENERATION_CONFIG),
                      hf_tokenizer.generation_config(ids, source.get("hf_generation_config")))


def _write_adapter(loaded, source, family: str, prefix: str, out_dir: str) -> None:
    import jax

    config, tensors, targets = loaded.config, {}, set()
    names = _GPT2_PROJ if family == "gpt2" else _HF_PROJ
    fused: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for layer, blocks in jax.device_get(loaded.variables["lora"]).items():
        i = int(layer.split("_")[1])
        for _block, projs in blocks.items():
            for proj, ab in projs.items():
                module = names[proj]
                a, b = np.asarray(ab["a"], np.float32), np.asarray(ab["b"], np.float32)
                name = f"base_model.model.{prefix}{'h' if family == 'gpt2' else 'layers'}.{i}.{module}"
                targets.add(module if family == "gpt2" else module.split(".")[1])
                if family == "gpt2" and proj in "qkv":
                    fused.setdefault(name, {})[proj] = (a, b)
                    continue
                tensors[f"{name}.lora_A.weight"] = np.ascontiguousarray(a.T)
                tensors[f"{name}.lora_B.weight"] = np.ascontiguousarray(b.T)
    for name, parts in fused.items():  # A = [A_q A_k A_v], B = diag(B_q, B_k, B_v): rank 3r
        a = np.concatenate([parts[p][0] for p in "qkv"], axis=1)
        b = np.zeros((a.shape[1], sum(parts[p][1].shape[1] for p in "qkv")), np.float32)
        row = col = 0
        for p in "qkv":
            part = parts[p][1]
            b[row:row + part.shape[0], col:col + part.shape[1]] = part
            row, col = row + part.shape[0], col + part.shape[1]
        tensors[f"{name}.lora_A.weight"] = np.ascontiguousarray(a.T)
        tensors[f"{name}.lora_B.weight"] = np.ascontiguousarray(b.T)
    hf_files.write_safetensors(os.path.join(out_dir, ADAPTER_WEIGHTS), tensors)
    adapter = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": config.lora_rank, "lora_alpha": config.lora_alpha,
               "target_modules": sorted(targets), "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
               "use_rslora": False, "inference_mode": True, "base_model_name_or_path": source.get("path")}
    if fused:  # GPT-2: Conv1D weights are [in, out]; c_attn's adapter is 3x the rank at the same scale
        adapter.update(fan_in_fan_out=True, rank_pattern={"attn.c_attn": 3 * config.lora_rank},
                       alpha_pattern={"attn.c_attn": 3 * config.lora_alpha})
    fileio.write_json(os.path.join(out_dir, ADAPTER_CONFIG), adapter)
