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

3. `--guidance W`: label-guided sampling against unguided sampling of the same rows in one run
   (`dpsynth.generate.sampler`, one contrast prompt per row: the two-label case), tokens/s of the
   generated tokens; the guided call does (1 + C) times the decode work. Target: <= 2.2x the time.

4. `--draw` (only this part runs): the sampler's token draw, inverse transform sampling with one
   uniform per row (`dpsynth.generate.sampler.draw`), against `jax.random.categorical`'s Gumbel-max
   (V uniforms per row): one step's draw on `[batch, vocab]` logits, and the sampler's tokens/s
   with each, unguided and guided.

5. `--phases` (only this part runs): the sampler's decode phases (`SamplerConfig.cache_block`: decode
   loops over a KV cache that grows between them, so a step reads about the length generated so
   far) against one loop over a cache of `max_len` (`cache_block=0`), tokens/s unguided and guided.

6. `--scale`: generation at scale (only this part runs). The `tiny` preset (randomly
   initialised), `--examples` synthetic examples of `--scale-length` tokens, `--workers`
   worker processes (each pinned to `--cores-per-worker` cores), three jobs on the same plan:
   - uninterrupted: wall time, examples/s of the whole job, the sampling rate of one worker
     (its shards after the first, which includes compilation: from the per-shard log lines),
     peak RSS of each worker
     process and of the driver (VmHWM from /proc, polled);
   - interrupted: the same job into a fresh directory, SIGKILLed once `--kill-after-shards`
     shards are written (`--kill worker`: one worker process holding an unfinished shard, the
     job must then fail by itself; `--kill job`: the whole process group), then rerun into the
     same directory (the resume). Checked: every planned shard file exactly once and whole,
     no temporary file left, the shards written before the kill untouched (same inode), the
     resume regenerates only the others, and every output file byte-identical to the
     uninterrupted job's;
   - the peer: the same job with `--peer-workers` workers (default 1; 0 skips it).
   Ratios printed: workers vs the peer (examples/s), and interrupted + resumed vs
   uninterrupted (total wall time).

