"""Pretraining the decoder-only LM on a cleaned token corpus (the `dpsynth pretrain` library).

Data: the corpus (token shards written by the tokenize/dedup jobs) is read with
`dpsynth.data.token_shards.iter_shards` (hashes verified) after checking that its manifest names
the given tokenizer. Each document becomes `[BOS] doc [EOS]`, cut into blocks of `seq_len`
tokens; a deterministic `valid_fraction` of blocks (by SHA-256 of (document id, block
index)) is held out for validation perplexity and never trained on (a document shorter than
`seq_len` is one block, so small documents are held out whole). With `valid_unit="document"`
the hash is of the document id alone, so whole documents are held out (a fixed set of
held-out reviews, say). `valid_groups` (document-id prefixes such as `hotels/`) report the
validation perplexity of each group's held-out blocks as well (e.g. reviews vs Wikipedia). The remaining blocks are
concatenated into one stream and packed into rows of `seq_len` tokens with segment ids, so no
token attends across documents and positions restart per segment; a target is only trained
on when it belongs to the same document as its input. Rows are visited in a seeded
permutation per epoch; the data position is a pure function of the step, so resuming is exact.

Loss: next-token cross-entropy + z-loss `z_loss * log(Z)^2` (1e-4), weight decay 1e-3,
Adafactor with `min(0.01, 1/sqrt(step))` (the paper's) or AdamW (default for tiny/small).

Outputs in OUT (a `dpsynth.model` directory once training finishes, see
`dpsynth.models.directory`): manifest.json, config.json, tokenizer.model, variables/,
plus checkpoints/ (resumable training state), metrics.jsonl and tb/ (TensorBoard events).

The corpus is packed in host memory (fine up to a few hundred million tokens on one host).

Multi-host (several JAX processes, e.g. the hosts of a TPU pod slice; `jax.distributed` must
be initialized first, see `dpsynth.train.sharding.initialize_distributed`): every process runs
this same function with the same arguments. The mesh spans every process's devices
(`mesh_data * mesh_model` must equal `jax.device_count()`); each process packs the same row
index (cheap, deterministic) but gathers and transfers only its own rows of every batch
(`core.TrainFunctions.process_rows`), which the core assembles into global arrays. The
losses and parameters equal a single-process run on as many devices up to float rounding
(tested in 2 processes). Checkpoints are Orbax multi-host (every process writes its shards
into the shared OUT, which must be one file system all hosts see, e.g. GCS or NFS); the
metrics, TensorBoard events and the model directory's JSON files are written by process 0.

Crash safety: a kill at any point loses at most the steps since the last checkpoint (`--resume`
continues exactly), and the model directory's manifest is written last (`dpsynth.train.release`):
a kill while the model is written leaves no manifest, so nothing loads it, and the rerun says
so and rewrites it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpsynth import binding
from dpsynth.data import token_shards
from dpsynth.data.tokenizers import BOS_ID, EOS_ID, Tokenizer
from dpsynth.errors import DpsynthError
from dpsynth.models import ModelConfig, Transformer, get_config
from dpsynth.models import directory as model_dir
from dpsynth.models.sharding import FSDP_RULES, LOGICAL_RULES
from dpsynth.train.checkpoint import TrainCheckpointer
from dpsynth.train import core, lm, loop, optim, release, resources, sharding

logger = logging.getLogger("dpsynth.pretrain")

# Peak dense bf16 FLOP/s per device for the MFU estimate (vendor figures, no sparsity).
PEAK_FLOPS = {"TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v6": 918e12,
              "H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12}


VALID_UNITS = ("block", "document")


class PretrainError(DpsynthError, ValueError):
    """Bad input to pretraining (says which file/flag and what to do)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class PretrainConfig:
    """Pretraining settings (see `dpsynth pretrain --help` for each flag).

    Attributes:
      preset: model preset name; `model_overrides` changes single fields of it.
      seq_len: packed sequence length L (must be <= the model's max_len).
      batch_size: rows per microbatch; a step sees `batch_size * grad_accum` rows.
      grad_accum: microbatches accumulated per optimizer step.
      microbatch_size: None (default): the microbatch is `batch_size` rows. N: the step's
        `batch_size * grad_accum` rows are split into equal microbatches of N rows (N divides
        them; the same mean gradient up to float rounding). "auto": the largest such N whose
        compiled step (accumulate and apply, or the fused step when N is the whole batch) fits
        the device memory (or `memory_limit`) less `memory_headroom`, found before training from
        XLA's memory analysis of the step compiled on abstract arrays (`auto_microbatch`); a
        resumed run keeps its checkpoint's. The resolved N is recorded in the checkpoints and the
        model manifest.
      memory_limit, memory_headroom: the budget of microbatch_size "auto": bytes per device
        (default: the device's; on CPU the host's available memory over its CPU devices) and the fraction of it left free.
      steps: total optimizer steps.
      optimizer: "adafactor", "adam" or "auto" (Adam for tiny/cpu/small, Adafactor otherwise).
      learning_rate: peak learning rate (Adam: warm-up + cosine; Adafactor: the cap of
        min(lr, 1/sqrt(step))); None = the optimizer's default (3e-3 / 0.01).
      warmup_steps: Adam warm-up steps.
      weight_decay, z_loss: regularizers (1e-3, 1e-4 as in the paper).
      valid_fraction: fraction of blocks held out for validation perplexity.
      valid_unit: "block" (hold out blocks) or "document" (hold out whole documents).
      valid_groups: document-id prefixes whose held-out blocks also get their own validation
        perplexity (`summary["valid_groups"][prefix]`); e.g. ("hotels/", "cars/").
      eval_every, eval_batches: validation cadence and size (batches of `batch_size` rows).
      checkpoint_every: steps between checkpoints (and one at the end).
      log_every: steps between metric lines / TensorBoard points.
      seed: seeds initialization, data order and the step keys.
      mesh_data, mesh_model: device mesh shape; 1 x 1 = no mesh (single device).
      fsdp: also shard the parameters and optimizer state over the mesh's data axis
        (`dpsynth.models.sharding.FSDP_RULES`, the layout of `dpsynth plan --fsdp`; needs
        mesh_data >= 2); the same updates as without.
      peak_tflops: per-device peak for the MFU estimate (default: looked up by device kind).
      tensorboard: write TensorBoard event files to OUT/tb.
      progress_interval: seconds between progress lines.
      eval_at_start: also measure validation perplexity before the first step.
    """

    preset: str = "tiny"
    model_overrides: dict = dataclasses.field(default_factory=dict)
    seq_len: int = 1024
    batch_size: int = 8
    grad_accum: int = 1
    # Added after runs existed: left out of run records (and stage dicts) at their defaults.
    microbatch_size: int | str | None = binding.setting(
        None, unless_default=True,
        help="rows per compiled microbatch: the step's --batch-size x --grad-accum rows are split into equal "
             "microbatches of N (N divides them; default: --batch-size); auto: the largest such N whose compiled "
             "step fits the device memory less --memory-headroom (logged with its figures; CPU: the host's available memory)")
    memory_limit: int | None = binding.setting(
        None, unless_default=True,
        help="--microbatch-size auto: device memory to fit in (e.g. 80GB, 16GiB; default: the device's)")
    memory_headroom: float = binding.setting(
        resources.DEFAULT_HEADROOM, unless_default=True,
        help=f"--microbatch-size auto: fraction of the memory left free (default {resources.DEFAULT_HEADROOM})")
    steps: int = 1000
    optimizer: str = "auto"
    learning_rate: float | None = None
    warmup_steps: int = 50
    weight_decay: float = 1e-3
    z_loss: float = 1e-4
    valid_fraction: float = 0.02
    valid_unit: str = "block"
    valid_groups: tuple[str, ...] = ()
    eval_every: int = 200
    eval_batches: int = 8
    checkpoint_every: int = 200
    log_every: int = 10
    seed: int = 0
    mesh_data: int = 1
    mesh_model: int = 1
    fsdp: bool = binding.setting(
        False, unless_default=True,
        help="also shard the parameters and optimizer state over the data axis (FSDP; needs --mesh-data >= 2): "
             "per-device parameter memory / --mesh-data, the same updates")
    peak_tflops: float | None = None
    tensorboard: bool = True
    progress_interval: float = 5.0
    eval_at_start: bool = False

    def __post_init__(self):
        for name in ("seq_len", "batch_size", "grad_accum", "steps", "eval_every", "eval_batches",
                     "checkpoint_every", "log_every", "mesh_data", "mesh_model"):
            if getattr(self, name) <= 0:
                raise PretrainError(f"{name} must be positive, got {getattr(self, name)}")
        if self.learning_rate is not None and not (isinstance(self.learning_rate, (int, float)) and self.learning_rate > 0):
            raise PretrainError(f"learning_rate must be > 0 (or None: the optimizer's default), got {self.learning_rate!r}")
        if self.optimizer not in ("auto",) + optim.OPTIMIZERS:
            raise PretrainError(f"optimizer must be auto|adafactor|adam, got {self.optimizer!r}")
        if self.valid_unit not in VALID_UNITS:
            raise PretrainError(f"valid_unit must be one of {VALID_UNITS}, got {self.valid_unit!r}")
        if isinstance(self.valid_groups, str) or not all(isinstance(g, str) and g for g in self.valid_groups):
            raise PretrainError(f"valid_groups must be a list of non-empty id prefixes, got {self.valid_groups!r}")
        if not 0.0 <= self.valid_fraction < 1.0:
            raise PretrainError(f"valid_fraction must be in [0, 1), got {self.valid_fraction}")
        if self.fsdp and self.mesh_data < 2:
            raise PretrainError(f"fsdp shards the parameters over the mesh's data axis: needs mesh_data >= 2, got "
                                f"{self.mesh_data}")
        if self.batch_size % self.mesh_data:
            raise PretrainError(f"batch_size {self.batch_size} must be divisible by the mesh data axis {self.mesh_data}")
        m = self.microbatch_size
        if m is not None and m != "auto":
            if not isinstance(m, int) or isinstance(m, bool) or m < 1:
                raise PretrainError(f"microbatch_size must be a positive integer or 'auto', got {m!r}")
            if self.step_rows % m or m % self.mesh_data:
                raise PretrainError(f"microbatch_size {m} must divide the step's batch_size x grad_accum = "
                                    f"{self.step_rows} rows and be a multiple of the mesh data axis {self.mesh_data}; "
                                    f"divisors that are: {microbatch_candidates(self)}")
        if self.memory_limit is not None and (not isinstance(self.memory_limit, int) or self.memory_limit <= 0):
            raise PretrainError(f"memory_limit must be a positive number of bytes, got {self.memory_limit!r}")
        if not 0.0 <= self.memory_headroom < 1.0:
            raise PretrainError(f"memory_headroom must be in [0, 1), got {self.memory_headroom}")

    @property
    def step_rows(self) -> int:
        """Rows per optimizer step (`batch_size * grad_accum`, whatever the microbatch)."""
        return self.batch_size * self.grad_accum

    @property
    def microbatch(self) -> int:
        """Rows per compiled microbatch once resolved (`microbatch_size`, default `batch_size`)."""
        if self.microbatch_size == "auto":
            raise PretrainError("microbatch_size 'auto' is resolved by run_pretrain (resolve_microbatch) first")
        return self.microbatch_size or self.batch_size

    @property
    def optimizer_name(self) -> str:
        if self.optimizer != "auto":
            return self.optimizer
        return "adam" if self.preset in ("tiny", "cpu", "small") else "adafactor"

    def model_config(self, vocab_size: int) -> ModelConfig:
        """The preset with the overrides; vocab_size defaults to the tokenizer's exactly.

        (Not padded: a sampler must never emit an id the tokenizer cannot decode.)
        """
        overrides = dict(self.model_overrides)
        overrides.setdefault("vocab_size", int(vocab_size))
        try:
            config = get_config(self.preset, **overrides)
        except (TypeError, ValueError) as e:
            raise PretrainError(f"model: {e}") from e
        if config.vocab_size < vocab_size:
            raise PretrainError(f"model vocab_size {config.vocab_size} < tokenizer vocabulary {vocab_size}")
        if self.seq_len > config.max_len:
            raise PretrainError(f"--seq-len {self.seq_len} exceeds the max_len {config.max_len} of preset "
                                f"{config.preset!r}; use a shorter --seq-len or a preset with a longer max_len")
        return config


