"""The model directory the later stages load (`save_model` / `load_model`).

Format "dpsynth.model" version 1:

    DIR/manifest.json     {"format": "dpsynth.model", "format_version": 1, "preset": ...,
                           "collections": [...], "base": null | {"path": ..., "manifest_sha256": ...},
                           "created_by": ..., "tokenizer_sha256": ..., plus extra fields
                           (e.g. the corpus manifest hash, training steps)}
    DIR/config.json       `ModelConfig.to_dict()` (including lora_rank / prompt_length)
    DIR/tokenizer.model   the SentencePiece model (bytes), or DIR/tokenizer.json (an imported
                          Hugging Face tokenizer); DIR/special_ids.json when the special ids
                          are not dpsynth's (imported models, see `dpsynth.data.tokenizers`)
    DIR/variables/        Orbax tree {collection: {...}} of the collections listed
    DIR/privacy_report.*  (DP-tuned models only, written by dpsynth.dp)

An adapter-only directory (`save_model(..., collections=("lora",), base_dir=BASE)`) stores
only those collections plus a pointer to the base directory (and the SHA-256 of its
manifest); `load_model` loads the base's "params" and overlays the adapters. Resumable
training state is `dpsynth.train.checkpoint`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from dpsynth import fileio, outdir
from dpsynth.data.tokenizers import HF_FILE, SP_FILE, SPECIAL_IDS_FILE, Tokenizer, load_tokenizer, save_tokenizer
from dpsynth.errors import DpsynthError
from dpsynth.models.config import ModelConfig
from dpsynth.models.sharding import sync

MODEL_FORMAT = "dpsynth.model"
MODEL_FORMAT_VERSION = 1
MANIFEST, CONFIG, TOKENIZER, VARIABLES = "manifest.json", "config.json", "tokenizer.model", "variables"


class CheckpointError(DpsynthError, ValueError):
    """A checkpoint or model directory that cannot be used (says why and what to do)."""


def absolute_path(path: str) -> str:
    """`path` made absolute, unless it is a URL (gs://...)."""
    return path if "://" in path else os.path.abspath(path)


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    config: ModelConfig
    variables: dict
    tokenizer: Tokenizer
    manifest: dict


def save_model(directory: str, config: ModelConfig, variables: dict, tokenizer: Tokenizer,
               extra_manifest: dict[str, Any] | None = None, *, collections: Sequence[str] | None = None,
               base_dir: str | None = None, created_by: str = "dpsynth") -> dict[str, Any]:
    """Writes a model directory (layout in the module docstring) and returns its manifest.

    Args:
      directory: output directory (created; existing files are overwritten).
      config: the model config (with the adapter settings the variables were made with).
      variables: {collection: tree}; only `collections` of them are written.
      tokenizer: the tokenizer the model was trained with.
      extra_manifest: extra JSON fields (input hashes, training summary...).
      collections: which collections to store (default: all of `variables`).
      base_dir: for adapter-only directories: the model directory holding "params".
    """
    if tokenizer.vocab_size > config.vocab_size:
        raise CheckpointError(f"tokenizer has {tokenizer.vocab_size} ids but the model only {config.vocab_size}")
    collections = tuple(sorted(variables) if collections is None else collections)
    missing = [c for c in collections if c not in variables]
    if missing:
        raise CheckpointError(f"collections {missing} are not in the variables {sorted(variables)}")
    if "params" not in collections and base_dir is None:
        raise CheckpointError("saving without 'params' needs base_dir (the directory of the base model)")
    directory = absolute_path(directory)
    os.makedirs(directory, exist_ok=True)
    base = None
    if base_dir is not None:
        base_dir = absolute_path(base_dir)
        base_manifest = _read_manifest(base_dir)
        base = {"path": base_dir, "manifest_sha256": fileio.sha256_file(os.path.join(base_dir, MANIFEST)),
                "preset": base_manifest.get("preset")}
    ckpt = ocp.StandardCheckpointer()  # multi-host: every process takes part, Orbax coordinates the writes
    ckpt.save(os.path.join(directory, VARIABLES), {c: variables[c] for c in collections}, force=True)
    ckpt.wait_until_finished()
    manifest = {"format": MODEL_FORMAT, "format_version": MODEL_FORMAT_VERSION, "preset": config.preset,
                "collections": list(collections), "base": base, "created_by": created_by,
                "tokenizer_sha256": tokenizer.sha256, "num_params": config.num_params(collections),
                outdir.KIND_FIELD: outdir.MODEL}
    manifest.update(extra_manifest or {})
    if jax.process_index() == 0:  # the small files: one writer
        for stale in (SP_FILE, HF_FILE, SPECIAL_IDS_FILE):  # another tokenizer's files from an earlier save
            if os.path.isfile(os.path.join(directory, stale)):
                os.remove(os.path.join(directory, stale))
        save_tokenizer(tokenizer, directory)
        fileio.write_json(os.path.join(directory, CONFIG), config.to_dict())
        fileio.write_json(os.path.join(directory, MANIFEST), manifest)  # written last: marks the directory complete
    sync(f"dpsynth save_model {directory}")  # the others return once the directory is complete
    return manifest


def _read_manifest(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: missing; {directory!r} is not a dpsynth model directory "
                              "(written by `dpsynth pretrain` or `dpsynth dp-tune`), or its save was interrupted")
    try:
        manifest = fileio.read_json(path)
    except ValueError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from e
    if manifest.get("format") != MODEL_FORMAT:
        raise CheckpointError(f"{path}: format {manifest.get('format')!r} is not {MODEL_FORMAT!r}")
    if manifest.get("format_version") != MODEL_FORMAT_VERSION:
        raise CheckpointError(f"{path}: format_version {manifest.get('format_version')} is not supported (this "
                              f"dpsynth reads version {MODEL_FORMAT_VERSION}); re-create it with this dpsynth version")
    return manifest


def load_model(directory: str, *, expect_preset: str | None = None) -> LoadedModel:
    """Loads a model directory; adapter-only directories are resolved through their base.

    Raises:
      CheckpointError: missing/corrupt files, another format version, a preset other than
        `expect_preset`, or a base model that changed since the adapters were trained.
    """
    directory = absolute_path(directory)
    manifest = _read_manifest(directory)
    config_path = os.path.join(directory, CONFIG)
    try:
        config = ModelConfig.from_dict(fileio.read_json(config_path))
    except (OSError, ValueError, TypeError) as e:
        raise CheckpointError(f"{config_path}: not a model config ({type(e).__name__}: {e})") from e
    if expect_preset is not None and config.preset != expect_preset:
        raise CheckpointError(f"{directory}: holds preset {config.preset!r}, expected {expect_preset!r}; pass "
                              f"--preset {config.preset} or point to a checkpoint of preset {expect_preset!r}")
    try:
        tokenizer = load_tokenizer(directory)
    except (OSError, ValueError, RuntimeError) as e:  # missing/corrupt tokenizer file or special ids
        raise CheckpointError(f"{directory}: its tokenizer cannot be loaded ({type(e).__name__}: {e})") from e
    if tokenizer.sha256 != manifest.get("tokenizer_sha256"):
        raise CheckpointError(f"{directory}/{tokenizer.filename}: SHA-256 does not match the manifest (replaced or corrupt)")
    variables: dict[str, Any] = {}
    base = manifest.get("base")
    if base:
        base_manifest_path = os.path.join(base["path"], MANIFEST)
        if not os.path.exists(base_manifest_path):
            raise CheckpointError(f"{directory}: its base model {base['path']!r} is missing; copy the base model "
                                  "directory there (the adapters were trained on it)")
        if fileio.sha256_file(base_manifest_path) != base["manifest_sha256"]:
            raise CheckpointError(f"{directory}: base model {base['path']!r} changed since these adapters were "
                                  "trained (manifest hash differs); restore the original base model")
        loaded_base = load_model(base["path"])
        if loaded_base.config.base() != config.base().replace(preset=loaded_base.config.preset):
            raise CheckpointError(f"{directory}: base model shape differs from this model's config")
        variables.update({c: v for c, v in loaded_base.variables.items() if c not in manifest["collections"]})
    try:
        ckpt, path = ocp.StandardCheckpointer(), os.path.join(directory, VARIABLES)
        if jax.process_count() > 1:  # host arrays: a model saved on another topology loads on any
            metadata = ckpt.metadata(path).item_metadata
            restored = ckpt.restore(path, jax.tree.map(lambda m: np.empty(m.shape, m.dtype), metadata))
        else:
            restored = ckpt.restore(path)
    except Exception as e:  # Orbax raises a variety of errors on damaged trees
        raise CheckpointError(f"{directory}/{VARIABLES}: cannot be read ({type(e).__name__}: {e})") from e
    variables.update(restored)
    expected = {"params"} | ({"lora"} if config.lora_rank else set()) | ({"prompt"} if config.prompt_length else set())
    if set(variables) != expected:
        raise CheckpointError(f"{directory}: has collections {sorted(variables)}, the config needs {sorted(expected)}")
    return LoadedModel(config=config, variables=variables, tokenizer=tokenizer, manifest=manifest)


def variables_allclose(a: dict, b: dict, atol: float = 0.0) -> bool:
    """Whether two variable trees have the same structure and (near-)equal leaves."""
    if jax.tree.structure(a) != jax.tree.structure(b):
        return False
    return all(np.allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=0)
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
