"""Import a local GGUF checkpoint (llama.cpp's single-file format; architecture gemma3).

`import_model(gguf_path, out_dir)` reads the file with the `gguf` package (`gguf.GGUFReader`,
memory-mapped) and writes the same `dpsynth.model` directory as `hf_import.import_model`, with
the same manifest "source" fields ("format": "gguf"). It only reads the local file.

Config: the `gemma3.*` metadata is turned into the Hugging Face `config.json` that llama.cpp's
converter (`convert_hf_to_gguf.py`, `Gemma3Model`) read, and that goes through
`hf_files.model_config_from_hf`, so a GGUF and a safetensors Gemma 3 get one mapping. The
converter does not store what llama.cpp hard-codes for gemma3, so neither do we read it:
sliding-window layers are 5 of every 6 (`attention.sliding_window_pattern` when present), their
rotary base is 10,000 (`rope.freq_base_swa` when present), queries are scaled by
`key_length ** -0.5` (by `(embedding_length / head_count) ** -0.5` for the 62-layer 27B, as
llama.cpp does), no logit soft-capping (`final_logit_softcapping` when present). That config
is kept as the source's `hf_config`, so `dpsynth export-model` writes a Gemma 3 HF directory.

Tensors: GGUF lists shapes innermost first (ne order); numpy's shape is the reverse, so
`blk.N.attn_q.weight` is [out, in] like an `nn.Linear` weight and is transposed to our kernel.
Every tensor is dequantized on its own to float32 (`gguf.quants.dequantize`: F32, F16, BF16,
Q4_0/1, Q5_0/1, Q8_0, Q2_K..Q6_K) and cast to the parameter dtype. The converter stores
Gemma's norm weights with the 1 of `x * (1 + w)` already added (`data_torch + norm_shift` for
every `*norm.weight`), so 1 is subtracted here (our config's `norm_scale_offset=1` adds it back).
It does not permute q/k for gemma (it does only for llama-style rotary), so HF's rotate-half
layout, the one `rotary` uses, is what the file holds.

Tokenizer: `gguf_tokenizer.sentencepiece_proto` rebuilds the SentencePiece model from the
`tokenizer.ggml.*` arrays; it is the directory's `tokenizer.model`.

Every problem stops the import with a `GGUFFormatError` naming the file and the key, tensor,
architecture or tensor type.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import numpy as np

from dpsynth import fileio
from dpsynth.errors import DpsynthError
from dpsynth.models import gguf_tokenizer, hf_files, hf_import
from dpsynth.models.config import ModelConfig
from dpsynth.models.hf_files import Entry, HFFormatError

ARCHITECTURES = ("gemma3",)
# What `gguf.quants.dequantize` converts (gguf >= 0.17), by GGMLQuantizationType name.
TENSOR_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                "Q6_K")
NORM_SHIFT = 1.0  # llama.cpp's Gemma3Model.norm_shift
GEMMA3_SWA_PATTERN, GEMMA3_SWA_BASE = 6, 10_000.0  # llama.cpp's hard-coded gemma3 values


class GGUFFormatError(DpsynthError, ValueError):
    """A GGUF file we cannot import (names the file and the key, tensor or type)."""


def require_gguf():
    """The `gguf` package, or a one-line error saying how to install it."""
    try:
        import gguf
    except ImportError as e:
        raise GGUFFormatError("reading a GGUF file needs the `gguf` package (pip install 'gguf>=0.17'; "
                              "`pip install -e .` installs it)") from e
    return gguf


@dataclasses.dataclass(frozen=True)
class GGUFSource:
    """A checked GGUF file: what to build and where each tensor lives."""

    path: str
    architecture: str
    family: str
    config: ModelConfig
    hf_config: dict[str, Any]  # the equivalent Hugging Face config.json (module docstring)
    special_ids: dict[str, int]
    metadata: dict[str, Any]  # scalar metadata (general.*, ARCH.*, tokenizer ids), for provenance
    tensors: dict[str, tuple[Entry, Any]]  # our path "a/b/c" -> (entry, gguf ReaderTensor)
    reader: Any  # gguf.GGUFReader


def open_reader(path: str):
    gguf = require_gguf()
    if not os.path.isfile(path):
        raise GGUFFormatError(f"{path}: missing (or not a file)")
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # bad magic, truncated header, unknown value types
        raise GGUFFormatError(f"{path}: cannot be read as a GGUF file ({type(e).__name__}: {e})") from e


def metadata(reader) -> dict[str, Any]:
    """Every key's value as Python values (but the tokenizer's arrays, read by `tokenizer_proto`).

    A float32 value becomes the shortest decimal that rounds to it (`rms_norm_eps` 1e-06, not
    9.999999974752427e-07: the value of the config.json it was converted from).
    """
    gguf = require_gguf()
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or (key.startswith("tokenizer.ggml.") and len(field.types) > 1):
            continue
        value = field.contents()
        if field.types == [gguf.GGUFValueType.FLOAT32]:
            value = float(str(np.float32(value)))
        out[key] = value
    return out


def _array(reader, key: str, path: str) -> list:
    field = reader.fields.get(key)
    if field is None:
        raise GGUFFormatError(f"{path}: metadata key {key!r} is missing (needed for the tokenizer)")
    return field.contents()


def _need(meta: dict[str, Any], key: str, path: str):
    if key not in meta:
        raise GGUFFormatError(f"{path}: metadata key {key!r} is missing")
    return meta[key]


def hf_config_from_gguf(meta: dict[str, Any], path: str, *, vocab_size: int, tied: bool) -> dict[str, Any]:
    """The Hugging Face `config.json` (Gemma3TextConfig) the GGUF was converted from, as far as it says."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFFormatError(f"{path}: GGUF architecture {arch!r} is not supported (supported: "
                              f"{', '.join(ARCHITECTURES)})")
    k = lambda name: f"{arch}.{name}"  # noqa: E731
    layers, d = int(_need(meta, k("block_count"), path)), int(_need(meta, k("embedding_length"), path))
    heads = int(_need(meta, k("attention.head_count"), path))
    head_dim = int(meta.get(k("attention.key_length"), d // heads))
    if int(meta.get(k("attention.value_length"), head_dim)) != head_dim:
        raise GGUFFormatError(f"{path}: {k('attention.value_length')} != {k('attention.key_length')} is not "
                              "implemented")
    base = float(meta.get(k("rope.freq_base"), 1_000_000.0))
    full_rope: dict[str, Any] = {"rope_type": "default", "rope_theta": base}
    scaling = meta.get(k("rope.scaling.type"), "none")
    if scaling == "linear":
        full_rope.update(rope_type="linear", factor=float(_need(meta, k("rope.scaling.factor"), path)))
    elif scaling not in ("none", None):
        raise GGUFFormatError(f"{path}: {k('rope.scaling.type')}={scaling!r} is not implemented (none, linear are)")
    pattern = meta.get(k("attention.sliding_window_pattern"), GEMMA3_SWA_PATTERN)
    if isinstance(pattern, list):  # one bool per layer (true: sliding window)
        if len(pattern) != layers:
            raise GGUFFormatError(f"{path}: {k('attention.sliding_window_pattern')} has {len(pattern)} entries for "
                                  f"{layers} layers")
        layout = {"layer_types": ["sliding_attention" if p else "full_attention" for p in pattern]}
    else:
        layout = {"sliding_window_pattern": int(pattern)}
    return {
        **layout, "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": int(vocab_size),
        "hidden_size": d, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get(k("attention.head_count_kv"), heads)), "head_dim": head_dim,
        "intermediate_size": int(_need(meta, k("feed_forward_length"), path)),
        "max_position_embeddings": int(_need(meta, k("context_length"), path)),
        "rms_norm_eps": float(meta.get(k("attention.layer_norm_rms_epsilon"), 1e-6)),
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": float(d // heads if layers == 62 else head_dim),
        "sliding_window": int(_need(meta, k("attention.sliding_window"), path)),
        "rope_parameters": {"full_attention": full_rope,
                            "sliding_attention": {"rope_type": "default",
                                                  "rope_theta": float(meta.get(k("rope.freq_base_swa"),
                                                                               GEMMA3_SWA_BASE))}},
        "attn_logit_softcapping": None, "final_logit_softcapping": meta.get(k("final_logit_softcapping")),
        "tie_word_embeddings": tied, "dtype": "float32",
    }


def tensor_map(config: ModelConfig) -> list[Entry]:
    """Every parameter of a gemma3 `Transformer(config)` and its GGUF tensor (kind as in `hf_files`)."""
    out = [Entry("token_embd.weight", ("embedding",)), Entry("output_norm.weight", ("final_norm", "scale"))]
    norms = {"attn_norm": "attention_norm", "post_attention_norm": "attention_post_norm", "ffn_norm": "mlp_norm",
             "post_ffw_norm": "mlp_post_norm"}
    for i in range(config.num_layers):
        b, layer = f"blk.{i}.", f"layer_{i}"
        out += [Entry(f"{b}{name}.weight", (layer, ours, "scale")) for name, ours in norms.items()]
        out += [Entry(f"{b}attn_{name}.weight", (layer, "attention", proj, "kernel"), "linear")
                for name, proj in (("q", "q"), ("k", "k"), ("v", "v"), ("output", "o"))]
        out += [Entry(f"{b}attn_q_norm.weight", (layer, "attention", "q_norm", "scale")),
                Entry(f"{b}attn_k_norm.weight", (layer, "attention", "k_norm", "scale"))]
        out += [Entry(f"{b}ffn_{proj}.weight", (layer, "mlp", proj, "kernel"), "linear")
                for proj in ("gate", "up", "down")]
    return out


def _shape(tensor) -> tuple[int, ...]:
    """The numpy shape of a GGUF tensor (its ne order reversed)."""
    return tuple(int(n) for n in reversed(tensor.shape.tolist()))


def inspect(path: str, *, dtype: str = "float32") -> GGUFSource:
    """Reads and checks the metadata and tensor infos (no tensor data is converted)."""
    path = os.path.abspath(path)
    reader = open_reader(path)
    meta = metadata(reader)
    found = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in found:
        raise GGUFFormatError(f"{path}: tensor 'token_embd.weight' (the token embedding) is missing")
    vocab = _shape(found["token_embd.weight"])[0]
    tied = "output.weight" not in found
    hf = hf_config_from_gguf(meta, path, vocab_size=vocab, tied=tied)
    try:
        family, config = hf_files.model_config_from_hf(hf, f"{path} (its gemma3 metadata)", dtype=dtype)
    except HFFormatError as e:
        raise GGUFFormatError(str(e)) from e
    entries = tensor_map(config)
    if not tied:
        entries.append(Entry("output.weight", ("lm_head",), "linear"))
    shapes = {hf_import._path_key(tuple(str(getattr(k, "key", k)) for k in p)): leaf.shape
              for p, leaf in jax.tree_util.tree_flatten_with_path(hf_import.abstract_params(config))[0]}
    tensors: dict[str, tuple[Entry, Any]] = {}
    for entry in entries:
        key = hf_import._path_key(entry.path)
        tensor = found.get(entry.hf)
        if tensor is None:
            raise GGUFFormatError(f"{path}: tensor {entry.hf!r} is missing (needed for {key})")
        kind = tensor.tensor_type.name
        if kind not in TENSOR_TYPES:
            raise GGUFFormatError(f"{path}: tensor {entry.hf!r} has type {kind}, which is not supported "
                                  f"(supported: {', '.join(TENSOR_TYPES)})")
        got = hf_files.to_ours(entry, np.empty(_shape(tensor), np.bool_)).shape
        if tuple(got) != tuple(shapes[key]):
            raise GGUFFormatError(f"{path}: tensor {entry.hf!r} has shape {list(_shape(tensor))}, the metadata implies "
                                  f"{list(shapes[key]) if entry.kind != 'linear' else list(shapes[key][::-1])}")
        tensors[key] = (entry, tensor)
    used = {entry.hf for entry in entries}
    extra = sorted(set(found) - used - {"rope_freqs.weight"})
    if extra:
        raise GGUFFormatError(f"{path}: unexpected tensor {extra[0]!r} (not part of a {hf['model_type']} model with "
                              "this metadata)")
    special = special_ids(meta, vocab, path)
    return GGUFSource(path, meta["general.architecture"], family, config, hf, special, meta, tensors, reader)


def special_ids(meta: dict[str, Any], vocab: int, path: str) -> dict[str, int]:
    """bos/eos/pad/unk from `tokenizer.ggml.*_token_id` (pad falls back to eos, unk to pad, bos to eos)."""
    def get(name):
        value = meta.get(f"tokenizer.ggml.{name}_token_id")
        return None if value is None else int(value)

    eos = get("eos")
    if eos is None:
        raise GGUFFormatError(f"{path}: metadata key 'tokenizer.ggml.eos_token_id' is missing (dpsynth ends generated "
                              "texts there)")
    ids = {"eos": eos, "bos": get("bos") if get("bos") is not None else eos}
    ids["pad"] = get("padding") if get("padding") is not None else eos
    ids["unk"] = get("unknown") if get("unknown") is not None else ids["pad"]
    for name, value in ids.items():
        if not 0 <= value < vocab:
            raise GGUFFormatError(f"{path}: {name} token id {value} is outside the vocabulary of {vocab}")
    return ids


def read_tensor(tensor) -> np.ndarray:
    """One GGUF tensor, dequantized to float32, in numpy (reversed ne) shape."""
    gguf = require_gguf()
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    return np.asarray(values, np.float32).reshape(_shape(tensor))


def to_ours(source: GGUFSource, entry: Entry, array: np.ndarray) -> np.ndarray:
    """A dequantized GGUF tensor in our layout: linear weights transposed, the converter's norm shift undone."""
    if entry.hf.endswith("norm.weight") and source.config.norm_scale_offset:
        array = array - np.float32(NORM_SHIFT)
    return hf_files.to_ours(entry, array)


def load_params(source: GGUFSource, *, param_dtype: str = "float32", mesh=None) -> dict:
    """The "params" tree, tensor by tensor (each dequantized, converted and placed on its own)."""
    dtype = hf_import.PARAM_DTYPES[param_dtype]
    return hf_import.placed_params(source.config, (
        (key, np.ascontiguousarray(to_ours(source, entry, read_tensor(tensor)), dtype=dtype))
        for key, (entry, tensor) in sorted(source.tensors.items(), key=lambda kv: int(kv[1][1].data_offset))),
        mesh=mesh)


def tokenizer_proto(source: GGUFSource) -> bytes:
    """The SentencePiece model of the file's `tokenizer.ggml.*` metadata (`gguf_tokenizer`)."""
    path, reader = source.path, source.reader
    model = source.metadata.get("tokenizer.ggml.model")
    if model != "llama":
        raise GGUFFormatError(f"{path}: tokenizer.ggml.model={model!r} is not supported (only 'llama', llama.cpp's "
                              "SentencePiece tokenizer)")
    tokens = [str(t) for t in _array(reader, "tokenizer.ggml.tokens", path)]
    scores = _array(reader, "tokenizer.ggml.scores", path)
    types = _array(reader, "tokenizer.ggml.token_type", path)
    if not len(tokens) == len(scores) == len(types):
        raise GGUFFormatError(f"{path}: tokenizer.ggml.tokens/scores/token_type have {len(tokens)}/{len(scores)}/"
                              f"{len(types)} entries (they must be equal)")
    bad = next((t for t in types if int(t) not in gguf_tokenizer.PIECE_TYPES), None)
    if bad is not None:
        raise GGUFFormatError(f"{path}: tokenizer.ggml.token_type has {bad}, not a SentencePiece piece type (1..6)")
    if len(tokens) > source.config.vocab_size:
        raise GGUFFormatError(f"{path}: the tokenizer has {len(tokens)} tokens but tensor 'token_embd.weight' has only "
                              f"{source.config.vocab_size} rows (vocabulary disagrees with the embedding)")
    if len(set(tokens)) != len(tokens):
        raise GGUFFormatError(f"{path}: tokenizer.ggml.tokens has duplicate pieces")
    return gguf_tokenizer.sentencepiece_proto(
        tokens, scores, types, special_ids=source.special_ids,
        add_dummy_prefix=bool(source.metadata.get("tokenizer.ggml.add_space_prefix", True)))


def load_gguf_tokenizer(source: GGUFSource):
    """The rebuilt SentencePiece tokenizer, loaded with the file's special ids."""
    from dpsynth.data.tokenizers import Tokenizer

    proto = tokenizer_proto(source)
    try:
        return Tokenizer(proto, source.special_ids)
    except Exception as e:  # sentencepiece refuses the rebuilt model
        raise GGUFFormatError(f"{source.path}: its tokenizer.ggml.* metadata does not make a SentencePiece model "
                              f"({type(e).__name__}: {e})") from e


def provenance(source: GGUFSource, tokenizer) -> dict[str, Any]:
    """The manifest's "source" record: the fields of `hf_import.provenance`, for a GGUF file.

    `config_sha256` hashes the equivalent config.json (canonical JSON), `weights_sha256` the file,
    `tokenizer_file_sha256` the rebuilt tokenizer.model; `gguf_metadata` keeps the scalar metadata.
    """
    config_json = json.dumps(source.hf_config, sort_keys=True, separators=(",", ":")).encode()
    types = sorted({t.tensor_type.name for _, t in source.tensors.values()})
    return {
        "format": "gguf", "family": source.family, "path": source.path, "model_type": source.hf_config["model_type"],
        "architectures": source.hf_config["architectures"], "source_dtype": "+".join(types),
        "config_sha256": fileio.sha256_bytes(config_json),
        "weights_sha256": {os.path.basename(source.path): fileio.sha256_file(source.path)},
        "tokenizer_file": tokenizer.filename, "tokenizer_file_sha256": fileio.sha256_bytes(tokenizer.model_proto),
        "pretraining_data_checked": False, "hf_config": source.hf_config, "hf_tokenizer_config": None,
        "hf_generation_config": None, "gguf_architecture": source.architecture,
        "gguf_metadata": {k: v for k, v in source.metadata.items() if isinstance(v, (int, float, str, bool))},
    }


def import_model(gguf_path: str, out_dir: str, *, dtype: str = "float32", mesh=None) -> dict[str, Any]:
    """Imports the GGUF file `gguf_path` into the dpsynth model directory `out_dir`; returns its manifest.

    Args:
      gguf_path: a local .gguf file.
      out_dir: the model directory to write.
      dtype: "float32" or "bfloat16": parameters and compute dtype.
      mesh: optional mesh to load the parameters into.
    """
    from dpsynth.models.directory import save_model  # Orbax: only when a model is written

    hf_import._check_out(out_dir)
    source = inspect(gguf_path, dtype=dtype)
    tokenizer = load_gguf_tokenizer(source)
    params = load_params(source, param_dtype=dtype, mesh=mesh)
    return save_model(out_dir, source.config, {"params": params}, tokenizer,
                      {"source": provenance(source, tokenizer)}, created_by=hf_import.CREATED_BY)
