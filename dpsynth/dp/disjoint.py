"""Is D_valid disjoint from D_train? The precondition of a parallel composition (`dpsynth select`).

A DP selection on D_valid composes in PARALLEL with the tuning on D_train only when one record
of D changes D_train or D_valid, never both (`dpsynth.dp.private_selection`). A D_valid that is
D_train, or a copy of it, breaks that: the release is then the sequential composition, and a
report that claims the parallel one overstates the guarantee. This module checks it on exact
duplicates, without keeping any text:

* a record's hash is the first `HASH_BYTES` (8) bytes of the SHA-256 of its normalized
  (text, label) (`record_hash`: whitespace runs collapsed, label as a string). The hashes of
  D_train are computed from `--label-source` (which is D_train) or kept by `dpsynth dp-tune` in
  the run's owner-only private state (`HASHES_FILE` in `MODEL.private/`, `write_hashes`); they
  are NOT DP (a hash of a short text is a dictionary attack away from it) and live only there,
  never in a published directory or a log.
* Real data has natural duplicates ("great food ." many times in Yelp sentences), so a few
  D_valid records found in D_train are expected of a legitimate split. The rule
  (`check_overlap`): under a data-independent split (own files of a shuffled export, a per-record
  hash) a D_valid record and a D_train record are exchangeable, so the chance that a D_valid
  record has an exact copy in D_train is the chance that a D_train record has one among the
  other D_train records: p, estimated by the within-D_train duplicate rate (Laplace-smoothed:
  (d + 1) / (n + 2), d the D_train records whose hash occurs more than once). The number of
  D_valid records found in D_train is then about Binomial(m, p). Allowing `ODDS_TOLERANCE` (2)
  times the predicted odds (a file split is not exactly exchangeable: other periods, other
  sources), the check refuses when P[Binomial(m, q) >= found] < `ALPHA` (1e-6), q the tolerated
  rate: then D_valid shares far more records with D_train than the split explains (it is D_train,
  a copy, or mostly one). A legitimate split is refused with probability below ALPHA when its
  duplicate rate is within the tolerance; what passes can still share a few records with D_train
  (at most the tolerance allows), whose change the selection's sensitivity does not cover: the
  same as any natural duplicate of a data-independent split, where the two copies are two records.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from dpsynth.errors import DpsynthError

HASH_BYTES = 8
HASHES_FILE = "train_record_hashes.u64"  # in the tuning's private state: sorted big-endian uint64, NOT DP
ODDS_TOLERANCE = 2.0
ALPHA = 1e-6
CHECKED, NOT_CHECKED = "checked", "not checked"


class OverlapError(DpsynthError, ValueError):
    """D_valid shares far more records with D_train than a data-independent split explains."""


def normalize(text: Any, label: Any) -> bytes:
    """The bytes a record is hashed by: its text with whitespace runs collapsed, a separator, its label."""
    return (" ".join(str(text).split()) + "\x1f" + str(label)).encode("utf-8")


def record_hash(record: Mapping[str, Any]) -> int:
    """The first `HASH_BYTES` bytes of the SHA-256 of the normalized (text, label), as an integer."""
    return int.from_bytes(hashlib.sha256(normalize(record["text"], record["label"])).digest()[:HASH_BYTES], "big")


def record_hashes(records: Iterable[Mapping[str, Any]]) -> np.ndarray:
    """The records' hashes (uint64, in record order)."""
    return np.fromiter((record_hash(r) for r in records), dtype=np.uint64)


def write_hashes(directory: str, records: Iterable[Mapping[str, Any]]) -> str:
    """Writes D_train's sorted hashes to the owner-only `directory/HASHES_FILE` (0600 in a 0700
    directory); returns the path. `directory` must be private state, never a published directory."""
    from dpsynth import fileio
    from dpsynth.owner_only import FILE_MODE, make_private_dir

    make_private_dir(directory)
    data = np.sort(record_hashes(records)).astype(">u8").tobytes()
    return fileio.write_bytes(os.path.join(directory, HASHES_FILE), data, mode=FILE_MODE)


def read_hashes(path: str) -> np.ndarray:
    """The hashes `write_hashes` wrote (uint64)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) % HASH_BYTES:
        raise OverlapError(f"{path}: not a file of {HASH_BYTES}-byte record hashes ({len(data)} bytes)")
    return np.frombuffer(data, dtype=">u8").astype(np.uint64)


@dataclasses.dataclass(frozen=True)
class Overlap:
    """The counts of one check (non-DP: for the owner's private state and terminal, never published).

    Attributes:
        valid: m, the D_valid records.
        found: the D_valid records whose hash is in D_train.
        train: n, the D_train records.
        train_duplicates: d, the D_train records whose hash occurs more than once in D_train.
        predicted_rate: p = (d + 1) / (n + 2), the predicted rate of D_valid records found in D_train.
        tolerated_rate: q, p's odds times `ODDS_TOLERANCE`.
        p_value: P[Binomial(m, q) >= found].
    """

    valid: int
    found: int
    train: int
    train_duplicates: int
    predicted_rate: float
    tolerated_rate: float
    p_value: float

    @property
    def refused(self) -> bool:
        return self.p_value < ALPHA

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "refused": self.refused, "alpha": ALPHA, "odds_tolerance": ODDS_TOLERANCE,
                "dp": False}


def overlap(valid_hashes: Sequence[int] | np.ndarray, train_hashes: Sequence[int] | np.ndarray) -> Overlap:
    """The counts and the test of `check_overlap` (see the module docstring)."""
    from scipy import stats

    train = np.asarray(train_hashes, dtype=np.uint64)
    valid = np.asarray(valid_hashes, dtype=np.uint64)
    if not train.size:
        raise OverlapError("D_train has no records to compare D_valid with")
    uniq, counts = np.unique(train, return_counts=True)
    dups = int(counts[counts > 1].sum())
    found = int(np.isin(valid, uniq).sum())
    p = (dups + 1) / (train.size + 2)
    odds = ODDS_TOLERANCE * p / (1 - p)
    q = odds / (1 + odds)
    p_value = float(stats.binom.sf(found - 1, valid.size, q)) if found else 1.0
    return Overlap(valid=int(valid.size), found=found, train=int(train.size), train_duplicates=dups,
                   predicted_rate=p, tolerated_rate=q, p_value=p_value)


def check_overlap(valid_records: Sequence[Mapping[str, Any]], train_hashes: np.ndarray, *, where: str) -> Overlap:
    """`overlap` of D_valid's records against D_train's hashes; OverlapError (one line, the counts)
    when D_valid shares far more records with D_train than a data-independent split explains."""
    o = overlap(record_hashes(valid_records), train_hashes)
    if o.refused:
        raise OverlapError(
            f"--valid: {o.found} of its {o.valid} records are exact copies of records of D_train ({where}); a "
            f"data-independent split predicts about {o.predicted_rate * o.valid:.0f} (D_train's own duplicate rate: "
            f"{o.train_duplicates} of {o.train}): D_valid must be disjoint from D_train (a held-out file, not the "
            "training file or a copy of it) for the selection to compose in parallel")
    return o