# ============================================================================ data


@dataclasses.dataclass(frozen=True)
class PackedRows:
    """Packed rows [N, L]: inputs, targets, weights (1 = train on the target), segment ids."""

    inputs: np.ndarray
    targets: np.ndarray
    weights: np.ndarray
    segment_ids: np.ndarray

    @property
    def num_rows(self) -> int:
        return int(self.inputs.shape[0])

    def rows(self, index: np.ndarray) -> dict[str, np.ndarray]:
        n = len(index)
        return {"inputs": self.inputs[index], "targets": self.targets[index], "weights": self.weights[index],
                "segment_ids": self.segment_ids[index], "mask": np.ones((n,), np.float32)}


def load_documents(corpus_dir: str, tokenizer: Tokenizer) -> tuple[list[np.ndarray], list[str], dict]:
    """Reads every document of a token corpus after checking it matches `tokenizer`."""
    manifest = token_shards.read_manifest(corpus_dir)
    if manifest.get("tokenizer_sha256") != tokenizer.sha256:
        raise PretrainError(
            f"{corpus_dir}/manifest.json: the corpus was tokenized with tokenizer sha256 "
            f"{str(manifest.get('tokenizer_sha256'))[:12]}..., but the given tokenizer is {tokenizer.sha256[:12]}...; "
            "pass the tokenizer the corpus was made with, or re-run `dpsynth tokenize` with this one")
    if int(manifest.get("vocab_size", 0)) > tokenizer.vocab_size:
        raise PretrainError(f"{corpus_dir}: vocab_size {manifest['vocab_size']} exceeds the tokenizer's")
    docs, ids = [], []
    for shard in token_shards.iter_shards(corpus_dir):
        for i, meta in enumerate(shard.docs):
            doc = shard.document(i)
            if len(doc):
                docs.append(np.asarray(doc, np.int32))
                ids.append(str(meta["id"]))
    if not docs:
        raise PretrainError(f"{corpus_dir}: the corpus has no non-empty documents")
    return docs, ids, manifest


