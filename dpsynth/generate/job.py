"""Sharded synthetic-data generation as a Beam fan-out: plan, generate shards, merge, report.

Flow of `generate(config)`:
  1. Read the model directory's manifest (no weights): label set and label-prompt template
     (`dpsynth.train.prompts.labels_of` / `template_of`), maximum length, privacy report
     (refused without one unless `allow_non_private`).
  2. Plan every shard up front: `ShardSpec(split, index, num_shards, start, labels, seed)`
     with `seed = hash(job seed, split, index)` and the labels of its examples (exact,
     shuffled counts from the label distribution). A config hash covers everything that
     determines the output.
  3. `DIR/generation_config.json` is written first; a directory holding another job's config
     is refused. Shards whose file already exists (complete) are skipped, so a rerun after a
     failure regenerates only the missing ones.
  4. Beam: `Create(specs) | Reshuffle | ParDo(GenerateShardFn)`; each worker loads the model
     once (`setup`), samples its shards in fixed-shape batches with the KV cache and writes
     `DIR/shards/{split}-{index:05d}-of-{n:05d}.jsonl` atomically (temporary file + rename).
  5. The driver merges the shards in index order into `DIR/{split}.jsonl` (and Parquet /
     TFRecord when asked), writes `DIR/manifest.json`, copies the privacy report and writes
     `DIR/generation_report.json` (computed from the synthetic data alone). Only when asked
     (`train_path`), the memorisation audit against D_train (NOT DP) goes to an owner-only
     file outside DIR (`audit_dir`, default `DIR.private/`), never into DIR.

Determinism: example i of a shard is sampled with key `fold_in(shard_key, i)`, and a shard's
batches depend only on its spec, so the bytes of every output are the same whatever the
runner, the number of workers or the order in which shards run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from typing import Any

import apache_beam as beam

from dpsynth import fileio
from dpsynth.dedup import DEFAULT_MIN_TOKENS
from dpsynth.generate import labels as labels_lib
from dpsynth.generate.postprocess import PostprocessConfig, filter_samples, keys_of
from dpsynth.owner_only import check_outside, write_private_json
from dpsynth.generate.sampler import DecodeModel, Sampler, SamplerConfig, example_keys, seed_to_key_data
from dpsynth.train import prompts

logger = logging.getLogger("dpsynth.generate")

FORMAT = "dpsynth.synthetic"
FORMAT_VERSION = 1
SPLITS = ("train", "valid")
OUTPUT_FORMATS = ("jsonl", "parquet", "tfrecord")
DEFAULT_MAX_LEN = 512
CONFIG_FILE = "generation_config.json"
MANIFEST_FILE = "manifest.json"
REPORT_FILE = "generation_report.json"
PRIVACY_FILES = ("privacy_report.json", "privacy_report.md")
SHARD_DIR = "shards"
MEMORISATION_AUDIT_FILE = "memorisation_audit.json"  # owner-only, outside the output directory


class GenerateError(ValueError):
    """Bad generation input: names the path or flag and the reason."""


# ----------------------------------------------------------------------------- model access


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
    """Loads a checkpoint directory (`dpsynth.train.checkpoint.load_model`) for sampling."""
    from dpsynth.generate.sampler import TransformerDecodeModel
    from dpsynth.train.checkpoint import load_model

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
    """

    model_dir: str
    fingerprint: str
    max_len: int
    labels: tuple[str, ...] | None
    prompt_template: str
    private: bool
    has_report: bool = False


def _read_json(path: str) -> dict[str, Any]:
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
    for path in (manifest_path, config_path):
        if not os.path.exists(path):
            raise GenerateError(f"{path}: missing; is {model_dir!r} a checkpoint written by `dpsynth pretrain`/`dp-tune`?")
    manifest = _read_json(manifest_path)
    config = _read_json(config_path)
    report_path = os.path.join(model_dir, "privacy_report.json")
    report = _read_json(report_path) if os.path.exists(report_path) else None
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
    return ModelInfo(
        model_dir=model_dir,
        fingerprint=digest.hexdigest(),
        max_len=int(max_len),
        labels=prompts.labels_of(manifest),
        prompt_template=template,
        private=report is not None and report.get("private") is not False,
        has_report=report is not None,
    )


