"""DP functions run inside each process of a multi-process test (`tests.multiprocess.run`).

Each also runs in the test process itself (1 process x 8 CPU devices), the reference.
"""

from __future__ import annotations

import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dpsynth.dp import seeds, strategy
from dpsynth.train import core, sharding

GLOBAL_ROWS, REAL_ROWS = 16, 11  # one padded microbatch: 11 real examples, 5 padding rows


def seed_case() -> dict:
    """Two `shared_secret_seed` draws, as hashes (the seeds themselves never leave the process)."""
    a, b = seeds.shared_secret_seed(), seeds.shared_secret_seed()
    return {"process": jax.process_index(), "first": hashlib.sha256(str(a).encode()).hexdigest(),
            "second": hashlib.sha256(str(b).encode()).hexdigest()}


def _loss(params, frozen, batch, key):
    """Example i's gradient is x_i * (1, ..., 1): norm |x_i| sqrt(#params)."""
    del frozen, key
    total = sum(jnp.sum(leaf) for leaf in jax.tree.leaves(params))
    return batch["x"] * total, {}


def _one_step(clip_norm: float, noise_multiplier: float, x: float, seed: int) -> dict:
    """One DP-SGD step (SGD, lr 1, divisor 1) from zero parameters: params = -(clipped sum + noise)."""
    mesh = sharding.make_mesh(4, 2)  # 2 processes: each holds 2 rows of `data`; kernels split over `model`
    params = {"layer_0": {"attention": {"q": {"kernel": jnp.zeros((128, 256))}}}, "bias": jnp.zeros((512,))}
    dp = strategy.DPSGDStrategy(clip_norm=clip_norm, noise_multiplier=noise_multiplier, expected_batch_size=1.0)
    fns = core.make_train_functions(_loss, optax.sgd(1.0), dp, mesh=mesh)
    state = fns.init_state(params, rng=seeds.jax_key(seed))
    rows = fns.process_rows(GLOBAL_ROWS)
    batch = {"x": np.full(GLOBAL_ROWS, x, np.float32), "mask": (np.arange(GLOBAL_ROWS) < REAL_ROWS).astype(np.float32)}
    state, metrics = fns.train_step(state, fns.shard_batch({k: v[rows] for k, v in batch.items()},
                                                           global_rows=GLOBAL_ROWS))
    update = -np.concatenate([np.ravel(v) for v in jax.tree.leaves(sharding.gather(state.params))])
    return {"update": update, "count": float(metrics["count"]), "clipped": float(metrics["clipped"]),
            "sharded": not state.params["layer_0"]["attention"]["q"]["kernel"].sharding.is_fully_replicated}


def dp_step_case(clip_norm: float = 0.5, noise_multiplier: float = 3.0, seed: int = 7) -> dict:
    """Clipping (large gradients, no noise) and noise (zero gradients) of one step each."""
    clip = _one_step(clip_norm, 0.0, x=100.0, seed=seed)
    noise = _one_step(clip_norm, noise_multiplier, x=0.0, seed=seed)
    return {"process": jax.process_index(), "processes": jax.process_count(), "sharded": clip["sharded"],
            "clip_update_norm": float(np.linalg.norm(clip["update"])), "count": clip["count"],
            "clipped": clip["clipped"], "noise_var": float(np.var(noise["update"])),
            "noise_mean": float(np.mean(noise["update"])), "noise_size": int(noise["update"].size),
            "noise_head": noise["update"][:2048]}
