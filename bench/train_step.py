"""Training-step throughput of the core against a naive JAX/optax loop and a matmul roofline.

Measures, per preset: compile time, tokens/s, achieved TFLOP/s (and MFU where the device
peak is known), and XLA's memory estimate of the step (arguments + temporaries - donated
aliases), for
  ours:  `dpsynth.train.core` train_step (one jit: grad + optimizer update, state donated);
  peer:  the plain loop people write first: `jax.jit(jax.value_and_grad(loss))` then a
         separately jitted `optimizer.update` + `optax.apply_updates`, no donation;
and prints ours/peer. 1b/8b run only when an accelerator is present.

Roofline (same run, same process): a plain f32 `jnp.dot` of the step's largest matmul shape
([batch*seq, d_model] x [d_model, vocab]) is timed before the presets; each preset's achieved
FLOP/s (`ModelConfig.flops_per_token`, forward + backward) is printed as a ratio of it. On a
CPU the ratio is the fraction of the machine's reachable dense-matmul speed the whole step
reaches (attention, softmax, norms, the optimizer and dispatch are the rest).

`--shapes` measures candidate shapes that are not presets (`name:key=value,...` over a base
preset, e.g. `c1:base=small,d_model=192,d_ff=512`); `--loop` also times the pretraining
loop's host side (batch gather + transfer per step) with metrics pulled to the host every
step (`sync`) against the trainer's way (device-side sums, pulled every `--log-every` steps).
XLA CPU flags are read from `XLA_FLAGS` at start-up: run the script once per setting.

    .venv/bin/python bench/train_step.py                      # tiny + small on CPU, a few minutes
    .venv/bin/python bench/train_step.py --presets small --seq-len 512 --batch-size 16 --steps 20
    .venv/bin/python bench/train_step.py --presets cpu --vocab-size 8192 --batch-size 32 --loop
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])

from dpsynth.models import Transformer, get_config  # noqa: E402
from dpsynth.train import core, lm, optim  # noqa: E402
from dpsynth.train.pretrain import peak_flops_per_device  # noqa: E402


def _batch(config, batch_size, seq_len, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(4, config.vocab_size, (batch_size, seq_len + 1)).astype(np.int32)
    seg = np.ones((batch_size, seq_len), np.int32)
    seg[:, seq_len // 2:] = 2  # two packed documents per row
    return {"inputs": x[:, :-1], "targets": x[:, 1:], "weights": np.ones((batch_size, seq_len), np.float32),
            "segment_ids": seg, "mask": np.ones((batch_size,), np.float32)}


def _memory(compiled) -> float | None:
    try:
        m = compiled.memory_analysis()
        return (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                - m.alias_size_in_bytes) / 2**20
    except Exception:  # not every backend reports it
        return None


def _time(fn, n):
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


CPU_S: dict = {}  # variant -> median process CPU seconds per step (all threads), see _interleaved


def _interleaved(fns: dict, steps: int, rounds: int) -> dict:
    """Median per-step time of each variant over `rounds` alternating rounds (fair under load).

    Also records the process CPU time per step (`CPU_S`): on a shared machine the wall time
    depends on the other jobs, the CPU seconds a step consumes much less so.
    """
    times = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            c = time.process_time()
            times[k].append(_time(f, steps))
            cpu[k].append((time.process_time() - c) / steps)
    CPU_S.update({k: float(np.median(v)) for k, v in cpu.items()})
    return {k: float(np.median(v)) for k, v in times.items()}


def roofline_flops(m: int, k: int, n: int, reps: int = 5) -> float:
    """FLOP/s of a plain f32 [m, k] x [k, n] jitted matmul (median of `reps`), same process."""
    a = jnp.asarray(np.random.default_rng(0).standard_normal((m, k)), jnp.float32)
    b = jnp.asarray(np.random.default_rng(1).standard_normal((k, n)), jnp.float32)
    f = jax.jit(jnp.dot)
    f(a, b).block_until_ready()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        f(a, b).block_until_ready()
        times.append(time.perf_counter() - t)
    return 2.0 * m * k * n / float(np.median(times))


def parse_shape(spec: str):
    """`name:base=small,d_model=192,...` -> (name, ModelConfig); a bare preset name is itself."""
    name, _, rest = spec.partition(":")
    fields = dict(kv.split("=", 1) for kv in rest.split(",") if kv) if rest else {}
    base = fields.pop("base", name if not rest else "small")
    overrides = {k: (float(v) if k in ("rope_base", "norm_eps", "lora_alpha") else v if k in ("mlp", "dtype") else int(v))
                 for k, v in fields.items()}
    return name, get_config(base, **overrides).replace(preset=name)


def bench_loop(config, seq_len, batch_size, steps, optimizer, log_every=10):
    """tokens/s of the pretraining loop's host side: metrics pulled every step vs every `log_every`."""
    from dpsynth.train.pretrain import PackedRows, batch_indices

    model = Transformer(config)
    rng = np.random.default_rng(0)
    n = max(64 * batch_size, 1024)
    x = rng.integers(4, config.vocab_size, (n, seq_len + 1)).astype(np.int32)
    rows = PackedRows(x[:, :-1], x[:, 1:], np.ones((n, seq_len), np.float32), np.ones((n, seq_len), np.int32))
    variables = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))
    params, frozen = lm.split_variables(variables)
    fns = core.make_train_functions(lm.make_lm_loss(model), optim.make_optimizer(optimizer, learning_rate=1e-3))
    out = {}
    for variant in ("sync", "async", "sync", "async"):
        state = fns.init_state(params, frozen, rng=0)
        state, m = fns.train_step(state, fns.shard_batch(rows.rows(batch_indices(n, 0, batch_size, 0))))
        jax.block_until_ready(m["loss"])
        window = None
        t = time.perf_counter()
        for step in range(steps):
            idx = batch_indices(n, step * batch_size, batch_size, 0)
            state, m = fns.train_step(state, fns.shard_batch(rows.rows(idx)))
            if variant == "sync":
                float(m["loss"]), float(m["grad_norm"])
            else:
                window = core.sum_metrics(window, {k: m[k] for k in ("ce_sum", "tokens", "loss_sum", "count")})
                if (step + 1) % log_every == 0:
                    jax.device_get(window)
                    window = None
        jax.block_until_ready(state.params)
        out.setdefault(variant, []).append(steps * batch_size * seq_len / (time.perf_counter() - t))
    return {k: float(np.max(v)) for k, v in out.items()}