def _held_out(doc_id: str, block: int, fraction: float, unit: str = "block") -> bool:
    key = f"{doc_id}\x00{block}" if unit == "block" else f"{doc_id}\x00document"
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64 < fraction


def _pack(pieces: list[tuple[np.ndarray, int]], seq_len: int) -> PackedRows:
    """Concatenates (tokens, segment) pieces and cuts rows of `seq_len` inputs (+1 target)."""
    if not pieces:
        empty = np.zeros((0, seq_len), np.int32)
        return PackedRows(empty, empty, empty.astype(np.float32), empty)
    toks = np.concatenate([p for p, _ in pieces])
    segs = np.concatenate([np.full(len(p), s, np.int32) for p, s in pieces])
    n = (len(toks) - 1) // seq_len
    if n == 0:  # pad a too-short stream to one row
        pad = seq_len + 1 - len(toks)
        toks, segs = np.concatenate([toks, np.zeros(pad, np.int32)]), np.concatenate([segs, np.zeros(pad, np.int32)])
        n = 1
    x, y = toks[: n * seq_len], toks[1: n * seq_len + 1]
    sx, sy = segs[: n * seq_len], segs[1: n * seq_len + 1]
    weights = ((sx == sy) & (sx > 0)).astype(np.float32)
    return PackedRows(x.reshape(n, seq_len), y.reshape(n, seq_len), weights.reshape(n, seq_len),
                      sx.reshape(n, seq_len))


