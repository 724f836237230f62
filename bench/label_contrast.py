"""Benchmark: one DP-SGD step with the label contrast off, in its sampled form and in its full form.

The label contrast (`dp_tune --label-contrast`, docs/dp.md) feeds each example under label
prompts: the full form under all K labels (K rows per example), the sampled form under its own
label and one other drawn per step (2 rows for any K; `--label-contrast-form`). For K = 4 and
K = 8 this measures, on the same model, mode and batch, one logical DP step as `dp_tune` runs
it: the host gather of the step's rows (`dpsynth.train.tune_data.gather_train`, with the sampled
form's draw), ceil(expected batch / microbatch) accumulate calls (forward, backward, per-example
clipping) and one apply (noise, Adam); it prints the median time per step, its ratio to the step
without the contrast, and XLA's FLOP estimate of the step (`dpsynth.train.resources.program_cost`).

    nice -n 10 .venv/bin/python bench/label_contrast.py                     # cpu preset, LoRA, K 4 and 8
    nice -n 10 .venv/bin/python bench/label_contrast.py --labels 4 8 16 --reps 5 --json out.json

Timings on a shared machine move with its load: compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from dpsynth.dp.strategy import DPSGDStrategy  # noqa: E402
from dpsynth.models import Transformer, get_config  # noqa: E402
from dpsynth.train import core, lm, resources, tune_config, tune_data, tune_model  # noqa: E402

PROMPT = 4  # tokens of a label prompt (weight 0)


def make_arrays(n: int, k: int | None, t: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """D_train's arrays as `tune_data.encode_data` holds them: Prefix-LM rows [N, T] and, with `k`
    labels, the contrast rows [N, K, T] with each example's own label."""
    rng = np.random.default_rng(seed)
    weights = np.ones((n, t), np.float32)
    weights[:, :PROMPT] = 0.0
    out = {"inputs": rng.integers(4, vocab, (n, t)).astype(np.int32),
           "targets": rng.integers(4, vocab, (n, t)).astype(np.int32), "weights": weights}
    if k is not None:
        out["contrast_inputs"] = rng.integers(4, vocab, (n, k, t)).astype(np.int32)
        out["contrast_targets"] = rng.integers(4, vocab, (n, k, t)).astype(np.int32)
        out["contrast_weights"] = np.broadcast_to(weights[:, None], (n, k, t)).copy()
        out["contrast_label"] = rng.integers(0, k, n).astype(np.int32)
    return out


def measure(form: str | None, k: int | None, args) -> dict:
    """One variant: `form` None (off), "sampled" or "full" over `k` labels."""
    config = tune_config.TuneConfig(mode=args.mode, lora_rank=8, prompt_length=20,
                                    label_contrast=0.0 if form is None else 1.0,
                                    label_contrast_form=form or "auto")
    base_cfg = get_config(args.preset, max_len=max(args.seq, 64))
    model_cfg = tune_model.tuned_model_config(base_cfg, config)
    base = Transformer(base_cfg).init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"]
    params, frozen = lm.split_variables(tune_model.init_variables(model_cfg, jax.device_get(base), config),
                                        tune_config.TRAINABLE[args.mode])
    strategy = DPSGDStrategy(clip_norm=1.0, noise_multiplier=1.0, expected_batch_size=float(args.batch))
    fns = core.make_train_functions(tune_model.make_loss_fn(model_cfg, config), tune_model.make_optimizer(config),
                                    strategy, donate=False)
    state = fns.init_state(params, frozen, rng=0)
    arrays = make_arrays(args.examples, k, args.seq, base_cfg.vocab_size)
    micro = math.ceil(args.batch / args.microbatch)
    rng = np.random.default_rng(1)

    def step(t: int):
        acc = fns.init_accumulator(state)
        for _ in range(micro):
            idx = rng.choice(args.examples, args.microbatch, replace=False)
            batch = tune_data.gather_train(arrays, idx, t, seed=5, form=form or "auto")
            acc, _ = fns.accumulate_step(state, acc, fns.shard_batch(batch))
        new, _ = fns.apply_step(state, acc)
        jax.block_until_ready(new)

    t0 = time.perf_counter()
    step(0)  # compiles
    compile_s = time.perf_counter() - t0
    times = []
    for t in range(1, args.reps + 1):
        t0 = time.perf_counter()
        step(t)
        times.append(time.perf_counter() - t0)
    batch = fns.shard_batch(tune_data.gather_train(arrays, np.arange(args.microbatch), 0, seed=5, form=form or "auto"))
    acc = fns.init_accumulator(state)
    accumulate = resources.program_cost("accumulate", fns.lower("accumulate", state, acc, batch))
    applied = resources.program_cost("apply", fns.lower("apply", state, acc))
    rows = 1 if form is None else config.contrast_rows(k)
    return {"form": form or "off", "labels": k, "rows_per_example": rows, "step_s": float(np.median(times)),
            "step_s_all": times, "compile_s": compile_s,
            "step_flops": micro * accumulate.flops + applied.flops, "accumulate_flops": accumulate.flops,
            "accumulate_temp_bytes": accumulate.temp_bytes}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="cpu", help="model preset (default: %(default)s)")
    p.add_argument("--mode", default="lora", choices=tune_config.MODES, help="what is tuned (default: %(default)s)")
    p.add_argument("--labels", type=int, nargs="+", default=[4, 8], help="label set sizes K (default: %(default)s)")
    p.add_argument("--batch", type=int, default=32, help="expected batch of a step (default: %(default)s)")
    p.add_argument("--microbatch", type=int, default=8, help="examples per compiled microbatch (default: %(default)s)")
    p.add_argument("--seq", type=int, default=64, help="tokens per row (default: %(default)s)")
    p.add_argument("--examples", type=int, default=1024, help="D_train's size N (default: %(default)s)")
    p.add_argument("--reps", type=int, default=3, help="timed steps per variant (default: %(default)s)")
    p.add_argument("--json", default=None, help="also write the rows as JSON here (default: none)")
    args = p.parse_args(argv)
    print(f"label_contrast: preset={args.preset} mode={args.mode} batch={args.batch} microbatch={args.microbatch} "
          f"seq={args.seq} reps={args.reps} devices={jax.devices()[0].platform}x{len(jax.devices())}", flush=True)
    off = measure(None, None, args)
    rows = [off]
    print(f"{'off':>8}:      1 row/example  step {off['step_s'] * 1e3:8.1f} ms  1.00x  FLOPs/step "
          f"{off['step_flops']:.3g} (1.00x)", flush=True)
    for k in args.labels:
        for form in ("sampled", "full"):
            r = measure(form, k, args)
            rows.append(r)
            print(f"{form:>8} K={k:<3} {r['rows_per_example']:2d} rows/example  step {r['step_s'] * 1e3:8.1f} ms  "
                  f"{r['step_s'] / off['step_s']:.2f}x  FLOPs/step {r['step_flops']:.3g} "
                  f"({r['step_flops'] / off['step_flops']:.2f}x)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
