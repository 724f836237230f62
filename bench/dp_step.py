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
full with ghost clipping (`dpsynth.dp.ghost`, row "full/ghost", issue 37) <= 1.3x; LoRA with ghost
clipping (row "lora/ghost", issue 56) <= 1.15x. `--clipping` picks the clipping methods measured in
full and LoRA modes (default: both, vmap and ghost; prompt tuning: vmap only).

    .venv/bin/python bench/dp_step.py                      # small preset, B=8, T=128
    .venv/bin/python bench/dp_step.py --preset tiny --microbatch 16 --seq 64 --reps 5
    .venv/bin/python bench/dp_step.py --preset cpu --modes full --clipping ghost --reps 3
    .venv/bin/python bench/dp_step.py --preset tiny --modes lora --microbatch 8 --seq 64

`--wordcnn` instead measures the downstream WordCNN's DP accumulate step (paper sizes by
default: vocab 30k, 384-d embeddings, seq 128): the sparse-embedding clipping path
(`dpsynth.dp.sparse`) against its peer, the dense vmap(grad) path, plus the non-private step.

    .venv/bin/python bench/dp_step.py --wordcnn --microbatch 16

`--model DIR --gguf FILE` (issue 56) measures DP-LoRA on a real model, DIR the `dpsynth import-model --gguf
FILE` import of FILE (e.g. Gemma 3 270M Q4_K_M, `make gemma3-gguf`), against the tool users would pick
instead: PEFT LoRA + Opacus on CPU torch with FILE loaded by transformers (`gguf_file=`), run in the peers'
venv (`.venv-peers`, `make bench-peers`; bench/peers/opacus_step.py). Same LoRA (rank 8, alpha 16, every
attention and MLP projection), same rows (`--examples` random rows of `--seq` tokens, the first 4 a
prefix of weight 0), same loss (Prefix-LM: each example's cross-entropy over its target tokens divided by
their number), same clipping norm (1), noise multiplier (1), expected batch (`--examples`, the logical
step) and microbatch. Rows: ours DP (vmapped per-example clipping; `--clipping ghost` [vmap]: ghost clipping, one
batched backward, `dpsynth.dp.ghost`, a row each) and non-private (`MeanGradient`);
Opacus with hooks (per-sample gradients) and with ghost clipping, and PEFT non-private. Printed: seconds
per 1,000 training examples of each, peak RSS of the timed steps, ours/Opacus (target <= 0.8x), our DP /
our non-private (target <= 1.15x), and each of our steps' FLOP/s against a plain float32 matmul of the
step's largest shape ([microbatch x seq, d_model] x [d_model, vocab], the roofline of
bench/train_step.py) timed in the same run (target >= 0.7x). A LoRA step's FLOPs: forward 2N per token and
the backward's input gradients 2N (frozen weights get no weight gradient), N the matmul parameters with the
tied embedding as the output layer, plus the attention matmuls (forward + backward).

    nice -n 5 .venv/bin/python bench/dp_step.py --model runs/gemma --gguf gemma-3-270m-q4_k_m.gguf \
        [--examples 32 --microbatch 8 --seq 64 --reps 1] [--clipping ghost]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from dpsynth.dp.plan import plan_privacy  # noqa: E402
from dpsynth.dp.strategy import DPSGDStrategy  # noqa: E402
from dpsynth.models import Transformer, get_config  # noqa: E402
from dpsynth.train import core, lm, sharding, tune_config, tune_model  # noqa: E402
from common import peak_rss, reset_peak_rss, run_peer  # noqa: E402  (bench/peers/common.py)


def _batch(vocab: int, b: int, t: int, seed: int = 0, padding: float = 0.0) -> dict:
    rng = np.random.default_rng(seed)
    weights = np.ones((b, t), np.float32)
    weights[:, :4] = 0.0  # a label-prompt prefix
    if padding:
        weights[:, t - int(round(padding * t)):] = 0.0  # rows padded to the longest example
    return {"inputs": rng.integers(4, vocab, (b, t)).astype(np.int32),
            "targets": rng.integers(4, vocab, (b, t)).astype(np.int32),
            "weights": weights, "mask": np.ones((b,), np.float32)}