# ----------------------------------------------------------------------------- config and plan


@dataclasses.dataclass(frozen=True, kw_only=True)
class GenerateConfig:
    """One generation job.

    Attributes:
      model_dir: checkpoint directory (DP-tuned: has `privacy_report.json`).
      out_dir: output directory.
      num_examples: synthetic training examples (> 0).
      valid_examples: synthetic validation examples (>= 0; 0 = no valid split).
      seed: job seed; shard seeds are hashes of (seed, split, shard index).
      temperature, top_k, num_decodes: sampling (see `SamplerConfig`).
      max_len: total tokens per example (prompt + text); None = min(512, the model's).
      batch_size: prompts per compiled sampler call.
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
    """

    model_dir: str
    out_dir: str
    num_examples: int
    valid_examples: int = 0
    seed: int = 0
    temperature: float = 1.0
    top_k: int = 0
    num_decodes: int = 1
    max_len: int | None = None
    batch_size: int = 16
    examples_per_shard: int = 256
    labels: tuple[str, ...] | None = None
    label_distribution: labels_lib.LabelDistribution | None = None
    formats: tuple[str, ...] = ("jsonl",)
    allow_non_private: bool = False
    cores_per_worker: int = 0
    postprocess: PostprocessConfig | None = None

    def __post_init__(self):
        if int(self.num_examples) != self.num_examples or self.num_examples <= 0:
            raise GenerateError(f"--num-examples must be a positive integer, got {self.num_examples}")
        if int(self.valid_examples) != self.valid_examples or self.valid_examples < 0:
            raise GenerateError(f"--valid-examples must be an integer >= 0, got {self.valid_examples}")
        if self.examples_per_shard < 1:
            raise GenerateError(f"--examples-per-shard must be >= 1, got {self.examples_per_shard}")
        if self.cores_per_worker < 0:
            raise GenerateError(f"--cores-per-worker must be >= 0, got {self.cores_per_worker}")
        bad = [f for f in self.formats if f not in OUTPUT_FORMATS]
        if bad or "jsonl" not in self.formats:
            raise GenerateError(f"--format must include jsonl and only {OUTPUT_FORMATS}, got {list(self.formats)}")
        SamplerConfig(  # validates the sampling flags early
            temperature=self.temperature, top_k=self.top_k, num_decodes=self.num_decodes,
            max_len=self.max_len or DEFAULT_MAX_LEN, batch_size=self.batch_size,
        )


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

    def shard_path(self, spec: ShardSpec) -> str:
        return os.path.join(self.out_dir, SHARD_DIR, spec.name + ".jsonl")


def make_plan(config: GenerateConfig, info: ModelInfo) -> GenerationPlan:
    """Validates the job against the model and creates every shard spec up front."""
    if not info.private and not config.allow_non_private:
        why = "its privacy report says it is NOT private" if info.has_report else "no privacy_report.json"
        raise GenerateError(
            f"{info.model_dir}: {why}, so this model is not known to be DP; "
            "use a DP-tuned model directory, or pass --allow-non-private (the output is then marked non-private)"
        )
    max_len = config.max_len or min(DEFAULT_MAX_LEN, info.max_len)
    if max_len > info.max_len:
        raise GenerateError(f"--max-len {max_len} exceeds the model's max_len {info.max_len} ({info.model_dir}/config.json)")
    sampler = SamplerConfig(
        temperature=config.temperature, top_k=config.top_k, num_decodes=config.num_decodes,
        max_len=max_len, batch_size=config.batch_size,
    )
    if config.label_distribution is not None:
        dist = config.label_distribution
        labels_lib.check_labels(dist.labels, info.labels, "label distribution")
        if config.labels is not None and tuple(config.labels) != dist.labels:
            raise GenerateError("--labels and the label distribution name different label sets")
    else:
        requested = config.labels if config.labels is not None else info.labels
        if requested is None:
            raise GenerateError(f"{info.model_dir}: the manifest records no label set; pass --labels")
        dist = labels_lib.uniform(labels_lib.check_labels(requested, info.labels, "--labels"))
    config_json = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model_dir": os.path.abspath(config.model_dir),
        "model_fingerprint": info.fingerprint,
        "private": info.private,
        "num_examples": {"train": int(config.num_examples), "valid": int(config.valid_examples)},
        "seed": int(config.seed),
        "sampler": dataclasses.asdict(sampler),
        "examples_per_shard": int(config.examples_per_shard),
        "prompt_template": info.prompt_template,
        "prompt_bos": True,  # prompts are `prompts.prompt_ids` (BOS first); kept so config hashes stay valid
        "label_distribution": dist.to_json(),
    }
    post = config.postprocess if config.postprocess is not None and config.postprocess.active else None
    if post is not None:  # only when used: the hashes of earlier jobs stay valid
        config_json["postprocess"] = dataclasses.asdict(post)
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
    )


