"""Fixed train/valid/test splits of labeled datasets, and fixed subsamples.

Benchmarks ship their splits in different shapes: separate files (Yelp polarity, SST-2), one
file with a split column (Yelp sentences: `split,label,text`), or a single file to be cut
(AG News' `test.csv`). `make_splits` turns the records read from the configured files into
D_train / D_valid / D_test by a `SplitSpec`:

1. `split_column` + `split_values`: the records of a split's file are only those whose
   `split_column` equals `split_values[split]` (e.g. `{train: test, test: dev}` for Yelp
   sentences: the file's `test` rows are D_train and D_valid, its `dev` rows D_test).
2. Missing splits are carved out of train: valid always (when no valid file is given), test
   when `test_fraction > 0`. `holdout: tail` takes the last `valid_fraction` of train as
   valid (the paper's split, and the default); `holdout: hash` assigns each record by a seeded
   hash of its id (`u < test_fraction` -> test, `u < test_fraction + valid_fraction` ->
   valid, else train), so the split does not depend on the file's order (files sorted by
   label, for one) and never changes when records are added elsewhere.
3. `max_{train,valid,test}` keep N records per split: the first N (`subsample: first`) or
   the N with the smallest seeded hash, in file order (`subsample: hash`: a fixed random
   subsample whatever the file's order).

All choices depend only on record ids and `seed`: the same files give the same splits on
every machine and Python hash seed. Nothing here looks at the text.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from dpsynth.errors import DpsynthError

SPLITS = ("train", "valid", "test")
HOLDOUTS = ("tail", "hash")
SUBSAMPLES = ("first", "hash")


class SplitError(DpsynthError, ValueError):
    """An invalid split specification or data that does not fit it (names the split/field)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SplitSpec:
    """How to make D_train / D_valid / D_test (see the module docstring).

    Attributes:
      split_column: a column naming each record's split in its file (None = no filter).
      split_values: split -> the `split_column` value its records must have.
      holdout: "tail" or "hash": how valid (and test) are carved from train.
      valid_fraction: fraction of train held out as valid when no valid file is given.
      test_fraction: fraction of train held out as test (> 0 needs `holdout: hash` and no
        test file).
      seed: seeds the hash holdout and the hash subsample.
      subsample: "first" or "hash": which records `max_*` keep.
    """

    split_column: str | None = None
    split_values: Mapping[str, str] = dataclasses.field(default_factory=dict)
    holdout: str = "tail"
    valid_fraction: float = 0.1
    test_fraction: float = 0.0
    seed: int = 0
    subsample: str = "first"

    def __post_init__(self):
        if self.holdout not in HOLDOUTS:
            raise SplitError(f"holdout must be one of {HOLDOUTS}, got {self.holdout!r}")
        if self.subsample not in SUBSAMPLES:
            raise SplitError(f"subsample must be one of {SUBSAMPLES}, got {self.subsample!r}")
        if not 0.0 < self.valid_fraction < 1.0:
            raise SplitError(f"valid_fraction must be in (0, 1), got {self.valid_fraction}")
        if not 0.0 <= self.test_fraction < 1.0 or self.valid_fraction + self.test_fraction >= 1.0:
            raise SplitError(f"test_fraction must be in [0, 1) and leave room for train, got {self.test_fraction}")
        if self.test_fraction > 0 and self.holdout != "hash":
            raise SplitError("test_fraction > 0 needs holdout: hash")
        unknown = sorted(set(self.split_values) - set(SPLITS))
        if unknown:
            raise SplitError(f"split_values: unknown split(s) {unknown}; known: {', '.join(SPLITS)}")
        if self.split_values and not self.split_column:
            raise SplitError("split_values needs split_column")


def hash_unit(seed: int, purpose: str, record_id: str) -> float:
    """A uniform number in [0, 1) fixed by (seed, purpose, id): SHA-256, not Python's hash."""
    digest = hashlib.sha256(f"{seed}\x00{purpose}\x00{record_id}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") / 2**64


def filter_split(records: Sequence[Mapping[str, Any]], column: str, value: str, where: str) -> list[dict[str, Any]]:
    """The records whose `column` equals `value` (the column is dropped from the result)."""
    out = []
    for r in records:
        if column not in r:
            raise SplitError(f"{where}: record {r.get('id')!r} has no {column!r} field (split_column)")
        if str(r[column]) == value:
            out.append({k: v for k, v in r.items() if k != column})
    return out


def subsample(records: Sequence[dict[str, Any]], n: int, how: str = "first", seed: int = 0) -> list[dict[str, Any]]:
    """`n` records: the first `n`, or the `n` smallest by seeded id hash, kept in file order."""
    if n >= len(records):
        return list(records)
    if how == "first":
        return list(records[:n])
    order = sorted(range(len(records)), key=lambda i: (hash_unit(seed, "subsample", str(records[i]["id"])), i))
    return [records[i] for i in sorted(order[:n])]


def make_splits(
    sources: Mapping[str, Sequence[dict[str, Any]] | None],
    spec: SplitSpec = SplitSpec(),
    max_sizes: Mapping[str, int | None] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """D_train / D_valid / D_test from the records of each configured split's file.

    Args:
      sources: split -> records read from that split's file (`{"id", "text", "label", ...}`),
        None or absent when the split has no file (train is required).
      spec: the split rules.
      max_sizes: split -> N records to keep (None = all).

    Raises:
      SplitError: no train records, a test split that is neither given nor carved, a
        `split_column` missing from a record, or an empty split.
    """
    if not sources.get("train"):
        raise SplitError("train: no records")
    got: dict[str, list[dict[str, Any]]] = {}
    for split in SPLITS:
        records = sources.get(split)
        if records is None:
            continue
        records = [dict(r) for r in records]
        if spec.split_column:
            if split in spec.split_values:
                records = filter_split(records, spec.split_column, str(spec.split_values[split]), split)
            else:
                records = [{k: v for k, v in r.items() if k != spec.split_column} for r in records]
        got[split] = records
    if "test" in got and spec.test_fraction > 0:
        raise SplitError("test_fraction > 0 carves test out of train, but a test file is also given")
    if "test" not in got and spec.test_fraction <= 0:
        raise SplitError("test: give a test file or test_fraction > 0")
    train = got["train"]
    carve_valid = "valid" not in got
    if spec.holdout == "tail":
        if carve_valid:
            n_valid = int(round(len(train) * spec.valid_fraction))
            got["valid"] = train[len(train) - n_valid:]
            train = train[: len(train) - n_valid]
    else:
        kept, valid, test = [], [], []
        for r in train:
            u = hash_unit(spec.seed, "holdout", str(r["id"]))
            if u < spec.test_fraction:
                test.append(r)
            elif carve_valid and u < spec.test_fraction + spec.valid_fraction:
                valid.append(r)
            else:
                kept.append(r)
        train = kept
        if carve_valid:
            got["valid"] = valid
        if spec.test_fraction > 0:
            got["test"] = test
    got["train"] = train
    for split in SPLITS:
        limit = (max_sizes or {}).get(split)
        if limit:
            got[split] = subsample(got[split], int(limit), spec.subsample, spec.seed)
        if not got[split]:
            raise SplitError(f"{split}: no records after splitting")
    return {s: got[s] for s in SPLITS}
