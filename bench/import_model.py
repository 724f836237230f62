"""Hugging Face import: time and peak host memory per parameter against a plain safetensors load.

Builds a sharded Llama-shaped checkpoint (random weights; `--d-model`, `--layers`, `--vocab`,
`--shards`) in a temporary directory, then measures, each in a fresh process (so peak RSS is
its own):
  ours: `dpsynth.models.hf_import.inspect` + `load_params` (tensor by tensor into device
        arrays; float32, and bfloat16 from the same float32 files);
  peer: `safetensors.numpy.load_file` of every shard into NumPy (what a converter does first),
and prints seconds, peak-RSS growth per parameter (bytes) and the ours/peer ratios.

Where an accelerator is present (or with --dp-lora on CPU), also: DP-LoRA training tokens/s
on the imported model against the native preset of the same shape (`--dp-lora`).

    .venv/bin/python bench/import_model.py                 # ~60M parameters, a minute on CPU
    .venv/bin/python bench/import_model.py --d-model 1024 --layers 16 --dp-lora
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
REPO = __file__.rsplit("/bench/", 1)[0]
FIXTURE_TOKENIZER = os.path.join(REPO, "tests", "models", "fixtures", "hf", "llama", "tokenizer.json")


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def make_checkpoint(directory: str, d: int, layers: int, vocab: int, shards: int) -> int:
    """Writes config.json, the shards and their index; returns the parameter count."""
    from dpsynth.models import hf_files

    heads, kv, ff = max(1, d // 64), max(1, d // 256), 4 * d
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": d, "intermediate_size": ff,
           "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": 64,
           "vocab_size": vocab, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
           "rope_theta": 500000.0, "bos_token_id": 0, "eos_token_id": 1, "hidden_act": "silu", "dtype": "float32"}
    rng = np.random.default_rng(0)
    names = {"model.embed_tokens.weight": (vocab, d), "lm_head.weight": (vocab, d), "model.norm.weight": (d,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        names.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                      p + "self_attn.q_proj.weight": (heads * 64, d), p + "self_attn.k_proj.weight": (kv * 64, d),
                      p + "self_attn.v_proj.weight": (kv * 64, d), p + "self_attn.o_proj.weight": (d, heads * 64),
                      p + "mlp.gate_proj.weight": (ff, d), p + "mlp.up_proj.weight": (ff, d),
                      p + "mlp.down_proj.weight": (d, ff)})
    order = sorted(names)
    weight_map = {}
    for k in range(shards):
        part = order[k::shards]
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        hf_files.write_safetensors(os.path.join(directory, file),
                                   {n: (0.02 * rng.standard_normal(names[n])).astype(np.float32) for n in part})
        weight_map.update({n: file for n in part})
    with open(os.path.join(directory, hf_files.INDEX_FILE), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f)
    with open(FIXTURE_TOKENIZER, "rb") as src, open(os.path.join(directory, "tokenizer.json"), "wb") as dst:
        dst.write(src.read())
    return int(sum(np.prod(s) for s in names.values()))


def child(kind: str, directory: str) -> dict:
    """One measurement in this (fresh) process."""
    import jax
    import jax.numpy as jnp
    from safetensors.numpy import load_file

    from dpsynth.models import hf_files, hf_import

    jax.block_until_ready(jnp.zeros(1))  # backend up before the baseline: both sides pay only for the load
    base = _rss_mib()
    t0 = time.perf_counter()
    if kind == "peer":
        tensors = {}
        for f in hf_files.checkpoint_files(directory):
            tensors.update(load_file(f))
        n = sum(t.size for t in tensors.values())
    else:
        source = hf_import.inspect(directory, dtype=kind)
        params = hf_import.load_params(source, param_dtype=kind)
        jax.block_until_ready(params)
        n = sum(x.size for x in jax.tree.leaves(params))
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "peak_growth_mib": _rss_mib() - base, "params": int(n)}


def dp_lora_tokens_per_second(directory: str, steps: int, batch: int, seq: int) -> dict:
    """DP-LoRA step throughput: the imported model vs the native preset of the same shape."""
    import jax

    from dpsynth.dp.strategy import DPSGDStrategy
    from dpsynth.models import ModelConfig, Transformer
    from dpsynth.models import hf_import
    from dpsynth.train import core, lm, tune_config, tune_model

    source = hf_import.inspect(directory)
    imported = source.config.replace(lora_rank=8, dtype="bfloat16" if jax.default_backend() != "cpu" else "float32")
    native = ModelConfig(vocab_size=imported.vocab_size, d_model=imported.d_model, num_layers=imported.num_layers,
                         num_heads=imported.num_heads, head_dim=imported.head_dim, d_ff=imported.d_ff,
                         max_len=imported.max_len, mlp="swiglu", lora_rank=8, dtype=imported.dtype)
    rng = np.random.default_rng(0)
    x = rng.integers(4, 300, (batch, seq + 1)).astype(np.int32)
    data = {"inputs": x[:, :-1], "targets": x[:, 1:], "weights": np.ones((batch, seq), np.float32),
            "mask": np.ones((batch,), np.float32)}
    tune = tune_config.TuneConfig(mode="lora", lora_rank=8)
    out = {}
    for name, cfg in (("imported", imported), ("native", native)):
        params = (hf_import.load_params(source) if name == "imported" else
                  Transformer(cfg.base()).init(jax.random.PRNGKey(0), x[:1, :8])["params"])
        variables = tune_model.init_variables(cfg, params, tune)
        p, frozen = lm.split_variables(variables, ("lora",))
        fns = core.make_train_functions(tune_model.make_loss_fn(cfg, tune), tune_model.make_optimizer(tune),
                                        DPSGDStrategy(clip_norm=1.0, noise_multiplier=1.0, expected_batch_size=batch))
        state = fns.init_state(p, frozen, rng=0)
        state, _ = fns.accumulated_step(state, [data])  # compile
        jax.block_until_ready(state.params)
        t0 = time.perf_counter()
        for _ in range(steps):
            state, _ = fns.accumulated_step(state, [data])
        jax.block_until_ready(state.params)
        out[name] = steps * batch * seq / (time.perf_counter() - t0)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--dp-lora", action="store_true", help="also DP-LoRA tokens/s (default: only on accelerators)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--child", choices=["float32", "bfloat16", "peer"], help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.dir)))
        return 0
    with tempfile.TemporaryDirectory() as d:
        n = make_checkpoint(d, args.d_model, args.layers, args.vocab, args.shards)
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".safetensors"))
        print(f"checkpoint: {n / 1e6:.1f}M parameters, {args.shards} float32 shards, {size / 2**20:.0f} MiB")
        results = {}
        for kind in ("peer", "float32", "bfloat16"):
            env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
            proc = subprocess.run([sys.executable, __file__, "--child", kind, "--dir", d], capture_output=True,
                                  text=True, env=env, check=True)
            results[kind] = json.loads(proc.stdout.strip().splitlines()[-1])
        peer = results["peer"]
        print(f"{'load':<34} {'seconds':>8} {'peak RSS growth':>16} {'bytes/param':>12}")
        for kind, label in (("peer", "peer: safetensors.numpy.load_file"), ("float32", "ours: import float32"),
                            ("bfloat16", "ours: import bfloat16")):
            r = results[kind]
            print(f"{label:<34} {r['seconds']:>8.2f} {r['peak_growth_mib']:>12.0f} MiB "
                  f"{r['peak_growth_mib'] * 2**20 / n:>12.2f}")
        for kind in ("float32", "bfloat16"):
            r = results[kind]
            print(f"ratio ours({kind})/peer: time {r['seconds'] / peer['seconds']:.2f}x, "
                  f"peak memory {r['peak_growth_mib'] / max(peer['peak_growth_mib'], 1e-9):.2f}x")
        import jax

        if args.dp_lora or jax.default_backend() != "cpu":
            tps = dp_lora_tokens_per_second(d, args.steps, args.batch_size, args.seq_len)
            print(f"DP-LoRA tokens/s on {jax.default_backend()}: imported {tps['imported']:.0f}, native "
                  f"{tps['native']:.0f}, ratio imported/native {tps['imported'] / tps['native']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