7. `--peers --gguf FILE [--model DIR]` (only this part runs): the tools users would pick instead, on the
   same real model (issue 56). `--samples` label-prompted synthetic examples (labels alternating over
   `--labels`, the default template "[{label}] ", BOS first) of `--new-tokens` sampled tokens each
   (temperature 1, the full distribution, EOS never ends a row) with dpsynth's sampler on DIR, the
   `dpsynth import-model --gguf FILE` import (made into DIR when it is missing), against, in the peers'
   venv (`.venv-peers`, `make bench-peers`; bench/peers/): llama.cpp (llama-cpp-python) on FILE itself
   with `--threads` threads, one sequence at a time and all of them as parallel sequences of one
   llama_batch (n_seq_max = samples); and transformers' `generate` on CPU torch, FILE loaded with
   `gguf_file=`, one batch. Same prompt ids everywhere. Printed: examples/s and tokens/s of each, peak
   RSS while generating (model loaded), ours against each peer (target >= 1.0x llama.cpp's best, >= 2x
   transformers), and our decode step against its memory-bandwidth bound: bytes of the weights + the KV
   cache a step reads, divided by the copy bandwidth of a large NumPy array measured in the same run.

    .venv/bin/python bench/generate.py [--preset small] [--length 256] [--batch 8]
        [--examples 64] [--skip-workers] [--guidance 1.5]
    .venv/bin/python bench/generate.py --draw --preset cpu --length 72 --batch 64
    .venv/bin/python bench/generate.py --phases --preset cpu --length 512 --batch 64
    .venv/bin/python bench/generate.py --scale --examples 100000 --workers 2 [--kill-after-shards K]
        [--kill worker|job] [--scale-length 64] [--scale-batch 32] [--examples-per-shard 256]
    nice -n 5 .venv/bin/python bench/generate.py --peers --gguf gemma-3-270m-q4_k_m.gguf --model runs/gemma
        [--samples 16] [--new-tokens 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

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


def _best_seconds(fn, *args, repeats: int) -> float:
    """The fastest of `repeats` timed calls of `fn(*args)`, after one untimed call (compilation)."""
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return min(times)


def _sampler_tokens_per_s(config, variables, length: int, batch: int, guidance: float, prompt_len: int,
                          repeats: int, **sampler: Any) -> float:
    """Generated tokens/s of one compiled sampler call on random prompts (one contrast prompt per row when
    guided), every row running to `length` (no EOS)."""
    import numpy as np

    from dpsynth.generate.sampler import Sampler, SamplerConfig, TransformerDecodeModel, example_keys, seed_to_key_data

    rng = np.random.default_rng(1)
    prompts = rng.integers(4, config.vocab_size, size=(batch, prompt_len)).astype(np.int32)
    contrast = rng.integers(4, config.vocab_size, size=(batch, 1, prompt_len)).astype(np.int32)
    args = (variables, prompts, np.full((batch,), prompt_len, np.int32), example_keys(seed_to_key_data(0), range(batch)))
    if guidance:
        args += (contrast, np.full((batch, 1), prompt_len, np.int32))
    sampler = Sampler(TransformerDecodeModel(config), SamplerConfig(
        temperature=1.0, max_len=length, batch_size=batch, prompt_bucket=prompt_len, eos_id=-1, guidance=guidance,
        **sampler))
    return batch * (length - prompt_len) / _best_seconds(sampler.sample_batch, *args, repeats=repeats)


def bench_guided_vs_unguided(preset: str, length: int, batch: int, guidance: float, prompt_len: int = 8,
                             repeats: int = 2) -> dict:
    """Generated tokens/s of the guided sampler (one contrast prompt per row) against the unguided one."""
    config, _, variables = make_model(preset, length)
    out = {"preset": preset, "length": length, "batch": batch, "guidance": guidance}
    for name, w in (("unguided", 0.0), ("guided", guidance)):
        out[f"{name}_tokens_per_s"] = _sampler_tokens_per_s(config, variables, length, batch, w, prompt_len, repeats)
    out["time_ratio"] = out["unguided_tokens_per_s"] / out["guided_tokens_per_s"]
    return out


def bench_draw(preset: str, length: int, batch: int, guidance: float, prompt_len: int = 8, repeats: int = 3) -> dict:
    """The sampler's token draw (`dpsynth.generate.sampler.draw`: inverse transform, one uniform per row)
    against the peer `jax.random.categorical` (Gumbel-max, V uniforms per row): one step's draw alone on
    `[batch, vocab]` logits, and the whole sampler's generated tokens/s with each (unguided and guided)."""
    import jax

    from dpsynth.generate import sampler as sampler_module

    config, _, variables = make_model(preset, length)
    draws = {"ours": sampler_module.draw, "peer": jax.random.categorical}
    logits = jax.random.normal(jax.random.key(1), (batch, config.vocab_size)) * 3
    keys = jax.random.split(jax.random.key(2), batch)
    out = {"preset": preset, "length": length, "batch": batch, "vocab": config.vocab_size, "guidance": guidance}
    for name, fn in draws.items():
        step = jax.jit(lambda k, l, fn=fn: jax.vmap(fn)(k, l))
        out[f"{name}_draw_ms"] = 1e3 * _best_seconds(lambda: [step(keys, logits) for _ in range(16)][-1],
                                                      repeats=repeats) / 16
    for kind, w in (("unguided", 0.0), ("guided", guidance)):
        for name, fn in draws.items():
            sampler_module.draw = fn  # a new Sampler traces the module's `draw` when it compiles
            try:
                out[f"{kind}_{name}_tokens_per_s"] = _sampler_tokens_per_s(config, variables, length, batch, w,
                                                                           prompt_len, repeats)
            finally:
                sampler_module.draw = draws["ours"]
        out[f"{kind}_speedup"] = out[f"{kind}_ours_tokens_per_s"] / out[f"{kind}_peer_tokens_per_s"]
    out["draw_speedup"] = out["peer_draw_ms"] / out["ours_draw_ms"]
    return out


def bench_phases(preset: str, length: int, batch: int, guidance: float, prompt_len: int = 8, repeats: int = 3) -> dict:
    """The sampler's decode phases (`SamplerConfig.cache_block`, default 128: a KV cache that grows
    between decode loops) against the peer `cache_block=0` (one loop over a cache of `max_len`, every
    step reading all of it): generated tokens/s, unguided and guided."""
    from dpsynth.generate.sampler import SamplerConfig, decode_phases

    config, _, variables = make_model(preset, length)
    block = SamplerConfig().cache_block
    out = {"preset": preset, "length": length, "batch": batch, "guidance": guidance, "cache_block": block,
           "phases": len(decode_phases(prompt_len, length, block))}
    for kind, w in (("unguided", 0.0), ("guided", guidance)):
        for name, b in (("phased", block), ("whole", 0)):
            out[f"{kind}_{name}_tokens_per_s"] = _sampler_tokens_per_s(config, variables, length, batch, w, prompt_len,
                                                                       repeats, cache_block=b)
        out[f"{kind}_speedup"] = out[f"{kind}_phased_tokens_per_s"] / out[f"{kind}_whole_tokens_per_s"]
    return out


def copy_bandwidth(nbytes: int = 512 * 2**20, repeats: int = 5) -> float:
    """Bytes/s moved by `np.copyto` of a `nbytes` float32 array (read + write counted), the best of `repeats`."""
    import numpy as np

    a = np.ones(nbytes // 4, np.float32)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best


def _import_gguf(gguf: str, model_dir: str) -> None:
    """`dpsynth import-model --gguf gguf --out model_dir` (as a user runs it)."""
    subprocess.run([sys.executable, "-m", "dpsynth.cli", "import-model", "--gguf", gguf, "--out", model_dir],
                   check=True, env=dict(os.environ, PYTHONPATH=REPO))


def bench_peers(gguf: str, model_dir: str | None, samples: int, new_tokens: int, threads: int,
                labels: tuple[str, ...] = ("positive", "negative"), repeats: int = 1) -> dict:
    """dpsynth's sampler on the imported GGUF model against llama.cpp and transformers on the file itself."""
    import jax
    import numpy as np

    sys.path.insert(0, os.path.join(REPO, "bench", "peers"))
    import common

    from dpsynth.generate.sampler import Sampler, SamplerConfig, TransformerDecodeModel, example_keys, seed_to_key_data
    from dpsynth.models.directory import load_model
    from dpsynth.train import prompts as prompts_lib

    tmp = tempfile.mkdtemp(prefix="dpsynth-bench-peers-")
    try:
        if model_dir is None or not os.path.exists(os.path.join(model_dir, "manifest.json")):
            model_dir = model_dir or os.path.join(tmp, "model")
            _import_gguf(gguf, model_dir)
        t0 = time.perf_counter()
        loaded = load_model(model_dir)
        load_s = time.perf_counter() - t0
        tok, config = loaded.tokenizer, loaded.config
        rows = [prompts_lib.prompt_ids(tok, prompts_lib.DEFAULT_TEMPLATE, labels[i % len(labels)]).tolist()
                for i in range(samples)]
        width = max(len(r) for r in rows)
        ids = np.full((samples, width), tok.pad_id, np.int32)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = r
        lens = np.array([len(r) for r in rows], np.int32)
        # Every row samples exactly new_tokens: the longest prompt sets max_len, shorter ones stop at it too.
        cfg = SamplerConfig(temperature=1.0, max_len=width + new_tokens, batch_size=samples, prompt_bucket=width,
                            eos_id=-1, pad_id=tok.pad_id, banned_ids=(tok.pad_id, tok.bos_id), vocab_limit=tok.vocab_size)
        sampler = Sampler(TransformerDecodeModel(config), cfg)
        keys = example_keys(seed_to_key_data(0), range(samples))
        t0 = time.perf_counter()
        out = jax.block_until_ready(sampler.sample_batch(loaded.variables, ids, lens, keys))  # compile
        compile_s = time.perf_counter() - t0
        common.reset_peak_rss()
        times, cpu = [], []
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            out = jax.block_until_ready(sampler.sample_batch(loaded.variables, ids, lens, keys))
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        generated = int(np.sum(np.asarray(out[1]))) if isinstance(out, tuple) else samples * new_tokens
        ours = {"seconds": min(times), "cpu_s": min(cpu), "generated_tokens": generated, "rows": samples, "load_s": load_s,
                "compile_s": compile_s, "peak_rss": common.peak_rss()}
        # The decode step's memory-bandwidth bound: every weight once (the tied embedding is the output layer)
        # plus the KV cache of all rows (K and V of each layer over the cache's length).
        weight_bytes = sum(x.nbytes for x in jax.tree.leaves(loaded.variables))
        kv_bytes = (2 * config.num_layers * samples * cfg.max_len * config.num_kv_heads * config.head_dim
                    * np.dtype(config.dtype).itemsize)
        bandwidth = copy_bandwidth()
        ours.update(weight_bytes=weight_bytes, kv_bytes=kv_bytes, copy_bandwidth=bandwidth,
                    step_bound_s=(weight_bytes + kv_bytes) / bandwidth, step_s=ours["seconds"] / new_tokens)
        del loaded, sampler
        prompts_path = os.path.join(tmp, "prompts.json")
        with open(prompts_path, "w") as f:
            json.dump(rows, f)
        common_args = ["--gguf", gguf, "--prompts", prompts_path, "--new-tokens", str(new_tokens),
                       "--threads", str(threads)]
        return {"gguf": gguf, "model_dir": model_dir, "samples": samples, "new_tokens": new_tokens, "threads": threads,
                "prompt_width": width, "ours": ours,
                "llama.cpp": common.run_peer("llamacpp_generate.py", common_args),
                "transformers": common.run_peer("hf_generate.py", common_args + ["--repeats", str(repeats)])}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def print_peers(r: dict) -> None:
    def rate(x):
        return x["rows"] / x["seconds"], x["generated_tokens"] / x["seconds"]

    o = r["ours"]
    print(f"[{os.path.basename(r['gguf'])}, {r['samples']} label-prompted samples x {r['new_tokens']} tokens, "
          f"{r['threads']} threads for the peers; prompt width {r['prompt_width']}]", flush=True)
    ex, tps = rate(o)
    print(f"  dpsynth sampler (imported, float32): {ex:.2f} examples/s, {tps:.1f} tokens/s, {o['cpu_s']:.1f} CPU-s; peak RSS"
          f" {_mb(o['peak_rss'])}"
          f" (load {o['load_s']:.0f}s, compile {o['compile_s']:.0f}s)", flush=True)
    peers = []
    for name, variants in (("llama.cpp", ("single", "batched")), ("transformers", (None,))):
        p = r[name]
        if "unavailable" in p:
            print(f"  {name}: not measured: {p['unavailable']}", flush=True)
            continue
        print(f"  {name} versions: {', '.join(f'{k} {v}' for k, v in p['versions'].items())}", flush=True)
        for v in variants:
            x = p[v] if v else p
            pex, ptps = rate(x)
            label = x["peer"] if v is None else f"{name} {x['peer']}"
            peers.append((label, ex / pex, name))
            print(f"  {label}: {pex:.2f} examples/s, {ptps:.1f} tokens/s, {x['cpu_s']:.1f} CPU-s; peak RSS "
                  f"{_mb(x['peak_rss'])}; ours/peer {ex / pex:.2f}x examples/s, {x['cpu_s'] / o['cpu_s']:.2f}x less CPU time",
                  flush=True)
    print(f"  our decode step {1e3 * o['step_s']:.0f} ms vs its memory-bandwidth bound {1e3 * o['step_bound_s']:.0f} ms"
          f" (weights {_mb(o['weight_bytes'])} + KV {_mb(o['kv_bytes'])} at a copy bandwidth of"
          f" {o['copy_bandwidth'] / 1e9:.1f} GB/s): {o['step_bound_s'] / o['step_s']:.2f} of the bound", flush=True)
    best = {}
    for label, ratio, name in peers:
        best[name] = min(best.get(name, (float("inf"), "")), (ratio, label))
    for name, target in (("llama.cpp", 1.0), ("transformers", 2.0)):
        if name in best:
            ratio, label = best[name]
            print(f"ratio ours/{name} (its fastest: {label}): {ratio:.2f}x examples/s, target >= {target:g}x: "
                  f"{'MET' if ratio >= target else 'MISSED'}", flush=True)


def print_phases(r: dict) -> None:
    for kind in ("unguided", "guided"):
        print(f"[{r['preset']}, {r['length']} tokens, batch {r['batch']}] {kind} sampler, {r['phases']} decode phases "
              f"(cache_block {r['cache_block']}) {r[f'{kind}_phased_tokens_per_s']:.0f} tok/s vs one cache of "
              f"max_len (cache_block 0) {r[f'{kind}_whole_tokens_per_s']:.0f} tok/s: {r[f'{kind}_speedup']:.2f}x", flush=True)


def print_draw(r: dict) -> None:
    print(f"[{r['preset']}, vocab {r['vocab']}, batch {r['batch']}] one step's draw: inverse transform "
          f"{r['ours_draw_ms']:.2f} ms vs jax.random.categorical {r['peer_draw_ms']:.2f} ms: {r['draw_speedup']:.1f}x",
          flush=True)
    for kind in ("unguided", "guided"):
        print(f"[{r['preset']}, {r['length']} tokens, batch {r['batch']}] {kind} sampler "
              f"{r[f'{kind}_ours_tokens_per_s']:.0f} tok/s vs {r[f'{kind}_peer_tokens_per_s']:.0f} tok/s with "
              f"jax.random.categorical: {r[f'{kind}_speedup']:.2f}x", flush=True)


def _save_model_dir(preset: str, max_len: int, path: str) -> None:
    import random

    from dpsynth.dp.ledger import PrivacyLedger
    from dpsynth.dp.report import build_report, write_report
    from dpsynth.data.tokenizer_training import train_tokenizer
    from dpsynth.models.directory import save_model

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
        " max_len=%d, cores_per_worker=%d),"
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
                     batch_size={batch}, max_len={length})
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


# ----------------------------------------------------------------------------- generation at scale

_SCALE_JOB = (
    "import sys; sys.path.insert(0, {repo!r})\n"
    "from dpsynth import logs\n"
    "from dpsynth.generate.job import GenerateConfig, generate\n"
    "logs.configure(fmt='%(message)s')\n"
    "generate(GenerateConfig(model_dir={model!r}, out_dir={out!r}, num_examples={examples}, examples_per_shard={per_shard},"
    " batch_size={batch}, max_len={length}, seed=0, cores_per_worker={cores}),"
    " beam_args=['--direct_running_mode=multi_processing', '--direct_num_workers={workers}'])\n"
)
POLL_S = 0.2


def _vm_hwm(pid: int) -> int:
    """Peak resident set size (bytes) of a live process so far, or 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _cpu_ticks(pid: int) -> int:
    """User + system CPU time of a live process so far (clock ticks), or 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


def _shard_files(out: str) -> list[str]:
    d = os.path.join(out, "shards")
    return sorted(n for n in os.listdir(d) if n.endswith(".jsonl")) if os.path.isdir(d) else []


def _run_scale_job(code: str, out: str, log_path: str, lock_dir: str, *, kill_after: int | None = None,
                   kill: str = "worker", timeout_s: float = 24 * 3600) -> dict:
    """Runs one job in its own session; polls its workers' peak RSS; optionally kills it.

    With `kill_after`, once that many shard files exist: `kill="worker"` SIGKILLs one worker
    process (the job must then exit by itself: `dpsynth.beam.workers`), `kill="job"` the whole
    process group.
    """
    from dpsynth.beam.workers import worker_processes

    env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu", TMPDIR=lock_dir)
    with open(log_path, "ab") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    peaks: dict[int, int] = {}
    cpu: dict[int, int] = {}
    driver_peak, killed_at, killed = 0, None, None
    try:
        while proc.poll() is None:
            if time.perf_counter() - t0 > timeout_s:
                raise RuntimeError(f"job still running after {timeout_s:.0f}s (see {log_path})")
            driver_peak = max(driver_peak, _vm_hwm(proc.pid))
            pids = worker_processes(proc.pid)
            busy = {}
            for pid in pids:
                peaks[pid] = max(peaks.get(pid, 0), _vm_hwm(pid))
                ticks = _cpu_ticks(pid)
                busy[pid], cpu[pid] = ticks - cpu.get(pid, ticks), ticks
            if kill_after is not None and killed_at is None and len(_shard_files(out)) >= kill_after:
                killed_at = time.perf_counter()
                if kill == "job":
                    os.killpg(proc.pid, signal.SIGKILL)
                    killed = "job"
                elif busy:  # the busiest worker: one still generating (an idle one has no shard left)
                    victim = max(busy, key=busy.get)
                    os.kill(victim, signal.SIGKILL)
                    killed = f"worker pid {victim}"
            time.sleep(POLL_S)
    finally:
        try:  # whatever is left of the job (nothing, normally)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    end = time.perf_counter()
    return {"rc": proc.returncode, "seconds": end - t0, "worker_peak_rss": sorted(peaks.values()),
            "driver_peak_rss": driver_peak, "killed": killed,
            "exit_after_kill_s": None if killed_at is None else end - killed_at}


def _shard_state(out: str) -> dict[str, tuple[int, str]]:
    """{shard file: (inode, sha256)} of the shard files now in `out`."""
    d = os.path.join(out, "shards")
    state = {}
    for name in _shard_files(out):
        path = os.path.join(d, name)
        with open(path, "rb") as f:
            state[name] = (os.stat(path).st_ino, hashlib.sha256(f.read()).hexdigest())
    return state


_WROTE = re.compile(r"generate: wrote (\S+) \((\d+) examples, ([0-9.]+)s\)")


def _sampling_rate(log_path: str, workers: int) -> float | None:
    """Examples/s of one worker while it samples: from the job log's per-shard lines ("wrote
    NAME (N examples, Ts)"), leaving out the first shard written by each worker (it includes
    the compilation), i.e. the `workers` shards logged first."""
    shards: dict[str, tuple[int, float]] = {}
    with open(log_path, errors="replace") as f:
        for line in f:
            m = _WROTE.search(line)
            if m and m.group(1) not in shards:  # a worker's line may also come back through Beam's log
                shards[m.group(1)] = (int(m.group(2)), float(m.group(3)))
    rest = list(shards.values())[workers:]
    seconds = sum(t for _, t in rest)
    return sum(n for n, _ in rest) / seconds if rest and seconds > 0 else None


def bench_scale(*, examples: int, workers: int, length: int, batch: int, per_shard: int, preset: str = "tiny",
                kill_after: int | None = None, kill: str = "worker", peer_workers: int = 1,
                cores_per_worker: int = 1, keep: str | None = None) -> dict:
    """Generation at scale: throughput, peak memory per worker, an interrupted run resumed."""
    tmp = keep or tempfile.mkdtemp(prefix="dpsynth-bench-gen-scale-")
    os.makedirs(tmp, exist_ok=True)
    try:
        model_dir = os.path.join(tmp, "model")
        if not os.path.isdir(model_dir):
            _save_model_dir(preset, length, model_dir)
        num_shards = -(-examples // per_shard)
        kill_after = kill_after if kill_after is not None else max(1, num_shards // 2)
        if not 1 <= kill_after < num_shards:
            raise ValueError(f"--kill-after-shards must be in [1, {num_shards}) for {num_shards} shards")

        runs = itertools.count()

        def job(name, n_workers, **kw):
            out, locks = os.path.join(tmp, name), os.path.join(tmp, f"locks-{next(runs)}")
            os.makedirs(locks)  # fresh core claims per job
            code = _SCALE_JOB.format(repo=REPO, model=model_dir, out=out, examples=examples, per_shard=per_shard,
                                     batch=batch, length=length, cores=cores_per_worker, workers=n_workers)
            return out, _run_scale_job(code, out, os.path.join(tmp, f"{name}.log"), locks, **kw)

        res: dict = {"preset": preset, "examples": examples, "length": length, "batch": batch,
                     "examples_per_shard": per_shard, "num_shards": num_shards, "workers": workers,
                     "cores_per_worker": cores_per_worker}
        ref_out, ref = job("uninterrupted", workers)
        if ref["rc"] != 0:
            raise RuntimeError(f"uninterrupted job failed (rc {ref['rc']}); see {tmp}/uninterrupted.log")
        ref["examples_per_s"] = examples / ref["seconds"]
        ref["sampling_examples_per_s_per_worker"] = _sampling_rate(os.path.join(tmp, "uninterrupted.log"), workers)
        res["uninterrupted"] = ref

        out, first = job("interrupted", workers, kill_after=kill_after, kill=kill)
        before = _shard_state(out)
        _, resume = job("interrupted", workers)
        after = _shard_state(out)
        ref_state = _shard_state(ref_out)
        leftovers = sorted(n for n in os.listdir(os.path.join(out, "shards")) if not n.endswith(".jsonl"))
        same_files = {}
        for name in ("train.jsonl", "manifest.json", "generation_report.json"):
            with open(os.path.join(out, name), "rb") as a, open(os.path.join(ref_out, name), "rb") as b:
                same_files[name] = a.read() == b.read()
        with open(os.path.join(out, "manifest.json")) as f:
            manifest = json.load(f)
        res["interrupted"] = {
            "first_run": first, "resume": resume, "kill_after_shards": kill_after, "kill": kill,
            "shards_kept": len(before), "shards_regenerated": len(set(after) - set(before)),
            "kept_untouched": all(after.get(n) == v for n, v in before.items()),
            "every_shard_once": sorted(after) == sorted(ref_state) and not leftovers,
            "shards_equal_uninterrupted": {n: v[1] for n, v in after.items()} == {n: v[1] for n, v in ref_state.items()},
            "outputs_identical": same_files,
            "num_examples": manifest["splits"]["train"]["num_examples"],
            "total_seconds": first["seconds"] + resume["seconds"],
        }
        res["interrupted"]["ok"] = (first["rc"] != 0 and resume["rc"] == 0 and res["interrupted"]["kept_untouched"]
                                    and res["interrupted"]["every_shard_once"]
                                    and res["interrupted"]["shards_equal_uninterrupted"]
                                    and all(same_files.values()) and res["interrupted"]["num_examples"] == examples
                                    and 0 < len(before) < num_shards)
        if peer_workers:
            peer_out, peer = job(f"peer-{peer_workers}-workers", peer_workers)
            if peer["rc"] != 0:
                raise RuntimeError(f"peer job failed (rc {peer['rc']}); see {tmp}")
            peer["examples_per_s"] = examples / peer["seconds"]
            peer["sampling_examples_per_s_per_worker"] = _sampling_rate(
                os.path.join(tmp, f"peer-{peer_workers}-workers.log"), peer_workers)
            with open(os.path.join(peer_out, "train.jsonl"), "rb") as a, open(os.path.join(ref_out, "train.jsonl"), "rb") as b:
                peer["identical_output"] = a.read() == b.read()
            res["peer"] = {"workers": peer_workers, **peer}
        return res
    finally:
        if keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


def _mb(n: int) -> str:
    return f"{n / 2**20:.0f} MB"


def print_scale(r: dict) -> None:
    u, i = r["uninterrupted"], r["interrupted"]
    print(f"[{r['preset']}, {r['examples']} examples x {r['length']} tokens, batch {r['batch']}, {r['num_shards']} shards of"
          f" {r['examples_per_shard']}, {r['workers']} workers x {r['cores_per_worker'] or 'all'} core(s)]", flush=True)
    rate = u["sampling_examples_per_s_per_worker"]
    print(f"  uninterrupted: {u['seconds']:.1f}s, {u['examples_per_s']:.1f} examples/s whole job; sampling"
          f" {f'{rate:.1f}' if rate else 'n/a'} examples/s per worker (after its first shard); peak RSS per worker {', '.join(_mb(b) for b in u['worker_peak_rss'])}; driver"
          f" {_mb(u['driver_peak_rss'])}", flush=True)
    f, res = i["first_run"], i["resume"]
    print(f"  interrupted: killed ({f['killed']}) after {i['kill_after_shards']} shards; the job exited"
          f" {f['exit_after_kill_s']:.1f}s later with status {f['rc']} ({f['seconds']:.1f}s), keeping {i['shards_kept']}"
          f" shards{' (it FINISHED before the kill took effect: use more examples or fewer --kill-after-shards)' if f['rc'] == 0 else ''};"
          f" resume {res['seconds']:.1f}s regenerated {i['shards_regenerated']}; every shard once:"
          f" {i['every_shard_once']}, kept shards untouched: {i['kept_untouched']}, outputs byte-identical to the"
          f" uninterrupted job: {all(i['outputs_identical'].values())}; {i['num_examples']} examples: "
          f"{'OK' if i['ok'] else 'FAILED'}", flush=True)
    print(f"  interrupted + resumed vs uninterrupted (wall): {i['total_seconds']:.1f}s vs {u['seconds']:.1f}s:"
          f" {i['total_seconds'] / u['seconds']:.2f}x", flush=True)
    if "peer" in r:
        p = r["peer"]
        print(f"  {r['workers']} workers vs {p['workers']} worker(s) (whole job): {u['examples_per_s']:.1f} vs"
              f" {p['examples_per_s']:.1f} examples/s: {u['examples_per_s'] / p['examples_per_s']:.2f}x"
              + (f"; sampling per worker {u['sampling_examples_per_s_per_worker']:.1f} vs"
                 f" {p['sampling_examples_per_s_per_worker']:.1f} examples/s:"
                 f" {u['sampling_examples_per_s_per_worker'] / p['sampling_examples_per_s_per_worker']:.2f}x"
                 if u["sampling_examples_per_s_per_worker"] and p["sampling_examples_per_s_per_worker"] else "")
              + f"; peer peak RSS"
              f" per worker {', '.join(_mb(b) for b in p['worker_peak_rss'])}; identical output: {p['identical_output']}",
              flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--length", type=int, default=256, help="total tokens per row (prompt + generated)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--examples", type=int, default=None,
                   help="examples for the 1-vs-2-worker job (default 64), or with --scale (default 100000)")
    p.add_argument("--worker-preset", default="small")
    p.add_argument("--worker-length", type=int, default=128)
    p.add_argument("--skip-workers", action="store_true")
    p.add_argument("--guidance", type=float, default=1.5, help="guided vs unguided sampling at this weight (0: skip)")
    p.add_argument("--json", default=None, help="also write the results to this file")
    p.add_argument("--phases", action="store_true",
                   help="only the decode phases (cache_block) against one cache of max_len, unguided and guided")
    p.add_argument("--draw", action="store_true",
                   help="only the token draw: inverse transform vs jax.random.categorical (--preset, --length, "
                        "--batch, --guidance)")
    q = p.add_argument_group("peers on a real model (--peers: only this part runs)")
    q.add_argument("--peers", action="store_true", help="dpsynth vs llama.cpp and transformers on --gguf")
    q.add_argument("--gguf", default=None, help="a GGUF file (make gemma3-gguf: Gemma 3 270M Q4_K_M)")
    q.add_argument("--model", default=None, help="its dpsynth import (made there when missing; default: a temporary one)")
    q.add_argument("--samples", type=int, default=16, help="label-prompted examples")
    q.add_argument("--new-tokens", type=int, default=64, help="sampled tokens per example")
    q.add_argument("--threads", type=int, default=2, help="the peers' threads")
    q.add_argument("--repeats", type=int, default=1, help="timed calls of ours and transformers (best kept)")
    g = p.add_argument_group("generation at scale (--scale: only this part runs)")
    g.add_argument("--scale", action="store_true")
    g.add_argument("--workers", type=int, default=2)
    g.add_argument("--kill-after-shards", type=int, default=None, help="default: half the shards")
    g.add_argument("--kill", choices=("worker", "job"), default="worker",
                   help="SIGKILL one worker process, or the job's whole process group")
    g.add_argument("--peer-workers", type=int, default=1, help="workers of the peer job (0: no peer)")
    g.add_argument("--scale-preset", default="tiny")
    g.add_argument("--scale-length", type=int, default=64, help="total tokens per example")
    g.add_argument("--scale-batch", type=int, default=32)
    g.add_argument("--examples-per-shard", type=int, default=256)
    g.add_argument("--cores-per-worker", type=int, default=1, help="0: unpinned workers")
    g.add_argument("--keep", default=None, help="work in this directory and keep it (default: a temporary one)")
    args = p.parse_args(argv)
    results = {}
    if args.peers:
        if not args.gguf:
            p.error("--peers needs --gguf FILE")
        r = bench_peers(args.gguf, args.model, args.samples, args.new_tokens, args.threads, repeats=args.repeats)
        print("reproduce: nice -n 5 .venv/bin/python bench/generate.py " + " ".join(sys.argv[1:] if argv is None else argv))
        print_peers(r)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"peers": r}, f, indent=2)
        return 0
    if args.scale:
        r = bench_scale(examples=args.examples or 100_000, workers=args.workers, length=args.scale_length,
                        batch=args.scale_batch, per_shard=args.examples_per_shard, preset=args.scale_preset,
                        kill_after=args.kill_after_shards, kill=args.kill, peer_workers=args.peer_workers,
                        cores_per_worker=args.cores_per_worker, keep=args.keep)
        print_scale(r)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"scale": r}, f, indent=2)
        return 0 if r["interrupted"]["ok"] else 1
    for part, run, show in (("phases", bench_phases, print_phases), ("draw", bench_draw, print_draw)):
        if getattr(args, part):  # a part that runs alone
            r = run(args.preset, args.length, args.batch, args.guidance or 1.5)
            show(r)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({part: r}, f, indent=2)
            return 0
    args.examples = args.examples or 64
    r = bench_cache_vs_recompute(args.preset, args.length, args.batch)
    results["kv_cache_vs_recompute"] = r
    print(f"[{r['preset']}, {r['length']} tokens, batch {r['batch']}] KV-cache sampler {r['kv_cache_tokens_per_s']:.0f} tok/s"
          f" vs recompute {r['recompute_tokens_per_s']:.0f} tok/s: ratio {r['ratio']:.1f}x (target >= 10x);"
          f" greedy tokens agree {100 * r['greedy_tokens_agree']:.1f}%", flush=True)
    if args.guidance:
        g = bench_guided_vs_unguided(args.preset, args.length, args.batch, args.guidance)
        results["guided_vs_unguided"] = g
        print(f"[{g['preset']}, {g['length']} tokens, batch {g['batch']}] guided (w {g['guidance']:g}, 1 contrast) "
              f"{g['guided_tokens_per_s']:.0f} tok/s vs unguided {g['unguided_tokens_per_s']:.0f} tok/s: "
              f"{g['time_ratio']:.2f}x the time (target <= 2.2x)", flush=True)
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
