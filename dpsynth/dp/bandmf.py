"""BandMF: DP training with banded matrix-factorisation (correlated) noise, on jax-privacy.

Amplified banded matrix factorisation (Choquette-Choo et al. 2023, arXiv:2306.08153). With a
lower-triangular b-banded strategy matrix C (n x n, columns of L2 norm 1) the noise added at
step t is row t of C^{-1} Z (Z iid Gaussian, std sigma * clip_norm), so the noise of a step
partly cancels the noise of the b-1 steps before it in the running sum of updates. Pieces:

* **Strategy** (`optimized_coefs`): a banded Toeplitz strategy optimised for the run's n steps
  and b bands by `jax_privacy.matrix_factorization.toeplitz.optimize_banded_toeplitz` (mean
  squared error of prefix sums), column-normalised for n. It depends on (n, b) only, never
  on data, and is cached on disk by (n, b) under `cache_dir()`: `$DPSYNTH_CACHE_DIR/bandmf`
  (default `~/.cache/dpsynth/bandmf`), one JSON file per (n, b) with its SHA-256
  (`strategy_sha256`), which the ledger and privacy report record. b = 1 is C = I (DP-SGD).
* **Noise** (`BandMFStrategy`): `jax_privacy.noise_addition.matrix_factorization_privatizer`
  with the streaming C^{-1} (`toeplitz.inverse_as_streaming_matrix(coefs,
  column_normalize_for_n=n)`). Its state (a PRNG key and b - 1 buffers shaped like the
  trainable parameters) lives in `TrainState.noise_state` of the training core, so it is
  saved in every (private) checkpoint and a resumed run continues the same noise sequence.
  The state is secret (it determines future noise): it never leaves the private checkpoint.
* **Sampling** (`CyclicPoissonSampler`): cyclic Poisson sampling with cycle length b:
  units (rows, or users at user level) are assigned to b groups independently and uniformly
  at random once (jax-privacy's `BallsInBinsSampling` assignment, seeded from the secret
  seed), and step t Poisson-samples group t mod b with probability q = B / floor(N / b)
  (jax-privacy's `CyclicPoissonSampling` draw, from the per-step stream of
  `dpsynth.dp.sampling`). Every unit therefore participates only in steps b apart.

Formal guarantee: with C b-banded and column-normalised and every unit's participations at
least b steps apart, the mechanism's privacy loss is that of ceil(n / b) compositions of the
Poisson-subsampled Gaussian mechanism with rate q and noise multiplier sigma (Theorem 4 of
arXiv:2306.08153), under add-or-remove-one-unit adjacency: `dpsynth.dp.accounting.dpsgd_event`
with `cycle_length=b`, equal to jax-privacy's `DpsgdTrainingAccountant` with `cycle_length=b`
(tested). With b = 1 this is DP-SGD exactly (same noise distribution, same epsilon; tested).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax_privacy import batch_selection, noise_addition
from jax_privacy.matrix_factorization import toeplitz

from dpsynth import fileio
from dpsynth.dp import sampling
from dpsynth.dp.strategy import DPSGDStrategy, UserDPSGDStrategy

CACHE_ENV = "DPSYNTH_CACHE_DIR"
CACHE_FORMAT = "dpsynth.bandmf_strategy"
# L-BFGS iterations of the strategy optimisation (jax-privacy's default).
OPTIMIZER_STEPS = 250
# Tag of the stream that assigns units to the b groups of cyclic Poisson sampling.
PARTITION_STREAM = 0xC7C1E
# Tag folded into the training core's key for the privatizer's initial key.
NOISE_STATE_STREAM = 0xBA4D


def cache_dir() -> str:
    """Where optimised strategies are cached: `$DPSYNTH_CACHE_DIR/bandmf` or `~/.cache/dpsynth/bandmf`."""
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "dpsynth")
    return os.path.join(root, "bandmf")


def strategy_sha256(steps: int, bands: int, coefs) -> str:
    """SHA-256 of a strategy (n, b and the float64 coefficients): the ledger's strategy id."""
    c = np.asarray(coefs, np.float64)
    return hashlib.sha256(json.dumps({"steps": int(steps), "bands": int(bands), "coefs": c.tolist()},
                                     sort_keys=True).encode()).hexdigest()


