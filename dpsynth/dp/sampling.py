"""Poisson batch selection for DP-SGD, with per-step random streams and fixed-shape padding.

Sampling: at step t every training example is in the batch independently with probability
q. We use `jax_privacy.batch_selection.CyclicPoissonSampling` (cycle_length 1 = plain
Poisson sampling) for the draw itself. What it lacks, and we add here:

* **Per-step streams.** jax_privacy draws all steps from one generator, so resuming at step
  t would need the generator state of step t (or a replay of steps 0..t-1). We instead seed
  a fresh generator per step from `SeedSequence([seed, SAMPLING_STREAM, t])`: batch t is a
  pure function of (seed, t), a resumed run draws exactly the batches an uninterrupted run
  would, and no stream is ever reused across steps. The tag `SAMPLING_STREAM` keeps this
  stream disjoint from any other consumer of the same seed; the DP noise uses JAX keys
  (`dpsynth.dp.strategy`), a different generator altogether.
* **Fixed shapes.** The variable-size batch is split into microbatches of a fixed size and
  the last one padded with index -1 (`batch_selection.split_and_pad_global_batch`);
  `mask = index >= 0`. Padding rows are filled with a dummy example and contribute exactly
  zero to the clipped sum (tested), so the accumulate step compiles once.

Batch-size cap: none by default (a large Poisson draw just takes more microbatches). With
`max_batch_size`, a batch above the cap is truncated to a uniformly random subset of the
cap (jax_privacy's truncation) and the accountant is told so: every step is then a
`TruncatedSubsampledGaussianDpEvent` (analysed by the PLD accountant, see
`dpsynth.dp.accounting.dpsgd_event`), so the cap never weakens the stated guarantee.

Formal guarantee: for a fixed (seed, step), the indices returned by `poisson_batch` include
each example independently with probability q (before an optional cap), as the accountant
assumes. The batch indices are sensitive: never log them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jax_privacy import batch_selection

# Tag mixed into every sampling seed so that the sampling stream differs from any other
# stream derived from the same user seed.
SAMPLING_STREAM = 0x5A3D1E


def step_generator(seed: int, step: int) -> np.random.Generator:
    """The dedicated sampling generator of one step: a pure function of (seed, step)."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return np.random.default_rng(np.random.SeedSequence([int(seed) % (1 << 64), SAMPLING_STREAM, int(step)]))


def poisson_batch(
    num_examples: int, q: float, seed: int, step: int, *, max_batch_size: int | None = None
) -> np.ndarray:
    """Indices of the Poisson sample of step `step` (sorted, int64)."""
    if num_examples < 1:
        raise ValueError(f"num_examples must be >= 1, got {num_examples}")
    if not 0.0 < q <= 1.0:
        raise ValueError(f"q must be in (0, 1], got {q}")
    strategy = batch_selection.CyclicPoissonSampling(
        sampling_prob=float(q), iterations=1, truncated_batch_size=max_batch_size
    )
    (indices,) = strategy.batch_iterator(num_examples, rng=step_generator(seed, step))
    return np.sort(indices.astype(np.int64))


def pad_microbatches(indices: np.ndarray, microbatch_size: int) -> list[np.ndarray]:
    """Splits indices into microbatches of exactly `microbatch_size`, padding with -1.

    Always returns at least one microbatch (an empty batch becomes one all-padding
    microbatch, so the step still adds noise).
    """
    if microbatch_size < 1:
        raise ValueError(f"microbatch_size must be >= 1, got {microbatch_size}")
    return [np.asarray(m, dtype=np.int64) for m in batch_selection.split_and_pad_global_batch(
        np.asarray(indices, dtype=np.int64), microbatch_size)]


def gather(examples: dict[str, np.ndarray], indices: np.ndarray) -> dict[str, np.ndarray]:
    """Rows `indices` of a dict of equal-length arrays; -1 rows become copies of row 0 with mask 0.

    The padded rows' content is irrelevant (the mask zeroes their contribution) but must be a
    valid input for the model, hence a real row's shape; the output has a float32 "mask".
    """
    idx = np.asarray(indices, dtype=np.int64)
    mask = idx >= 0
    safe = np.where(mask, idx, 0)
    out = {k: np.asarray(v)[safe] for k, v in examples.items() if k != "mask"}
    out["mask"] = mask.astype(np.float32)
    return out


@dataclasses.dataclass(frozen=True)
class PoissonSampler:
    """Poisson batches of one training set, addressed by step.

    Attributes:
        num_examples: size N of the training set.
        expected_batch_size: q * N.
        microbatch_size: fixed shape of each microbatch.
        seed: sampling seed (the stream of step t is `step_generator(seed, t)`).
        max_batch_size: optional cap (truncation; accounted as truncated Poisson sampling).
    """

    num_examples: int
    expected_batch_size: float
    microbatch_size: int
    seed: int
    max_batch_size: int | None = None

    def __post_init__(self):
        if self.num_examples < 1:
            raise ValueError("empty training set: nothing to sample from")
        if not 0 < self.expected_batch_size <= self.num_examples:
            raise ValueError(
                f"expected batch size {self.expected_batch_size} must be in (0, {self.num_examples}]"
            )
        if self.microbatch_size < 1:
            raise ValueError(f"microbatch_size must be >= 1, got {self.microbatch_size}")
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")

    @property
    def q(self) -> float:
        return self.expected_batch_size / self.num_examples

    def batch_indices(self, step: int) -> np.ndarray:
        return poisson_batch(self.num_examples, self.q, self.seed, step, max_batch_size=self.max_batch_size)

    def microbatches(self, step: int) -> list[np.ndarray]:
        return pad_microbatches(self.batch_indices(step), self.microbatch_size)