def _block(tree):
    jax.tree.map(lambda x: x.block_until_ready() if hasattr(x, "block_until_ready") else x, tree)


def measure(mode: str, strategy_name: str, preset: str, b: int, t: int, reps: int, clipping: str = "vmap",
            base: tuple | None = None, expected_batch: float | None = None, rows: dict | None = None,
            loss_clipping: str | None = None, full_head: bool = False, op_profile: bool = False) -> dict:
    """One mode's accumulate and apply steps on `preset`'s random model, or on `base` = (config, params)
    of a loaded model; `rows`: the microbatch (default `_batch`). The loss is dp-tune's for `clipping`
    (LoRA with ghost clipping: the target-only output layer) or for `loss_clipping` when given (a
    non-private step with the same loss as a DP one)."""
    config = tune_config.TuneConfig(mode=mode, lora_rank=8, prompt_length=20,
                                    clipping=loss_clipping or (clipping if strategy_name == "dp" else "vmap"))
    if base is None:
        base_cfg = get_config(preset, max_len=max(t, 64))
        base_params = jax.device_get(Transformer(base_cfg).init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"])
    else:
        base_cfg, base_params = base
    model_cfg = tune_model.tuned_model_config(base_cfg, config)
    variables = tune_model.init_variables(model_cfg, base_params, config)
    params, frozen = lm.split_variables(variables, tune_config.TRAINABLE[mode])
    loss_fn = tune_model.make_loss_fn(model_cfg, config)
    if full_head:  # the A/B row of --full-head-too: the same loss with the output layer at every position
        loss_fn = lm.make_lm_loss(Transformer(model_cfg), z_loss=config.z_loss)
    strategy = (DPSGDStrategy(clip_norm=1.0, noise_multiplier=1.0, expected_batch_size=float(expected_batch or b),
                              clipping=clipping) if strategy_name == "dp" else core.MeanGradient())
    # A loaded model's state (its frozen base included) is donated as dp-tune donates it: not copied per step.
    # Several CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=N): the microbatch split over a data mesh,
    # as dp-tune runs it on N devices.
    mesh = sharding.make_mesh() if len(jax.devices()) > 1 else None
    fns = core.make_train_functions(loss_fn, optax.adam(1e-3), strategy, donate=base is not None, mesh=mesh)
    state = fns.init_state(params, frozen, rng=0)
    batch = fns.shard_batch(rows if rows is not None else _batch(base_cfg.vocab_size, b, t))
    t0 = time.perf_counter()
    acc, _ = fns.accumulate_step(state, fns.init_accumulator(state), batch)
    state, _ = fns.apply_step(state, acc)
    _block(state)
    compile_s = time.perf_counter() - t0
    acc_times, apply_times, acc_cpu, apply_cpu = [], [], [], []
    reset_peak_rss()
    for _ in range(reps):
        acc = fns.init_accumulator(state)
        _block(acc)
        t0, c0 = time.perf_counter(), time.process_time()
        acc, _ = fns.accumulate_step(state, acc, batch)
        _block(acc)
        acc_times.append(time.perf_counter() - t0)
        acc_cpu.append(time.process_time() - c0)
        t0, c0 = time.perf_counter(), time.process_time()
        state, _ = fns.apply_step(state, acc)
        _block(state)
        apply_times.append(time.perf_counter() - t0)
        apply_cpu.append(time.process_time() - c0)
    acc = fns.init_accumulator(state)
    ops = trace_ops(lambda: fns.accumulate_step(state, fns.init_accumulator(state), batch)[0]) if op_profile else None
    temp = None
    if base is None:  # (a second compile: skipped for a loaded model, whose peak RSS is measured instead)
        mem = jax.jit(fns._accumulate).lower(state, acc, batch).compile().memory_analysis()
        temp = getattr(mem, "temp_size_in_bytes", None) if mem is not None else None
    trainable = sum(x.size for x in jax.tree.leaves(params))
    return {"mode": mode, "strategy": strategy_name, "clipping": clipping, "accumulate_s": float(np.median(acc_times)),
            "apply_s": float(np.median(apply_times)), "compile_s": compile_s,
            "accumulate_cpu_s": float(np.median(acc_cpu)), "apply_cpu_s": float(np.median(apply_cpu)),
            "temp_bytes": int(temp) if temp is not None else None, "trainable_params": int(trainable),
            "peak_rss": peak_rss(), **({"ops": ops} if ops is not None else {})}


def trace_ops(run, top: int = 8) -> dict:
    """Where one call of `run` (a compiled step) spends its time, by XLA:CPU operation kind: a
    `jax.profiler` trace, its op events summed by name without the ".N" suffix ("ynn_fusion": the
    matmuls XLA hands to its YNNPACK kernels; "copy_bitcast_fusion": layout copies; the rest mostly
    element-wise fusions). Events of the two cores' threads overlap, so the sum can exceed the wall
    time. Returns {"wall_s", "op_s" (the sum), "top": [[kind, seconds, count], ...]}."""
    import collections
    import gzip
    import re
    import tempfile

    _block(run())  # (compiled before the trace)
    with tempfile.TemporaryDirectory(prefix="dpsynth-bench-trace-") as d:
        t0 = time.perf_counter()
        with jax.profiler.trace(d, create_perfetto_trace=True):
            _block(run())
        wall = time.perf_counter() - t0
        paths = [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs if f.endswith(".trace.json.gz")]
        with gzip.open(paths[0]) as f:
            events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    total, count = collections.Counter(), collections.Counter()
    for e in events:
        name = e.get("name", "")
        if e.get("ph") != "X" or "dur" not in e or name.startswith(("$", "ThunkExecutor", "SlinkyThreadPool", "Pjit",
                                                                     "CommonPjRt", "end: ")):
            continue
        kind = re.sub(r"\.\d+$", "", name)
        total[kind] += e["dur"] / 1e6
        count[kind] += 1
    return {"wall_s": wall, "op_s": sum(total.values()),
            "top": [[k, v, count[k]] for k, v in total.most_common(top)]}


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


def lora_flops_per_token(config, seq_len: int, head_fraction: float = 1.0) -> float:
    """FLOPs per token of a LoRA step: forward 2N + the backward's input gradients 2N (frozen weights get no
    weight gradient) over the matmul parameters N, plus the attention matmuls forward and backward (the
    attention term of `ModelConfig.flops_per_token`); the adapters' own FLOPs (rank 8) are left out.
    `head_fraction`: the share of positions the output layer runs on (the target-only head: its width over T)."""
    n = config.num_params(("params",)) - config.d_model * (2 * config.num_layers + 1)
    head = config.vocab_size * config.d_model
    return 4.0 * (n - head + head_fraction * head) + 12 * config.num_layers * config.num_heads * config.head_dim * seq_len / 2


def head_width(weights) -> int:
    """The target-only head's width for a microbatch's weights (`lm.row_sums`)."""
    need = int((np.asarray(weights) > 0).sum(axis=1).max())
    return next(c for c in lm.head_capacities(weights.shape[1]) if c >= need)


def main_model(args) -> int:
    """DP-LoRA on a real (imported) model against Opacus + PEFT on CPU torch (issue 56)."""
    import tempfile

    from dpsynth.models.directory import load_model
    from train_step import roofline_flops  # bench/train_step.py

    loaded = load_model(args.model)
    cfg, params = loaded.config, jax.device_get(loaded.variables["params"])
    n, b, t = args.examples, args.microbatch, args.seq
    if n % b:
        raise SystemExit(f"--examples {n} must be a multiple of --microbatch {b}")
    rows = _batch(cfg.vocab_size, n, t, padding=args.padding)
    print(f"dp_step model: {args.model} ({cfg.preset}, {cfg.num_params() / 1e6:.0f}M params, vocab {cfg.vocab_size}); "
          f"LoRA rank 8 on every projection; {n} examples (the expected batch of one logical step) in microbatches "
          f"of {b}, seq {t} ({args.padding:.0%} padding); clip 1, noise 1; devices={jax.devices()[0].platform}x{len(jax.devices())}", flush=True)
    roof = roofline_flops(b * t, cfg.d_model, cfg.vocab_size)
    k = n // b
    ours = {}
    dp_rows = [("dp" if c == "vmap" else f"dp/{c}", c) for c in (args.clipping or ["vmap"])]
    extra = [("dp/ghost/full-head", "dp", "ghost")] if args.full_head_too and "ghost" in (args.clipping or []) else []
    # The non-private row runs the loss the fastest DP row runs (with ghost: the target-only output layer).
    np_loss = "ghost" if "ghost" in (args.clipping or []) else "vmap"
    for name, strategy, clip in [("nonprivate", "nonprivate", np_loss)] + [(n_, "dp", c) for n_, c in dp_rows] + extra:
        r = measure("lora", strategy, cfg.preset, b, t, args.reps, base=(cfg, params), expected_batch=float(n),
                    rows={key: v[:b] for key, v in rows.items()}, clipping=clip, loss_clipping=clip,
                    full_head=name.endswith("full-head"), op_profile=args.profile)
        r["step_s"] = k * r["accumulate_s"] + r["apply_s"]
        r["step_cpu_s"] = k * r["accumulate_cpu_s"] + r["apply_cpu_s"]
        target_only = clip == "ghost" and not name.endswith("full-head")
        r["head_fraction"] = head_width(rows["weights"][:b]) / t if target_only else 1.0
        r["flops_per_s"] = lora_flops_per_token(cfg, t, r["head_fraction"]) * b * t / r["accumulate_s"]
        ours[name] = r
    head = head_profile(cfg, params, b, t, args.reps) if args.profile else None
    del loaded, params
    with tempfile.TemporaryDirectory(prefix="dpsynth-bench-opacus-") as tmp:
        path = os.path.join(tmp, "batch.npz")
        np.savez(path, **{key: rows[key] for key in ("inputs", "targets", "weights")})
        peer = (run_peer("opacus_step.py", ["--gguf", args.gguf, "--batch", path, "--microbatch", str(b),
                                            "--reps", str(args.reps)])
                if args.gguf else {"unavailable": "no --gguf FILE given"})
    per_k = 1000 / n
    print(f"reproduce: nice -n 5 .venv/bin/python bench/dp_step.py {' '.join(sys.argv[1:])}")
    if "versions" in peer:
        print(f"peer versions: {', '.join(f'{key} {v}' for key, v in peer['versions'].items())}")
    for name, r in ours.items():
        print(f"  dpsynth {name:>10}: {r['step_s'] * per_k:.1f} s per 1,000 examples, {r['step_cpu_s'] * per_k:.1f} CPU-s ({k} "
              f"accumulates of {r['accumulate_s']:.2f} s + apply {r['apply_s']:.3f} s; compile {r['compile_s']:.0f} s); peak RSS "
              f"{peak_mb(r['peak_rss'])}; trainable {r['trainable_params']:,}", flush=True)
    for name in ("nonprivate", "hooks", "ghost"):
        x = peer.get(name, peer)
        if "unavailable" in x:
            print(f"  peer {name:>10}: not measured: {x['unavailable']}")
        else:
            print(f"  {'PEFT' if name == 'nonprivate' else 'Opacus+PEFT'} {name:>10}: {x['step_s'] * per_k:.1f} s per "
                  f"1,000 examples, {x['step_cpu_s'] * per_k:.1f} CPU-s; peak RSS {peak_mb(x['peak_rss'])}")
    for name, r in ours.items():
        print(f"  roofline: plain matmul [{b * t}x{cfg.d_model}]x[{cfg.d_model}x{cfg.vocab_size}] {roof / 1e9:.1f} GFLOP/s;"
              f" our {name} LoRA accumulate {r['flops_per_s'] / 1e9:.1f} GFLOP/s (output layer on {r['head_fraction']:.0%} of"
              f" the positions) -> {r['flops_per_s'] / roof:.2f}x"
              f" (target >= 0.7x: {'MET' if r['flops_per_s'] / roof >= 0.7 else 'MISSED'})")
    for name, r in ours.items():
        if "ops" in r:
            o = r["ops"]
            print(f"profile of our {name} accumulate by XLA operation kind (one traced call, {o['wall_s']:.2f} s wall, "
                  f"{o['op_s']:.2f} s of op events on the cores' threads): "
                  + "; ".join(f"{k} {s:.2f} s x{n}" for k, s, n in o["top"]))
    if head:
        acc_np = ours["nonprivate"]["accumulate_s"]
        print(f"profile (one microbatch of {b} x {t}; our non-private accumulate {acc_np:.2f} s):")
        for label, s in head.items():
            print(f"  output layer + cross-entropy, {label}: {s:.2f} s ({s / acc_np:.0%} of the accumulate)")
    for name, clip in dp_rows:
        dp_ratio = ours[name]["step_s"] / ours["nonprivate"]["step_s"]
        dp_cpu = ours[name]["step_cpu_s"] / ours["nonprivate"]["step_cpu_s"]
        print(f"ratio our DP ({clip} clipping) / our non-private step: {dp_ratio:.2f}x wall, {dp_cpu:.2f}x CPU time "
              f"(target <= 1.15x: {'MET' if dp_ratio <= 1.15 else 'MISSED'})")
    dp_peers = [(peer[v]["step_s"], v) for v in ("hooks", "ghost") if "step_s" in peer.get(v, {})]
    if "step_s" in peer.get("nonprivate", {}):
        print(f"ratio our non-private / PEFT non-private: {ours['nonprivate']['step_s'] / peer['nonprivate']['step_s']:.2f}x "
              f"wall, {ours['nonprivate']['step_cpu_s'] / peer['nonprivate']['step_cpu_s']:.2f}x CPU time")
    for name, clip in dp_rows:
        if not dp_peers:
            print("ratio our DP-LoRA / Opacus: not measured (Opacus unavailable, above)")
            break
        best, which = min(dp_peers)
        ratio = ours[name]["step_s"] / best
        cpu = ours[name]["step_cpu_s"] / peer[which]["step_cpu_s"]
        print(f"ratio our DP-LoRA ({clip} clipping) / Opacus ({which}, its fastest): {ratio:.2f}x the time, {cpu:.2f}x "
              f"the CPU time (target <= 0.8x: {'MET' if ratio <= 0.8 else 'MISSED'})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ours": ours, "peer": peer, "roofline_flops": roof}, f, indent=1)
    return 0


