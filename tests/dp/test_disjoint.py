"""`dpsynth.dp.disjoint`: D_valid = D_train (or a copy, or mostly one) is refused; a data-independent split
of data with natural duplicates passes; the hashes stay owner-only."""

import os

import numpy as np
import pytest

from dpsynth.dp import disjoint

COMMON = ["great food .", "good service .", "love it !", "terrible .", "the food was great .", "i love this place .",
          "horrible service .", "yum !"]


def natural(n: int, seed: int, duplicate_share: float = 0.1) -> list[dict]:
    """Records of which about `duplicate_share` are a few short texts repeated Zipf-like (Yelp sentences)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        if rng.random() < duplicate_share:
            t = COMMON[int(rng.zipf(1.5)) % len(COMMON)]
        else:
            t = f"review {i} " + " ".join(rng.choice(list("abcdefghijklmnop"), 8))
        out.append({"id": str(i), "text": t, "label": "pos" if "great" in t or "love" in t else "neg"})
    return out


def split(records, seed: int, valid_share: float = 0.1):
    """A data-independent split: a random permutation (as a per-record hash split would do)."""
    idx = np.random.default_rng(seed).permutation(len(records))
    k = int(len(records) * valid_share)
    return [records[i] for i in idx[k:]], [records[i] for i in idx[:k]]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("share", [0.0, 0.1, 0.4])
def test_a_data_independent_split_with_natural_duplicates_passes(seed, share):
    train, valid = split(natural(4000, seed, share), seed + 100)
    o = disjoint.check_overlap(valid, disjoint.record_hashes(train), where="test")
    assert not o.refused
    if share >= 0.1:  # (the natural duplicates do show up: the check tolerates them, it does not miss them)
        assert o.found > 0


@pytest.mark.parametrize("share", [0.0, 0.1, 0.4])
def test_the_training_set_itself_a_shuffled_copy_or_mostly_it_is_refused(share):
    train, valid = split(natural(4000, 1, share), 2)
    hashes = disjoint.record_hashes(train)
    with pytest.raises(disjoint.OverlapError) as e:
        disjoint.check_overlap(train, hashes, where="--label-source")
    msg = str(e.value)
    assert "\n" not in msg and f"{len(train)} of its {len(train)} records" in msg and "--label-source" in msg
    shuffled = [dict(train[i]) for i in np.random.default_rng(3).permutation(len(train))]
    for r in shuffled:  # whitespace differences are not differences
        r["text"] = "  " + r["text"].replace(" ", "  ") + " "
    with pytest.raises(disjoint.OverlapError):
        disjoint.check_overlap(shuffled, hashes, where="x")
    k = len(valid) // 4
    with pytest.raises(disjoint.OverlapError):  # a D_valid three quarters of which are D_train
        disjoint.check_overlap(valid[:k] + shuffled[: 3 * k], hashes, where="x")


def test_a_label_is_part_of_the_record():
    train = [{"text": f"text {i}", "label": "a"} for i in range(500)]
    relabeled = [{"text": r["text"], "label": "b"} for r in train[:100]]
    assert disjoint.overlap(disjoint.record_hashes(relabeled), disjoint.record_hashes(train)).found == 0


def test_hashes_are_owner_only_and_round_trip(tmp_path):
    records = natural(300, 0)
    path = disjoint.write_hashes(str(tmp_path / "m.private"), records)
    assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(tmp_path / "m.private").st_mode & 0o777 == 0o700
    assert np.array_equal(disjoint.read_hashes(path), np.sort(disjoint.record_hashes(records)))
    assert os.path.getsize(path) == disjoint.HASH_BYTES * len(records)
    (tmp_path / "bad").write_bytes(b"123")
    with pytest.raises(disjoint.OverlapError, match="not a file of 8-byte record hashes"):
        disjoint.read_hashes(str(tmp_path / "bad"))
