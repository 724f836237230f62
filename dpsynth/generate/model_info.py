"""Reading a model directory for generation: its manifest, config and privacy report, no weights.

`read_model_info` gives the driver what it plans with (`ModelInfo`: label set, label-prompt
template, maximum length, privacy); `load_bundle` gives a worker what it samples with
(`ModelBundle`: decoder, params, tokenizer).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable
from typing import Any

from dpsynth import fileio
from dpsynth.errors import DpsynthError
from dpsynth.generate.sampler import DecodeModel
from dpsynth.train import prompts


class GenerateError(DpsynthError, ValueError):
    """Bad generation input: names the path or flag and the reason."""


@dataclasses.dataclass
class ModelBundle:
    """What a worker needs to sample: a decoder, its params and a tokenizer.

    Attributes:
      decoder: a `DecodeModel` (`TransformerDecodeModel` for real checkpoints).
      params: the decoder's parameter pytree (base + adapters).
      tokenizer: `.encode(text) -> int ids`, `.decode(ids) -> text`.
      on_shard: optional callback called with each `ShardSpec` before it is sampled
        (progress or fault-injection hooks; None in production).
    """

    decoder: DecodeModel
    params: Any
    tokenizer: Any
    on_shard: Callable[[Any], None] | None = None


def load_bundle(model_dir: str) -> ModelBundle:
    """Loads a checkpoint directory (`dpsynth.models.directory.load_model`) for sampling."""
    from dpsynth.generate.sampler import TransformerDecodeModel
    from dpsynth.models.directory import load_model

    loaded = load_model(model_dir)
    return ModelBundle(decoder=TransformerDecodeModel(loaded.config), params=loaded.variables, tokenizer=loaded.tokenizer)


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What the driver reads from a model directory (no weights).

    Attributes:
      model_dir: the directory.
      fingerprint: SHA-256 over its manifest, config and privacy report files.
      max_len: the model's maximum sequence length.
      labels: the label set the model was tuned on (None if not recorded).
      prompt_template: the label prompt template ("{label}" marks the label).
      private: whether the directory has a privacy report that does not say "private": false.
      has_report: whether it has a privacy report at all.
      label_dropout: the probability with which DP tuning trained examples under the null
        prompt (0: the model never learned it; `dpsynth.train.prompts`).
      tuned_len: the tokens per example DP tuning trained on (the privacy report's
        `max_tokens_per_example`, public; None without a private report).
    """

    model_dir: str
    fingerprint: str
    max_len: int
    labels: tuple[str, ...] | None
    prompt_template: str
    private: bool
    has_report: bool = False
    label_dropout: float = 0.0
    tuned_len: int | None = None


def read_json(path: str) -> dict[str, Any]:
    """A JSON file's content; unreadable JSON is a `GenerateError` (a missing file is not caught)."""
    try:
        return fileio.read_json(path)
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as e:
        raise GenerateError(f"{path}: unreadable JSON ({e})") from e


def read_model_info(model_dir: str) -> ModelInfo:
    """Reads a model directory's manifest/config/privacy report; raises `GenerateError`."""
    if not os.path.isdir(model_dir):
        raise GenerateError(f"{model_dir}: model directory not found")
    manifest_path = os.path.join(model_dir, "manifest.json")
    config_path = os.path.join(model_dir, "config.json")
    from dpsynth.train import release

    incomplete = release.status(model_dir)  # a directory a killed run left half-written is never read
    if incomplete:
        raise GenerateError(f"{model_dir}: {incomplete}")
    for path in (manifest_path, config_path):
        if not os.path.exists(path):
            raise GenerateError(f"{path}: missing; is {model_dir!r} a checkpoint written by `dpsynth pretrain`/`dp-tune`?")
    manifest = read_json(manifest_path)
    config = read_json(config_path)
    report_path = os.path.join(model_dir, "privacy_report.json")
    report = read_json(report_path) if os.path.exists(report_path) else None
    digest = hashlib.sha256()
    for path in (manifest_path, config_path, report_path):
        if os.path.exists(path):
            with open(path, "rb") as f:
                digest.update(f.read())
    model_cfg = config.get("model", config)
    max_len = model_cfg.get("max_len")
    if not isinstance(max_len, int) or max_len < 2:
        raise GenerateError(f"{config_path}: no valid 'max_len'")
    try:
        template = prompts.template_of(manifest)
    except prompts.ExampleError as e:
        raise GenerateError(f"{manifest_path}: {e}") from e
    private = report is not None and report.get("private") is not False
    tuned = report.get("max_tokens_per_example") if private else None
    return ModelInfo(
        model_dir=model_dir,
        fingerprint=digest.hexdigest(),
        max_len=int(max_len),
        labels=prompts.labels_of(manifest),
        prompt_template=template,
        private=private,
        has_report=report is not None,
        label_dropout=prompts.label_dropout_of(manifest),
        tuned_len=int(tuned) if isinstance(tuned, int) and tuned >= 2 else None,
    )


def model_delta(model_dir: str) -> float | None:
    """The delta of the model directory's privacy report (None without one)."""
    path = os.path.join(model_dir, "privacy_report.json")
    if not os.path.exists(path):
        return None
    return float(read_json(path)["delta"])


def check_label_histogram(model_dir: str) -> None:
    """Raises `GenerateError` when a DP label histogram cannot be composed into the model's privacy report.

    Called before the histogram is drawn and before anything is written, so a refused job
    leaves neither a spent release nor a corpus without a privacy report (a user-level model:
    the histogram's sensitivity is 1 per example, not per user; `dpsynth.dp.report`).
    """
    from dpsynth.dp import report as report_lib

    path = os.path.join(model_dir, "privacy_report.json")
    if not os.path.exists(path):
        return  # a non-private model: the corpus is marked non-private anyway
    report = read_json(path)
    if report.get("private") is False:
        return
    try:
        report_lib.check_gaussian_composable(report, "label_histogram")
    except ValueError as e:
        raise GenerateError(f"{model_dir}: a DP label histogram cannot be drawn for this model: {e}; use the "
                            "uniform label distribution") from e
