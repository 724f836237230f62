"""Resource figures of compiled programs, before a weight is loaded: memory, FLOPs, accelerators, microbatches.

A program lowered on abstract arrays (`jax.ShapeDtypeStruct`, with shardings over a mesh of
real or virtual devices) compiles without weights or the device it will run on; XLA then
reports, per device (`compiled.memory_analysis()`, `cost_analysis()`):

* arguments, outputs, the donated aliases, temporaries; `ProgramCost.total_bytes = arguments +
  outputs - aliases + temporaries + generated code`, the program's peak (a step's live buffers
  are its arguments, its temporaries and the outputs not written in place);
* FLOPs and bytes accessed of one call.

`ACCELERATORS` holds datasheet figures (peak dense bf16 FLOP/s, HBM, bandwidth, with sources)
for a roofline time, max(FLOPs / peak, bytes / bandwidth) per call: a lower bound (perfect
overlap at peak throughput). `largest_microbatch` is the search behind `--microbatch-size auto`
(`dpsynth dp-tune`, and `dpsynth pretrain` over the divisors of its step's batch) and `dpsynth
generate --batch-size auto` (the sampler's call, `dpsynth.generate.auto_batch`).
`dpsynth.train.tune_plan` applies all this to the exact step of a `dp_tune` run
(`dpsynth.train.tune_model.compile_steps`).

Caveat: the figures are those of the backend that compiles. On the CPU they are XLA:CPU's buffer
assignment, which differs from an accelerator's (other fusions; bfloat16 arithmetic widened to
float32); compile on the device itself for its own figures (`--microbatch-size auto` does).
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpsynth.errors import DpsynthError

logger = logging.getLogger("dpsynth.train.resources")

GIB = 1024 ** 3
DEFAULT_HEADROOM = 0.10  # fraction of device memory left free (allocator fragmentation, XLA's runtime buffers)


class PlanError(DpsynthError, ValueError):
    """A resource plan that cannot be made (bad model source, no microbatch fits, ...)."""


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """Datasheet figures of one accelerator chip (dense bfloat16, no sparsity)."""

    name: str
    peak_flops: float  # FLOP/s
    memory_bytes: float  # HBM per chip
    bandwidth: float  # HBM bytes/s
    source: str


ACCELERATORS: tuple[Accelerator, ...] = (
    Accelerator("H100", 989e12, 80e9, 3.35e12, "NVIDIA H100 SXM datasheet (bf16 dense 989 TFLOP/s, 80 GB HBM3, 3.35 TB/s)"),
    Accelerator("H200", 989e12, 141e9, 4.8e12, "NVIDIA H200 SXM datasheet (bf16 dense 989 TFLOP/s, 141 GB HBM3e, 4.8 TB/s)"),
    Accelerator("A100", 312e12, 80e9, 2.039e12, "NVIDIA A100 80GB SXM datasheet (bf16 312 TFLOP/s, 80 GB HBM2e, 2.039 TB/s)"),
    Accelerator("TPU v4", 275e12, 32 * GIB, 1.2e12, "cloud.google.com/tpu/docs/v4 (275 TFLOP/s bf16, 32 GiB HBM2, 1.2 TB/s per chip)"),
    Accelerator("TPU v5e", 197e12, 16 * GIB, 0.819e12, "cloud.google.com/tpu/docs/v5e (197 TFLOP/s bf16, 16 GiB HBM2, 819 GB/s per chip)"),
    Accelerator("TPU v3", 123e12, 32 * GIB, 0.9e12, "cloud.google.com/tpu/docs/v3 (123 TFLOP/s bf16, 32 GiB HBM, 900 GB/s per chip "
                "of 2 cores; the paper's TPUv3-128 = 64 chips)"),
)


# ============================================================================ compiled figures


@dataclasses.dataclass(frozen=True)
class ProgramCost:
    """One compiled program's figures, per device (XLA's memory and cost analyses)."""

    name: str
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    code_bytes: int
    flops: float
    bytes_accessed: float
    fingerprint: str  # SHA-256 of the lowered (StableHLO) module text: equal programs, equal fingerprints

    @property
    def total_bytes(self) -> int:
        """Peak bytes of one call: arguments + outputs not written in place + temporaries + code."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.code_bytes

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "total_bytes": self.total_bytes}


def fingerprint(lowered) -> str:
    """SHA-256 of a lowered program's module text (what the plan and the trainer compare)."""
    return hashlib.sha256(lowered.as_text().encode()).hexdigest()


