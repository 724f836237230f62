"""Generation speed: the KV-cache sampler against recomputation, and 1 vs 2 Beam workers.

1. Tokens/s of `dpsynth.generate.sampler.Sampler` (prefill + `lax.while_loop` of cached decode
   steps, one compiled call per batch) against the same model recomputing the whole prefix at
   every step (a jitted forward pass over the prefix, lengths bucketed to multiples of 32 so
   it compiles a handful of times; compilation is excluded from both timings). Greedy
   decoding of `--length` tokens in total, EOS disabled so every row runs to the end; the two
   outputs are compared token by token as a correctness check. Target: >= 10x at 256 tokens.

2. The whole generation job (`dpsynth.generate.job.generate`) on the FnApiRunner in
   multi-process mode with 1 vs 2 worker processes, same model and shards, twice:
   - pinned (`cores_per_worker=1`): each worker pins itself to a core of its own before XLA
     starts, so "one worker" means one core: the fan-out's scaling with workers;
   - unpinned: each worker's XLA thread pools span every core, so one worker already uses
     both cores of a 2-core machine for part of its work, and two oversubscribe them.
   Job time includes worker start, model load and compilation (paid once per worker, so
   small jobs scale worse); the steady-state lines time sampling only (after load and
   compile): one process doing every shard vs two processes each doing half, started
   together. The ratio printed for each is against the 1-worker run of the same kind, plus
   pinned 2 workers against the unpinned single worker. Target: >= 1.7x.

    .venv/bin/python bench/generate.py [--preset small] [--length 256] [--batch 8]
        [--examples 64] [--skip-workers]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def make_model(preset: str, max_len: int):
    import jax
    import jax.numpy as jnp

    from dpsynth.models import Transformer, get_config

    config = get_config(preset, max_len=max(max_len, 64))
    model = Transformer(config)
    variables = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))
    return config, model, variables


def bench_cache_vs_recompute(preset: str, length: int, batch: int, prompt_len: int = 8, repeats: int = 1) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from dpsynth.generate.sampler import Sampler, SamplerConfig, TransformerDecodeModel, example_keys, seed_to_key_data

    config, model, variables = make_model(preset, length)
    rng = np.random.default_rng(0)
    prompts = rng.integers(4, config.vocab_size, size=(batch, prompt_len)).astype(np.int32)
    new_tokens = length - prompt_len

    cfg = SamplerConfig(temperature=0.0, max_len=length, batch_size=batch, prompt_bucket=prompt_len, eos_id=-1)
    sampler = Sampler(TransformerDecodeModel(config), cfg)
    keys = example_keys(seed_to_key_data(0), range(batch))
    lens = np.full((batch,), prompt_len, np.int32)
    jax.block_until_ready(sampler.sample_batch(variables, prompts, lens, keys))  # compile
    t_cache = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(sampler.sample_batch(variables, prompts, lens, keys))
        t_cache.append(time.perf_counter() - t0)
    cached_tokens = np.asarray(out[0])[:, :new_tokens]

    forward = jax.jit(lambda v, toks: model.apply(v, toks))
    bucket = 32

    def recompute():
        buf = np.zeros((batch, length), np.int32)
        buf[:, :prompt_len] = prompts
        for pos in range(prompt_len, length):
            width = min(length, -(-pos // bucket) * bucket)
            logits = forward(variables, jnp.asarray(buf[:, :width]))
            buf[:, pos] = np.asarray(jnp.argmax(logits[:, pos - 1], axis=-1))
        return buf[:, prompt_len:]

    for width in sorted({min(length, -(-p // bucket) * bucket) for p in range(prompt_len, length)}):
        jax.block_until_ready(forward(variables, jnp.zeros((batch, width), jnp.int32)))  # compile all buckets
    t_rec = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        rec_tokens = recompute()
        t_rec.append(time.perf_counter() - t0)
    generated = batch * new_tokens
    cache_tps, rec_tps = generated / min(t_cache), generated / min(t_rec)
    return {
        "preset": preset, "length": length, "batch": batch, "prompt_len": prompt_len,
        "kv_cache_tokens_per_s": cache_tps, "recompute_tokens_per_s": rec_tps, "ratio": cache_tps / rec_tps,
        "greedy_tokens_agree": float(np.mean(cached_tokens == rec_tokens)),
        "compile_count": sampler.compile_count,
    }


def _save_model_dir(preset: str, max_len: int, path: str) -> None:
    import random

    from dpsynth.dp.ledger import PrivacyLedger
    from dpsynth.dp.report import build_report, write_report
    from dpsynth.tokens import train_tokenizer
    from dpsynth.train.checkpoint import save_model

    config, _, variables = make_model(preset, max_len)
    words = "good great tasty fresh awful bland stale sweet salty coffee tea bread the a it was is and but not".split()
    rng = random.Random(0)
    texts = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(500)] + ["[great] [other]"] * 10
    tok = train_tokenizer(texts, vocab_size=min(320, config.vocab_size))
    save_model(path, config, {"params": variables["params"]}, tok, extra_manifest={"labels": ["great", "other"]})
    ledger = PrivacyLedger(delta=1e-5, target_epsilon=3.0)
    ledger.record_dpsgd(sampling_probability=0.05, noise_multiplier=1.0, steps=100, clip_norm=1.0, dataset_size=1000)
    write_report(path, build_report(ledger, training={"mode": "bench"}, contamination_sha256=None))


def _job_time(model_dir: str, out: str, workers: int, examples: int, length: int, batch: int, pinned: bool,
              lock_dir: str) -> float:
    code = (
        "import sys,time,logging; sys.path.insert(0, %r)\n"
        "from dpsynth.generate.job import GenerateConfig, generate\n"
        "t=time.perf_counter()\n"
        "generate(GenerateConfig(model_dir=%r, out_dir=%r, num_examples=%d, examples_per_shard=%d, batch_size=%d,"
        " max_len=%d, temperature=1.0, cores_per_worker=%d),"
        " beam_args=['--direct_running_mode=multi_processing', '--direct_num_workers=%d'])\n"
        "print('SECONDS', time.perf_counter()-t)\n"
    ) % (REPO, model_dir, out, examples, max(1, examples // 8), batch, length, int(pinned), workers)
    env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu", TMPDIR=lock_dir)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO)
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-3000:])
    return float([l for l in res.stdout.splitlines() if l.startswith("SECONDS")][-1].split()[1])


_STEADY_WORKER = r"""
import json, os, sys, time
sys.path.insert(0, {repo!r})
from dpsynth.generate.model_info import load_bundle, read_model_info
from dpsynth.generate.plan import GenerateConfig, make_plan
from dpsynth.generate.transforms import generate_shard
from dpsynth.generate.sampler import Sampler
import dataclasses
rank, world, model_dir, out_dir, barrier = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
if sys.argv[6] == "1":  # one core per process, before XLA starts
    os.sched_setaffinity(0, [sorted(os.sched_getaffinity(0))[rank]])