def check_bands(steps: int, bands: int) -> None:
    if int(bands) != bands or bands < 1:
        raise ValueError(f"bands must be a positive integer, got {bands}")
    if int(steps) != steps or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps}")
    if bands > steps:
        raise ValueError(f"bands ({bands}) cannot exceed the number of steps ({steps})")


def _check_coefs(coefs: np.ndarray, bands: int, where: str) -> np.ndarray:
    coefs = np.asarray(coefs, np.float64)
    if coefs.shape != (bands,) or not np.all(np.isfinite(coefs)):
        raise ValueError(f"{where}: expected {bands} finite strategy coefficients, got shape {coefs.shape}")
    if np.any(coefs < 0) or np.any(np.diff(coefs) > 1e-7) or coefs[0] <= 0:
        # The amplified analysis (and jax-privacy's min-sep sensitivity) needs positive,
        # non-increasing Toeplitz coefficients.
        raise ValueError(f"{where}: strategy coefficients must be positive and non-increasing")
    return coefs / np.linalg.norm(coefs)


def optimized_coefs(steps: int, bands: int, *, directory: str | None = None) -> np.ndarray:
    """The banded Toeplitz strategy coefficients for (steps, bands), L2 norm 1 (cached on disk)."""
    check_bands(steps, bands)
    if bands == 1:
        return np.ones(1)
    directory = directory or cache_dir()
    path = os.path.join(directory, f"toeplitz_n{int(steps)}_b{int(bands)}.json")
    if os.path.exists(path):
        data = fileio.read_json(path)
        coefs = _check_coefs(np.asarray(data.get("coefs", []), np.float64), bands, path)
        if data.get("format") != CACHE_FORMAT or data.get("sha256") != strategy_sha256(steps, bands, data["coefs"]):
            raise ValueError(f"{path}: corrupt BandMF strategy cache entry (delete it to re-optimise)")
        return np.asarray(data["coefs"], np.float64)
    raw = toeplitz.optimize_banded_toeplitz(int(steps), int(bands), max_optimizer_steps=OPTIMIZER_STEPS)
    coefs = _check_coefs(np.asarray(raw, np.float64), bands, f"optimised strategy (n={steps}, b={bands})")
    os.makedirs(directory, exist_ok=True)
    data = {"format": CACHE_FORMAT, "steps": int(steps), "bands": int(bands), "coefs": coefs.tolist(),
            "sha256": strategy_sha256(steps, bands, coefs),
            "optimizer": "jax_privacy.matrix_factorization.toeplitz.optimize_banded_toeplitz",
            "max_optimizer_steps": OPTIMIZER_STEPS}
    fileio.write_json(path, data, indent=1, newline=False)
    return coefs


def strategy_matrix(steps: int, coefs) -> np.ndarray:
    """The n x n column-normalised banded Toeplitz strategy C (NumPy; a reference for tests)."""
    coefs = np.asarray(coefs, np.float64)
    c = np.zeros((steps, steps))
    for k, v in enumerate(coefs[:steps]):
        c += np.diag(np.full(steps - k, v), -k)
    return c / np.linalg.norm(c, axis=0, keepdims=True)


