"""Hugging Face checkpoint files: safetensors I/O, `config.json` spellings and the tensor-name map.

Shared by `hf_import` (HF directory -> dpsynth model) and `hf_export` (the reverse).

safetensors layout: 8-byte little-endian header length N, N bytes of JSON
`{name: {"dtype": "F32"|"BF16"|..., "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}}`,
then the raw little-endian tensor bytes (offsets relative to the end of the header). Tensors
are read as NumPy memory maps (bfloat16 through `ml_dtypes`), so a tensor costs host memory
only when it is converted, one at a time.

Tensor map: `tensor_map(family, config)` lists `Entry(hf_name, path, kind, part)`:
  - kind "linear": an `nn.Linear` weight [out, in], stored transposed as our kernel [in, out];
  - kind "same": copied as is (embeddings, norms, biases, GPT-2 `Conv1D` weights, already [in, out]);
  - kind "fused": part `part` of 3 equal slices of the last axis (GPT-2's fused `c_attn` q/k/v).
Gemma's norms store `w` and compute `x * (1 + w)`; our config's `norm_scale_offset=1` does
the same with the same stored value, so no tensor changes. Hugging Face's rotary layout
("rotate half": dimension i pairs with i + head_dim/2) is the one `rotary` uses, so q/k need
no per-head permutation.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from typing import Any

import ml_dtypes
import numpy as np

from dpsynth import fileio
from dpsynth.errors import DpsynthError
from dpsynth.models.config import ModelConfig

SINGLE_FILE, INDEX_FILE, CONFIG_FILE = "model.safetensors", "model.safetensors.index.json", "config.json"
DTYPES = {"F32": np.dtype(np.float32), "F16": np.dtype(np.float16), "BF16": np.dtype(ml_dtypes.bfloat16),
          "F64": np.dtype(np.float64), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
          "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_)}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
FAMILIES = ("llama", "mistral", "qwen2", "gemma", "gemma2", "gemma3", "gpt2")


class HFFormatError(DpsynthError, ValueError):
    """A Hugging Face directory we cannot import (names the file and the field or tensor)."""


# ============================================================================ safetensors


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    file: str
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    begin: int  # absolute byte offset in the file
    end: int


def read_header(path: str) -> dict[str, TensorInfo]:
    """The tensors of one safetensors file (reads the header only)."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100_000_000:
                raise HFFormatError(f"{path}: header length {n} is implausible (not a safetensors file?)")
            header = json.loads(f.read(n))
    except (OSError, struct.error, ValueError) as e:
        if isinstance(e, HFFormatError):
            raise
        raise HFFormatError(f"{path}: cannot read the safetensors header ({type(e).__name__}: {e})") from e
    size = os.path.getsize(path)
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry.get("dtype") not in DTYPES:
            raise HFFormatError(f"{path}: tensor {name!r} has dtype {entry.get('dtype')!r}, not one of {sorted(DTYPES)}")
        begin, end = entry["data_offsets"]
        shape = tuple(int(s) for s in entry["shape"])
        dtype = DTYPES[entry["dtype"]]
        if end - begin != math.prod(shape) * dtype.itemsize or 8 + n + end > size:
            raise HFFormatError(f"{path}: tensor {name!r} byte range [{begin}, {end}) does not fit shape {list(shape)} "
                                f"{entry['dtype']} or the file ({size} bytes; truncated?)")
        out[name] = TensorInfo(path, name, dtype, shape, 8 + n + begin, 8 + n + end)
    return out


def read_tensor(info: TensorInfo) -> np.ndarray:
    """A read-only memory map of one tensor (no copy)."""
    return np.memmap(info.file, dtype=info.dtype, mode="r", offset=info.begin, shape=info.shape)


