"""`dpsynth generate --batch-size auto`: the largest generation batch whose compiled call fits.

Before anything is drawn or written, `resolve_batch` compiles the call a worker makes
(`Sampler.sample_batch`: prefill + KV-cache decode loop) for this job on abstract arrays
(`jax.ShapeDtypeStruct`s of the model directory's stored variables, read from the Orbax
metadata; no weight is loaded): the run's own model (adapters included), sampling settings
(temperature, top-k, min-p, best-of-N, guidance with its contrast prompts), `max_len`, and the
longest label prompt under the model's tokenizer. With the `off_label` filter, the scoring pass
(`dpsynth.generate.label_scores`, which runs at the same batch) is compiled too and the larger
peak counts. `dpsynth.train.resources.largest_microbatch` then finds the largest batch, at most
the largest shard's examples (no call holds more), whose peak (`memory_analysis()`: arguments,
i.e. the model's variables, + outputs + temporaries + code) fits the device memory (or
`memory_limit`; on CPU the host's available memory over its CPU devices) less `memory_headroom`: doubling, then bisection, O(log n)
compilations.

The resolved batch is the job's `batch_size`: it is in `generation_config.json` (and the config
hash). A rerun into an output directory whose `generation_config.json` holds this same job at
some batch keeps that batch (after checking that it fits here), so a resume on another machine
continues the same job. Every example has its own key (`fold_in(shard_key, i)`), so the batch
changes no random draw; it can change the output only through float rounding (XLA may compute
a row's logits in another order at another batch shape: the recorded scores may differ in their
last digit, and a draw at a rounding boundary may differ).

The figures are those of the backend that compiles, in the driver process: compile on the
device the workers sample on (on a GPU the driver then initialises the device's client, with
its default memory preallocation); the budget is per worker process, so with several worker
processes on one device give each its share as `--memory-limit`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import jax
import jax.numpy as jnp

from dpsynth.generate.model_info import GenerateError, ModelInfo, read_json, read_model_info
from dpsynth.generate.outputs import CONFIG_FILE
from dpsynth.generate.plan import GenerateConfig, GenerationPlan, make_plan
from dpsynth.generate.sampler import Sampler, TransformerDecodeModel
from dpsynth.generate.transforms import worker_sampler_config
from dpsynth.train import prompts, resources

logger = logging.getLogger("dpsynth.generate")

FLAG = "--batch-size auto"
_ADVICE = "use a shorter --max-len, fewer --num-decodes, a smaller model or a larger --memory-limit"
SCORE_BUCKET = 16  # `label_scores.label_log_likelihoods`' default bucket, which the job uses


@dataclasses.dataclass(frozen=True)
class AbstractModel:
    """A model directory without its weights: its config (adapters included), its variables as
    `jax.ShapeDtypeStruct`s (the tree `load_model` restores) and its tokenizer."""

    config: Any
    variables: dict
    tokenizer: Any


def abstract_variables(model_dir: str) -> dict:
    """The variables `dpsynth.models.directory.load_model(model_dir)` restores, as ShapeDtypeStructs
    (Orbax metadata; an adapter directory's base collections from its base directory)."""
    import orbax.checkpoint as ocp

    from dpsynth.models.directory import VARIABLES, _read_manifest

    manifest = _read_manifest(model_dir)
    out: dict = {}
    base = manifest.get("base")
    if base:
        out.update({c: v for c, v in abstract_variables(base["path"]).items() if c not in manifest["collections"]})
    path = os.path.join(model_dir, VARIABLES)
    try:
        meta = ocp.StandardCheckpointer().metadata(path).item_metadata
        stored = jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), jnp.dtype(m.dtype)), dict(meta))
    except Exception as e:  # Orbax raises a variety of errors on damaged or absent trees
        raise GenerateError(f"{FLAG}: {path}: cannot read its metadata ({type(e).__name__}: {e}); it needs a dpsynth "
                            "model directory") from e
    out.update({c: dict(v) if isinstance(v, dict) else v for c, v in stored.items()})
    return out


def abstract_model(model_dir: str) -> AbstractModel:
    """`AbstractModel` of a dpsynth model directory (raises `GenerateError`)."""
    from dpsynth import fileio
    from dpsynth.data.tokenizers import load_tokenizer
    from dpsynth.models.config import ModelConfig

    try:
        config = ModelConfig.from_dict(fileio.read_json(os.path.join(model_dir, "config.json")))
        tokenizer = load_tokenizer(model_dir)
    except (OSError, ValueError, TypeError, RuntimeError) as e:
        raise GenerateError(f"{FLAG}: {model_dir}: not a dpsynth model directory ({type(e).__name__}: {e})") from e
    return AbstractModel(config=config, variables=abstract_variables(model_dir), tokenizer=tokenizer)