def head_profile(cfg, params, b: int, t: int, reps: int) -> dict:
    """Where a LoRA step's time goes: the tied output layer + the Prefix-LM cross-entropy alone (forward and
    the input gradient, as the step runs them: the table frozen) on the step's [b * t, d_model] hidden rows,
    timed as the model computes it (`x @ table.T`) and with the table pre-transposed ([d_model, vocab]: a
    layout the model does not use, timed to see whether the transposed operand costs a copy)."""
    table = jnp.asarray(params["embedding"], jnp.float32)
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((b * t, cfg.d_model)).astype(np.float32))
    targets = jnp.asarray(rng.integers(4, cfg.vocab_size, (b * t,)).astype(np.int32))

    from dpsynth.models.transformer import output_layer

    def head_loss(h, w, transposed):
        # transposed: `w` is [d_model, vocab], multiplied as it is (the model's `x @ table.T` otherwise)
        dot = (lambda x, wt, _: jnp.dot(x, wt, preferred_element_type=jnp.float32)) if transposed else None
        ce, _ = lm.cross_entropy_with_z_loss(output_layer(cfg, h, w, dot), targets, 0.0)
        return jnp.mean(ce)

    out = {}
    for name, w, transposed in (("as the model runs it (x @ table.T)", table, False),
                                ("table pre-transposed", jnp.asarray(table.T), True)):
        fwd = jax.jit(lambda h, w, tr=transposed: head_loss(h, w, tr))
        both = jax.jit(jax.value_and_grad(lambda h, w, tr=transposed: head_loss(h, w, tr)))
        for label, fn in (("forward", fwd), ("forward+input grad", both)):
            _block(fn(x, w))
            times = []
            for _ in range(max(reps, 2)):
                t0 = time.perf_counter()
                _block(fn(x, w))
                times.append(time.perf_counter() - t0)
            out[f"{name}: {label}"] = float(np.median(times))
    return out