def pack_documents(documents: list[np.ndarray], ids: list[str], seq_len: int, valid_fraction: float,
                   valid_unit: str = "block", valid_groups: tuple[str, ...] = ()
                   ) -> tuple[PackedRows, PackedRows] | tuple[PackedRows, PackedRows, dict[str, PackedRows]]:
    """(train, valid) packed rows; see the module docstring for the hold-out and packing rules.

    With `valid_groups`, a third item maps each id prefix to the packed held-out blocks of its
    documents (a subset of `valid`).
    """
    train, valid = [], []
    grouped: dict[str, list] = {g: [] for g in valid_groups}
    segment = 0
    prev_train = False
    for doc, doc_id in zip(documents, ids):
        full = np.concatenate([[BOS_ID], doc, [EOS_ID]]).astype(np.int32)
        prev_train = False
        for b, start in enumerate(range(0, len(full), seq_len)):
            piece = full[start: start + seq_len]
            held = valid_fraction > 0 and _held_out(doc_id, b, valid_fraction, valid_unit)
            if held:
                segment += 1
                valid.append((piece, segment))
                for g in valid_groups:
                    if doc_id.startswith(g):
                        grouped[g].append((piece, segment))
                prev_train = False
            else:
                if not prev_train:
                    segment += 1  # a new training segment (a new document or after a held-out gap)
                train.append((piece, segment))
                prev_train = True
    if valid_fraction > 0 and not valid and len(train) > 1:
        # Tiny corpora: hold out the last block so validation perplexity always exists.
        piece, _ = train.pop()
        segment += 1
        valid.append((piece, segment))
    if valid_groups:
        return _pack(train, seq_len), _pack(valid, seq_len), {g: _pack(p, seq_len) for g, p in grouped.items()}
    return _pack(train, seq_len), _pack(valid, seq_len)


def batch_indices(num_rows: int, row_offset: int, count: int, seed: int) -> np.ndarray:
    """Rows `row_offset .. row_offset + count` of the endless stream of seeded epoch permutations."""
    out = []
    while count > 0:
        epoch, within = divmod(row_offset, num_rows)
        perm = np.random.default_rng([seed, epoch]).permutation(num_rows)
        take = min(count, num_rows - within)
        out.append(perm[within: within + take])
        row_offset += take
        count -= take
    return np.concatenate(out)


# ============================================================================ metrics


def peak_flops_per_device(device: jax.Device | None = None) -> float | None:
    """Vendor peak (dense bf16) FLOP/s for known accelerators; None for CPUs and unknown kinds."""
    kind = (device or jax.devices()[0]).device_kind
    for name, flops in PEAK_FLOPS.items():
        if name.lower() in kind.lower():
            return flops
    return None


class _NullWriter:
    """What processes other than 0 of a multi-host run write: nothing."""

    def write(self, step: int, split: str, metrics: dict[str, float]) -> None:
        del step, split, metrics

    def close(self) -> None:
        pass


