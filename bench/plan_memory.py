"""The resource plan's memory against the measured peak of the same DP step on CPU (issue 37).

For each preset x mode (default `cpu`, `small` x `full`, `lora`), in a fresh process:

* predicted: `dpsynth.train.tune_model.compile_steps` compiles the accumulate step of a `dp_tune`
  run on abstract arrays; its total = arguments + outputs - donated aliases + temporaries
  (XLA's `memory_analysis()`);
* measured: the same step (`tune_model.planned_step`, real initialised weights, a random batch),
  compiled ahead, runs once while the kernel's resident high-water mark (VmHWM, reset through
  /proc/self/clear_refs just before; where that cannot be reset, a thread samples
  /proc/self/statm every 0.2 ms) records its peak; measured = the bytes of its arguments (state,
  accumulator, batch: exact, from the arrays) + (peak RSS during the execution - RSS before it).
  It is the first execution's: XLA:CPU keeps part of a step's working memory for its later
  executions, whose rise (reported as `steady_rise_bytes`) therefore misses it. glibc's mmap
  threshold is pinned (MALLOC_MMAP_THRESHOLD_) so that freed buffers leave the RSS.

On an accelerator (GPU/TPU) the measured figure is the device's own
`memory_stats()["peak_bytes_in_use"]` after the second execution (each unit in its own process, so the
peak is that step's alone), and the plan compiles for that device: this is the check of the
plan on a lent device (docs/scaling.md says how to run it there, e.g. `--presets small 1b`).

Peer: the measured peak; target (issue 37): predicted / measured within [1/1.5, 1.5].

    .venv/bin/python bench/plan_memory.py            # cpu, small x full, lora; microbatch 8 x 128 tokens
    .venv/bin/python bench/plan_memory.py --presets cpu --modes lora --microbatch 16 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
TARGET = 1.5


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak() -> bool:
    """Resets the kernel's resident high-water mark of this process (Linux >= 4.0); False if it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss() -> int:
    """The kernel's resident high-water mark (VmHWM) of this process, in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def measure_one(preset: str, mode: str, microbatch: int, tokens: int) -> dict:
    """Predicted and measured bytes of one accumulate step (run in its own process)."""
    import jax
    import numpy as np

    from dpsynth.models.config import get_config
    from dpsynth.train import lm, resources, tune_config, tune_model

    config = tune_config.TuneConfig(mode=mode, epsilon=3.0, batch_size=4 * microbatch, microbatch_size=microbatch,
                                    steps=10, max_tokens=tokens + 1, lora_rank=8)
    plan = tune_config.plan_run(config, 10_000)
    base_config = get_config(preset)
    predicted = tune_model.compile_steps(base_config, config, plan, microbatch=microbatch, row_length=tokens,
                                         apply=False).accumulate
    model_config, fns = tune_model.planned_step(base_config, config, plan)
    base = jax.jit(lambda k: __import__("dpsynth.models", fromlist=["Transformer"]).Transformer(
        model_config.base()).init(k, jax.numpy.zeros((1, 4), jax.numpy.int32))["params"])(jax.random.PRNGKey(0))
    params, frozen = lm.split_variables(tune_model.init_variables(model_config, base, config),
                                        tune_config.TRAINABLE[mode])
    state = fns.init_state(params, frozen, rng=0, copy=False)
    del base, params, frozen
    rng = np.random.default_rng(0)
    batch = {"inputs": rng.integers(4, model_config.vocab_size, (microbatch, tokens)).astype(np.int32),
             "targets": rng.integers(4, model_config.vocab_size, (microbatch, tokens)).astype(np.int32),
             "weights": np.ones((microbatch, tokens), np.float32), "mask": np.ones((microbatch,), np.float32)}
    batch = fns.shard_batch(batch)
    acc = fns.init_accumulator(state)
    # Compiled ahead (the program `accumulate_step` runs), so the first execution's memory is the step's own
    # and not the compiler's.
    step = fns.lower("accumulate", state, acc, batch).compile()
    arguments = resources.bytes_per_device((state, acc, batch))
    device = jax.devices()[0]
    on_cpu = device.platform == "cpu"

    sources = []  # where each execution's peak came from

    def execute() -> tuple[int, float]:
        """(the resident-memory rise during one execution, its seconds)."""
        nonlocal acc
        peak, done = [0], threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], _rss())
                time.sleep(0.0002)

        before = _rss()
        kernel_peak = on_cpu and _reset_peak()
        thread = threading.Thread(target=sample)
        if on_cpu and not kernel_peak:
            thread.start()
        t0 = time.perf_counter()
        acc, _ = step(state, acc, batch)
        jax.block_until_ready(acc)
        seconds = time.perf_counter() - t0
        done.set()
        if kernel_peak:  # exact: the kernel's high-water mark, reset just before the call
            peak[0] = _peak_rss()
        elif on_cpu:
            thread.join()
        sources.append("device" if not on_cpu else ("VmHWM" if kernel_peak else "sampled"))
        return max(0, peak[0] - before), seconds

    # The runtime's process-wide one-time set-up (thread pools, kernel libraries) happens on another
    # program's first execution, not counted as the step's.
    warm = jax.numpy.ones((256, 256), jax.numpy.float32)
    jax.block_until_ready(jax.jit(lambda x: jax.nn.softmax(x @ x) @ x)(warm))
    first_rise, _ = execute()
    steady_rise, seconds = execute()
    if on_cpu:
        # XLA:CPU keeps part of a step's working memory after its first execution for the next ones (e.g.
        # 91 of the LoRA step's 165 MiB on the `cpu` preset), so a later execution's rise misses it: the
        # step's peak is the first execution's.
        measured = arguments + first_rise
    else:  # the device's own high-water mark (this process ran only this step)
        measured = int(device.memory_stats()["peak_bytes_in_use"])
    return {"preset": preset, "mode": mode, "microbatch": microbatch, "tokens": tokens,
            "predicted_bytes": predicted.total_bytes, "predicted_temp_bytes": predicted.temp_bytes,
            "argument_bytes": arguments, "measured_bytes": measured, "ratio": predicted.total_bytes / measured,
            "first_rise_bytes": first_rise, "steady_rise_bytes": steady_rise, "step_seconds": seconds,
            "device": device.device_kind, "peak_source": sources[0]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="+", default=["cpu", "small"])
    p.add_argument("--modes", nargs="+", default=["full", "lora"], choices=["full", "lora", "prompt"])
    p.add_argument("--microbatch", type=int, default=8)
    p.add_argument("--tokens", type=int, default=128, help="row length (tokens per example - 1)")
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument("--one", nargs=2, metavar=("PRESET", "MODE"), help=argparse.SUPPRESS)  # the child process
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(args.one[0], args.one[1], args.microbatch, args.tokens)))
        return 0
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": REPO}
    env.pop("XLA_FLAGS", None)
    rows = []
    print(f"{'preset':6s} {'mode':5s} {'predicted MiB':>13s} {'measured MiB':>12s} {'ratio':>6s}  (target {1 / TARGET:.2f}-{TARGET})")
    for preset in args.presets:
        for mode in args.modes:
            out = subprocess.run([sys.executable, __file__, "--one", preset, mode, "--microbatch", str(args.microbatch),
                                  "--tokens", str(args.tokens)], capture_output=True, text=True, env=env, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            ok = 1 / TARGET <= row["ratio"] <= TARGET
            print(f"{preset:6s} {mode:5s} {row['predicted_bytes'] / 2**20:13.1f} {row['measured_bytes'] / 2**20:12.1f} "
                  f"{row['ratio']:6.2f}  {'ok' if ok else 'OUTSIDE TARGET'}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
