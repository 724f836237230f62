"""The resource plan's memory against the measured peak of the same DP step on CPU (issue 37).

For each preset x mode (default `cpu`, `small` x `full`, `lora`), in a fresh process:

* predicted: `dpsynth.train.tune_model.compile_steps` compiles the accumulate step of a `dp_tune`
  run on abstract arrays; its total = arguments + outputs - donated aliases + temporaries
  (XLA's `memory_analysis()`);
* measured: the same step (`tune_model.planned_step`, real initialised weights, a random batch)
  runs once to compile and warm up, then once more while a thread samples the process's
  resident memory (/proc/self/statm) every 0.2 ms; measured = the bytes of its arguments (state,
  accumulator, batch: exact, from the arrays) + (peak RSS during the call - RSS before it).
  glibc's mmap threshold is pinned (MALLOC_MMAP_THRESHOLD_) so that freed buffers leave the
  RSS and the second call's temporaries show.

On an accelerator (GPU/TPU) the measured figure is the device's own
`memory_stats()["peak_bytes_in_use"]` after the second call (each unit in its own process, so the
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
    acc, _ = fns.accumulate_step(state, acc, batch)  # compile + warm up
    jax.block_until_ready(acc)
    arguments = resources.bytes_per_device((state, acc, batch))
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.0002)

    device = jax.devices()[0]
    on_cpu = device.platform == "cpu"
    before = _rss()
    thread = threading.Thread(target=sample)
    if on_cpu:
        thread.start()
    t0 = time.perf_counter()
    acc, _ = fns.accumulate_step(state, acc, batch)
    jax.block_until_ready(acc)
    seconds = time.perf_counter() - t0
    done.set()
    if on_cpu:
        thread.join()
        measured = arguments + max(0, peak[0] - before)
    else:  # the device's own high-water mark (this process ran only this step)
        measured = int(device.memory_stats()["peak_bytes_in_use"])
    return {"preset": preset, "mode": mode, "microbatch": microbatch, "tokens": tokens,
            "predicted_bytes": predicted.total_bytes, "predicted_temp_bytes": predicted.temp_bytes,
            "argument_bytes": arguments, "measured_bytes": measured, "ratio": predicted.total_bytes / measured,
            "step_seconds": seconds, "device": device.device_kind}


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
