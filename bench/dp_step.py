"""Benchmark: one DP-SGD microbatch step vs the non-private step of the same mode.

Peer: the same training core, loss, model, trainable subset and microbatch with
`dpsynth.train.core.MeanGradient` (no per-example gradients, no clipping, no noise). For each
mode (full, prompt, lora) on the `small` preset it measures

  * time per microbatch of `accumulate_step` (forward + backward [+ per-example clipping]),
  * time of `apply_step` (finalize [+ noise] + Adam),
  * a logical step (default expected batch 1024 = ceil(1024 / microbatch) accumulates + one
    apply; the ratio compared with the targets),
  * CPU time of the accumulate step (process time: less sensitive to other load on the host),
  * peak temporary memory of the compiled accumulate step (XLA's memory analysis),

and prints DP / non-private ratios. Targets (issue 4): LoRA and prompt <= 1.5x, full <= 3x;
full with ghost clipping (`dpsynth.dp.ghost`, row "full/ghost", issue 37) <= 1.3x. `--clipping`
picks the clipping methods measured in full mode (default: both, vmap and ghost).

    .venv/bin/python bench/dp_step.py                      # small preset, B=8, T=128
    .venv/bin/python bench/dp_step.py --preset tiny --microbatch 16 --seq 64 --reps 5
    .venv/bin/python bench/dp_step.py --preset cpu --modes full --clipping ghost --reps 3

`--wordcnn` instead measures the downstream WordCNN's DP accumulate step (paper sizes by
default: vocab 30k, 384-d embeddings, seq 128): the sparse-embedding clipping path
(`dpsynth.dp.sparse`) against its peer, the dense vmap(grad) path, plus the non-private step.

    .venv/bin/python bench/dp_step.py --wordcnn --microbatch 16
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from dpsynth.dp.plan import plan_privacy  # noqa: E402
from dpsynth.dp.strategy import DPSGDStrategy  # noqa: E402
from dpsynth.models import Transformer, get_config  # noqa: E402
from dpsynth.train import core, lm, tune_config, tune_model  # noqa: E402


def _batch(vocab: int, b: int, t: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    weights = np.ones((b, t), np.float32)
    weights[:, :4] = 0.0  # a label-prompt prefix
    return {"inputs": rng.integers(4, vocab, (b, t)).astype(np.int32),
            "targets": rng.integers(4, vocab, (b, t)).astype(np.int32),
            "weights": weights, "mask": np.ones((b,), np.float32)}


def _block(tree):
    jax.tree.map(lambda x: x.block_until_ready() if hasattr(x, "block_until_ready") else x, tree)


def measure(mode: str, strategy_name: str, preset: str, b: int, t: int, reps: int, clipping: str = "vmap") -> dict:
    config = tune_config.TuneConfig(mode=mode, lora_rank=8, prompt_length=20)
    base_cfg = get_config(preset, max_len=max(t, 64))
    model_cfg = tune_model.tuned_model_config(base_cfg, config)
    base = Transformer(base_cfg).init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"]
    variables = tune_model.init_variables(model_cfg, jax.device_get(base), config)
    params, frozen = lm.split_variables(variables, tune_config.TRAINABLE[mode])
    loss_fn = tune_model.make_loss_fn(model_cfg, config)
    strategy = (DPSGDStrategy(clip_norm=1.0, noise_multiplier=1.0, expected_batch_size=float(b), clipping=clipping)
                if strategy_name == "dp" else core.MeanGradient())
    fns = core.make_train_functions(loss_fn, optax.adam(1e-3), strategy, donate=False)
    state = fns.init_state(params, frozen, rng=0)
    batch = fns.shard_batch(_batch(base_cfg.vocab_size, b, t))
    acc = fns.init_accumulator(state)
    t0 = time.perf_counter()
    acc2, _ = fns.accumulate_step(state, acc, batch)
    state2, _ = fns.apply_step(state, acc2)
    _block(state2)
    compile_s = time.perf_counter() - t0
    acc_times, apply_times, acc_cpu = [], [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        acc2, _ = fns.accumulate_step(state, acc, batch)
        _block(acc2)
        acc_times.append(time.perf_counter() - t0)
        acc_cpu.append(time.process_time() - c0)
        t0 = time.perf_counter()
        s2, _ = fns.apply_step(state, acc2)
        _block(s2)
        apply_times.append(time.perf_counter() - t0)
    lowered = jax.jit(fns._accumulate).lower(state, acc, batch).compile()
    mem = lowered.memory_analysis()
    temp = getattr(mem, "temp_size_in_bytes", None) if mem is not None else None
    trainable = sum(x.size for x in jax.tree.leaves(params))
    return {"mode": mode, "strategy": strategy_name, "clipping": clipping, "accumulate_s": float(np.median(acc_times)),
            "apply_s": float(np.median(apply_times)), "compile_s": compile_s,
            "accumulate_cpu_s": float(np.median(acc_cpu)),
            "temp_bytes": int(temp) if temp is not None else None, "trainable_params": int(trainable)}


def measure_wordcnn(strategy_name: str, vocab: int, dim: int, b: int, t: int, reps: int) -> dict:
    """One WordCNN accumulate step: "sparse" / "dense" DP clipping or "nonprivate"."""
    from dpsynth.evaluate import classifiers
    from dpsynth.evaluate import trainer as tr

    cfg = classifiers.WordCNNConfig(vocab_words=vocab - 2, embed_dim=dim, max_len=t)
    module = classifiers.WordCNN(vocab, 2, cfg)
    params = module.init(jax.random.PRNGKey(0), jnp.zeros((1, t), jnp.int32))["params"]
    model = tr.Model(module, params, {}, None, "wordcnn", embedding_path=("embed", "embedding"))
    trainer = tr.Trainer(model)
    if strategy_name == "nonprivate":
        strategy, loss_fn = core.MeanGradient(), tr.classification_loss(model)
    else:
        dp = tr.DPConfig(epsilon=1.0, clip_norm=1.0, sparse_embedding=strategy_name == "sparse")
        plan = plan_privacy(dataset_size=10 * b, expected_batch_size=float(b), steps=1, noise_multiplier=1.0)
        strategy, _ = trainer.dp_mechanism(dp, plan, num_units=10 * b, seed=0)
        loss_fn = tr.embedded_loss(model, strategy.embedding) if strategy.embedding else tr.classification_loss(model)
    fns = core.make_train_functions(loss_fn, optax.adam(1e-3), strategy, donate=False)
    state = fns.init_state(params, {}, rng=0)
    rng = np.random.default_rng(0)
    x = rng.integers(2, vocab, (b, t)).astype(np.int32)
    x[:, t // 2:] = 0  # half padding, as in short reviews
    batch = fns.shard_batch({"x": x, "y": rng.integers(0, 2, b).astype(np.int32), "mask": np.ones(b, np.float32)})
    acc = fns.init_accumulator(state)
    t0 = time.perf_counter()
    _block(fns.accumulate_step(state, acc, batch))
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        _block(fns.accumulate_step(state, acc, batch))
        times.append(time.perf_counter() - t0)
    mem = jax.jit(fns._accumulate).lower(state, acc, batch).compile().memory_analysis()
    temp = getattr(mem, "temp_size_in_bytes", None) if mem is not None else None
    return {"strategy": strategy_name, "accumulate_s": float(np.median(times)), "compile_s": compile_s,
            "temp_bytes": int(temp) if temp is not None else None}


def main_wordcnn(args) -> int:
    print(f"dp_step wordcnn: vocab={args.vocab} dim={args.embed_dim} microbatch={args.microbatch} seq={args.seq} "
          f"reps={args.reps} devices={jax.devices()[0].platform}x{len(jax.devices())}")
    rows = {name: measure_wordcnn(name, args.vocab, args.embed_dim, args.microbatch, args.seq, args.reps)
            for name in ("nonprivate", "sparse", "dense")}
    for name, r in rows.items():
        print(f"{name:>10}: accumulate {r['accumulate_s'] * 1e3:.1f} ms (compile {r['compile_s']:.1f} s) | temp memory "
              f"{r['temp_bytes'] / 2**20 if r['temp_bytes'] else float('nan'):.1f} MiB", flush=True)
    d, s, n = rows["dense"], rows["sparse"], rows["nonprivate"]
    print(f"dense / sparse accumulate: {d['accumulate_s'] / s['accumulate_s']:.2f}x | sparse / non-private: "
          f"{s['accumulate_s'] / n['accumulate_s']:.2f}x | dense / sparse temp memory: "
          f"{d['temp_bytes'] / s['temp_bytes'] if d['temp_bytes'] and s['temp_bytes'] else float('nan'):.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--microbatch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--modes", nargs="+", default=["lora", "prompt", "full"])
    p.add_argument("--logical-batch", type=int, default=1024,
                   help="expected logical batch: a step is ceil(logical/microbatch) accumulates + one apply")
    p.add_argument("--clipping", nargs="+", default=["vmap", "ghost"],
                   help="full mode: the clipping methods measured, one row each (lora/prompt: vmap)")
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    p.add_argument("--wordcnn", action="store_true", help="WordCNN: sparse vs dense embedding clipping")
    p.add_argument("--vocab", type=int, default=30_002, help="--wordcnn: vocabulary (30k words + PAD/OOV)")
    p.add_argument("--embed-dim", type=int, default=384, help="--wordcnn: embedding width")
    args = p.parse_args(argv)
    if args.wordcnn:
        return main_wordcnn(args)
    print(f"dp_step: preset={args.preset} microbatch={args.microbatch} seq={args.seq} reps={args.reps} "
          f"devices={jax.devices()[0].platform}x{len(jax.devices())}")
    rows = []
    targets = {"lora": 1.5, "prompt": 1.5, "full": 3.0, "full/ghost": 1.3}
    runs = [(mode, c) for mode in args.modes for c in (args.clipping if mode == "full" else ["vmap"])]
    np_rows = {}
    for mode, clip in runs:
        if mode not in np_rows:
            np_rows[mode] = measure(mode, "nonprivate", args.preset, args.microbatch, args.seq, args.reps)
        np_row = np_rows[mode]
        dp_row = measure(mode, "dp", args.preset, args.microbatch, args.seq, args.reps, clipping=clip)
        mode = mode if clip == "vmap" else f"{mode}/{clip}"
        k = -(-args.logical_batch // args.microbatch)  # microbatches per logical step
        step_np = k * np_row["accumulate_s"] + np_row["apply_s"]
        step_dp = k * dp_row["accumulate_s"] + dp_row["apply_s"]
        ratio_acc = dp_row["accumulate_s"] / np_row["accumulate_s"]
        ratio_cpu = dp_row["accumulate_cpu_s"] / np_row["accumulate_cpu_s"]
        ratio_step = step_dp / step_np
        mem_ratio = (dp_row["temp_bytes"] / np_row["temp_bytes"]) if np_row["temp_bytes"] and dp_row["temp_bytes"] else None
        rows.append({"mode": mode, "nonprivate": np_row, "dp": dp_row, "ratio_accumulate": ratio_acc,
                     "ratio_step": ratio_step, "ratio_accumulate_cpu": ratio_cpu, "ratio_temp_memory": mem_ratio, "target": targets.get(mode)})
        print(f"{mode:>10}: trainable {dp_row['trainable_params']:,} | accumulate DP {dp_row['accumulate_s'] * 1e3:.1f} ms "
              f"vs non-private {np_row['accumulate_s'] * 1e3:.1f} ms -> {ratio_acc:.2f}x (CPU time {ratio_cpu:.2f}x) | logical step ({k} mb + apply) "
              f"{ratio_step:.2f}x | temp memory {dp_row['temp_bytes'] / 2**20 if dp_row['temp_bytes'] else float('nan'):.1f} "
              f"vs {np_row['temp_bytes'] / 2**20 if np_row['temp_bytes'] else float('nan'):.1f} MiB"
              f"{f' -> {mem_ratio:.2f}x' if mem_ratio else ''} | target <= {targets.get(mode)}x: "
              f"{'MET' if ratio_step <= targets.get(mode, 1e9) else 'MISSED'}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