def program_cost(name: str, lowered) -> ProgramCost:
    """Compiles `lowered` (a `jax.stages.Lowered`) and reads its memory and cost analyses."""
    compiled = lowered.compile()
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else (cost or {})
    if mem is None:
        raise PlanError(f"the {jax.default_backend()} backend gives no memory analysis of the {name} step")
    return ProgramCost(name=name, argument_bytes=int(mem.argument_size_in_bytes), output_bytes=int(mem.output_size_in_bytes),
                       alias_bytes=int(mem.alias_size_in_bytes), temp_bytes=int(mem.temp_size_in_bytes),
                       code_bytes=int(mem.generated_code_size_in_bytes), flops=float(cost.get("flops", 0.0)),
                       bytes_accessed=float(cost.get("bytes accessed", 0.0)), fingerprint=fingerprint(lowered))


def bytes_per_device(tree: Any) -> int:
    """Bytes one device holds of a tree of (possibly sharded) arrays or ShapeDtypeStructs."""
    total = 0
    for x in jax.tree.leaves(tree):
        shape = np.shape(x)
        sh = getattr(x, "sharding", None)
        if sh is not None and shape:
            shape = sh.shard_shape(shape)
        total += int(np.prod(shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize
    return total


def count(tree: Any) -> int:
    return sum(int(np.prod(np.shape(x), dtype=np.int64)) for x in jax.tree.leaves(tree))


def host_memory_bytes() -> int | None:
    """The memory this machine can give a new allocation now: /proc/meminfo's MemAvailable (free
    memory plus reclaimable caches; other processes' memory excluded), or the physical memory where
    that is not known, bounded by the cgroup's room (a container: cgroup v2 `memory.max` less
    `memory.current`, v1 `memory.limit_in_bytes` less `memory.usage_in_bytes`); None where
    nothing is known."""
    found = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    if not found:
        try:
            found.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        except (ValueError, OSError, AttributeError):
            pass
    for limit_path, usage_path in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_path) as f:
                limit = f.read().strip()
            with open(usage_path) as f:
                usage = f.read().strip()
        except OSError:
            continue
        if limit.isdigit() and usage.isdigit() and 0 < int(limit) < 1 << 60:  # "max" (v2), huge (v1): no limit
            found.append(max(0, int(limit) - int(usage)))
    return min(found) if found else None


def device_memory_limit(device: jax.Device | None = None) -> int | None:
    """The memory XLA may allocate on `device`: `memory_stats()["bytes_limit"]` where the backend
    says (accelerators); on the CPU, the host's available memory (`host_memory_bytes`) shared by
    this process's CPU devices (8 virtual devices: an eighth each); None where neither is known."""
    device = device or jax.local_devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # backends without the call
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    if device.platform != "cpu":
        return None
    host = host_memory_bytes()
    if host is None:
        return None
    return host // max(1, sum(d.platform == "cpu" for d in jax.local_devices(backend="cpu")))


def parse_bytes(text: str) -> int:
    """'80GB', '16GiB', '512MiB', '1e9' -> bytes (SI for GB/MB, binary for GiB/MiB)."""
    units = {"gib": GIB, "mib": 1024 ** 2, "kib": 1024, "gb": 1e9, "mb": 1e6, "kb": 1e3, "b": 1}
    t = text.strip().lower().replace(" ", "")
    for u, f in units.items():
        if t.endswith(u):
            try:
                return int(float(t[: -len(u)]) * f)
            except ValueError:
                break
    try:
        return int(float(t))
    except ValueError:
        raise PlanError(f"memory size {text!r}: expected a number of bytes or e.g. 80GB, 16GiB, 512MiB") from None


def bytes_flag(text: str) -> int:
    """`parse_bytes` as an argparse type (`--memory-limit 16GiB`): a bad size is a usage error."""
    import argparse

    try:
        return parse_bytes(text)
    except PlanError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# ============================================================================ the automatic microbatch


@dataclasses.dataclass(frozen=True)
class MicrobatchChoice:
    """What `largest_microbatch` found: the microbatch, its peak bytes, the budget and what it tried."""

    microbatch: int
    peak_bytes: int
    budget_bytes: int
    limit_bytes: int
    headroom: float
    tried: tuple[tuple[int, int], ...]  # (microbatch, peak bytes) in the order compiled

    def describe(self, name: str = "microbatch", program: str = "step") -> str:
        """One line of figures: `name` is what was chosen ("batch" for generation), `program` what compiled."""
        return (f"{name} {self.microbatch}: compiled {program} peak {self.peak_bytes / GIB:.3f} GiB <= budget "
                f"{self.budget_bytes / GIB:.3f} GiB ({self.limit_bytes / GIB:.3f} GiB device memory less "
                f"{self.headroom:.0%} headroom); tried " + ", ".join(f"{m}: {b / GIB:.3f} GiB" for m, b in self.tried))


_ADVICE = "use a larger mesh, LoRA/prompt mode, a shorter --max-tokens or a larger --memory-limit"  # dp-tune's


def largest_microbatch(peak_bytes: Callable[[int], int], *, limit_bytes: int, headroom: float = DEFAULT_HEADROOM,
                       maximum: int | None = None, multiple: int = 1, candidates: Sequence[int] | None = None,
                       advice: str = _ADVICE, name: str = "microbatch") -> MicrobatchChoice:
    """The largest microbatch m (a multiple of `multiple`, <= `maximum`; or one of `candidates`,
    e.g. the divisors of a step's batch) with `peak_bytes(m) <= limit_bytes * (1 - headroom)`,
    assuming the peak grows with m.

    Doubles from the smallest candidate (to the smallest candidate >= twice the last) until one
    does not fit (or the largest fits), then bisects the candidates between the last that fits
    and the first that does not: O(log maximum) compilations.

    Raises:
        PlanError: not even the smallest candidate fits (the message gives its peak, the budget
            and `advice`; `name` is what is searched: "microbatch", "batch").
    """
    if not 0 <= headroom < 1:
        raise PlanError(f"headroom must be in [0, 1), got {headroom}")
    budget = int(limit_bytes * (1 - headroom))
    if candidates is None:
        if maximum is None:
            raise TypeError("largest_microbatch needs `maximum` or `candidates`")
        maximum = max(multiple, (maximum // multiple) * multiple)
        sizes: Sequence[int] = range(multiple, maximum + 1, multiple)
    else:
        sizes = sorted({int(c) for c in candidates})
        if not sizes or sizes[0] < 1:
            raise PlanError(f"no {name} to try: candidates {list(candidates)}")
    tried: dict[int, int] = {}

    def fits(i: int) -> bool:
        m = sizes[i]
        if m not in tried:
            tried[m] = int(peak_bytes(m))
        return tried[m] <= budget

    lo, hi = -1, None  # indices into sizes: lo fits (-1: none yet), hi does not
    i, last = 0, len(sizes) - 1
    while True:
        if fits(i):
            lo = i
            if i == last:
                break
            i = min(bisect.bisect_left(sizes, 2 * sizes[i]), last)
        else:
            hi = i
            break
    if lo < 0:
        raise PlanError(f"no {name} fits: {name} {sizes[0]} needs {tried[sizes[0]] / GIB:.3f} GiB per device, "
                        f"more than {budget / GIB:.3f} GiB ({limit_bytes / GIB:.3f} GiB less {headroom:.0%} headroom); "
                        + advice)
    while hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return MicrobatchChoice(microbatch=sizes[lo], peak_bytes=tried[sizes[lo]], budget_bytes=budget,
                            limit_bytes=int(limit_bytes), headroom=headroom, tried=tuple(tried.items()))


def agreed_size(search: Callable[[], MicrobatchChoice]) -> tuple[int, MicrobatchChoice | None]:
    """Runs an automatic size `search` on every process and returns (process 0's size, this process's
    choice). With several processes each one's outcome is gathered before anyone goes on, so a
    process whose search fails (its device reports less memory, say) makes every process raise the
    same one-line `PlanError`, instead of failing alone while the others wait in the next collective.
    """
    if jax.process_count() == 1:
        choice = search()
        return choice.microbatch, choice
    from jax.experimental import multihost_utils

    try:
        choice, failure = search(), None
    except PlanError as e:
        choice, failure = None, e
    sizes = np.asarray(multihost_utils.process_allgather(np.int32(choice.microbatch if choice else 0))).reshape(-1)
    if failure is not None:
        raise failure
    failed = [i for i, m in enumerate(sizes.tolist()) if m <= 0]
    if failed:
        raise PlanError(f"the automatic size search failed on process(es) {failed} (see their error); every process "
                        "stops")
    return int(sizes[0]), choice


def memory_limit(memory_limit: int | None, device: jax.Device | None = None, *,
                 flag: str = "--microbatch-size auto") -> int:
    """The memory budget of `flag` (`--microbatch-size auto`, `--batch-size auto`): `memory_limit`
    when given, else the device's."""
    if memory_limit is not None:
        return int(memory_limit)
    found = device_memory_limit(device)
    if found is None:
        raise PlanError(f"{flag}: the {jax.default_backend()} backend does not report its memory; "
                        "pass --memory-limit (e.g. 8GiB)")
    if (device or jax.local_devices()[0]).platform == "cpu":
        logger.info("%s: fitting in %.1f GiB per CPU device (this host's available memory over its %d CPU device(s); "
                    "--memory-limit to choose)", flag, found / GIB, len(jax.local_devices(backend="cpu")))
    return found


# ============================================================================ model sources


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """A base model's config and the dtype its parameters are stored in, without its weights."""

    name: str
    config: Any  # dpsynth.models.config.ModelConfig (a base: no adapters)
    param_dtype: str


def resolve_model(model: str, *, dtype: str | None = None) -> ModelSource:
    """A preset name, a dpsynth model directory, or a Hugging Face config.json (or its directory).

    `dtype` ("float32"/"bfloat16"): for a Hugging Face config, the parameter and compute dtype
    (as `dpsynth import-model --dtype`, default float32); for a preset, the parameter dtype
    (default float32, as `dpsynth pretrain` stores). A model directory's stored dtype is read
    from its checkpoint metadata.
    """
    from dpsynth import fileio
    from dpsynth.models import hf_files
    from dpsynth.models.config import PRESETS, ModelConfig, get_config

    if model in PRESETS:
        return ModelSource(model, get_config(model), dtype or "float32")
    path = os.path.abspath(model)
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "manifest.json")):
        from dpsynth.models.directory import VARIABLES, _read_manifest

        manifest = _read_manifest(path)
        config = ModelConfig.from_dict(fileio.read_json(os.path.join(path, "config.json"))).base()
        stored = dtype or _stored_dtype(os.path.join((manifest.get("base") or {}).get("path") or path, VARIABLES))
        return ModelSource(path, config, stored)
    config_path = os.path.join(path, hf_files.CONFIG_FILE) if os.path.isdir(path) else path
    if not os.path.isfile(config_path):
        raise PlanError(f"{model}: not a preset ({', '.join(sorted(PRESETS))}), a dpsynth model directory or a "
                        "Hugging Face config.json")
    hf = hf_files.read_json(config_path)
    _, config = hf_files.model_config_from_hf(hf, config_path, dtype=dtype or "float32")
    return ModelSource(config_path, config, dtype or "float32")


def _stored_dtype(variables_dir: str) -> str:
    """The dtype of a model directory's "params" (Orbax metadata; no tensor is read)."""
    import orbax.checkpoint as ocp

    try:
        meta = ocp.StandardCheckpointer().metadata(variables_dir).item_metadata
        dtypes = {np.dtype(m.dtype).name for m in jax.tree.leaves(meta["params"])}
    except Exception as e:  # Orbax raises a variety of errors on damaged trees
        raise PlanError(f"{variables_dir}: cannot read its metadata ({type(e).__name__}: {e})") from e
    return "bfloat16" if dtypes == {"bfloat16"} else "float32"


def abstract_variables(model_config, param_dtype: str, base_params: Any = None) -> dict:
    """ShapeDtypeStructs of every collection of `Transformer(model_config)`; "params" in `param_dtype`
    (the stored base) or as `base_params` (an abstract tree) when given; adapters as
    `tune_model.init_variables` makes them."""
    from dpsynth.models import Transformer

    shapes = dict(jax.eval_shape(Transformer(model_config).init, jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32)))
    dt = jnp.dtype(param_dtype)
    shapes["params"] = (base_params if base_params is not None
                        else jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, dt), shapes["params"]))
    return shapes


