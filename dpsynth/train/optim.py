"""Optimizers and learning-rate schedules used by the trainers."""

from __future__ import annotations

import jax.numpy as jnp
import optax

OPTIMIZERS = ("adafactor", "adam")


def rsqrt_schedule(max_lr: float = 0.01):
    """The paper's (T5) schedule: lr(step) = min(max_lr, 1 / sqrt(step)), steps counted from 1."""

    def schedule(count):
        step = jnp.maximum(jnp.asarray(count, jnp.float32) + 1.0, 1.0)
        return jnp.minimum(max_lr, jax_rsqrt(step))

    return schedule


def jax_rsqrt(x):
    return 1.0 / jnp.sqrt(x)


def warmup_cosine_schedule(peak_lr: float, total_steps: int, warmup_steps: int = 0, final_fraction: float = 0.1):
    """Linear warm-up to `peak_lr`, then cosine decay to `final_fraction * peak_lr` at `total_steps`."""
    warmup_steps = max(0, min(warmup_steps, total_steps - 1))
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0 if warmup_steps else peak_lr, peak_value=peak_lr, warmup_steps=warmup_steps,
        decay_steps=max(total_steps, warmup_steps + 1), end_value=final_fraction * peak_lr)


def make_optimizer(name: str = "adafactor", *, learning_rate=None, weight_decay: float = 1e-3,
                   total_steps: int | None = None, warmup_steps: int = 0, grad_clip: float | None = 1.0):
    """Adafactor with the rsqrt schedule (the paper's), or AdamW (for the small presets).

    Args:
      name: "adafactor" or "adam".
      learning_rate: a float or an optax schedule; default rsqrt_schedule(0.01) for Adafactor
        and warm-up + cosine from 3e-3 over `total_steps` (else constant 1e-3) for Adam.
      weight_decay: decoupled weight decay (1e-3 as in the paper).
      grad_clip: global-norm clipping for Adam (None: off); Adafactor clips updates itself.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {OPTIMIZERS}")
    if name == "adafactor":
        lr = rsqrt_schedule(0.01) if learning_rate is None else learning_rate
        return optax.adafactor(learning_rate=lr, weight_decay_rate=weight_decay or None)
    if learning_rate is None:
        learning_rate = warmup_cosine_schedule(3e-3, total_steps, warmup_steps) if total_steps else 1e-3
    chain = [optax.clip_by_global_norm(grad_clip)] if grad_clip else []
    chain.append(optax.adamw(learning_rate, weight_decay=weight_decay))
    return optax.chain(*chain)