def checkpoint_files(directory: str) -> list[str]:
    """The safetensors files of an HF directory, from the index when sharded."""
    index = os.path.join(directory, INDEX_FILE)
    if os.path.exists(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
        except (ValueError, KeyError) as e:
            raise HFFormatError(f"{index}: not a safetensors index (needs a 'weight_map' object): {e}") from e
        files = sorted(set(weight_map.values()))
        for name in files:
            if not os.path.exists(os.path.join(directory, name)):
                raise HFFormatError(f"{index}: lists shard {name!r}, which is missing from {directory}")
        return [os.path.join(directory, name) for name in files]
    single = os.path.join(directory, SINGLE_FILE)
    if not os.path.exists(single):
        raise HFFormatError(f"{directory}: has neither {SINGLE_FILE} nor {INDEX_FILE} (only safetensors checkpoints "
                            "are read; convert .bin/.pth files with transformers' save_pretrained first)")
    return [single]


def write_safetensors(path: str, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """Writes NumPy arrays (float32, bfloat16 via ml_dtypes, ...) as one safetensors file."""
    header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    names = sorted(tensors)
    for name in names:
        arr = tensors[name]
        nbytes = arr.size * arr.dtype.itemsize
        header[name] = {"dtype": DTYPE_NAMES[np.dtype(arr.dtype)], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with fileio.atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in names:
            f.write(np.ascontiguousarray(tensors[name]).tobytes())


# ============================================================================ config.json


def read_json(path: str) -> dict[str, Any]:
    if not os.path.exists(path):
        raise HFFormatError(f"{path}: missing")
    try:
        return fileio.read_json(path)
    except ValueError as e:
        raise HFFormatError(f"{path}: not valid JSON ({e})") from e


def family_of(hf: dict[str, Any], where: str) -> str:
    """The dpsynth family of an HF config (from `model_type`, else `architectures`)."""
    model_type = hf.get("model_type")
    aliases = {"gemma3_text": "gemma3", "gemma3": "gemma3"}
    family = aliases.get(model_type, model_type)
    if family in FAMILIES:
        return family
    arch = (hf.get("architectures") or [""])[0]
    by_arch = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
               "GemmaForCausalLM": "gemma", "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3",
               "Gemma3ForConditionalGeneration": "gemma3", "GPT2LMHeadModel": "gpt2"}
    if arch in by_arch:
        return by_arch[arch]
    raise HFFormatError(f"{where}: model_type {model_type!r} / architectures {hf.get('architectures')!r} is not "
                        f"supported; supported families: {', '.join(FAMILIES)}")


def _rope(hf: dict[str, Any], where: str, layer_type: str | None = None) -> dict[str, Any]:
    """Rotary settings from either spelling: `rope_theta` + `rope_scaling`, or `rope_parameters`."""
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and layer_type is not None and layer_type in params:
        params = params[layer_type]
    scaling = dict(params) if isinstance(params, dict) else dict(hf.get("rope_scaling") or {})
    theta = scaling.pop("rope_theta", None)
    if theta is None:
        theta = hf.get("rope_local_base_freq" if layer_type == "sliding_attention" else "rope_theta")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    field = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"
    out: dict[str, Any] = {"base": float(theta) if theta is not None else None}
    if kind == "default":
        out["scaling"] = "none"
    elif kind == "linear":
        out.update(scaling="linear", factor=float(scaling["factor"]))
    elif kind == "llama3":
        try:
            out.update(scaling="llama3", factor=float(scaling["factor"]),
                       low=float(scaling["low_freq_factor"]), high=float(scaling["high_freq_factor"]),
                       original=int(scaling["original_max_position_embeddings"]))
        except KeyError as e:
            raise HFFormatError(f"{where}: {field} of type llama3 lacks {e.args[0]!r}") from e
    else:
        raise HFFormatError(f"{where}: {field}.rope_type {kind!r} is not implemented (default, linear and llama3 are)")
    if float(scaling.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)) or 1.0) != 1.0:
        raise HFFormatError(f"{where}: partial_rotary_factor != 1 is not implemented")
    return out


def _need(hf: dict[str, Any], key: str, where: str):
    if hf.get(key) is None:
        raise HFFormatError(f"{where}: required field {key!r} is missing")
    return hf[key]