# ----------------------------------------------------------------------------- files


def shard_complete(plan: GenerationPlan, spec: ShardSpec) -> bool:
    """True when the shard's file exists with exactly the planned number of records."""
    path = plan.shard_path(spec)
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip()) == spec.count


def prepare_out_dir(plan: GenerationPlan) -> None:
    """Creates the output dir, or checks it belongs to this job (same config hash)."""
    out = plan.out_dir
    cfg_path = os.path.join(out, CONFIG_FILE)
    if os.path.exists(cfg_path):
        existing = _read_json(cfg_path)
        if existing.get("config_hash") != plan.config_hash:
            raise GenerateError(
                f"{out}: holds another generation job's output (config hash {str(existing.get('config_hash'))[:12]} != "
                f"{plan.config_hash[:12]}); choose another --out or delete the directory"
            )
    elif os.path.isdir(os.path.join(out, SHARD_DIR)) and os.listdir(os.path.join(out, SHARD_DIR)):
        raise GenerateError(f"{out}: has shards but no {CONFIG_FILE}; choose another --out or delete the directory")
    os.makedirs(os.path.join(out, SHARD_DIR), exist_ok=True)
    for name in os.listdir(os.path.join(out, SHARD_DIR)):  # partial writes of a killed run
        if fileio.TMP_MARK in name:
            os.remove(os.path.join(out, SHARD_DIR, name))
    if not os.path.exists(cfg_path):
        fileio.write_json(cfg_path, plan.config_json)


# ----------------------------------------------------------------------------- the shard DoFn


def generate_shard(plan: GenerationPlan, bundle: ModelBundle, sampler: Sampler, spec: ShardSpec) -> dict[str, Any]:
    """Samples one shard and writes its file atomically; returns its summary."""
    prompts_by_label = {
        label: prompts.prompt_ids(bundle.tokenizer, plan.prompt_template, label) for label in set(spec.labels)
    }
    keys = example_keys(seed_to_key_data(spec.seed), range(spec.count))
    lines = []
    step = max(plan.sampler.batch_size * 4, 1)
    from dpsynth.progress import Progress

    with Progress(total=spec.count, desc=f"generate {spec.name}", unit="example", interval=30.0) as progress:
        for lo in range(0, spec.count, step):
            hi = min(spec.count, lo + step)
            out = sampler.sample(bundle.params, [prompts_by_label[l] for l in spec.labels[lo:hi]], keys[lo:hi])
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
                lines.append(json.dumps(record, ensure_ascii=False, sort_keys=True))
            progress.update(hi - lo)
    data = ("\n".join(lines) + "\n").encode("utf-8")
    fileio.write_bytes(plan.shard_path(spec), data)
    return {"name": spec.name, "split": spec.split, "num_examples": spec.count, "sha256": fileio.sha256_bytes(data)}