@dataclasses.dataclass(frozen=True)
class BandMFStrategy:
    """Clipped sums (per example or per user) plus BandMF correlated noise, / expected batch.

    A `dpsynth.train.core.GradientStrategy` with noise state: the core calls
    `init_noise_state(params, key)` once and `finalize_with_noise_state` every step.

    Attributes:
        clip_norm: C.
        noise_multiplier: sigma; the iid noise Z has std sigma * C before C^{-1}.
        expected_batch_size: B (expected units per step), the divisor.
        coefs: the strategy's Toeplitz coefficients (b of them, L2 norm 1).
        steps: n, the steps the strategy is column-normalised for.
        per_user: clip each user's mean gradient (user level) instead of each example's.
        clipping: how the clipped sum is computed ("vmap" or "ghost", as `DPSGDStrategy`).
    """

    clip_norm: float
    noise_multiplier: float
    expected_batch_size: float
    coefs: tuple[float, ...]
    steps: int
    per_user: bool = False
    clipping: str = "vmap"

    def __post_init__(self):
        check_bands(self.steps, len(self.coefs))
        object.__setattr__(self, "coefs", tuple(float(c) for c in _check_coefs(
            np.asarray(self.coefs), len(self.coefs), "BandMFStrategy")))
        self._terms  # validates C, sigma, B

    @property
    def bands(self) -> int:
        return len(self.coefs)

    @property
    def noise_stddev(self) -> float:
        return float(self.noise_multiplier) * float(self.clip_norm)

    @functools.cached_property
    def _terms(self) -> DPSGDStrategy:
        cls = UserDPSGDStrategy if self.per_user else DPSGDStrategy
        return cls(clip_norm=self.clip_norm, noise_multiplier=self.noise_multiplier,
                   expected_batch_size=self.expected_batch_size, clipping=self.clipping)

    def _privatizer(self, key=None):
        noising = toeplitz.inverse_as_streaming_matrix(jnp.asarray(self.coefs, jnp.float32),
                                                       column_normalize_for_n=int(self.steps))
        # The key only seeds `init`; `update` reads the key carried in the state.
        key = jnp.zeros((2,), jnp.uint32) if key is None else key
        return noise_addition.matrix_factorization_privatizer(noising, stddev=self.noise_stddev, prng_key=key)

    def init_accumulator(self, params):
        return self._terms.init_accumulator(params)

    def accumulate(self, loss_fn, params, frozen, batch, key, acc):
        return self._terms.accumulate(loss_fn, params, frozen, batch, key, acc)

    def init_noise_state(self, params, key):
        """The privatizer's initial state: (key, buffers); `key` is a raw uint32[2] PRNG key."""
        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        return self._privatizer(jax.random.fold_in(key, NOISE_STATE_STREAM)).init(zeros)

    def noisy_sum(self, acc, noise_state):
        """(clipped sum + row t of C^{-1} Z, next noise state), before division."""
        return self._privatizer().update(acc["grad_sum"], noise_state)

    def finalize_with_noise_state(self, acc, params, key, noise_state):
        del params, key  # the noise comes from the privatizer's own key chain
        noisy, noise_state = self.noisy_sum(acc, noise_state)
        return jax.tree.map(lambda g: g / self.expected_batch_size, noisy), noise_state

    def finalize(self, acc, params, key):
        raise TypeError("BandMFStrategy needs its noise state: use it through dpsynth.train.core (TrainState."
                        "noise_state) or call finalize_with_noise_state")


@dataclasses.dataclass(frozen=True)
class CyclicPoissonSampler:
    """Cyclic Poisson batches over N units with cycle length b, addressed by step (resume-exact).

    Attributes:
        num_units: N (examples, or users at user level).
        expected_batch_size: B; q = B / floor(N / b).
        cycle_length: b (the number of bands).
        microbatch_size: fixed microbatch shape (padding -1).
        seed: the secret seed (group assignment and per-step draws).
    """

    num_units: int
    expected_batch_size: float
    cycle_length: int
    microbatch_size: int
    seed: int

    def __post_init__(self):
        if self.cycle_length < 1 or self.num_units < self.cycle_length:
            raise ValueError(f"cyclic Poisson sampling needs 1 <= cycle length ({self.cycle_length}) <= units "
                             f"({self.num_units})")
        if not 0 < self.q <= 1:
            raise ValueError(f"expected batch {self.expected_batch_size} must be in (0, floor(N / b) = "
                             f"{self.num_units // self.cycle_length}]")
        if self.microbatch_size < 1:
            raise ValueError(f"microbatch_size must be >= 1, got {self.microbatch_size}")

    @property
    def q(self) -> float:
        return float(self.expected_batch_size) / (self.num_units // self.cycle_length)

    @functools.cached_property
    def groups(self) -> list[np.ndarray]:
        """The b groups: each unit in one group, independently and uniformly (sensitive)."""
        rng = np.random.default_rng(np.random.SeedSequence([int(self.seed) % (1 << 64), PARTITION_STREAM]))
        assign = batch_selection.BallsInBinsSampling(iterations=self.cycle_length, cycle_length=self.cycle_length)
        return [np.asarray(g, np.int64) for g in assign.batch_iterator(self.num_units, rng=rng)]

    def batch_indices(self, step: int) -> np.ndarray:
        group = self.groups[step % self.cycle_length]
        if len(group) == 0:
            return np.zeros(0, np.int64)
        draw = batch_selection.CyclicPoissonSampling(sampling_prob=min(1.0, self.q), iterations=1)
        (idx,) = draw.batch_iterator(len(group), rng=sampling.step_generator(self.seed, step))
        return np.sort(group[np.asarray(idx, np.int64)])

    def microbatches(self, step: int) -> list[np.ndarray]:
        return sampling.pad_microbatches(self.batch_indices(step), self.microbatch_size)
