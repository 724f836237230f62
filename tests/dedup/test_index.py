"""SensitiveIndex: building, one-file save/load, hashes and input checks."""

import numpy as np
import pytest

from dpsynth.data.token_shards import FormatError, TokenShard
from dpsynth.dedup.index import SensitiveIndex


def shard(name, docs, dtype=np.uint16):
    offsets = np.zeros(len(docs) + 1, np.int64)
    np.cumsum([len(d) for d in docs], out=offsets[1:])
    tokens = np.concatenate([np.asarray(d, dtype) for d in docs]) if docs else np.zeros(0, dtype)
    return TokenShard(name, tokens, offsets, [{"id": f"{name}:{i}", "label": "x"} for i in range(len(docs))])


def test_build_concatenates_datasets_in_order(tmp_path):
    idx = SensitiveIndex.build(
        [("train", shard("t0", [[1, 2], [3]])), ("test", shard("e0", [[4, 5, 6]])), ("train", shard("t1", [[]]))]
    )
    assert [(d.name, d.num_examples, d.first_doc) for d in idx.datasets] == [("train", 3, 0), ("test", 1, 3)]
    assert idx.doc_ids == ("t0:0", "t0:1", "t1:0", "e0:0")
    assert idx.tokens.tolist() == [1, 2, 3, 4, 5, 6]
    assert idx.offsets.tolist() == [0, 2, 3, 3, 6]
    assert idx.token_bound == 7 and idx.dataset_of(3).name == "test"

    path = str(tmp_path / "sensitive.npz")
    idx.save(path)
    back = SensitiveIndex.load(path)
    assert back.sha256 == idx.sha256 and back.doc_ids == idx.doc_ids and back.datasets == idx.datasets
    np.testing.assert_array_equal(back.tokens, idx.tokens)
    np.testing.assert_array_equal(back.offsets, idx.offsets)


def test_hash_is_stable_and_content_sensitive():
    a = SensitiveIndex.build([("s", shard("s", [[1, 2, 3]]))])
    b = SensitiveIndex.build([("s", shard("s", [[1, 2, 3]], np.uint32))])
    c = SensitiveIndex.build([("s", shard("s", [[1, 2, 4]]))])
    d = SensitiveIndex.build([("other", shard("s", [[1, 2, 3]]))])
    assert a.sha256 == b.sha256
    assert len({a.sha256, c.sha256, d.sha256}) == 3


def test_load_rejects_corrupt_or_foreign_files(tmp_path):
    idx = SensitiveIndex.build([("s", shard("s", [[1, 2, 3]]))])
    path = tmp_path / "i.npz"
    idx.save(str(path))
    raw = bytearray(path.read_bytes())
    pos = raw.find(bytes([1, 0, 2, 0, 3, 0]))
    raw[pos] = 9
    path.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match="SHA-256|corrupt"):
        SensitiveIndex.load(str(path))
    (tmp_path / "junk.npz").write_bytes(b"not an index")
    with pytest.raises(FormatError):
        SensitiveIndex.load(str(tmp_path / "junk.npz"))
    with pytest.raises(FormatError, match="not found"):
        SensitiveIndex.load(str(tmp_path / "missing.npz"))


def test_bad_inputs_are_named():
    bad = TokenShard("b", np.array([1, 2], np.uint16), np.array([0, 3], np.int64), [{"id": "x"}])
    with pytest.raises(ValueError, match="'s'.*'b'"):
        SensitiveIndex.build([("s", bad)])
    no_id = TokenShard("b", np.array([1], np.uint16), np.array([0, 1], np.int64), [{}])
    with pytest.raises(ValueError, match="no string 'id'"):
        SensitiveIndex.build([("s", no_id)])
    with pytest.raises(ValueError, match="names"):
        SensitiveIndex.build([("", shard("s", [[1]]))])