class GenerateShardFn(beam.DoFn):
    """Loads the model once per worker (`setup`) and generates whole shards."""

    def __init__(self, plan: GenerationPlan, loader: Callable[[str], ModelBundle] = load_bundle):
        self._plan = plan
        self._loader = loader
        self._shards = beam.metrics.Metrics.counter("generate", "shards_generated")
        self._skipped = beam.metrics.Metrics.counter("generate", "shards_already_done")
        self._examples = beam.metrics.Metrics.counter("generate", "examples")

    def setup(self):
        if self._plan.cores_per_worker:  # before the model load starts XLA's thread pools
            from dpsynth.beam.affinity import claim_cores

            claim_cores(self._plan.cores_per_worker)
        self._bundle = self._loader(self._plan.model_dir)
        tok = self._bundle.tokenizer
        vocab = getattr(tok, "vocab_size", None)
        ids = {}
        if hasattr(tok, "eos_id"):  # the model's own special ids (an imported model's differ from dpsynth's)
            ids = dict(eos_id=tok.eos_id, pad_id=tok.pad_id, banned_ids=tuple(sorted({tok.pad_id, tok.bos_id} -
                                                                                      {tok.eos_id})))
        self._sampler = Sampler(self._bundle.decoder, dataclasses.replace(self._plan.sampler, vocab_limit=vocab, **ids))

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

    def __init__(self, plan: GenerationPlan, loader: Callable[[str], ModelBundle] = load_bundle, label: str | None = None):
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


# ----------------------------------------------------------------------------- merge and report


def _write_parquet(path: str, rows: list[dict[str, str]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"text": [r["text"] for r in rows], "label": [r["label"] for r in rows]})
    with fileio.atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def _write_tfrecord(path: str, rows: list[dict[str, str]]) -> None:
    try:
        import tensorflow as tf
    except ImportError as e:  # pragma: no cover - depends on the [tf] extra
        raise GenerateError("--format tfrecord needs the [tf] extra (pip install 'dpsynth[tf]')") from e
    with fileio.atomic_path(path) as tmp, tf.io.TFRecordWriter(tmp) as writer:
        for r in rows:
            feature = {k: tf.train.Feature(bytes_list=tf.train.BytesList(value=[r[k].encode("utf-8")])) for k in ("text", "label")}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def merge_outputs(plan: GenerationPlan, formats: Sequence[str]) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """Concatenates the shards of each split in order into DIR/{split}.{jsonl,...}.

    With `plan.postprocess`, each split keeps the first N samples (N = the requested number)
    that pass its filters; the counts are in the entry's "postprocess" field.

    Returns:
      (the manifest's "splits" entry, the kept records per split for the report).
    """
    splits: dict[str, Any] = {}
    kept_keys: set = set()
    records: dict[str, list[dict[str, Any]]] = {}
    for split in SPLITS:
        specs = [s for s in plan.specs if s.split == split]
        if not specs:
            continue
        rows, shard_entries = [], []
        for spec in specs:
            path = plan.shard_path(spec)
            with open(path, "rb") as f:
                data = f.read()
            shard_rows = [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
            if len(shard_rows) != spec.count:
                raise GenerateError(f"{path}: {len(shard_rows)} records, expected {spec.count} (rerun to regenerate it)")
            rows.extend(shard_rows)
            shard_entries.append({"name": spec.name, "num_examples": spec.count, "sha256": fileio.sha256_bytes(data)})
        counts = None
        if plan.postprocess is not None:
            want = int(plan.config_json["num_examples"][split])
            rows, counts = filter_samples(rows, plan.postprocess, want, seen=kept_keys if split == "valid" else ())
            if not rows:
                raise GenerateError(f"{plan.out_dir}: no {split} sample survived the post-processing filters {counts}")
            kept_keys |= keys_of(rows)
        records[split] = rows
        out_rows = [{"text": r["text"], "label": r["label"]} for r in rows]
        files = {}
        jsonl = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in out_rows).encode("utf-8")
        fileio.write_bytes(os.path.join(plan.out_dir, f"{split}.jsonl"), jsonl)
        files["jsonl"] = {"path": f"{split}.jsonl", "sha256": fileio.sha256_bytes(jsonl)}
        if "parquet" in formats:
            _write_parquet(os.path.join(plan.out_dir, f"{split}.parquet"), out_rows)
            files["parquet"] = {"path": f"{split}.parquet"}
        if "tfrecord" in formats:
            _write_tfrecord(os.path.join(plan.out_dir, f"{split}.tfrecord"), out_rows)
            files["tfrecord"] = {"path": f"{split}.tfrecord"}
        splits[split] = {"num_examples": len(rows), "files": files, "shards": shard_entries}
        if counts is not None:
            splits[split]["postprocess"] = counts
    return splits, records


