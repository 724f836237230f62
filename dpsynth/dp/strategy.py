"""`DPSGDStrategy`: the DP-SGD gradient strategy of the training core (`dpsynth.train.core`).

One DP-SGD step over a Poisson batch B_t (possibly split into padded microbatches):

    g_t = ( sum_{i in B_t} clip_C(grad l_i(params)) + N(0, sigma^2 C^2 I) ) / (q N)

* `accumulate` adds the clipped per-example gradients of one microbatch
  (`dpsynth.dp.clipping.clipped_grad_sum`; padding rows contribute exactly zero). With an
  `embedding` declaration (`dpsynth.dp.sparse.EmbeddingSpec`) the loss must be a
  `dpsynth.dp.sparse.EmbeddedLoss` and the same clipped sum is computed without per-example
  copies of the embedding table's gradient (`clipped_grad_sum_sparse_embedding`);
* `finalize` adds Gaussian noise once per step with `jax_privacy.noise_addition`'s
  `gaussian_privatizer` (standard deviation sigma * C), keyed by `fold_in(key, NOISE_STREAM)`
  where `key` is the core's finalize key of the step (`fold_in(fold_in(rng, step), 1)`): it is
  independent of the loss keys and of the NumPy Poisson sampling stream, and never repeats
  across steps or resumes (the step is checkpointed);
* the noisy sum is divided by the EXPECTED batch size q N (a constant), not by the realised
  batch size, which would itself be a non-private function of the data.

Formal guarantee: with `noise_multiplier` sigma > 0, if the batch was drawn by Poisson
sampling with rate q (`dpsynth.dp.sampling`) and `loss_fn` is per-example separable, each
step is the Poisson-subsampled Gaussian mechanism with L2 sensitivity C (add-or-remove one
example) and noise multiplier sigma; the optimizer update is post-processing. The sequence
of T steps is then (epsilon, delta)-DP with epsilon from
`dpsynth.dp.accounting.epsilon(q, T, sigma, delta)`. `noise_multiplier = 0` gives clipped,
non-private training (epsilon = inf) with the same code path, for baselines.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax_privacy import noise_addition

from dpsynth.dp import clipping, sparse

# Tag folded into the finalize key so the noise stream is disjoint from any other use of it.
NOISE_STREAM = 0x401_5E


@dataclasses.dataclass(frozen=True)
class DPSGDStrategy:
    """Per-example clipping, Gaussian noise, division by the expected batch size.

    Attributes:
        clip_norm: C, the L2 bound on each example's gradient (> 0).
        noise_multiplier: sigma; noise std is sigma * C (0 = no noise, non-private).
        expected_batch_size: q * N, the divisor of the noisy sum (> 0).
        embedding: optional sparse input-embedding declaration; when set, `accumulate` expects
            a `sparse.EmbeddedLoss` with this spec and uses the exact sparse clipping path.
        clipping: how the clipped sum is computed (`clipping.METHODS`): "vmap" (per-example
            gradients, any loss) or "ghost" (`dpsynth.dp.ghost`: same sum, no per-example copies).
    """

    clip_norm: float
    noise_multiplier: float
    expected_batch_size: float
    embedding: sparse.EmbeddingSpec | None = None
    clipping: str = "vmap"

    def __post_init__(self):
        if not self.clip_norm > 0:
            raise ValueError(f"clip_norm must be > 0, got {self.clip_norm}")
        if not self.noise_multiplier >= 0:
            raise ValueError(f"noise_multiplier must be >= 0, got {self.noise_multiplier}")
        if not self.expected_batch_size > 0:
            raise ValueError(f"expected_batch_size must be > 0, got {self.expected_batch_size}")
        if self.clipping not in clipping.METHODS:
            raise ValueError(f"clipping must be one of {clipping.METHODS}, got {self.clipping!r}")
        if self.clipping != "vmap" and self.embedding is not None:
            raise ValueError("the sparse-embedding path has its own clipping: use clipping='vmap' with it")

    @property
    def noise_stddev(self) -> float:
        return float(self.noise_multiplier) * float(self.clip_norm)

    def init_accumulator(self, params):
        return {"grad_sum": jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params),
                "count": jnp.zeros((), jnp.float32)}

    def accumulate(self, loss_fn, params, frozen, batch, key, acc):
        """Adds the clipped per-example gradients of one microbatch.

        Metrics ("loss_sum", "count", "clipped": examples whose norm exceeded C) are
        non-private monitoring values: they go to local logs only, never into a release.
        """
        mask = batch["mask"].astype(jnp.float32)
        if self.embedding is None:
            grads, losses, norms = clipping.method(self.clipping)(loss_fn, params, frozen, batch, key, self.clip_norm)
        else:
            if not isinstance(loss_fn, sparse.EmbeddedLoss) or loss_fn.spec != self.embedding:
                raise TypeError("DPSGDStrategy(embedding=spec) needs loss_fn = sparse.EmbeddedLoss(spec, ...) "
                                f"with the same spec, got {type(loss_fn).__name__}")
            grads, losses, norms = sparse.clipped_grad_sum_sparse_embedding(
                loss_fn, params, frozen, batch, key, self.clip_norm)
        count = jnp.sum(mask)
        acc = {"grad_sum": jax.tree.map(jnp.add, acc["grad_sum"], grads), "count": acc["count"] + count}
        metrics = {"loss_sum": jnp.sum(losses * mask), "count": count,
                   "clipped": jnp.sum((norms > self.clip_norm) * mask)}
        return acc, metrics

    def noisy_sum(self, acc, key):
        """The clipped sum plus N(0, (sigma C)^2 I), before division (for tests and audits)."""
        if self.noise_multiplier == 0:
            return acc["grad_sum"]
        privatizer = noise_addition.gaussian_privatizer(
            stddev=self.noise_stddev, prng_key=jax.random.fold_in(key, NOISE_STREAM))
        noisy, _ = privatizer.update(acc["grad_sum"], privatizer.init(acc["grad_sum"]))
        return noisy

    def finalize(self, acc, params, key):
        del params
        noisy = self.noisy_sum(acc, key)
        return jax.tree.map(lambda g: g / self.expected_batch_size, noisy)


def user_mean_loss(loss_fn):
    """A loss over users: each user's mean per-example loss over its rows.

    The wrapped batch has arrays [M, W, ...] (M users, W row slots), "example_mask" [M, W]
    and "mask" [M] (`dpsynth.dp.users.gather_users`). The returned per-user losses [M] are
    what the per-unit clipping differentiates, so a user's gradient is the mean of its rows'
    gradients (padding slots weigh exactly 0).
    """

    def fun(params, frozen, batch, key):
        m, w = batch["example_mask"].shape
        flat = {k: v.reshape((m * w,) + v.shape[2:]) for k, v in batch.items() if k not in ("mask", "example_mask")}
        weights = batch["example_mask"].astype(jnp.float32)
        flat["mask"] = weights.reshape(m * w)
        losses, _ = loss_fn(params, frozen, flat, key)
        per_user = jnp.sum(losses.reshape(m, w) * weights, axis=1) / jnp.maximum(jnp.sum(weights, axis=1), 1.0)
        return per_user, {}

    return fun


@dataclasses.dataclass(frozen=True)
class UserDPSGDStrategy(DPSGDStrategy):
    """User-level DP-SGD: each drawn user's mean gradient is clipped to C; noise and divisor as DP-SGD.

    The batch is a user batch (`dpsynth.dp.users.gather_users`): "mask" marks real users,
    "example_mask" their real rows. `expected_batch_size` is the expected number of users
    per step (q U). Metrics "loss_sum"/"count"/"clipped" are per user (local logs only).

    Formal guarantee: adding or removing one user changes exactly one term of the clipped sum
    (its mean gradient, norm <= C), whatever its number of rows, so with Poisson sampling over
    users each step is the subsampled Gaussian mechanism over users (`dpsynth.dp.users`).
    """

    def __post_init__(self):
        super().__post_init__()
        if self.embedding is not None:
            raise ValueError("UserDPSGDStrategy does not support the sparse-embedding path")
        if self.clipping != "vmap":
            raise ValueError("user-level DP-SGD clips each user's mean gradient with the vmapped clipping only")

    def accumulate(self, loss_fn, params, frozen, batch, key, acc):
        if "example_mask" not in batch:
            raise ValueError("user-level DP-SGD needs a user batch with 'example_mask' [M, W] (users.gather_users)")
        return super().accumulate(user_mean_loss(loss_fn), params, frozen, batch, key, acc)
