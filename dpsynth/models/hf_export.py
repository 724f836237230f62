"""Export a dpsynth model that was imported from Hugging Face (and DP-tuned) back to that layout.

`export_model(model_dir, out_dir)` writes a directory `transformers` loads
(`AutoModelForCausalLM.from_pretrained(out_dir)`):

    OUT/config.json            the source model's config (dtype float32)
    OUT/model.safetensors      the weights; LoRA adapters merged (`W + alpha/r * A @ B`)
    OUT/tokenizer.json | tokenizer.model   the model's tokenizer file
    OUT/soft_prompt.safetensors   (prompt-tuned models) "prompt_embedding" [P, d_model]: prepend
                               it to the (already scaled) input embeddings, at positions 0..P-1
    OUT/privacy_report.json, .md   the DP-tuned model's privacy report, unchanged
    OUT/dpsynth_export.json    what was exported (model directory, manifest SHA-256, mode)

With `adapter_only=True` a LoRA model is written as a PEFT adapter instead of merged weights:
`adapter_config.json` (r, lora_alpha, target_modules, base_model_name_or_path = the imported
source) and `adapter_model.safetensors` (`...q_proj.lora_A.weight` [r, in] = A^T,
`lora_B.weight` [out, r] = B^T); PEFT's scale `lora_alpha / r` is ours. GPT-2's fused `c_attn`
has no per-q/k/v LoRA in PEFT, so GPT-2 adapters export merged only.

Exporting is post-processing of a DP-tuned model: it releases nothing the model directory
does not already release (the report travels with it).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import numpy as np

from dpsynth import fileio
from dpsynth.models import hf_files
from dpsynth.models.hf_files import HFFormatError

EXPORT_RECORD, SOFT_PROMPT, ADAPTER_CONFIG, ADAPTER_WEIGHTS = (
    "dpsynth_export.json", "soft_prompt.safetensors", "adapter_config.json", "adapter_model.safetensors")
PRIVACY_FILES = ("privacy_report.json", "privacy_report.md")
_HF_PROJ = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
            "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}


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


def export_model(model_dir: str, out_dir: str, *, adapter_only: bool = False) -> dict[str, Any]:
    """Writes the HF directory (layout in the module docstring); returns the export record."""
    from dpsynth.train.checkpoint import load_model

    loaded = load_model(model_dir)
    manifest_path = os.path.join(os.path.abspath(model_dir), "manifest.json")
    source = source_of(loaded.manifest, manifest_path)
    family, config = source["family"], loaded.config
    prefix = "transformer." if family == "gpt2" else "model."
    os.makedirs(out_dir, exist_ok=True)
    if adapter_only:
        if not config.lora_rank:
            raise HFFormatError(f"{manifest_path}: --adapter-only needs a LoRA-tuned model (lora_rank is 0)")
        if family == "gpt2":
            raise HFFormatError(f"{manifest_path}: GPT-2's fused c_attn has no per-projection PEFT adapter; export "
                                "merged weights (drop --adapter-only)")
        _write_adapter(loaded, source, prefix, out_dir)
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
    loaded.tokenizer.save(os.path.join(out_dir, loaded.tokenizer.filename))
    model_root = os.path.abspath(model_dir)
    for name in PRIVACY_FILES:
        if os.path.exists(os.path.join(model_root, name)):
            shutil.copy2(os.path.join(model_root, name), os.path.join(out_dir, name))
    manifest_sha = fileio.sha256_file(manifest_path)
    record = {"exported_from": model_root, "manifest_sha256": manifest_sha, "mode": mode, "family": family,
              "source": {k: v for k, v in source.items() if k != "hf_config"},
              "privacy_report": os.path.exists(os.path.join(model_root, PRIVACY_FILES[0]))}
    fileio.write_json(os.path.join(out_dir, EXPORT_RECORD), record)
    return record


def _write_adapter(loaded, source, prefix: str, out_dir: str) -> None:
    import jax

    config, tensors, targets = loaded.config, {}, set()
    for layer, blocks in jax.device_get(loaded.variables["lora"]).items():
        i = int(layer.split("_")[1])
        for _block, projs in blocks.items():
            for proj, ab in projs.items():
                name = f"base_model.model.{prefix}layers.{i}.{_HF_PROJ[proj]}"
                tensors[f"{name}.lora_A.weight"] = np.ascontiguousarray(np.asarray(ab["a"], np.float32).T)
                tensors[f"{name}.lora_B.weight"] = np.ascontiguousarray(np.asarray(ab["b"], np.float32).T)
                targets.add(_HF_PROJ[proj].split(".")[1])
    hf_files.write_safetensors(os.path.join(out_dir, ADAPTER_WEIGHTS), tensors)
    fileio.write_json(os.path.join(out_dir, ADAPTER_CONFIG), {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": config.lora_rank, "lora_alpha": config.lora_alpha,
        "target_modules": sorted(targets), "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
        "use_rslora": False, "inference_mode": True, "base_model_name_or_path": source.get("path")})