cfg = GenerateConfig(model_dir=model_dir, out_dir=out_dir, num_examples={examples}, examples_per_shard={per_shard},
                     batch_size={batch}, max_len={length}, temperature=1.0)
plan = make_plan(cfg, read_model_info(model_dir))
os.makedirs(os.path.join(out_dir, "shards"), exist_ok=True)
bundle = load_bundle(model_dir)
sampler = Sampler(bundle.decoder, dataclasses.replace(plan.sampler, vocab_limit=bundle.tokenizer.vocab_size))
generate_shard(plan, bundle, sampler, dataclasses.replace(plan.specs[0], index=10**4 + rank))  # warm-up: compile
open(os.path.join(barrier, f"ready-{{rank}}"), "w").close()
while len(os.listdir(barrier)) < world:
    time.sleep(0.01)
t0 = time.perf_counter()
mine = plan.specs[rank::world]
for spec in mine:
    generate_shard(plan, bundle, sampler, spec)
print("RESULT", json.dumps({{"seconds": time.perf_counter() - t0, "examples": sum(s.count for s in mine)}}))
"""


def bench_steady_state(model_dir: str, tmp: str, examples: int, length: int, batch: int, pinned: bool) -> dict:
    """Sampling throughput after load and compile: 1 process doing all shards vs 2 each doing half."""
    per_shard = max(1, examples // 8)
    code = _STEADY_WORKER.format(repo=REPO, examples=examples, per_shard=per_shard, batch=batch, length=length)
    env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
    rates = {}
    kind = "pinned" if pinned else "unpinned"
    for world in (1, 2):
        barrier = os.path.join(tmp, f"barrier-{kind}{world}")
        os.makedirs(barrier)
        procs = [subprocess.Popen([sys.executable, "-c", code, str(r), str(world), model_dir,
                                   os.path.join(tmp, f"steady-{kind}{world}"), barrier, str(int(pinned))],
                                  env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in range(world)]
        results = []
        for proc in procs:
            out, err = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(err[-3000:])
            results.append(json.loads([l for l in out.splitlines() if l.startswith("RESULT")][-1][7:]))
        rates[world] = sum(r["examples"] for r in results) / max(r["seconds"] for r in results)
    return {"examples_per_s_1_process": rates[1], "examples_per_s_2_processes": rates[2],
            "steady_speedup": rates[2] / rates[1]}


def bench_workers(preset: str, examples: int, length: int, batch: int) -> dict:
    tmp = tempfile.mkdtemp(prefix="dpsynth-bench-gen-")
    try:
        model_dir = os.path.join(tmp, "model")
        _save_model_dir(preset, length, model_dir)
        out: dict = {"preset": preset, "examples": examples, "length": length, "batch": batch}
        outputs = []
        for kind in ("pinned", "unpinned"):
            times = {}
            for workers in (1, 2):
                lock_dir = os.path.join(tmp, f"locks-{kind}{workers}")  # fresh core claims per job
                os.makedirs(lock_dir)
                path = os.path.join(tmp, f"out-{kind}{workers}")
                times[workers] = _job_time(model_dir, path, workers, examples, length, batch, kind == "pinned", lock_dir)
                outputs.append(open(os.path.join(path, "train.jsonl"), "rb").read())
            steady = bench_steady_state(model_dir, tmp, examples, length, batch, kind == "pinned")
            out[kind] = {"seconds_1_worker": times[1], "seconds_2_workers": times[2], "speedup": times[1] / times[2],
                         **steady}
        out["pinned_2_vs_unpinned_1"] = out["unpinned"]["seconds_1_worker"] / out["pinned"]["seconds_2_workers"]
        out["identical_output"] = all(o == outputs[0] for o in outputs)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--length", type=int, default=256, help="total tokens per row (prompt + generated)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--examples", type=int, default=64, help="examples for the 1-vs-2-worker job")
    p.add_argument("--worker-preset", default="small")
    p.add_argument("--worker-length", type=int, default=128)
    p.add_argument("--skip-workers", action="store_true")
    p.add_argument("--json", default=None, help="also write the results to this file")
    args = p.parse_args(argv)
    results = {}
    r = bench_cache_vs_recompute(args.preset, args.length, args.batch)
    results["kv_cache_vs_recompute"] = r
    print(f"[{r['preset']}, {r['length']} tokens, batch {r['batch']}] KV-cache sampler {r['kv_cache_tokens_per_s']:.0f} tok/s"
          f" vs recompute {r['recompute_tokens_per_s']:.0f} tok/s: ratio {r['ratio']:.1f}x (target >= 10x);"
          f" greedy tokens agree {100 * r['greedy_tokens_agree']:.1f}%", flush=True)
    if not args.skip_workers:
        w = bench_workers(args.worker_preset, args.examples, args.worker_length, args.batch)
        results["workers"] = w
        print(f"[{w['preset']}, {w['examples']} examples x {w['length']} tokens, identical output in all 4 jobs:"
              f" {w['identical_output']}]", flush=True)
        for kind in ("pinned", "unpinned"):
            k = w[kind]
            print(f"  {kind:8s} job: 1 worker {k['seconds_1_worker']:.1f}s vs 2 workers {k['seconds_2_workers']:.1f}s:"
                  f" speedup {k['speedup']:.2f}x (target >= 1.7x); steady state 1 process"
                  f" {k['examples_per_s_1_process']:.2f} ex/s vs 2 processes {k['examples_per_s_2_processes']:.2f} ex/s:"
                  f" {k['steady_speedup']:.2f}x", flush=True)
        print(f"  pinned 2 workers vs unpinned 1 worker (whole job): {w['pinned_2_vs_unpinned_1']:.2f}x", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