def _reject(hf: dict[str, Any], where: str, **allowed: Any) -> None:
    """Stops on a config option we do not implement (its value differs from the one we support)."""
    for key, ok in allowed.items():
        value = hf.get(key)
        if value is not None and value not in (ok if isinstance(ok, tuple) else (ok,)):
            raise HFFormatError(f"{where}: {key}={value!r} is not implemented (supported: {ok!r})")


def model_config_from_hf(hf: dict[str, Any], where: str, *, dtype: str = "float32") -> tuple[str, ModelConfig]:
    """(family, ModelConfig) of an HF `config.json` dict; `where` names the file in errors."""
    family = family_of(hf, where)
    if family == "gemma3" and isinstance(hf.get("text_config"), dict):  # multimodal checkpoint: its text model
        hf = {**hf["text_config"], "model_type": "gemma3_text"}
        where = f"{where} (text_config)"
    common: dict[str, Any] = dict(preset=f"hf:{family}", dtype=dtype)
    if family == "gpt2":
        _reject(hf, where, activation_function=("gelu_new", "gelu_pytorch_tanh", "gelu_fast"),
                scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False, add_cross_attention=False,
                tie_word_embeddings=True)
        d = int(_need(hf, "n_embd", where))
        heads = int(_need(hf, "n_head", where))
        return family, ModelConfig(
            vocab_size=int(_need(hf, "vocab_size", where)), d_model=d, num_layers=int(_need(hf, "n_layer", where)),
            num_heads=heads, head_dim=d // heads, d_ff=int(hf.get("n_inner") or 4 * d),
            max_len=int(_need(hf, "n_positions", where)), mlp="gelu", norm="layernorm",
            norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)), qkv_bias=True, o_bias=True, mlp_bias=True,
            positions="learned", scale_embedding=False, **common)
    d = int(_need(hf, "hidden_size", where))
    heads = int(_need(hf, "num_attention_heads", where))
    layers = int(_need(hf, "num_hidden_layers", where))
    gemma = family.startswith("gemma")
    act = hf.get("hidden_activation") or hf.get("hidden_act") or ("gelu_pytorch_tanh" if gemma else "silu")
    if gemma and hf.get("hidden_activation") is None and act == "gelu":
        act = "gelu_pytorch_tanh"  # Gemma 1 configs say "gelu"; transformers runs the tanh approximation
    mlps = {"silu": "swiglu", "gelu_pytorch_tanh": "gated_gelu", "gelu_new": "gated_gelu", "gelu_fast": "gated_gelu"}
    if act not in mlps:
        raise HFFormatError(f"{where}: activation {act!r} is not implemented (supported: {sorted(mlps)})")
    _reject(hf, where, pretraining_tp=1, use_bidirectional_attention=False, attention_dropout=(0, 0.0))
    kw: dict[str, Any] = dict(
        vocab_size=int(_need(hf, "vocab_size", where)), d_model=d, num_layers=layers, num_heads=heads,
        head_dim=int(hf.get("head_dim") or d // heads), d_ff=int(_need(hf, "intermediate_size", where)),
        max_len=int(_need(hf, "max_position_embeddings", where)), mlp=mlps[act],
        num_kv_heads=int(hf.get("num_key_value_heads") or heads), norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", gemma)), scale_embedding=gemma,
        norm_scale_offset=1.0 if gemma else 0.0, **common)
    if family == "qwen2":
        kw["qkv_bias"] = True
    elif family in ("llama", "mistral"):
        kw.update(qkv_bias=bool(hf.get("attention_bias", False)), o_bias=bool(hf.get("attention_bias", False)),
                  mlp_bias=bool(hf.get("mlp_bias", False)))
    elif hf.get("attention_bias"):
        raise HFFormatError(f"{where}: attention_bias=true is not implemented for {family}")
    layer_types = hf.get("layer_types")
    if family == "gemma2" and layer_types is None:
        layer_types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    if family == "gemma3" and layer_types is None:
        pattern = int(hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern") or 6)
        layer_types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    if family == "mistral" and hf.get("sliding_window") is not None and layer_types is None:
        layer_types = ["sliding_attention"] * layers
    if family == "qwen2" and not hf.get("use_sliding_window"):
        layer_types = None
    if layer_types is not None:
        if len(layer_types) != layers or any(t not in ("full_attention", "sliding_attention") for t in layer_types):
            raise HFFormatError(f"{where}: layer_types must be {layers} of full_attention/sliding_attention, "
                                f"got {layer_types!r}")
        if "sliding_attention" in layer_types:
            kw["layer_kinds"] = tuple("sliding" if t == "sliding_attention" else "full" for t in layer_types)
            kw["sliding_window"] = int(_need(hf, "sliding_window", where))
    rope = _rope(hf, where, "full_attention" if family == "gemma3" else None)
    if rope["base"] is None:
        rope["base"] = 1_000_000.0 if family == "gemma3" else 10_000.0
    kw.update(rope_base=rope["base"], rope_scaling=rope["scaling"])
    if rope["scaling"] != "none":
        kw["rope_factor"] = rope["factor"]
    if rope["scaling"] == "llama3":
        kw.update(rope_low_freq_factor=rope["low"], rope_high_freq_factor=rope["high"],
                  rope_original_max_len=rope["original"])
    if family == "gemma3":
        local = _rope(hf, where, "sliding_attention")
        if local["scaling"] != "none":
            raise HFFormatError(f"{where}: scaled rope on sliding layers is not implemented")
        kw["rope_local_base"] = local["base"] if local["base"] is not None else 10_000.0
    if family in ("gemma2", "gemma3"):
        kw.update(post_norms=True, query_pre_attn_scalar=float(_need(hf, "query_pre_attn_scalar", where)),
                  attn_softcap=hf.get("attn_logit_softcapping"), final_softcap=hf.get("final_logit_softcapping"))
    if family == "gemma3":
        kw["qk_norm"] = True
    return family, ModelConfig(**kw)


def special_ids_from_hf(hf: dict[str, Any], generation: dict[str, Any] | None, vocab: int, where: str,
                        tokenizer_unk: int | None = None) -> dict:
    """bos/eos/pad/unk ids from config.json (and generation_config.json); pad falls back to eos,
    unk to the tokenizer's own unknown token (`tokenizer_unk`), else to pad."""
    if isinstance(hf.get("text_config"), dict):
        hf = {**hf["text_config"], **{k: v for k, v in hf.items() if k.endswith("_token_id") and v is not None}}
    merged = {**{k: v for k, v in (generation or {}).items() if v is not None},
              **{k: v for k, v in hf.items() if k.endswith("_token_id") and v is not None}}

    def first(key):
        value = merged.get(key)
        return value[0] if isinstance(value, list) and value else value

    eos = first("eos_token_id")
    if eos is None:
        raise HFFormatError(f"{where}: no eos_token_id (dpsynth ends generated texts there)")
    bos = first("bos_token_id")
    ids = {"eos": int(eos), "bos": int(eos if bos is None else bos)}
    ids["pad"] = int(first("pad_token_id") if first("pad_token_id") is not None else ids["eos"])
    unk = first("unk_token_id")
    ids["unk"] = int(unk if unk is not None else tokenizer_unk if tokenizer_unk is not None else ids["pad"])
    for name, value in ids.items():
        if not 0 <= value < vocab:
            raise HFFormatError(f"{where}: {name}_token_id={value} is outside the vocabulary of {vocab}")
    return ids


# ============================================================================ tensor names


@dataclasses.dataclass(frozen=True)
class Entry:
    hf: str
    path: tuple[str, ...]
    kind: str = "same"  # "same" | "linear" | "fused"
    part: int = 0


def tensor_map(family: str, config: ModelConfig) -> list[Entry]:
    """Every parameter of `Transformer(config)` ("params" collection) and its HF tensor (no prefix)."""
    out: list[Entry] = []
    if family == "gpt2":
        out += [Entry("wte.weight", ("embedding",)), Entry("wpe.weight", ("position_embedding",)),
                Entry("ln_f.weight", ("final_norm", "scale")), Entry("ln_f.bias", ("final_norm", "bias"))]
        for i in range(config.num_layers):
            h, layer = f"h.{i}.", f"layer_{i}"
            for hf_norm, ours in (("ln_1", "attention_norm"), ("ln_2", "mlp_norm")):
                out += [Entry(f"{h}{hf_norm}.weight", (layer, ours, "scale")),
                        Entry(f"{h}{hf_norm}.bias", (layer, ours, "bias"))]
            for part, proj in enumerate("qkv"):
                out += [Entry(f"{h}attn.c_attn.weight", (layer, "attention", proj, "kernel"), "fused", part),
                        Entry(f"{h}attn.c_attn.bias", (layer, "attention", proj, "bias"), "fused", part)]
            for hf_proj, ours in (("attn.c_proj", ("attention", "o")), ("mlp.c_fc", ("mlp", "up")),
                                  ("mlp.c_proj", ("mlp", "down"))):
                out += [Entry(f"{h}{hf_proj}.weight", (layer, *ours, "kernel")),
                        Entry(f"{h}{hf_proj}.bias", (layer, *ours, "bias"))]
        return out
    out += [Entry("embed_tokens.weight", ("embedding",)), Entry("norm.weight", ("final_norm", "scale"))]
    sandwich = family in ("gemma2", "gemma3")
    norms = ({"input_layernorm": "attention_norm", "post_attention_layernorm": "attention_post_norm",
              "pre_feedforward_layernorm": "mlp_norm", "post_feedforward_layernorm": "mlp_post_norm"} if sandwich else
             {"input_layernorm": "attention_norm", "post_attention_layernorm": "mlp_norm"})
    for i in range(config.num_layers):
        h, layer = f"layers.{i}.", f"layer_{i}"
        out += [Entry(f"{h}{hf_norm}.weight", (layer, ours, "scale")) for hf_norm, ours in norms.items()]
        for proj in "qkvo":
            out.append(Entry(f"{h}self_attn.{proj}_proj.weight", (layer, "attention", proj, "kernel"), "linear"))
            if (config.qkv_bias and proj != "o") or (config.o_bias and proj == "o"):
                out.append(Entry(f"{h}self_attn.{proj}_proj.bias", (layer, "attention", proj, "bias")))
        if config.qk_norm:
            out += [Entry(f"{h}self_attn.q_norm.weight", (layer, "attention", "q_norm", "scale")),
                    Entry(f"{h}self_attn.k_norm.weight", (layer, "attention", "k_norm", "scale"))]
        for proj in ("gate", "up", "down"):
            out.append(Entry(f"{h}mlp.{proj}_proj.weight", (layer, "mlp", proj, "kernel"), "linear"))
            if config.mlp_bias:
                out.append(Entry(f"{h}mlp.{proj}_proj.bias", (layer, "mlp", proj, "bias")))
    return out


# Prefixes of the decoder's tensors in the checkpoints transformers writes (first match wins),
# the untied head's name, and tensors of other parts of a checkpoint that are skipped.
PREFIXES = {"gpt2": ("transformer.", ""),
            "gemma3": ("model.language_model.", "language_model.model.", "model.", "")}
DEFAULT_PREFIXES = ("model.", "")
HEAD = {"gemma3": ("lm_head.weight", "language_model.lm_head.weight")}
IGNORED_PREFIXES = ("vision_tower.", "model.vision_tower.", "multi_modal_projector.", "model.multi_modal_projector.")
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")  # buffers of old checkpoints


def to_ours(entry: Entry, array: np.ndarray) -> np.ndarray:
    """The HF tensor (or its slice) in our layout (a view where possible)."""
    if entry.kind == "linear":
        return array.T
    if entry.kind == "fused":
        n = array.shape[-1] // 3
        return array[..., entry.part * n:(entry.part + 1) * n]
    return array
