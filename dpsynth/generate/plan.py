"""The generation job's configuration and its plan: every shard specified up front.

`make_plan(config, info)` validates the job against the model (`ModelInfo`) and creates every
`ShardSpec(split, index, num_shards, start, labels, seed)` with `seed = hash(job seed, split,
index)` and the labels of its examples (exact, shuffled counts from the label distribution).
A config hash covers everything that determines the output. The label distribution is
uniform, given, or a DP label histogram of D_train drawn here (`dp_label_distribution`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import numbers
import os
from collections.abc import Sequence
from typing import Any

from dpsynth.generate import labels as labels_lib
from dpsynth.generate.model_info import GenerateError, ModelInfo, check_label_histogram, model_delta, read_model_info
from dpsynth.generate.postprocess import PostprocessConfig
from dpsynth import binding
from dpsynth.binding import SettingError, flag_name
from dpsynth.generate.sampler_config import SamplerConfig, SamplingOptions
from dpsynth.train.prompts import NULL_LABEL
from dpsynth.train.resources import DEFAULT_HEADROOM

FORMAT = "dpsynth.synthetic"
FORMAT_VERSION = 1
SPLITS = ("train", "valid")
OUTPUT_FORMATS = ("jsonl", "parquet", "tfrecord")
DEFAULT_MAX_LEN = 512
SHARD_DIR = "shards"


@dataclasses.dataclass(frozen=True, kw_only=True)
class GenerateConfig:
    """One generation job.

    Attributes:
      model_dir: checkpoint directory (DP-tuned: has `privacy_report.json`).
      out_dir: output directory.
      num_examples: synthetic training examples (> 0).
      valid_examples: synthetic validation examples (>= 0; 0 = no valid split).
      seed: job seed; shard seeds are hashes of (seed, split, shard index).
      sampling: the sampling options (`SamplingOptions`: temperature, top-k, min-p, guidance,
        ...; declared and validated by `SamplerConfig`).
      max_len: total tokens per example (prompt + text); None = the length DP tuning trained on
        (the privacy report's `max_tokens_per_example`, e.g. what `--max-tokens auto` chose), or
        min(512, the model's) for a model without one.
      batch_size: prompts per compiled sampler call (and per call of the off_label scorer), or
        "auto": the largest batch, at most a shard's examples, whose compiled sampler call
        (prefill + KV-cache decode of this model, sampling settings, max_len and longest label
        prompt; with the off_label filter also its scoring pass) fits `memory_limit` (default:
        the device's memory) less `memory_headroom`, found by `generate` before anything is
        written or drawn (`dpsynth.generate.auto_batch`). The resolved batch is the one
        recorded (`generation_config.json`), and a rerun into the same output keeps it. Every
        example has its own key, so the batch changes no draw; it can change the output only
        through float rounding (a row's logits computed in another order at another batch
        shape), which is why it stays in the config hash.
      memory_limit, memory_headroom: the budget of batch_size "auto": bytes per device (None:
        the device's `memory_stats()`; on CPU the host's available memory over its CPU devices) and the fraction left free.
      examples_per_shard: examples per output shard (the unit of work and of resume).
      labels: labels to generate (a subset of the model's; None = all of them).
      label_distribution: None = uniform over `labels`; else e.g. a DP label histogram.
      formats: output formats: "jsonl" (always) plus optionally "parquet", "tfrecord".
      allow_non_private: accept a model directory without a privacy report (the output is
        then marked non-private).
      cores_per_worker: 0 = workers use every core they see; N = each worker process pins
        itself to N cores no other worker on its machine holds (`dpsynth.beam.affinity`),
        for several workers per machine (`--direct_num_workers`, `--sdk_worker_parallelism`).
        Does not change the output.
      postprocess: drop empty / truncated / duplicate samples and draw extra ones to make up
        for them (`dpsynth.generate.postprocess`; no privacy cost); None = keep all.

    Label-guided sampling (`sampling.guidance` > 0) is post-processing of the DP model: no
    privacy cost. Its contrast (`sampling.guidance_contrast`) "others" (the other labels'
    prompts) needs a model with >= 2 labels; "null" (the null prompt) one DP-tuned with label
    dropout.
    """

    model_dir: str
    out_dir: str
    num_examples: int = binding.setting(help="synthetic training examples")
    valid_examples: int = binding.setting(0, help="synthetic validation examples (0: none)")
    seed: int = binding.setting(0, help="job seed (shard seeds derive from it)")
    sampling: SamplingOptions = SamplingOptions()
    max_len: int | None = binding.setting(None, help="total tokens per example (default: the length the model was "
                                                     "DP-tuned on, from its privacy report; else min(512, model))")
    batch_size: int | str = binding.setting(16, help="prompts per compiled sampler call; auto: the largest (at most "
                                            "a shard's examples) whose compiled call fits the device memory less "
                                            "--memory-headroom (logged with its figures; on CPU the host's available memory), "
                                            "recorded in generation_config.json. Each example has its own key, so the "
                                            "batch changes the samples only by float rounding (a score's last digit, "
                                            "rarely a token)")
    examples_per_shard: int = binding.setting(256, help="unit of work and of resume")
    labels: tuple[str, ...] | None = None
    label_distribution: labels_lib.LabelDistribution | None = None
    formats: tuple[str, ...] = ("jsonl",)
    allow_non_private: bool = binding.setting(False, help="accept a model without a privacy report")
    cores_per_worker: int = binding.setting(0, help="pin each worker process to this many cores of its machine "
                                                    "(0: no pinning)")
    postprocess: PostprocessConfig | None = None
    memory_limit: int | None = binding.setting(None, help="--batch-size auto: device memory to fit in (e.g. 80GB, "
                                                          "16GiB; default: the device's)")
    memory_headroom: float = binding.setting(DEFAULT_HEADROOM, help="--batch-size auto: fraction of the memory left "
                                                                    f"free (default {DEFAULT_HEADROOM})")

    def __post_init__(self):
        if int(self.num_examples) != self.num_examples or self.num_examples <= 0:
            raise GenerateError(f"--num-examples must be a positive integer, got {self.num_examples}")
        if int(self.valid_examples) != self.valid_examples or self.valid_examples < 0:
            raise GenerateError(f"--valid-examples must be an integer >= 0, got {self.valid_examples}")
        b = self.batch_size
        if b != "auto" and (isinstance(b, bool) or not isinstance(b, numbers.Integral) or b < 1):
            raise GenerateError(f"--batch-size must be a positive integer or 'auto', got {b!r}")
        if self.memory_limit is not None and (isinstance(self.memory_limit, bool) or not isinstance(self.memory_limit, int)
                                              or self.memory_limit <= 0):
            raise GenerateError(f"--memory-limit must be a positive number of bytes, got {self.memory_limit!r}")
        if not 0.0 <= self.memory_headroom < 1.0:
            raise GenerateError(f"--memory-headroom must be in [0, 1), got {self.memory_headroom}")
        if self.examples_per_shard < 1:
            raise GenerateError(f"--examples-per-shard must be >= 1, got {self.examples_per_shard}")
        if self.cores_per_worker < 0:
            raise GenerateError(f"--cores-per-worker must be >= 0, got {self.cores_per_worker}")
        bad = [f for f in self.formats if f not in OUTPUT_FORMATS]
        if bad or "jsonl" not in self.formats:
            raise GenerateError(f"--format must include jsonl and only {OUTPUT_FORMATS}, got {list(self.formats)}")
        if self.max_len is not None and self.max_len < 2:  # (0 is not "the default": None is)
            raise GenerateError(f"--max-len must be >= 2 tokens (prompt + text), got {self.max_len}")
        self.sampler_config(DEFAULT_MAX_LEN if self.max_len is None else self.max_len)  # validates the sampling flags early

    def sampler_config(self, max_len: int) -> SamplerConfig:
        """The sampler of this job at `max_len` tokens per example (GenerateError naming the flag at fault;
        batch_size "auto" validates the sampling flags at batch 1: `make_plan` needs it resolved)."""
        try:
            return self.sampling.sampler(max_len=max_len, batch_size=1 if self.batch_size == "auto" else self.batch_size)
        except SettingError as e:
            raise GenerateError(f"{flag_name(e.field)} {e.message}") from e


@dataclasses.dataclass(frozen=True)
class ShardSpec:
    """One unit of work: `len(labels)` examples of `split` starting at global index `start`."""

    split: str
    index: int
    num_shards: int
    start: int
    labels: tuple[str, ...]
    seed: int

    @property
    def name(self) -> str:
        return f"{self.split}-{self.index:05d}-of-{self.num_shards:05d}"

    @property
    def count(self) -> int:
        return len(self.labels)


def shard_seed(job_seed: int, split: str, index: int) -> int:
    """A 64-bit seed from (job seed, split, shard index) (SHA-256, stable across runs)."""
    digest = hashlib.sha256(f"dpsynth.generate/{int(job_seed)}/{split}/{int(index)}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


@dataclasses.dataclass(frozen=True)
class GenerationPlan:
    """Everything a worker needs besides the model, and the job's identity."""

    model_dir: str
    out_dir: str
    sampler: SamplerConfig
    prompt_template: str
    specs: tuple[ShardSpec, ...]
    config_json: dict[str, Any]
    config_hash: str
    cores_per_worker: int = 0  # not part of the job's identity: it never changes the output
    postprocess: PostprocessConfig | None = None  # in config_json when active
    score_labels: tuple[str, ...] = ()  # the model's labels, when samples get a `label_margin` (off_label)
    contrast_labels: tuple[str, ...] = ()  # guided, contrast "others": the model's labels

    def contrast_prompts(self, label: str, prompt_of) -> list:
        """The contrast prompts of `label` in a guided job (`prompt_of(label)` -> token ids)."""
        if self.sampler.guidance_contrast == "null":
            return [prompt_of(NULL_LABEL)]
        return [prompt_of(other) for other in self.contrast_labels if other != label]

    def shard_path(self, spec: ShardSpec) -> str:
        return os.path.join(self.out_dir, SHARD_DIR, spec.name + ".jsonl")


def _label_distribution(config: GenerateConfig, info: ModelInfo) -> labels_lib.LabelDistribution:
    """The job's label distribution (given, else uniform over the requested or the model's
    labels), checked against the model's label set."""
    if config.label_distribution is not None:
        dist = config.label_distribution
        labels_lib.check_labels(dist.labels, info.labels, "label distribution")
        if config.labels is not None and tuple(config.labels) != dist.labels:
            raise GenerateError("--labels and the label distribution name different label sets")
        return dist
    requested = config.labels if config.labels is not None else info.labels
    if requested is None:
        raise GenerateError(f"{info.model_dir}: the manifest records no label set; pass --labels")
    return labels_lib.uniform(labels_lib.check_labels(requested, info.labels, "--labels"))


def make_plan(config: GenerateConfig, info: ModelInfo) -> GenerationPlan:
    """Validates the job against the model and creates every shard spec up front."""
    if not info.private and not config.allow_non_private:
        why = "its privacy report says it is NOT private" if info.has_report else "no privacy_report.json"
        raise GenerateError(
            f"{info.model_dir}: {why}, so this model is not known to be DP; "
            "use a DP-tuned model directory, or pass --allow-non-private (the output is then marked non-private)"
        )
    if config.batch_size == "auto":
        raise GenerateError("--batch-size auto is resolved by `generate` first (`dpsynth.generate.auto_batch`)")
    max_len = config.max_len if config.max_len is not None else min(info.tuned_len or DEFAULT_MAX_LEN, info.max_len)
    if max_len > info.max_len:
        raise GenerateError(f"--max-len {max_len} exceeds the model's max_len {info.max_len} ({info.model_dir}/config.json)")
    sampler = config.sampler_config(max_len)
    dist = _label_distribution(config, info)
    contrast_labels: tuple[str, ...] = ()
    contrast = config.sampling.guidance_contrast
    if sampler.guided and contrast == "others":
        contrast_labels = tuple(info.labels or dist.labels)
        if len(contrast_labels) < 2:
            raise GenerateError(f"{info.model_dir}: --guidance-contrast others needs a model with >= 2 labels, "
                                f"got {list(contrast_labels)}")
    if sampler.guided and contrast == "null" and not info.label_dropout:
        raise GenerateError(f"{info.model_dir}: --guidance-contrast null contrasts with the null prompt, which this "
                            "model never learned (it was tuned without label dropout); use --guidance-contrast "
                            "others, or DP-tune with --label-dropout P")
    config_json = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model_dir": os.path.abspath(config.model_dir),
        "model_fingerprint": info.fingerprint,
        "private": info.private,
        "num_examples": {"train": int(config.num_examples), "valid": int(config.valid_examples)},
        "seed": int(config.seed),
        "sampler": sampler.identity(),
        "examples_per_shard": int(config.examples_per_shard),
        "prompt_template": info.prompt_template,
        "prompt_bos": True,  # prompts are `prompts.prompt_ids` (BOS first); kept so config hashes stay valid
        "label_distribution": dist.to_json(),
    }
    post = config.postprocess if config.postprocess is not None and config.postprocess.active else None
    if post is not None:  # only when used: the hashes of earlier jobs stay valid
        config_json["postprocess"] = post.to_json()
    if sampler.guided:  # likewise (the weight is in the sampler's identity)
        config_json["guidance_contrast"] = contrast
        if contrast_labels:
            config_json["contrast_labels"] = list(contrast_labels)
    config_hash = hashlib.sha256(json.dumps(config_json, sort_keys=True).encode()).hexdigest()
    config_json["config_hash"] = config_hash
    specs = []
    for split, n in (("train", config.num_examples), ("valid", config.valid_examples)):
        if n == 0:
            continue
        n = post.drawn(n) if post is not None else n
        assigned = labels_lib.assign_labels(n, dist, seed=shard_seed(config.seed, split, -1) % (1 << 63))
        num_shards = -(-n // config.examples_per_shard)
        for i in range(num_shards):
            lo, hi = i * config.examples_per_shard, min(n, (i + 1) * config.examples_per_shard)
            specs.append(ShardSpec(split, i, num_shards, lo, tuple(assigned[lo:hi]), shard_seed(config.seed, split, i)))
    return GenerationPlan(
        model_dir=config.model_dir, out_dir=config.out_dir, sampler=sampler, prompt_template=info.prompt_template,
        specs=tuple(specs), config_json=config_json, config_hash=config_hash,
        cores_per_worker=config.cores_per_worker, postprocess=post,
        score_labels=tuple(info.labels or dist.labels) if post is not None and post.scores_labels else (),
        contrast_labels=contrast_labels,
    )


def dp_label_distribution(
    model_dir: str,
    label_source: str | None,
    *,
    labels: Sequence[str] | None = None,
    noise_multiplier: float | None = None,
    epsilon: float | None = None,
    delta: float | None = None,
    seed: int | None = None,
    dead_letters=None,
    allow_large_delta: bool = False,
    encoding: str | None = None,
) -> labels_lib.LabelDistribution:
    """A DP label histogram of D_train (`label_source`) for the model's label set.

    `dead_letters`: a `dpsynth.data.dead_letters.Policy` for `label_source`'s rejected records
    (printed and counted always; written to `policy.out`; refused past `policy.limit`; default:
    the default limit, not written).

    Exactly one of `noise_multiplier` (sigma) or `epsilon` (calibrates sigma for the histogram
    alone at `delta`, default the model's delta; a delta above 1/N, N the records of
    `label_source`, is refused unless `allow_large_delta`). Its cost is composed into the output's
    privacy report by `generate` (`dpsynth.dp.report.compose_gaussian`).
    """
    from dpsynth.dp import accounting
    from dpsynth.data import dead_letters as dead_letters_lib

    if not label_source:
        raise GenerateError("--label-distribution dp-histogram needs --label-source (the D_train file(s))")
    if (noise_multiplier is None) == (epsilon is None):
        raise GenerateError("the DP label histogram needs exactly one of --label-noise-multiplier or --label-epsilon")
    info = read_model_info(model_dir)
    check_label_histogram(model_dir)  # before the draw: a user-level model refuses it
    label_set = labels_lib.check_labels(labels if labels is not None else (info.labels or ()), info.labels, "--labels")
    if epsilon is not None:
        if delta is None:
            delta = model_delta(model_dir)
        if delta is None:
            raise GenerateError(f"{model_dir}: no privacy report to take delta from; pass --label-delta")
    policy = dead_letters or dead_letters_lib.Policy(prefix="generate: ")
    [data] = dead_letters_lib.read_checked([("--label-source", label_source)], policy, encoding=encoding)
    if epsilon is not None:  # (delta against N = the records counted, before anything is drawn)
        try:
            accounting.check_delta_size(delta, len(data.records), allow_large_delta=allow_large_delta)
        except accounting.PrivacyConfigError as e:
            raise GenerateError(f"--label-delta: {e}") from None
        noise_multiplier = labels_lib.calibrate_histogram_noise(epsilon, delta)
    unseen = [r for r in data.records if r["label"] not in set(label_set)]
    if unseen:  # a label the model was not tuned on: named, never counted into another label or dropped
        first = unseen[0]
        raise GenerateError(f"--label-source {label_source}: record {first['id']}: label {first['label']!r} is not one "
                            f"the model was tuned on {list(label_set)} ({len(unseen)} records have such labels)")
    return labels_lib.dp_label_histogram([r["label"] for r in data.records], label_set,
                                         noise_multiplier=float(noise_multiplier), seed=seed)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DpLabelHistogram:
    """A request to draw the job's label distribution as a DP label histogram of D_train.

    `generate(..., label_histogram=...)` draws it with `dp_label_distribution`: every call is a
    new release (Gaussian mechanism on the label counts, sensitivity 1), composed into the
    output's privacy report. Exactly one of `noise_multiplier` or `epsilon`.

    Attributes:
      source: the D_train file(s) whose labels are counted.
      noise_multiplier: sigma of the noise on each count.
      epsilon: calibrate sigma for the histogram alone at `delta`.
      delta: delta for `epsilon` (default: the model's).
      seed: noise seed for tests only; None draws from the OS entropy pool.
      dead_letters: what to do with `source`'s rejected records (`dpsynth.data.dead_letters.Policy`).
      allow_large_delta: accept a `delta` above 1/|source| (refused by default).
      encoding: `source`'s text encoding (default UTF-8).
    """

    source: str | None
    noise_multiplier: float | None = None
    epsilon: float | None = None
    delta: float | None = None
    seed: int | None = None
    dead_letters: Any = None
    allow_large_delta: bool = False
    encoding: str | None = None


def draw_label_histogram(config: GenerateConfig, request: DpLabelHistogram) -> GenerateConfig:
    """`config` with the label distribution drawn as `request` asks (one release)."""
    if config.label_distribution is not None:
        raise GenerateError("pass either a label distribution or a DP label histogram to draw, not both")
    dist = dp_label_distribution(config.model_dir, request.source, labels=config.labels,
                                 noise_multiplier=request.noise_multiplier, epsilon=request.epsilon,
                                 delta=request.delta, seed=request.seed, dead_letters=request.dead_letters,
                                 allow_large_delta=request.allow_large_delta, encoding=request.encoding)
    return dataclasses.replace(config, label_distribution=dist)