def dp_label_distribution(
    model_dir: str,
    label_source: str | None,
    *,
    labels: Sequence[str] | None = None,
    noise_multiplier: float | None = None,
    epsilon: float | None = None,
    delta: float | None = None,
    seed: int | None = None,
) -> labels_lib.LabelDistribution:
    """A DP label histogram of D_train (`label_source`) for the model's label set.

    Exactly one of `noise_multiplier` (sigma) or `epsilon` (calibrates sigma for the histogram
    alone at `delta`, default the model's delta). Its cost is composed into the output's
    privacy report by `generate` (`dpsynth.dp.report.compose_gaussian`).
    """
    from dpsynth.data.readers import read_sensitive

    if not label_source:
        raise GenerateError("--label-distribution dp-histogram needs --label-source (the D_train file(s))")
    if (noise_multiplier is None) == (epsilon is None):
        raise GenerateError("the DP label histogram needs exactly one of --label-noise-multiplier or --label-epsilon")
    info = read_model_info(model_dir)
    label_set = labels_lib.check_labels(labels if labels is not None else (info.labels or ()), info.labels, "--labels")
    if epsilon is not None:
        if delta is None:
            delta = _model_delta(model_dir)
        if delta is None:
            raise GenerateError(f"{model_dir}: no privacy report to take delta from; pass --label-delta")
        noise_multiplier = labels_lib.calibrate_histogram_noise(epsilon, delta)
    data = read_sensitive(label_source)
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
    """

    source: str | None
    noise_multiplier: float | None = None
    epsilon: float | None = None
    delta: float | None = None
    seed: int | None = None


def _draw_label_histogram(config: GenerateConfig, request: DpLabelHistogram) -> GenerateConfig:
    """`config` with the label distribution drawn as `request` asks (one release)."""
    if config.label_distribution is not None:
        raise GenerateError("pass either a label distribution or a DP label histogram to draw, not both")
    dist = dp_label_distribution(config.model_dir, request.source, labels=config.labels,
                                 noise_multiplier=request.noise_multiplier, epsilon=request.epsilon,
                                 delta=request.delta, seed=request.seed)
    return dataclasses.replace(config, label_distribution=dist)


def _model_delta(model_dir: str) -> float | None:
    path = os.path.join(model_dir, "privacy_report.json")
    if not os.path.exists(path):
        return None
    return float(_read_json(path)["delta"])


def copy_privacy_report(plan: GenerationPlan, private: bool) -> None:
    """Carries the model's privacy report into DIR (composed with a DP label histogram, if
    one was used), or writes a non-private marker."""
    dist = plan.config_json["label_distribution"]
    if private and dist["source"] == "dp_histogram":
        from dpsynth.dp import report as dp_report

        report = dp_report.load_report(plan.model_dir)
        report = dp_report.compose_gaussian(
            report, noise_multiplier=dist["noise_multiplier"], name="label_histogram",
            detail="generator's label distribution: Gaussian mechanism on the label counts of D_train (sensitivity 1)",
        )
        dp_report.write_report(plan.out_dir, report)
        return
    if private or os.path.exists(os.path.join(plan.model_dir, PRIVACY_FILES[0])):  # a non-private report says so
        for name in PRIVACY_FILES:
            src = os.path.join(plan.model_dir, name)
            if os.path.exists(src):
                shutil.copyfile(src, os.path.join(plan.out_dir, name))
        return
    marker = {
        "private": False,
        "reason": f"generated with --allow-non-private from {plan.model_dir}, which has no privacy report",
        "guarantee": "none: this synthetic data may reveal its training data",
    }
    fileio.write_json(os.path.join(plan.out_dir, "privacy_report.json"), marker)
    fileio.write_text(os.path.join(plan.out_dir, "privacy_report.md"),
                      "# Privacy report\n\n**NOT PRIVATE.** " + marker["reason"] + ". " + marker["guarantee"].capitalize() + ".\n")


# ----------------------------------------------------------------------------- the job


def run_shards(plan: GenerationPlan, specs: Sequence[ShardSpec], *, beam_args: Sequence[str] = (),
               pipeline_factory=None, loader: Callable[[str], ModelBundle] = load_bundle) -> None:
    """Runs the Beam fan-out over `specs` (blocking; `dpsynth.beam.pipeline.run_pipeline`)."""
    from dpsynth.beam.pipeline import run_pipeline

    def build(p):
        _ = (
            p
            | "CreateShardSpecs" >> beam.Create(list(specs))
            | "GenerateSynthetic" >> GenerateSynthetic(plan, loader)
        )

    run_pipeline(build, beam_args=beam_args, pipeline_factory=pipeline_factory)


def generate(
    config: GenerateConfig,
    *,
    beam_args: Sequence[str] = (),
    pipeline_factory=None,
    loader: Callable[[str], ModelBundle] = load_bundle,
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
      pipeline_factory: returns the pipeline to run on instead (tests: `TestPipeline`).
      loader: model directory -> `ModelBundle` (default: the checkpoint loader).
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
    from dpsynth.generate import report as report_lib

    if train_path is not None:
        audit_dir = audit_dir or default_audit_dir(config.out_dir)
        try:
            check_outside(audit_dir, config.out_dir, "--audit-dir: the memorisation audit directory")
        except ValueError as e:
            raise GenerateError(str(e)) from e
    if label_histogram is not None:
        config = _draw_label_histogram(config, label_histogram)
    info = read_model_info(config.model_dir)
    plan = make_plan(config, info)
    prepare_out_dir(plan)
    missing = [s for s in plan.specs if not shard_complete(plan, s)]
    logger.info("generate: %d shards planned, %d to generate (config %s)", len(plan.specs), len(missing), plan.config_hash[:12])
    if missing:
        run_shards(plan, missing, beam_args=beam_args, pipeline_factory=pipeline_factory, loader=loader)
    still = [s.name for s in plan.specs if not shard_complete(plan, s)]
    if still:
        raise GenerateError(f"{plan.out_dir}: {len(still)} shards missing after the pipeline ran (first: {still[0]}); rerun")
    splits, records = merge_outputs(plan, config.formats)
    copy_privacy_report(plan, info.private)
    gen_report = report_lib.generation_report(records, plan.config_json["label_distribution"],
                                              max_len=plan.sampler.max_len)
    if plan.postprocess is not None:
        gen_report["postprocess"] = {"config": dataclasses.asdict(plan.postprocess), "note":
                                     "samples filtered by their own content: post-processing, no privacy cost",
                                     **{split: info["postprocess"] for split, info in splits.items()}}
    fileio.write_json(os.path.join(plan.out_dir, REPORT_FILE), gen_report)
    if train_path is not None:
        if tokenizer is None:
            tokenizer = _load_tokenizer(config.model_dir)
        audit = report_lib.memorisation_audit(records, tokenizer=tokenizer, train_path=train_path,
                                              min_shared_tokens=min_shared_tokens)
        audit["synthetic_corpus"] = os.path.abspath(config.out_dir)
        path = write_private_json(os.path.join(audit_dir, MEMORISATION_AUDIT_FILE), audit)
        logger.info("generate: memorisation audit (NOT DP, owner-only, do not share) -> %s", path)
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "config_hash": plan.config_hash,
        "private": info.private,
        "model_dir": plan.config_json["model_dir"],
        "model_fingerprint": info.fingerprint,
        "splits": splits,
        "files": {"config": CONFIG_FILE, "report": REPORT_FILE, "privacy_report": list(PRIVACY_FILES)},
    }
    fileio.write_json(os.path.join(plan.out_dir, MANIFEST_FILE), manifest)
    return manifest


def default_audit_dir(out_dir: str) -> str:
    """The default owner-only directory of a job's memorisation audit: `OUT.private` beside OUT."""
    return os.path.abspath(out_dir).rstrip(os.sep) + ".private"


def _load_tokenizer(model_dir: str):
    from dpsynth.tokens import load_tokenizer

    return load_tokenizer(model_dir)