def peak_mb(n) -> str:
    return f"{n / 2**20:.0f} MB" if n else "n/a"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--microbatch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--modes", nargs="+", default=["lora", "prompt", "full"])
    p.add_argument("--logical-batch", type=int, default=1024,
                   help="expected logical batch: a step is ceil(logical/microbatch) accumulates + one apply")
    p.add_argument("--clipping", nargs="+", default=None, choices=["vmap", "ghost"],
                   help="full and lora modes: the clipping methods of our DP step, one row each (default: vmap and "
                        "ghost; prompt: vmap only); --model: default vmap only")
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    p.add_argument("--wordcnn", action="store_true", help="WordCNN: sparse vs dense embedding clipping")
    p.add_argument("--vocab", type=int, default=30_002, help="--wordcnn: vocabulary (30k words + PAD/OOV)")
    p.add_argument("--embed-dim", type=int, default=384, help="--wordcnn: embedding width")
    m = p.add_argument_group("a real model against Opacus + PEFT (--model: only this part runs)")
    m.add_argument("--model", default=None, help="an imported model directory (dpsynth import-model --gguf FILE)")
    m.add_argument("--gguf", default=None, help="the GGUF file it was imported from (the peers load it)")
    m.add_argument("--examples", type=int, default=32, help="--model: examples per logical step (the expected batch)")
    m.add_argument("--padding", type=float, default=0.0,
                   help="--model: the fraction of each row after its text that is padding (weight 0), as in rows padded "
                        "to a batch's longest review; both sides get the same rows and weights")
    m.add_argument("--full-head-too", action="store_true",
                   help="--model with --clipping ghost: also time the ghost step with the output layer at every position "
                        "(the A/B of the target-only head, same run)")
    m.add_argument("--profile", action="store_true",
                   help="--model: also time the output layer + cross-entropy alone, and trace one accumulate of each "
                        "row by XLA operation kind (where the step's time goes)")
    args = p.parse_args(argv)
    if args.model:
        return main_model(args)
    if args.wordcnn:
        return main_wordcnn(args)
    print(f"dp_step: preset={args.preset} microbatch={args.microbatch} seq={args.seq} reps={args.reps} "
          f"devices={jax.devices()[0].platform}x{len(jax.devices())}")
    rows = []
    targets = {"lora": 1.5, "prompt": 1.5, "full": 3.0, "full/ghost": 1.3, "lora/ghost": 1.15}
    clippings = args.clipping or ["vmap", "ghost"]
    runs = [(mode, c) for mode in args.modes for c in (clippings if mode in tune_config.GHOST_MODES else ["vmap"])]
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