def abstract_batch(rows: int, length: int, sharding=None, *, segment_ids: bool = False,
                   contrast: tuple[int, int] | None = None) -> dict:
    """An abstract LM microbatch as the trainers feed it ("inputs", "targets" int32 and "weights" float32
    [rows, length], "mask" [rows]; `dp_tune`'s Prefix-LM rows; with `segment_ids`, also "segment_ids"
    int32 [rows, length], pretraining's packed rows; with `contrast` = (K labels, row length), also the
    label contrast's rows, `dpsynth.train.tune_data.contrast_arrays`), placed by `sharding` when given."""
    spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)  # noqa: E731
    batch = {"inputs": spec((rows, length), jnp.int32), "targets": spec((rows, length), jnp.int32),
             "weights": spec((rows, length), jnp.float32), "mask": spec((rows,), jnp.float32)}
    if segment_ids:
        batch["segment_ids"] = spec((rows, length), jnp.int32)
    if contrast is not None:
        k, width = contrast
        batch.update({"contrast_inputs": spec((rows, k, width), jnp.int32),
                      "contrast_targets": spec((rows, k, width), jnp.int32),
                      "contrast_weights": spec((rows, k, width), jnp.float32),
                      "contrast_label": spec((rows,), jnp.int32)})
    return batch

