"""Sharded synthetic-data generation as a Beam fan-out: plan, generate shards, merge, report.

This module runs the job (`generate`) and is the library's generation API (`__all__`); the
steps live in `model_info` (reading the model directory), `plan` (the config, the shard
specs, the label distribution), `transforms` (the Beam DoFn and PTransform) and `outputs`
(the output directory and its files).

Flow of `generate(config)`:
  1. Read the model directory's manifest (no weights): label set and label-prompt template
     (`dpsynth.train.prompts.labels_of` / `template_of`), maximum length, privacy report
     (refused without one unless `allow_non_private`).
  2. `--batch-size auto` (`batch_size="auto"`): the largest batch whose compiled sampler call fits
     the device memory, found on abstract arrays (`auto_batch.resolve_batch`; a rerun keeps the
     batch its output directory records).
  3. Plan every shard up front: `ShardSpec(split, index, num_shards, start, labels, seed)`
     with `seed = hash(job seed, split, index)` and the labels of its examples (exact,
     shuffled counts from the label distribution). A config hash covers everything that
     determines the output.
  4. `DIR/generation_config.json` is written first; a directory holding another job's config
     is refused. Shards whose file already exists (complete) are skipped, so a rerun after a
     failure regenerates only the missing ones.
  5. Beam: `Create(specs) | Reshuffle | ParDo(GenerateShardFn)`; each worker loads the model
     once (`setup`), samples its shards in fixed-shape batches with the KV cache and writes
     `DIR/shards/{split}-{index:05d}-of-{n:05d}.jsonl` atomically (temporary file + rename).
  6. The driver merges the shards in index order into `DIR/{split}.jsonl` (and Parquet /
     TFRecord when asked), writes `DIR/manifest.json`, copies the privacy report and writes
     `DIR/generation_report.json` (computed from the synthetic data alone). Only when asked
     (`train_path`), the memorisation audit against D_train (NOT DP) goes to an owner-only
     file outside DIR (`audit_dir`, default `DIR.private/`), never into DIR.

Determinism: example i of a shard is sampled with key `fold_in(shard_key, i)`, and a shard's
batches depend only on its spec, so the bytes of every output are the same whatever the
runner, the number of workers or the order in which shards run. The batch size changes no draw
either, but it is in the config hash: another batch can change the output through float
rounding alone (`auto_batch`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import apache_beam as beam

from dpsynth.dedup import DEFAULT_MIN_TOKENS
from dpsynth.generate import model_info
from dpsynth.generate.model_info import GenerateError, ModelBundle, ModelInfo, check_label_histogram, read_model_info
from dpsynth.generate.outputs import (
    CONFIG_FILE,
    MANIFEST_FILE,
    MEMORISATION_AUDIT_FILE,
    PRIVACY_FILES,
    REPORT_FILE,
    copy_privacy_report,
    default_audit_dir,
    merge_outputs,
    prepare_out_dir,
    shard_complete,
    write_generation_report,
    write_manifest,
)
from dpsynth.generate.plan import (
    DpLabelHistogram,
    GenerateConfig,
    GenerationPlan,
    ShardSpec,
    dp_label_distribution,
    draw_label_histogram,
    make_plan,
)
from dpsynth.generate.transforms import GenerateSynthetic
from dpsynth.owner_only import check_outside, write_private_json

__all__ = [  # the library's generation API (the experiment runner and the CLI use it from here)
    "CONFIG_FILE", "MANIFEST_FILE", "MEMORISATION_AUDIT_FILE", "PRIVACY_FILES", "REPORT_FILE",
    "DpLabelHistogram", "GenerateConfig", "GenerateError", "GenerationPlan", "ModelBundle", "ModelInfo",
    "ShardSpec", "default_audit_dir", "dp_label_distribution", "generate", "load_bundle", "make_plan",
    "read_model_info", "run_shards",
]

logger = logging.getLogger("dpsynth.generate")


def __getattr__(name: str):
    # `job.load_bundle` is `model_info.load_bundle` as it is now (no copy bound at import: a test's
    # patch of it holds whatever the import order)
    if name == "load_bundle":
        return model_info.load_bundle
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run_shards(plan: GenerationPlan, specs: Sequence[ShardSpec], *, beam_args: Sequence[str] = (),
               test_pipeline=None, loader: Callable[[str], ModelBundle] | None = None) -> None:
    """Runs the Beam fan-out over `specs` (blocking; `dpsynth.beam.pipeline.run_pipeline`); `loader`
    None: `model_info.load_bundle`, looked up when the workers load the model."""
    from dpsynth.beam.pipeline import run_pipeline

    def build(p):
        _ = (
            p
            | "CreateShardSpecs" >> beam.Create(list(specs))
            | "GenerateSynthetic" >> GenerateSynthetic(plan, loader)
        )

    run_pipeline(build, beam_args=beam_args, test_pipeline=test_pipeline)


def generate(
    config: GenerateConfig,
    *,
    beam_args: Sequence[str] = (),
    test_pipeline=None,
    loader: Callable[[str], ModelBundle] | None = None,
    label_histogram: DpLabelHistogram | None = None,
    train_path: str | None = None,
    audit_dir: str | None = None,
    min_shared_tokens: int = DEFAULT_MIN_TOKENS,
    tokenizer=None,
) -> dict[str, Any]:
    """Runs a whole generation job (plan, fan-out, merge, report); returns the manifest.

    Args:
      config: the job.
      beam_args: Beam pipeline flags (`--runner`, `--direct_num_workers`, ...).
      test_pipeline: returns the pipeline to run on instead (tests: `TestPipeline`).
      loader: model directory -> `ModelBundle` (None: the checkpoint loader, `model_info.load_bundle`,
        looked up when the workers load the model, not at import: a test's patch of it holds
        whatever the import order).
      label_histogram: draw the label distribution as a DP histogram of D_train
        (`DpLabelHistogram`; a new release on every call, so a rerun draws anew). To share one
        draw among jobs, draw it once with `dp_label_distribution` and pass it as
        `config.label_distribution` instead (the experiment runner's `labels` stage does).
      train_path: opt-in post-hoc memorisation audit against D_train (NOT DP; off by default;
        see `dpsynth.generate.report.memorisation_audit`).
      audit_dir: where the audit goes: an owner-only directory (0700; the file is 0600)
        outside `config.out_dir` (default `default_audit_dir(out_dir)`, i.e. `OUT.private`
        beside it). Never part of the synthetic corpus or its `generation_report.json`.
      min_shared_tokens: the memorisation threshold in tokens.
      tokenizer: tokenizer for the audit (default: the model directory's).

    Raises:
      GenerateError: bad input, or `audit_dir` inside the output directory.
    """
    if train_path is not None:
        audit_dir = audit_dir or default_audit_dir(config.out_dir)
        try:
            check_outside(audit_dir, config.out_dir, "--audit-dir: the memorisation audit directory")
        except ValueError as e:
            raise GenerateError(str(e)) from e
    dist = config.label_distribution
    if label_histogram is not None or (dist is not None and dist.source == "dp_histogram"):
        check_label_histogram(config.model_dir)  # refused before the draw and before anything is written
    if config.batch_size == "auto":  # before the draw and before anything is written: a refusal spends and writes nothing
        from dpsynth.generate.auto_batch import resolve_batch

        config = resolve_batch(config)
    if label_histogram is not None:
        config = draw_label_histogram(config, label_histogram)
    info = read_model_info(config.model_dir)
    plan = make_plan(config, info)
    prepare_out_dir(plan)
    missing = [s for s in plan.specs if not shard_complete(plan, s)]
    logger.info("generate: %d shards planned, %d to generate (config %s)", len(plan.specs), len(missing), plan.config_hash[:12])
    if missing:
        run_shards(plan, missing, beam_args=beam_args, test_pipeline=test_pipeline, loader=loader)
    still = [s.name for s in plan.specs if not shard_complete(plan, s)]
    if still:
        raise GenerateError(f"{plan.out_dir}: {len(still)} shards missing after the pipeline ran (first: {still[0]}); rerun")
    splits, records = merge_outputs(plan, config.formats)
    copy_privacy_report(plan, info.private)
    write_generation_report(plan, splits, records)
    if train_path is not None:
        _write_memorisation_audit(records, config, train_path=train_path, audit_dir=audit_dir, tokenizer=tokenizer,
                                  min_shared_tokens=min_shared_tokens)
    return write_manifest(plan, info, splits)


def _write_memorisation_audit(records: dict[str, list[dict[str, Any]]], config: GenerateConfig, *, train_path: str,
                              audit_dir: str, tokenizer, min_shared_tokens: int) -> None:
    """The opt-in memorisation audit against D_train (NOT DP) into the owner-only `audit_dir`."""
    from dpsynth.generate import report as report_lib

    if tokenizer is None:
        tokenizer = _load_tokenizer(config.model_dir)
    audit = report_lib.memorisation_audit(records, tokenizer=tokenizer, train_path=train_path,
                                          min_shared_tokens=min_shared_tokens)
    audit["synthetic_corpus"] = os.path.abspath(config.out_dir)
    path = write_private_json(os.path.join(audit_dir, MEMORISATION_AUDIT_FILE), audit)
    logger.info("generate: memorisation audit (NOT DP, owner-only, do not share) -> %s", path)


def _load_tokenizer(model_dir: str):
    from dpsynth.data.tokenizers import load_tokenizer

    return load_tokenizer(model_dir)
