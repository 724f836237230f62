"""Generation report: duplicates, lengths and the memorisation audit against brute force."""

import numpy as np
import pytest

from dpsynth.generate import report as R
from tests.dedup import brute_longest_shared


def test_duplicate_stats():
    d = R.duplicate_stats(["a", "b", "a", "c", "a", "b"])
    assert d == {"num_examples": 6, "num_unique": 3, "num_duplicates": 3, "duplicate_rate": 0.5, "max_copies": 3}
    assert R.duplicate_stats([])["duplicate_rate"] == 0.0


def test_length_stats():
    s = R.length_stats([0, 5, 10, 300], [True, True, False, True], max_len=512)
    assert s["min"] == 0 and s["max"] == 300 and s["empty"] == 1 and s["hit_max_len"] == 1
    assert sum(s["histogram"].values()) == 4 and s["mean"] == pytest.approx(78.75)


def test_memorisation_matches_brute_force():
    pytest.importorskip("dpsynth._native")
    rng = np.random.default_rng(0)
    train = [rng.integers(4, 9, size=rng.integers(5, 40)) for _ in range(12)]
    synth = [rng.integers(4, 9, size=rng.integers(0, 30)) for _ in range(15)]
    train[3] = rng.integers(4, 9, size=35)
    synth.append(np.concatenate([[5, 5], train[3][2:25], [6]]))  # a planted 23-token copy
    stats = R.memorisation_stats(train, synth, min_tokens=8)
    expected = [brute_longest_shared(list(d), [list(t) for t in train]) for d in synth]
    assert stats["longest_shared_tokens"] == max(expected) >= 23
    assert stats["num_sharing_at_least_min"] == sum(e >= 8 for e in expected)


class _Tok:
    def encode_batch(self, texts):
        return [np.asarray([4 + (ord(c) % 20) for c in t], np.int32) for t in texts]


def test_audit_is_separate_from_the_releasable_report(tmp_path):
    pytest.importorskip("dpsynth._native")
    train = tmp_path / "train.jsonl"
    train.write_text('{"text": "the quick brown fox jumps over the lazy dog", "label": "a"}\n'
                     '{"text": "completely different words here", "label": "b"}\n')
    records = {"train": [
        {"text": "xx the quick brown fox jumps over yy", "label": "a", "num_tokens": 9, "finished": True},
        {"text": "nothing", "label": "b", "num_tokens": 1, "finished": False},
    ]}
    dist = {"labels": ["a", "b"], "weights": [0.5, 0.5]}
    audit = R.memorisation_audit(records, tokenizer=_Tok(), train_path=str(train), min_shared_tokens=20)
    assert audit["dp"] is False and "NOT differentially private" in audit["notice"]
    assert audit["longest_shared_tokens"] == len("the quick brown fox jumps over ")
    assert audit["num_sharing_at_least_min"] == 1
    plain = R.generation_report(records, dist)
    assert plain["dp"] is True and "memorisation" not in plain
    # The releasable report cannot even be asked to read D_train.
    with pytest.raises(TypeError):
        R.generation_report(records, dist, tokenizer=_Tok(), train_path=str(train))
