"""User-level DP: rows grouped by user, contribution bounding, batches of users.

With `privacy_unit="user"` the unit of privacy is a person (every row they wrote), not a row:

* **Grouping and bounding** (`group_by_user`): rows are grouped by their user id; a user with
  more than K rows keeps K of them, chosen uniformly at random from a generator seeded by the
  run's secret seed (`SeedSequence([seed, BOUNDING_STREAM])`), so which rows are kept is as
  secret as the noise. The number of rows dropped is a function of the data that is NOT
  protected by DP: it is recorded as a side channel of the privacy report (never noised).
* **Sampling** (`UserBatches`): every step draws users, not rows: Poisson sampling over the
  U users with rate q = B / U (`dpsynth.dp.sampling.poisson_batch`, a per-step stream), or
  cyclic Poisson sampling over users for BandMF (`dpsynth.dp.bandmf.CyclicPoissonSampler`).
  A drawn user contributes all of its kept rows: the batch is a [users, K] matrix of row
  indices, padded with -1 (on a device mesh also with empty users, up to a multiple of its
  data axis: a user's rows stay on one device and the step is unchanged). This is the draw
  of jax-privacy's `batch_selection.UserSelectionStrategy(CyclicPoissonSampling(q), K)`
  (tested equal on the same generator) without its per-user cyclic repeats, which would
  weight a user's rows unequally when it has fewer than K of them.
* **Gradient**: each drawn user's gradient is the mean of its rows' gradients, clipped to C
  (`dpsynth.dp.strategy.UserDPSGDStrategy`).

Formal guarantee: adding or removing one user (with any number of rows) changes the batch
of a step by at most one user-row of the [users, K] matrix, i.e. one clipped term of norm
<= C, so the sum's L2 sensitivity is C under add-or-remove-one-user adjacency, and user-level
DP-SGD is the Poisson-subsampled Gaussian mechanism over U units: the accounting of
`dpsynth.dp.accounting` with dataset size U (tested equal to jax-privacy's
`DpsgdTrainingAccountant` with U samples and `DpsgdTrainingUserLevelAccountant` with one
unit per user). Delta defaults to 1 / U. The kept-row choice, the batches and the row counts
are sensitive: never log them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from dpsynth.dp import sampling
from dpsynth.errors import DpsynthError

# Tag of the bounding stream (which rows of a heavy user are kept): disjoint from sampling/noise.
BOUNDING_STREAM = 0xB0_0D
PRIVACY_UNITS = ("example", "user")


class UserColumnError(DpsynthError, ValueError):
    """Bad user ids (missing, empty) or a bad contribution bound."""


@dataclasses.dataclass(frozen=True)
class UserGroups:
    """Training rows grouped by user after contribution bounding.

    Attributes:
        slots: int64 [U, W] row indices of each user's kept rows (sorted), padded with -1;
            W = the largest kept count (<= max_examples_per_user).
        max_examples_per_user: K, the bound.
        rows_dropped: rows removed by the bound (a non-DP side channel).
    """

    slots: np.ndarray
    max_examples_per_user: int
    rows_dropped: int

    @property
    def num_users(self) -> int:
        return int(self.slots.shape[0])

    @property
    def rows_kept(self) -> int:
        return int(np.sum(self.slots >= 0))

    def row_users(self, num_rows: int) -> np.ndarray:
        """User index of each kept row, -1 for dropped rows ([num_rows] int64)."""
        out = np.full(num_rows, -1, np.int64)
        users = np.repeat(np.arange(self.num_users), self.slots.shape[1]).reshape(self.slots.shape)
        keep = self.slots >= 0
        out[self.slots[keep]] = users[keep]
        return out


def group_by_user(user_ids: Sequence, max_examples_per_user: int, seed: int) -> UserGroups:
    """Groups rows by `user_ids[i]` and keeps at most K rows per user (chosen with `seed`).

    Users are ordered by their sorted id; ids are compared as given (str or int).

    Raises:
        UserColumnError: an empty dataset, a missing/empty id, or K < 1.
    """
    if int(max_examples_per_user) != max_examples_per_user or max_examples_per_user < 1:
        raise UserColumnError(f"max_examples_per_user must be a positive integer, got {max_examples_per_user}")
    ids = list(user_ids)
    if not ids:
        raise UserColumnError("no rows to group by user")
    for i, u in enumerate(ids):
        if u is None or (isinstance(u, str) and not u.strip()):
            raise UserColumnError(f"row {i}: missing or empty user id")
    _, inverse, counts = np.unique(np.asarray([str(u) for u in ids]), return_inverse=True, return_counts=True)
    order = np.argsort(inverse, kind="stable")
    groups = np.split(order, np.cumsum(counts)[:-1])
    rng = np.random.default_rng(np.random.SeedSequence([int(seed) % (1 << 64), BOUNDING_STREAM]))
    k = int(max_examples_per_user)
    kept = [np.sort(rng.choice(g, size=k, replace=False)) if len(g) > k else g for g in groups]
    width = max(len(g) for g in kept)
    slots = np.full((len(kept), width), -1, np.int64)
    for u, g in enumerate(kept):
        slots[u, : len(g)] = g
    return UserGroups(slots=slots, max_examples_per_user=k, rows_dropped=int(len(ids) - sum(len(g) for g in kept)))


def gather_users(examples: dict[str, np.ndarray], slot_rows: np.ndarray) -> dict[str, np.ndarray]:
    """The rows of a [M, W] slot matrix (-1 = padding) as a user batch.

    Returns arrays of shape [M, W, ...], "example_mask" [M, W] (1 = a real row) and "mask" [M]
    (1 = a real user). Padding slots are copies of row 0 (valid model input; masked out).
    """
    slot_rows = np.asarray(slot_rows, np.int64)
    example_mask = slot_rows >= 0
    safe = np.where(example_mask, slot_rows, 0)
    out = {k: np.asarray(v)[safe] for k, v in examples.items() if k not in ("mask", "example_mask")}
    out["example_mask"] = example_mask.astype(np.float32)
    out["mask"] = example_mask.any(axis=1).astype(np.float32)
    return out


@dataclasses.dataclass(frozen=True)
class UserBatches:
    """Batches of users for one training run, addressed by step (resume-exact).

    Attributes:
        groups: the bounded user groups.
        unit_sampler: a sampler over user indices with `batch_indices(step)` (Poisson:
            `dpsynth.dp.sampling.PoissonSampler` over U units; BandMF: the cyclic sampler).
        microbatch_users: users drawn into each compiled microbatch.
        pad_multiple: each microbatch is padded with empty users (all -1 rows) to a multiple
            of this many users (a mesh's data axis, so it splits evenly over the devices); the
            padding users contribute exactly zero, so the drawn users of each microbatch, and
            the step, are the same for every value.
    """

    groups: UserGroups
    unit_sampler: object
    microbatch_users: int
    pad_multiple: int = 1

    def __post_init__(self):
        if self.microbatch_users < 1 or self.pad_multiple < 1:
            raise ValueError(f"microbatch_users ({self.microbatch_users}) and pad_multiple ({self.pad_multiple}) "
                             "must be >= 1")

    @property
    def rows_per_microbatch(self) -> int:
        """The leading dimension of every slot matrix: microbatch_users rounded up to pad_multiple."""
        return -(-self.microbatch_users // self.pad_multiple) * self.pad_multiple

    def microbatches(self, step: int) -> list[np.ndarray]:
        """[rows_per_microbatch, W] slot matrices of the users drawn at `step` (>= 1 microbatch)."""
        users = np.asarray(self.unit_sampler.batch_indices(step), np.int64)
        out = []
        for chunk in sampling.pad_microbatches(users, self.microbatch_users):
            rows = np.full((self.rows_per_microbatch, self.groups.slots.shape[1]), -1, np.int64)
            real = chunk >= 0
            rows[: len(chunk)][real] = self.groups.slots[chunk[real]]
            out.append(rows)
        return out
