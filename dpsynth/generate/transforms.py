"""The generation fan-out's Beam transforms: one DoFn call samples and writes one whole shard.

Each worker loads the model once (`GenerateShardFn.setup`), samples its shards in fixed-shape
batches with the KV cache and writes `DIR/shards/{split}-{index:05d}-of-{n:05d}.jsonl`
atomically. Example i of a shard is sampled with key `fold_in(shard_key, i)`, so a shard's
bytes depend only on its spec.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import apache_beam as beam
import numpy as np

from dpsynth import fileio
from dpsynth.generate import label_scores
from dpsynth.generate import model_info
from dpsynth.generate.model_info import ModelBundle
from dpsynth.generate.outputs import shard_complete
from dpsynth.generate.plan import GenerationPlan, ShardSpec
from dpsynth.generate.sampler import Sampler, SamplerConfig, example_keys, seed_to_key_data
from dpsynth.train import prompts

logger = logging.getLogger("dpsynth.generate")


def generate_shard(plan: GenerationPlan, bundle: ModelBundle, sampler: Sampler, spec: ShardSpec) -> dict[str, Any]:
    """Samples one shard and writes its file atomically; returns its summary."""
    prompt_of = functools.lru_cache(maxsize=None)(
        lambda label: prompts.prompt_ids(bundle.tokenizer, plan.prompt_template, label))
    prompts_by_label = {label: prompt_of(label) for label in set(spec.labels)}
    contrasts_by_label = ({label: plan.contrast_prompts(label, prompt_of) for label in prompts_by_label}
                          if plan.sampler.guided else None)
    keys = example_keys(seed_to_key_data(spec.seed), range(spec.count))
    score_prompts = {label: prompts.prompt_ids(bundle.tokenizer, plan.prompt_template, label)
                     for label in plan.score_labels}
    label_column = {label: j for j, label in enumerate(plan.score_labels)}
    lines = []
    step = max(plan.sampler.batch_size * 4, 1)
    from dpsynth.progress import Progress

    with Progress(total=spec.count, desc=f"generate {spec.name}", unit="example", interval=30.0) as progress:
        for lo in range(0, spec.count, step):
            hi = min(spec.count, lo + step)
            out = sampler.sample(bundle.params, [prompts_by_label[l] for l in spec.labels[lo:hi]], keys[lo:hi],
                                 contrasts=[contrasts_by_label[l] for l in spec.labels[lo:hi]]
                                 if contrasts_by_label is not None else None)
            margins = None
            if score_prompts:  # the off_label filter: each sample's margin under the model's label prompts
                cfg = sampler.config
                samples = [np.concatenate([out.tokens[r, : out.lengths[r]],
                                           np.asarray([cfg.eos_id] if out.finished[r] else [], np.int32)])
                           for r in range(hi - lo)]
                loglik = label_scores.label_log_likelihoods(
                    bundle.decoder, bundle.params, score_prompts, samples, batch_size=cfg.batch_size,
                    pad_id=cfg.pad_id, vocab_limit=cfg.vocab_limit, banned_ids=cfg.banned_ids)
                margins = label_scores.label_margins(loglik, [label_column[l] for l in spec.labels[lo:hi]])
            for r in range(hi - lo):
                ids = out.tokens[r, : out.lengths[r]]
                record = {
                    "id": f"{spec.split}-{spec.start + lo + r:08d}",
                    "text": bundle.tokenizer.decode(ids.tolist()),
                    "label": spec.labels[lo + r],
                    "num_tokens": int(out.lengths[r]),
                    "finished": bool(out.finished[r]),
                    "score": round(float(out.scores[r]), 4),
                }
                if margins is not None:
                    record["label_margin"] = round(float(margins[r]), 4)
                lines.append(json.dumps(record, ensure_ascii=False, sort_keys=True))
            progress.update(hi - lo)
    data = ("\n".join(lines) + "\n").encode("utf-8")
    fileio.write_bytes(plan.shard_path(spec), data)
    return {"name": spec.name, "split": spec.split, "num_examples": spec.count, "sha256": fileio.sha256_bytes(data)}


def worker_sampler_config(sampler: SamplerConfig, tokenizer: Any) -> SamplerConfig:
    """The plan's sampler as a worker runs it with the model's tokenizer: sampling restricted to the
    ids it decodes, and the model's own special ids (an imported model's differ from dpsynth's)."""
    ids = {}
    if hasattr(tokenizer, "eos_id"):
        ids = dict(eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id, banned_ids=tokenizer.sampling_banned_ids)
    return dataclasses.replace(sampler, vocab_limit=getattr(tokenizer, "vocab_size", None), **ids)


class GenerateShardFn(beam.DoFn):
    """Loads the model once per worker (`setup`) and generates whole shards."""

    def __init__(self, plan: GenerationPlan, loader: Callable[[str], ModelBundle] | None = None):
        self._plan = plan
        self._loader = loader
        self._shards = beam.metrics.Metrics.counter("generate", "shards_generated")
        self._skipped = beam.metrics.Metrics.counter("generate", "shards_already_done")
        self._examples = beam.metrics.Metrics.counter("generate", "examples")

    def setup(self):
        if self._plan.cores_per_worker:  # before the model load starts XLA's thread pools
            from dpsynth.beam.affinity import claim_cores

            claim_cores(self._plan.cores_per_worker)
        loader = self._loader or model_info.load_bundle  # (looked up now, not at import: tests patch it)
        self._bundle = loader(self._plan.model_dir)
        self._sampler = Sampler(self._bundle.decoder, worker_sampler_config(self._plan.sampler, self._bundle.tokenizer))

    def process(self, spec: ShardSpec):
        if shard_complete(self._plan, spec):
            self._skipped.inc()
            return
        if self._bundle.on_shard is not None:
            self._bundle.on_shard(spec)
        t0 = time.monotonic()
        summary = generate_shard(self._plan, self._bundle, self._sampler, spec)
        logger.info("generate: wrote %s (%d examples, %.1fs)", spec.name, spec.count, time.monotonic() - t0)
        self._shards.inc()
        self._examples.inc(spec.count)
        yield summary


class GenerateSynthetic(beam.PTransform):
    """Generates the shards of a `GenerationPlan` (each written to its own file)."""

    def __init__(self, plan: GenerationPlan, loader: Callable[[str], ModelBundle] | None = None,
                 label: str | None = None):
        super().__init__(label)
        self._plan = plan
        self._loader = loader

    def expand(self, specs):
        """PCollection[ShardSpec] -> PCollection[dict] (one summary per shard written:
        name, split, num_examples, sha256). Shards already complete are skipped."""
        return (
            specs
            | "SpreadShards" >> beam.Reshuffle()
            | "GenerateShards" >> beam.ParDo(GenerateShardFn(self._plan, self._loader))
        )
