"""Import a local Hugging Face checkpoint (Llama 2/3, Mistral, Qwen2/2.5, Gemma 1/2/3, GPT-2).

`import_model(hf_dir, out_dir)` reads `config.json`, `model.safetensors` (or the shards of
`model.safetensors.index.json`) and the tokenizer (`tokenizer.json` through `tokenizers`, else
a SentencePiece `tokenizer.model`) and writes a `dpsynth.model` directory (see
`dpsynth.models.directory`) whose manifest records the source: family, config SHA-256, the
SHA-256 of every weight file and of the tokenizer. It only reads local files (no network).

Large models: `load_params` walks the checkpoint file by file and tensor by tensor; each tensor
is memory-mapped, converted to our layout and dtype on its own and `jax.device_put` straight
into its mesh sharding, so the host never holds more than one converted tensor (and never a
float32 copy of a bfloat16 model when `param_dtype="bfloat16"`).

Every problem stops the import with an `HFFormatError` naming the file and the field or
tensor: an unknown architecture, a config option we do not implement, a missing or
unexpected tensor, a shape mismatch, or a tokenizer larger than the embedding.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpsynth import fileio, outdir
from dpsynth.models import hf_files, hf_tokenizer
from dpsynth.models import sharding as sharding_lib
from dpsynth.models.config import ModelConfig
from dpsynth.models.hf_files import HFFormatError, TensorInfo
from dpsynth.models.transformer import Transformer

GENERATION_CONFIG, TOKENIZER_CONFIG = hf_tokenizer.GENERATION_CONFIG, hf_tokenizer.TOKENIZER_CONFIG
CREATED_BY = "dpsynth import-model"
PARAM_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(jnp.bfloat16)}


@dataclasses.dataclass(frozen=True)
class HFSource:
    """A checked Hugging Face directory: what to build and where each tensor lives."""

    directory: str
    family: str
    config: ModelConfig
    hf_config: dict[str, Any]
    special_ids: dict[str, int]
    tokenizer_config: dict[str, Any] | None  # the source's tokenizer_config.json / generation_config.json,
    generation_config: dict[str, Any] | None  # kept for the export
    tensors: dict[str, tuple[hf_files.Entry, TensorInfo]]  # our path "a/b/c" -> (entry, tensor)
    files: tuple[str, ...]


def _path_key(path: tuple[str, ...]) -> str:
    return "/".join(path)


def abstract_params(config: ModelConfig) -> dict:
    """ShapeDtypeStructs of the "params" collection of `Transformer(config)`."""
    shapes = jax.eval_shape(Transformer(config.base()).init, jax.random.PRNGKey(0), jnp.zeros((1, 2), jnp.int32))
    return shapes["params"]


def inspect(hf_dir: str, *, dtype: str = "float32") -> HFSource:
    """Reads and checks config.json and the safetensors headers (no tensor data)."""
    hf_dir = os.path.abspath(hf_dir)
    config_path = os.path.join(hf_dir, hf_files.CONFIG_FILE)
    hf = hf_files.read_json(config_path)
    family, config = hf_files.model_config_from_hf(hf, config_path, dtype=dtype)
    files = hf_files.checkpoint_files(hf_dir)
    found: dict[str, TensorInfo] = {}
    for path in files:
        for name, info in hf_files.read_header(path).items():
            if name in found:
                raise HFFormatError(f"{path}: tensor {name!r} also appears in {found[name].file}")
            found[name] = info
    entries = hf_files.tensor_map(family, config)
    prefixes = hf_files.PREFIXES.get(family, hf_files.DEFAULT_PREFIXES)
    prefix = next((p for p in prefixes if p + entries[0].hf in found), None)
    if prefix is None:
        raise HFFormatError(f"{files[0]}: tensor {prefixes[0] + entries[0].hf!r} (the token embedding) is missing; "
                            f"is this a {family} checkpoint?")
    shapes = {_path_key(tuple(str(getattr(k, 'key', k)) for k in path)): leaf.shape
              for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_params(config))[0]}
    tensors: dict[str, tuple[hf_files.Entry, TensorInfo]] = {}
    used: set[str] = set()
    for entry in entries:
        name = prefix + entry.hf
        if name not in found:
            raise HFFormatError(f"{files[0] if len(files) == 1 else hf_dir}: tensor {name!r} is missing (needed for "
                                f"{_path_key(entry.path)})")
        tensors[_path_key(entry.path)] = (entry, found[name])
        used.add(name)
    head_names = hf_files.HEAD.get(family, ("lm_head.weight",))
    head = next((n for n in head_names if n in found), None)
    if not config.tie_embeddings:
        if head is None:
            raise HFFormatError(f"{config_path}: tie_word_embeddings is false but tensor {head_names[0]!r} is missing "
                                f"from {', '.join(os.path.basename(f) for f in files)}")
        tensors["lm_head"] = (hf_files.Entry(head, ("lm_head",), "linear"), found[head])
        used.add(head)
    elif head is not None:  # a tied checkpoint that stores the head anyway: it must be the embedding
        emb = found[prefix + entries[0].hf]
        if found[head].shape != emb.shape or not np.array_equal(hf_files.read_tensor(found[head]),
                                                                hf_files.read_tensor(emb)):
            raise HFFormatError(f"{found[head].file}: tensor {head!r} differs from {emb.name!r} but {config_path} "
                                "says tie_word_embeddings=true (set it to false to import an untied head)")
        used.add(head)
    for name, info in found.items():
        if name in used or name.startswith(hf_files.IGNORED_PREFIXES) or name.endswith(hf_files.IGNORED_SUFFIXES):
            continue
        raise HFFormatError(f"{info.file}: unexpected tensor {name!r} (not part of a {family} model with this "
                            f"config.json; a config option we do not read?)")
    for key, (entry, info) in tensors.items():
        got = hf_files.to_ours(entry, np.empty(info.shape, np.bool_)).shape
        if key not in shapes:
            raise HFFormatError(f"{info.file}: tensor {info.name!r} maps to {key}, which this config does not have")
        if tuple(got) != tuple(shapes[key]):
            raise HFFormatError(f"{info.file}: tensor {info.name!r} has shape {list(info.shape)}, config.json implies "
                                f"{list(shapes[key]) if entry.kind != 'linear' else list(shapes[key][::-1])}")
    missing = set(shapes) - set(tensors)
    if missing:
        raise HFFormatError(f"{hf_dir}: no tensor for {sorted(missing)}")
    generation, tokenizer_config = (_optional_json(os.path.join(hf_dir, name))
                                    for name in (GENERATION_CONFIG, TOKENIZER_CONFIG))
    special = hf_files.special_ids_from_hf(hf, generation, config.vocab_size, config_path,
                                           tokenizer_unk=_tokenizer_unk(hf_dir))
    return HFSource(hf_dir, family, config, hf, special, tokenizer_config, generation, tensors, tuple(files))


def _optional_json(path: str) -> dict[str, Any] | None:
    if not os.path.exists(path):
        return None
    data = hf_files.read_json(path)
    if not isinstance(data, dict):
        raise HFFormatError(f"{path}: not a JSON object")
    return data


def _tokenizer_unk(hf_dir: str) -> int | None:
    """The id of the tokenizer file's own unknown token, or None (none, or no readable file:
    `load_hf_tokenizer` reports that)."""
    json_path, sp_path = (os.path.join(hf_dir, name) for name in ("tokenizer.json", "tokenizer.model"))
    try:
        if os.path.exists(json_path):
            model = fileio.read_json(json_path)["model"]
            if model.get("type") == "Unigram":
                return model.get("unk_id")
            unk = model.get("unk_token")
            return model.get("vocab", {}).get(unk) if unk is not None else None
        if os.path.exists(sp_path):
            with open(sp_path, "rb") as f:
                pieces = hf_tokenizer.read_sentencepiece(f.read(), sp_path).pieces
            return next((i for i, (_, _, kind) in enumerate(pieces) if kind == hf_tokenizer.UNKNOWN), None)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return None


def load_params(source: HFSource, *, param_dtype: str = "float32", mesh=None) -> dict:
    """The "params" tree, loaded file by file, tensor by tensor, into `mesh` shardings.

    Args:
      source: from `inspect`.
      param_dtype: "float32" or "bfloat16" (each tensor is converted on its own).
      mesh: a `jax.sharding.Mesh` ("data", "model" axes; see `dpsynth.train.sharding.make_mesh`), or
        None for the default device.
    """
    dtype = PARAM_DTYPES[param_dtype]
    by_file: dict[str, list[tuple[str, hf_files.Entry, TensorInfo]]] = {}
    for key, (entry, info) in source.tensors.items():
        by_file.setdefault(info.file, []).append((key, entry, info))
    return placed_params(source.config, (
        (key, np.ascontiguousarray(hf_files.to_ours(entry, hf_files.read_tensor(info)), dtype=dtype))
        for file in source.files  # shard by shard, in file order
        for key, entry, info in sorted(by_file.get(file, []), key=lambda t: t[2].begin)), mesh=mesh)


def placed_params(config: ModelConfig, tensors, *, mesh=None) -> dict:
    """The "params" tree of `tensors` ((path key, host array) pairs, made one at a time by the
    caller's generator), each placed on its `mesh` sharding (or the default device) as it comes,
    so the host holds one tensor at a time. Shared by the safetensors and GGUF importers."""
    flat_specs = None
    if mesh is not None:
        specs = sharding_lib.param_shardings(abstract_params(config), mesh)
        flat_specs = {_path_key(tuple(str(getattr(k, "key", k)) for k in p)): s
                      for p, s in jax.tree_util.tree_flatten_with_path(specs)[0]}
    params: dict[str, Any] = {}
    for key, host in tensors:
        value = jax.device_put(host, flat_specs[key]) if flat_specs is not None else jax.device_put(host)
        del host
        node = params
        *parents, leaf = key.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return params


def load_hf_tokenizer(source: HFSource):
    """The source's tokenizer (`tokenizer.json` preferred, else `tokenizer.model`), checked against the embedding."""
    from dpsynth.data.tokenizers import HFTokenizer, Tokenizer

    json_path = os.path.join(source.directory, "tokenizer.json")
    sp_path = os.path.join(source.directory, "tokenizer.model")
    try:
        if os.path.exists(json_path):
            path = json_path
            with open(path, "rb") as f:
                tok = HFTokenizer(f.read(), source.special_ids)
        elif os.path.exists(sp_path):
            path = sp_path
            with open(path, "rb") as f:
                tok = Tokenizer(f.read(), source.special_ids)
        else:
            raise HFFormatError(f"{source.directory}: has neither tokenizer.json nor tokenizer.model")
    except HFFormatError:
        raise
    except Exception as e:  # tokenizers / sentencepiece parse errors, special ids outside the vocabulary
        raise HFFormatError(f"{path}: cannot be loaded as a tokenizer ({type(e).__name__}: {e})") from e
    if tok.vocab_size > source.config.vocab_size:
        entry, info = source.tensors["embedding"]
        raise HFFormatError(f"{path}: the tokenizer has {tok.vocab_size} ids but tensor {info.name!r} in {info.file} "
                            f"has only {source.config.vocab_size} rows (vocabulary disagrees with the embedding)")
    return tok, path


def provenance(source: HFSource, tokenizer_path: str) -> dict[str, Any]:
    """The manifest's "source" record: what was imported, with hashes.

    The `hf_*` entries hold the source's own JSON files (config.json, and tokenizer_config.json /
    generation_config.json or None) for `dpsynth export-model`; privacy reports leave them out.
    """
    return {
        "format": "huggingface-safetensors", "family": source.family, "path": source.directory,
        "model_type": source.hf_config.get("model_type"), "architectures": source.hf_config.get("architectures"),
        "source_dtype": source.hf_config.get("dtype", source.hf_config.get("torch_dtype")),
        "config_sha256": fileio.sha256_file(os.path.join(source.directory, hf_files.CONFIG_FILE)),
        "weights_sha256": {os.path.basename(f): fileio.sha256_file(f) for f in source.files},
        "tokenizer_file": os.path.basename(tokenizer_path), "tokenizer_file_sha256": fileio.sha256_file(tokenizer_path),
        "pretraining_data_checked": False, "hf_config": source.hf_config,
        "hf_tokenizer_config": source.tokenizer_config, "hf_generation_config": source.generation_config,
    }


def _check_out(out_dir: str) -> None:
    """`out_dir` must be new, empty or an earlier import (never another model directory)."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise HFFormatError(f"{out_dir}: exists and is not a directory; choose another --out")
    if os.path.isdir(out_dir) and outdir.without_run_files(os.listdir(out_dir)):
        manifest = os.path.join(out_dir, "manifest.json")
        try:
            earlier = fileio.read_json(manifest).get("created_by") == CREATED_BY
        except (OSError, ValueError, AttributeError):
            earlier = False
        if not earlier:
            raise HFFormatError(f"{out_dir}: is not empty and is not an earlier import-model output; choose a new or "
                                "empty --out directory")


def import_model(hf_dir: str, out_dir: str, *, dtype: str = "float32", mesh=None) -> dict[str, Any]:
    """Imports `hf_dir` into the dpsynth model directory `out_dir`; returns its manifest.

    Args:
      hf_dir: a local Hugging Face model directory.
      out_dir: the model directory to write.
      dtype: "float32" or "bfloat16": parameters and compute dtype.
      mesh: optional mesh to load the parameters into (see `load_params`).
    """
    from dpsynth.models.directory import save_model  # Orbax (~0.5 s to import): only when a model is written

    _check_out(out_dir)
    source = inspect(hf_dir, dtype=dtype)
    tokenizer, tokenizer_path = load_hf_tokenizer(source)
    params = load_params(source, param_dtype=dtype, mesh=mesh)
    return save_model(out_dir, source.config, {"params": params}, tokenizer,
                      {"source": provenance(source, tokenizer_path)}, created_by=CREATED_BY)