def bench_preset(preset, seq_len, batch_size, steps, optimizer, rounds=3, config=None):
    if config is None:
        config = get_config(preset, max_len=max(seq_len, get_config(preset).max_len))
    model = Transformer(config)
    batch = _batch(config, batch_size, seq_len)
    variables = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))
    params, frozen = lm.split_variables(variables)
    loss_fn = lm.make_lm_loss(model)
    opt = optim.make_optimizer(optimizer, learning_rate=1e-3)
    tokens = batch_size * seq_len
    out = {}

    # ---- ours
    fns = core.make_train_functions(loss_fn, opt)
    state = fns.init_state(params, frozen, rng=0)
    dev_batch = fns.shard_batch(batch)
    t = time.perf_counter()
    compiled = jax.jit(fns._train_step, donate_argnums=0).lower(state, dev_batch).compile()
    compile_s = time.perf_counter() - t
    holder = {"s": state}

    def ours():
        holder["s"], m = fns.train_step(holder["s"], dev_batch)
        jax.block_until_ready(m["loss"])

    ours()  # compile through the cached path
    out["ours"] = {"compile_s": compile_s, "mem_mib": _memory(compiled)}

    # ---- peer: separately jitted grad and update, no donation
    def mean_loss(p, b):
        per, _ = loss_fn(p, frozen, b, None)
        return jnp.sum(per * b["mask"]) / jnp.sum(b["mask"])

    grad_fn = jax.jit(jax.value_and_grad(mean_loss))

    @jax.jit
    def update(p, s, g):
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s

    p_params = jax.tree.map(jnp.copy, params)
    p_state = opt.init(p_params)
    t = time.perf_counter()
    c_grad = grad_fn.lower(p_params, dev_batch).compile()
    grads_shape = jax.eval_shape(grad_fn, p_params, dev_batch)[1]
    c_upd = update.lower(p_params, p_state, grads_shape).compile()
    peer_compile = time.perf_counter() - t
    ph = {"p": p_params, "s": p_state}

    def peer():
        loss, g = grad_fn(ph["p"], dev_batch)
        ph["p"], ph["s"] = update(ph["p"], ph["s"], g)
        jax.block_until_ready(loss)

    peer()
    mem = [_memory(c_grad), _memory(c_upd)]
    out["peer"] = {"compile_s": peer_compile, "mem_mib": None if None in mem else max(mem)}
    for name, step_s in _interleaved({"ours": ours, "peer": peer}, steps, rounds).items():
        out[name]["step_s"] = step_s
    flops = config.flops_per_token(seq_len) * tokens
    peak = peak_flops_per_device()
    for name in ("ours", "peer"):
        r = out[name]
        r["tokens_per_s"] = tokens / r["step_s"]
        r["tflops"] = flops / r["step_s"] / 1e12
        r["mfu"] = r["tflops"] * 1e12 / peak if peak else None
    return config, out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default=None, help="comma list (default: tiny,small; + 1b,8b on accelerators)")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=5, help="timed steps per variant and round")
    p.add_argument("--rounds", type=int, default=3, help="alternating timing rounds (median reported)")
    p.add_argument("--optimizer", default="adam", choices=("adam", "adafactor"), help="(1b/8b always use adafactor)")
    p.add_argument("--shapes", default=None, help="semicolon list of candidate shapes `name:base=small,d_model=192,...`")
    p.add_argument("--vocab-size", type=int, default=None, help="override every preset's/shape's vocabulary")
    p.add_argument("--loop", action="store_true", help="also time the loop's host side (sync vs async metrics)")
    args = p.parse_args(argv)
    accel = jax.default_backend() != "cpu"
    import os

    if args.presets or not args.shapes:
        presets = args.presets.split(",") if args.presets else ["tiny", "small"] + (["1b", "8b"] if accel else [])
    else:
        presets = []
    shapes = [(p, None) for p in presets] + [parse_shape(s) for s in (args.shapes or "").split(";") if s]
    dev = jax.devices()[0]
    print(f"device: {dev.platform} {dev.device_kind} x{jax.device_count()} ({os.cpu_count()} CPUs visible); seq_len "
          f"{args.seq_len}, batch {args.batch_size}, optimizer {args.optimizer}; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; "
          "peer = jit(value_and_grad) + separately jitted optax update, no donation")
    print(f"{'preset':8} {'variant':6} {'params':>8} {'compile_s':>9} {'step_ms':>9} {'tokens/s':>10} "
          f"{'TFLOP/s':>8} {'MFU':>6} {'mem_MiB':>8}")
    for preset, config in shapes:
        if config is None:
            config = get_config(preset, max_len=max(args.seq_len, get_config(preset).max_len))
        if args.vocab_size:
            config = config.replace(vocab_size=args.vocab_size)
        # Roofline: the step's largest matmul shape, measured now (the load may change between shapes).
        roof = roofline_flops(args.batch_size * args.seq_len, config.d_model, config.vocab_size)
        # Adam state for 8b (2 x 35 GB f32) plus params and grads does not fit one 141 GB chip.
        opt_name = "adafactor" if preset in ("1b", "8b") else args.optimizer
        config, out = bench_preset(preset, args.seq_len, args.batch_size, args.steps, opt_name, args.rounds, config=config)
        for name, r in out.items():
            mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] else "n/a"
            mem = f"{r['mem_mib']:.1f}" if r["mem_mib"] is not None else "n/a"
            print(f"{preset:8} {name:6} {config.num_params() / 1e6:7.1f}M {r['compile_s']:9.2f} "
                  f"{1e3 * r['step_s']:9.1f} {r['tokens_per_s']:10.0f} {r['tflops']:8.4f} {mfu:>6} {mem:>8}")
        print(f"{preset:8} ratio ours/peer: tokens/s x{out['ours']['tokens_per_s'] / out['peer']['tokens_per_s']:.2f}"
              + (f", step memory x{out['ours']['mem_mib'] / out['peer']['mem_mib']:.2f}"
                 if out["ours"]["mem_mib"] and out["peer"]["mem_mib"] else ""))
        ours = out["ours"]["tflops"] * 1e12
        tok_cpu = args.batch_size * args.seq_len / CPU_S["ours"]
        print(f"{preset:8} CPU time: {CPU_S['ours']:.2f} CPU-s per step = {tok_cpu:.0f} tokens per CPU-second "
              f"(wall {out['ours']['step_s']:.2f} s: {CPU_S['ours'] / out['ours']['step_s']:.2f} cores busy on average)")
        print(f"{preset:8} roofline: plain matmul [{args.batch_size * args.seq_len}x{config.d_model}]x[{config.d_model}x"
              f"{config.vocab_size}] {roof / 1e9:.1f} GFLOP/s; step achieved {ours / 1e9:.1f} GFLOP/s -> ratio "
              f"{ours / roof:.3f}; {config.flops_per_token(args.seq_len) / 1e6:.1f} MFLOP/token, "
              f"{config.num_params(('params',)) / 1e6:.2f}M params")
        if args.loop:
            loop = bench_loop(config, args.seq_len, args.batch_size, args.steps * args.rounds, opt_name)
            print(f"{preset:8} loop (host batches): metrics every step {loop['sync']:.0f} tokens/s, device-side sums "
                  f"pulled every 10 steps {loop['async']:.0f} tokens/s -> ratio {loop['async'] / loop['sync']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