class _Writer:
    """TensorBoard (tensorboardX) + metrics.jsonl, both append-only (a resume continues them)."""

    def __init__(self, out_dir: str, tensorboard: bool):
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(logdir=os.path.join(out_dir, "tb"))
        self._jsonl = open(os.path.join(out_dir, "metrics.jsonl"), "a")

    def write(self, step: int, split: str, metrics: dict[str, float]) -> None:
        self._jsonl.write(json.dumps({"step": step, "split": split, **metrics}) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            for k, v in metrics.items():
                if v is not None and math.isfinite(v):
                    self._tb.add_scalar(f"{split}/{k}", v, step)

    def close(self) -> None:
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()


# ============================================================================ training


class _Throughput:
    """Train metrics of the steps since the last log line, for the metric lines of pretraining.

    The first step's time is the compile time (`compile_s`), kept out of the rates, and so is
    the time of evaluations and checkpoints (`exclude`).
    """

    WINDOW_KEYS = ("ce_sum", "tokens", "loss_sum", "count")

    def __init__(self, flops_per_token: float, peak: float | None, num_devices: int):
        self.flops_per_token, self.peak, self.num_devices = flops_per_token, peak, num_devices
        self.compile_s: float | None = None
        self.last: dict[str, float] = {}  # the latest metric line
        self._window: dict | None = None
        self._grad_norm = None
        self._t = time.perf_counter()

    def add(self, metrics: dict, t0: float) -> None:
        """Adds one step's metrics; `t0` is when the step was called."""
        self._window = core.sum_metrics(self._window, {k: metrics[k] for k in self.WINDOW_KEYS})
        self._grad_norm = metrics["grad_norm"]
        if self.compile_s is None:
            jax.block_until_ready(metrics["loss"])
            self.compile_s = time.perf_counter() - t0
            self._t, self._window = time.perf_counter(), None  # exclude compilation from rates

    def exclude(self, seconds: float) -> None:
        self._t += seconds

    def read(self) -> dict[str, float] | None:
        """The metric line of the window (None when it is empty) and a new window."""
        host = jax.device_get(self._window) if self._window is not None else None
        now = time.perf_counter()
        line = None
        if host is not None:
            tokens = float(host["tokens"])
            tok_s = tokens / max(now - self._t, 1e-9)
            loss = float(host["ce_sum"]) / max(tokens, 1.0)
            achieved = tok_s * self.flops_per_token
            line = {"loss": float(host["loss_sum"]) / max(float(host["count"]), 1.0), "ce": loss,
                    "perplexity": float(math.exp(min(loss, 50.0))), "tokens_per_s": tok_s,
                    "tflops_per_s": achieved / 1e12, "grad_norm": float(self._grad_norm)}
            if self.peak:
                line["mfu"] = achieved / (self.peak * self.num_devices)
            self.last = line
        self._t, self._window = now, None
        return line


def _validate(eval_fn, fns: core.TrainFunctions, state: core.TrainState, rows: PackedRows, cfg: PretrainConfig,
              local: np.ndarray, per_call: int | None = None) -> dict[str, float]:
    """Validation loss and perplexity over the first `eval_batches` batches of `rows` ({} when empty),
    fed `per_call` rows at a time (default `batch_size`; `local`: this process's rows of each)."""
    if rows.num_rows == 0:
        return {}
    per_call = per_call or cfg.batch_size
    ce = toks = 0.0
    n = min(rows.num_rows, cfg.eval_batches * cfg.batch_size)
    for start in range(0, n, per_call):
        idx = np.arange(start, start + per_call) % rows.num_rows
        mask = (start + np.arange(per_call) < n).astype(np.float32)
        batch = rows.rows(idx[local])
        batch["mask"] = mask[local]
        aux = sharding.gather(eval_fn(state.params, state.frozen, fns.shard_batch(batch, global_rows=per_call)))
        ce += float(np.sum(np.asarray(aux["ce_sum"]) * mask))
        toks += float(np.sum(np.asarray(aux["tokens"]) * mask))
    loss = ce / max(toks, 1.0)
    return {"loss": loss, "perplexity": float(math.exp(min(loss, 50.0))), "tokens": toks}


def _meta(cfg: PretrainConfig, model_config: ModelConfig, corpus_manifest_sha: str, tokenizer_sha: str,
          step: int) -> dict[str, Any]:
    # The model config as it reads back from the checkpoint's JSON (tuples become lists).
    model_json = json.loads(json.dumps(model_config.to_dict()))
    return {"preset": model_config.preset, "model_config": model_json, "seq_len": cfg.seq_len,
            "batch_size": cfg.batch_size, "grad_accum": cfg.grad_accum, "seed": cfg.seed,
            "valid_fraction": cfg.valid_fraction, "valid_unit": cfg.valid_unit, "optimizer": cfg.optimizer_name, "steps": cfg.steps,
            "rows_consumed": step * cfg.batch_size * cfg.grad_accum, "corpus_manifest_sha256": corpus_manifest_sha,
            "tokenizer_sha256": tokenizer_sha,
            # the resolved microbatch, when set (a default run's metadata is as before: microbatch = batch_size)
            **({"microbatch_size": cfg.microbatch_size} if cfg.microbatch_size is not None else {})}


def _check_resume_meta(meta: dict, expected: dict, where: str) -> None:
    if meta.get("preset") != expected["preset"] or meta.get("model_config") != expected["model_config"]:
        raise model_dir.CheckpointError(
            f"{where}: checkpoint is from preset {meta.get('preset')!r} (model {meta.get('model_config')}), this run "
            f"is preset {expected['preset']!r}; resume with the original --preset/flags or use a new --out")
    for key in ("seq_len", "batch_size", "grad_accum", "seed", "valid_fraction", "valid_unit", "optimizer", "steps",
                "corpus_manifest_sha256", "tokenizer_sha256"):
        if meta.get(key, "block" if key == "valid_unit" else None) != expected[key]:  # older runs: block
            raise model_dir.CheckpointError(
                f"{where}: checkpoint has {key}={meta.get(key)!r} but this run has {expected[key]!r}; an exact resume "
                "needs the same corpus, tokenizer and flags (use a new --out to start over)")
    ours = expected.get("microbatch_size", expected["batch_size"])  # "auto": resumes with the checkpoint's
    theirs = meta.get("microbatch_size", meta.get("batch_size"))
    if ours != "auto" and ours != theirs:
        raise model_dir.CheckpointError(
            f"{where}: checkpoint has microbatch_size={theirs!r} but this run has {ours!r}; resume with "
            f"--microbatch-size {theirs} (or auto, which keeps the checkpoint's), or use a new --out to start over")


def make_training(cfg: PretrainConfig, model_config: ModelConfig,
                  mesh=None) -> tuple[core.LossFn, core.TrainFunctions, core.TrainState]:
    """The pretraining step of `cfg` on the training core, and its freshly initialised state.

    The LM loss with `cfg.z_loss`, `cfg.optimizer_name` with its schedule over `cfg.steps`, the
    plain mean gradient; parameters initialised from `cfg.seed` (the step keys come from the
    same seed). `run_pretrain` trains with exactly these; `bench/accelerator.py` times them.

    Returns:
      (loss_fn, train functions, initial `TrainState`, placed on `mesh` when given).
    """
    model, loss_fn, fns = _train_functions(cfg, model_config, mesh)
    init_key, step_key = jax.random.split(jax.random.PRNGKey(cfg.seed))
    variables = jax.jit(model.init)(init_key, _init_inputs(cfg))
    params, frozen = lm.split_variables(variables, ("params",))
    return loss_fn, fns, fns.init_state(params, frozen, rng=step_key, copy=False)


def _train_functions(cfg: PretrainConfig, model_config: ModelConfig, mesh=None):
    """(model, loss_fn, train functions) of `make_training`, without a state."""
    model = Transformer(model_config)
    optimizer = optim.make_optimizer(cfg.optimizer_name, learning_rate=cfg.learning_rate, weight_decay=cfg.weight_decay,
                                     total_steps=cfg.steps, warmup_steps=cfg.warmup_steps)
    loss_fn = lm.make_lm_loss(model, z_loss=cfg.z_loss)
    return model, loss_fn, core.make_train_functions(loss_fn, optimizer, core.MeanGradient(), mesh=mesh,
                                                     rules=FSDP_RULES if cfg.fsdp else LOGICAL_RULES)


def _init_inputs(cfg: PretrainConfig) -> jax.Array:
    return jnp.zeros((1, min(8, cfg.seq_len)), jnp.int32)


# ============================================================================ the automatic microbatch


def microbatch_candidates(cfg: PretrainConfig) -> list[int]:
    """The microbatches a step of `cfg` can be split into: divisors of `batch_size * grad_accum`
    that are multiples of the mesh's data axis, ascending."""
    return [m for m in range(cfg.mesh_data, cfg.step_rows + 1, cfg.mesh_data) if cfg.step_rows % m == 0]


class _AbstractSteps:
    """`cfg`'s step functions and state as `jax.ShapeDtypeStruct`s (what `make_training` builds, without
    allocating a weight): compiles the steps at any microbatch for their memory figures."""

    def __init__(self, cfg: PretrainConfig, model_config: ModelConfig, mesh=None):
        self.cfg = cfg
        model, _, self.fns = _train_functions(cfg, model_config, mesh)
        variables = jax.eval_shape(model.init, jax.random.PRNGKey(0), _init_inputs(cfg))
        self.state = self.fns.abstract_state(*lm.split_variables(variables, ("params",)))
        self._sharding = sharding.batch_sharding(mesh) if mesh is not None else None

    def costs(self, microbatch: int, *, apply: bool = True) -> dict[str, resources.ProgramCost]:
        """The programs a step of `microbatch`-row microbatches runs, compiled: "train" (the fused
        step) when one microbatch is the whole step, else "accumulate" and (with `apply`) "apply"."""
        batch = resources.abstract_batch(microbatch, self.cfg.seq_len, self._sharding, segment_ids=True)
        if microbatch == self.cfg.step_rows:
            return {"train": resources.program_cost("train", self.fns.lower("train", self.state, batch))}
        acc = self.fns.abstract_accumulator(self.state)
        out = {"accumulate": resources.program_cost("accumulate", self.fns.lower("accumulate", self.state, acc, batch))}
        if apply:
            out["apply"] = resources.program_cost("apply", self.fns.lower("apply", self.state, acc))
        return out

    def peak_bytes(self, microbatch: int) -> int:
        """The largest peak of the programs a step at `microbatch` runs."""
        return max(c.total_bytes for c in self.costs(microbatch).values())


def compile_steps(cfg: PretrainConfig, model_config: ModelConfig, *, microbatch: int, mesh=None
                  ) -> dict[str, resources.ProgramCost]:
    """The pretraining programs of `cfg` at `microbatch` rows, compiled on abstract arrays (no weights,
    no data): {"train"} when the microbatch is the step's whole batch, else {"accumulate", "apply"}."""
    return _AbstractSteps(cfg, model_config, mesh).costs(microbatch)


def auto_microbatch(cfg: PretrainConfig, model_config: ModelConfig, *, mesh=None, limit_bytes: int,
                    headroom: float = resources.DEFAULT_HEADROOM) -> resources.MicrobatchChoice:
    """`resources.largest_microbatch` over `microbatch_candidates(cfg)`: the largest whose compiled
    step (max of accumulate and apply, or the fused step for the whole batch) fits `limit_bytes`
    less `headroom`. Raises `resources.PlanError` (one line) when none fits."""
    steps = _AbstractSteps(cfg, model_config, mesh)
    applied: list[int] = []  # the apply step's peak does not depend on the microbatch: compiled once

    def peak(m: int) -> int:
        costs = steps.costs(m, apply=not applied)
        if "apply" in costs:
            applied.append(costs.pop("apply").total_bytes)
        return max([c.total_bytes for c in costs.values()] + ([applied[0]] if "accumulate" in costs else []))

    return resources.largest_microbatch(
        peak, limit_bytes=limit_bytes, headroom=headroom, candidates=microbatch_candidates(cfg),
        advice=f"use a shorter --seq-len, a smaller model, more devices (--mesh-data/--mesh-model) or a larger "
               f"--memory-limit (the step's batch is --batch-size x --grad-accum = {cfg.step_rows} rows)")


def resolve_microbatch(cfg: PretrainConfig, model_config: ModelConfig, *, mesh=None,
                       resumed: dict | None = None) -> PretrainConfig:
    """`cfg` with microbatch_size "auto" replaced by a number: the checkpoint's when resuming (`resumed`,
    its metadata: a resumed run keeps its microbatch), else `auto_microbatch`'s choice (logged in one
    line with its figures). Unchanged otherwise."""
    if cfg.microbatch_size != "auto":
        return cfg
    if resumed is not None:
        m = int(resumed.get("microbatch_size", resumed.get("batch_size")))
        logger.info("microbatch auto: microbatch %d, the checkpoint's (a resumed run keeps its microbatch)", m)
    else:
        def search() -> resources.MicrobatchChoice:
            limit = resources.memory_limit(cfg.memory_limit)  # this process's first device
            return auto_microbatch(cfg, model_config, mesh=mesh, limit_bytes=limit, headroom=cfg.memory_headroom)

        # Every process runs process 0's choice (their devices could report other limits); a search that
        # fails on any process stops all of them (`resources.agreed_size`).
        m, choice = resources.agreed_size(search)
        logger.info("microbatch auto: %s; %d microbatch(es) per step of %d rows", choice.describe(),
                    cfg.step_rows // m, cfg.step_rows)
    return dataclasses.replace(cfg, microbatch_size=m)


def run_pretrain(corpus_dir: str, tokenizer_path: str, out_dir: str, config: PretrainConfig, *,
                 resume: bool = False, stop_after: int | None = None) -> dict[str, Any]:
    """Pretrains a model and writes the model directory `out_dir`; returns a summary dict.

    Args:
      corpus_dir: cleaned token corpus (a `dpsynth.data.token_shards` directory).
      tokenizer_path: the SentencePiece model the corpus was tokenized with.
      out_dir: run and model directory.
      config: the settings.
      resume: continue from the latest checkpoint in `out_dir/checkpoints` (start fresh if none).
      stop_after: stop (after checkpointing) once this step is reached, as if killed there;
        used by tests and by time-sliced jobs; the final model is then not written.

    Raises:
      PretrainError / token_shards.FormatError / models.directory.CheckpointError on bad input.
    """
    cfg = config
    tokenizer = Tokenizer.load(tokenizer_path)
    model_config = cfg.model_config(tokenizer.vocab_size)
    docs, ids, corpus_manifest = load_documents(corpus_dir, tokenizer)
    corpus_sha = hashlib.sha256(json.dumps(corpus_manifest, sort_keys=True).encode()).hexdigest()
    packed = pack_documents(docs, ids, cfg.seq_len, cfg.valid_fraction, cfg.valid_unit, tuple(cfg.valid_groups))
    train_rows, valid_rows = packed[0], packed[1]
    group_rows = packed[2] if len(packed) > 2 else {}
    del docs, packed
    if train_rows.num_rows < cfg.batch_size:
        raise PretrainError(f"{corpus_dir}: only {train_rows.num_rows} training rows of {cfg.seq_len} tokens, fewer "
                            f"than --batch-size {cfg.batch_size}; use a smaller --batch-size/--seq-len or more text")
    if jax.process_count() > 1 and cfg.mesh_data * cfg.mesh_model != jax.device_count():
        raise PretrainError(f"multi-host run: --mesh-data {cfg.mesh_data} x --mesh-model {cfg.mesh_model} must use "
                            f"all {jax.device_count()} devices of the {jax.process_count()} processes")
    mesh = sharding.make_mesh(cfg.mesh_data, cfg.mesh_model) if cfg.mesh_data * cfg.mesh_model > 1 else None
    ckpt_dir = os.path.join(out_dir, "checkpoints")
    if jax.process_count() == 1 and not os.path.isdir(ckpt_dir):
        # nothing to resume or refuse: an automatic microbatch is found before anything is written (several
        # processes search below, at one point of the code in each: the choice is broadcast)
        cfg = resolve_microbatch(cfg, model_config, mesh=mesh)
    os.makedirs(out_dir, exist_ok=True)
    checkpointer = TrainCheckpointer(ckpt_dir)
    half = release.status(out_dir)  # a model directory left half-written by a killed run: said, and rewritten
    if not resume and checkpointer.latest_step() is not None:
        raise PretrainError(f"{out_dir}/checkpoints: holds an earlier run (step {checkpointer.latest_step()}); "
                            "pass --resume to continue it, or choose a new --out"
                            + (f" ({out_dir}: {half})" if half else ""))
    if half:
        logger.warning("%s: %s; this run rewrites it", out_dir, half)

    meta = checkpointer.read_meta() if resume and checkpointer.latest_step() is not None else None
    if meta is not None:
        _check_resume_meta(meta, _meta(cfg, model_config, corpus_sha, tokenizer.sha256, 0), checkpointer.directory)
    cfg = resolve_microbatch(cfg, model_config, mesh=mesh, resumed=meta)  # auto: the checkpoint's when resuming
    loss_fn, fns, state = make_training(cfg, model_config, mesh)
    if meta is not None:
        restored, meta = checkpointer.restore(state)
        state = fns.place_state(restored)
        logger.info("resumed from step %d (%d rows consumed)", int(state.step), meta["rows_consumed"])
    elif resume:
        logger.info("--resume: no checkpoint in %s, starting fresh", checkpointer.directory)

    eval_fn = jax.jit(lambda p, f, b: loss_fn(p, f, b, None)[1])
    micro = cfg.microbatch  # rows per microbatch (batch_size unless --microbatch-size)
    num_micro = cfg.step_rows // micro
    local = fns.process_rows(micro)  # the rows of every microbatch this process reads and feeds
    eval_rows = min(cfg.batch_size, micro)  # validation batches no larger than a training microbatch
    eval_local = fns.process_rows(eval_rows)
    primary = jax.process_index() == 0

    def evaluate(state, rows: PackedRows = valid_rows) -> dict[str, float]:
        return _validate(eval_fn, fns, state, rows, cfg, eval_local, eval_rows)

    writer = _Writer(out_dir, cfg.tensorboard) if primary else _NullWriter()
    start_step = int(jax.device_get(state.step))
    peak = cfg.peak_tflops * 1e12 if cfg.peak_tflops else peak_flops_per_device()
    throughput = _Throughput(model_config.flops_per_token(cfg.seq_len), peak, mesh.size if mesh is not None else 1)
    rows_per_step = cfg.step_rows
    valid_metrics: dict[str, float] = {}
    initial_valid = {}
    if cfg.eval_at_start and start_step == 0:
        initial_valid = evaluate(state)
        if initial_valid:
            writer.write(0, "valid", initial_valid)

    def batch(step: int) -> list[dict[str, np.ndarray]]:  # this process's rows of each microbatch
        idx = batch_indices(train_rows.num_rows, step * rows_per_step, rows_per_step, cfg.seed)
        return [train_rows.rows(idx[i * micro: (i + 1) * micro][local]) for i in range(num_micro)]

    def train_step(state, microbatches: list[dict[str, np.ndarray]]):
        t0 = time.perf_counter()
        if num_micro == 1:
            state, metrics = fns.train_step(state, fns.shard_batch(microbatches[0], global_rows=micro))
        else:
            state, metrics = fns.accumulated_step(state, microbatches, global_rows=micro)
        throughput.add(metrics, t0)
        return state, metrics

    def log(done: int, state) -> dict[str, float] | None:
        line = throughput.read()
        if line is None:
            return None
        writer.write(done, "train", line)
        return {k: line[k] for k in ("loss", "perplexity", "tokens_per_s")}

    def side_work(work):  # evaluation and checkpoints are kept out of the tokens/s window
        def hook(done: int, state):
            jax.block_until_ready(state.params)
            t_side = time.perf_counter()
            shown = work(done, state)
            throughput.exclude(time.perf_counter() - t_side)
            return shown
        return hook

    def validate(done: int, state) -> dict[str, float] | None:
        nonlocal valid_metrics
        valid_metrics = evaluate(state)
        if not valid_metrics:
            return None
        writer.write(done, "valid", valid_metrics)
        return {"valid_ppl": valid_metrics["perplexity"]}

    def save(done: int, state) -> None:
        checkpointer.save(state, _meta(cfg, model_config, corpus_sha, tokenizer.sha256, done))

    state = loop.run_loop(
        state, start=start_step, total=cfg.steps, stop_after=stop_after, batch=batch, step=train_step,
        log=log, log_every=cfg.log_every, evaluate=side_work(validate), eval_every=cfg.eval_every,
        save=side_work(save), checkpoint_every=cfg.checkpoint_every, desc="pretrain",
        progress_interval=cfg.progress_interval, stream=None if primary else io.StringIO()).state
    final_step = int(jax.device_get(state.step))
    if final_step >= cfg.steps and not valid_metrics:  # re-run of a finished run: report its validation
        valid_metrics = evaluate(state)
    group_metrics = {}
    if final_step >= cfg.steps:
        for g, rows in group_rows.items():
            group_metrics[g] = {**evaluate(state, rows), "rows": rows.num_rows}
            writer.write(final_step, f"valid/{g}", {k: v for k, v in group_metrics[g].items() if k != "rows"})
    writer.close()
    summary = {"out_dir": out_dir, "preset": model_config.preset, "step": final_step, "steps": cfg.steps,
               "num_params": model_config.num_params(("params",)), "train_rows": train_rows.num_rows,
               "valid_rows": valid_rows.num_rows, "compile_s": throughput.compile_s, "train": throughput.last, "valid": valid_metrics, "initial_valid": initial_valid,
               "valid_groups": group_metrics, "finished": final_step >= cfg.steps}
    # the microbatch, recorded when set (a default run's summary and manifest are as before)
    recorded = {"microbatch_size": micro} if cfg.microbatch_size is not None else {}
    summary.update(recorded)
    if final_step >= cfg.steps:
        variables = sharding.gather(lm.merge_variables(state.params, state.frozen))
        if primary:
            release.unmark(out_dir)  # a rewrite (a finished run resumed) is incomplete until its manifest is back
        model_dir.save_model(out_dir, model_config, variables, tokenizer, created_by="dpsynth pretrain", extra_manifest={
            "corpus_manifest_sha256": corpus_sha, "steps": final_step, "seq_len": cfg.seq_len,
            "valid_perplexity": valid_metrics.get("perplexity"),
            "valid_group_perplexity": {g: m.get("perplexity") for g, m in group_metrics.items()}, "train_tokens": final_step * rows_per_step * cfg.seq_len,
            **recorded})
    checkpointer.close()
    return summary


def final_params(out_dir: str) -> dict:
    """The variables of a finished pretraining run (its model directory)."""
    return model_dir.load_model(out_dir).variables