class SamplerPrograms:
    """The programs a worker of `plan` runs per batch, compiled on `model`'s abstract variables:
    "sample" (the sampler's call, at the job's longest prompt) and, with the off_label filter,
    "score" (its teacher-forced scoring pass at the longest prompt + sample)."""

    def __init__(self, plan: GenerationPlan, model: AbstractModel):
        self.plan, self.model = plan, model
        self.largest_shard = max(spec.count for spec in plan.specs)  # no call holds more prompts
        self._costs: dict[int, dict[str, resources.ProgramCost]] = {}
        self.sampler_config = worker_sampler_config(plan.sampler, model.tokenizer)
        self.decoder = TransformerDecodeModel(model.config)
        prompt_of = lambda label: prompts.prompt_ids(model.tokenizer, plan.prompt_template, label)  # noqa: E731
        labels = sorted({label for spec in plan.specs for label in spec.labels})
        own = {label: len(prompt_of(label)) for label in labels}
        contrast = ({label: [len(c) for c in plan.contrast_prompts(label, prompt_of)] for label in labels}
                    if plan.sampler.guided else {})
        self.prompt_width = max(max([own[label]] + contrast.get(label, [])) for label in labels)  # a guided row's width
        self.num_contrasts = max((len(c) for c in contrast.values()), default=1)
        self.score_width = None
        if plan.score_labels:  # score prompt + a sample of at most max_len - its own prompt tokens (EOS included)
            longest = max(len(prompt_of(label)) for label in plan.score_labels)
            width = longest + plan.sampler.max_len - min(own.values())
            self.score_width = -(-width // SCORE_BUCKET) * SCORE_BUCKET

    def costs(self, batch: int) -> dict[str, resources.ProgramCost]:
        """The programs at `batch` prompts per call, compiled (once per batch: kept)."""
        if batch not in self._costs:
            self._costs[batch] = self._compile(int(batch))
        return self._costs[batch]

    def _compile(self, batch: int) -> dict[str, resources.ProgramCost]:
        cfg = dataclasses.replace(self.sampler_config, batch_size=batch)
        sampler = Sampler(self.decoder, cfg)
        out = {"sample": resources.program_cost("sample", sampler.lower(self.model.variables, self.prompt_width,
                                                                          self.num_contrasts))}
        if self.score_width is not None:
            from dpsynth.generate import label_scores

            fn = label_scores._score_fn(self.decoder, cfg.vocab_limit, tuple(sorted(int(i) for i in cfg.banned_ids)))
            rows = jax.ShapeDtypeStruct((batch,), jnp.int32)
            out["score"] = resources.program_cost("score", fn.lower(
                self.model.variables, jax.ShapeDtypeStruct((batch, self.score_width), jnp.int32), rows, rows))
        return out

    def peak_bytes(self, batch: int) -> int:
        """The largest peak of the programs a worker runs at `batch` prompts per call."""
        return max(c.total_bytes for c in self.costs(batch).values())


def _recorded_batch(config: GenerateConfig, info: ModelInfo) -> int | None:
    """The batch of the job that `config.out_dir` holds when it is this job at that batch (a rerun)."""
    path = os.path.join(config.out_dir, CONFIG_FILE)
    if not os.path.isfile(path):
        return None
    existing = read_json(path)
    batch = (existing.get("sampler") or {}).get("batch_size")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        return None
    same = make_plan(dataclasses.replace(config, batch_size=batch), info).config_hash == existing.get("config_hash")
    return batch if same else None


def programs_of(config: GenerateConfig, info: ModelInfo | None = None) -> SamplerPrograms:
    """The `SamplerPrograms` of the job `config` (its batch aside; validates the job like `make_plan`)."""
    info = info or read_model_info(config.model_dir)
    return SamplerPrograms(make_plan(dataclasses.replace(config, batch_size=1), info), abstract_model(config.model_dir))


def choose_batch(programs: SamplerPrograms, *, limit_bytes: int,
                 headroom: float = resources.DEFAULT_HEADROOM) -> resources.MicrobatchChoice:
    """`resources.largest_microbatch` over batches 1..the largest shard's examples: the largest whose
    programs' peak fits `limit_bytes` less `headroom`. Raises `GenerateError` (one line) when none fits."""
    try:
        return resources.largest_microbatch(programs.peak_bytes, limit_bytes=limit_bytes, headroom=headroom,
                                            maximum=programs.largest_shard, advice=_ADVICE, name="batch")
    except resources.PlanError as e:
        raise GenerateError(f"{FLAG}: {e}") from None


def resolve_batch(config: GenerateConfig, info: ModelInfo | None = None, *,
                  programs: SamplerPrograms | None = None) -> GenerateConfig:
    """`config` with batch_size "auto" resolved (module docstring); unchanged otherwise.

    Logs one line "batch auto: ..." with the figures. Raises `GenerateError` (one line) when the
    backend reports no memory and no `memory_limit` is given, when not even batch 1 fits, or when
    a rerun's recorded batch does not fit here. `programs`: the job's (`programs_of`), when made.
    """
    if config.batch_size != "auto":
        return config
    info = info or read_model_info(config.model_dir)
    make_plan(dataclasses.replace(config, batch_size=1), info)  # the job's own errors first
    try:
        limit = resources.memory_limit(config.memory_limit, flag=FLAG)
    except resources.PlanError as e:
        raise GenerateError(str(e)) from None
    programs = programs or programs_of(config, info)
    budget = int(limit * (1 - config.memory_headroom))
    recorded = _recorded_batch(config, info)
    if recorded is not None:
        peak = programs.peak_bytes(recorded)
        if peak > budget:
            raise GenerateError(
                f"{FLAG}: {config.out_dir} holds this job at batch {recorded} ({CONFIG_FILE}), which needs "
                f"{peak / resources.GIB:.3f} GiB per device here, more than {budget / resources.GIB:.3f} GiB "
                f"({limit / resources.GIB:.3f} GiB less {config.memory_headroom:.0%} headroom); resume it on a "
                "device with more memory (or a larger --memory-limit), or choose another --out")
        logger.info("batch auto: batch %d, the run's own (%s; a rerun keeps its batch): compiled sampler call peak "
                    "%.3f GiB <= budget %.3f GiB", recorded, CONFIG_FILE, peak / resources.GIB, budget / resources.GIB)
        return dataclasses.replace(config, batch_size=recorded)
    choice = choose_batch(programs, limit_bytes=limit, headroom=config.memory_headroom)
    logger.info("batch auto: %s; at most %d (the largest shard's examples)",
                choice.describe("batch", "sampler call"), programs.largest_shard)
    return dataclasses.replace(config, batch_size=choice.microbatch)
