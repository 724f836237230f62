"""Tests for dpsynth.data.token_shards: the token-shard format (write, read, verify, copy)."""

import json

import numpy as np
import pytest

from dpsynth.data import token_shards


def test_token_dtype_boundaries():
    assert token_shards.token_dtype(65536) == np.dtype("<u2")
    assert token_shards.token_dtype(65537) == np.dtype("<u4")
    with pytest.raises(ValueError):
        token_shards.token_dtype(0)


@pytest.mark.parametrize("vocab_size", [300, 70000])
def test_shard_roundtrip_and_manifest(tmp_path, vocab_size):
    rng = np.random.default_rng(vocab_size)
    docs = [rng.integers(0, vocab_size, size=n) for n in (0, 1, 17, 5)]
    meta = [{"id": f"d{i}\u2028\x85", "label": "x\u2029"} for i in range(len(docs))]  # not line breaks in JSONL
    entry = token_shards.write_shard(str(tmp_path), token_shards.shard_name(0), docs, meta, vocab_size)
    manifest = token_shards.write_manifest(str(tmp_path), name="c", shards=[entry], vocab_size=vocab_size, tokenizer_sha256="h")
    assert manifest["num_tokens"] == 23 and manifest["num_documents"] == 4
    (shard,) = list(token_shards.iter_shards(str(tmp_path)))
    assert shard.tokens.dtype == token_shards.token_dtype(vocab_size)
    for i, d in enumerate(docs):
        np.testing.assert_array_equal(shard.document(i), d)
    assert shard.docs == meta
    whole = token_shards.read_corpus(str(tmp_path))
    assert whole.num_tokens == 23


def test_out_of_range_ids_are_refused(tmp_path):
    with pytest.raises(ValueError, match="does not fit uint16"):
        token_shards.write_shard(str(tmp_path), "s", [np.array([70000])], [{"id": "a"}], 300)
    with pytest.raises(ValueError, match="does not fit"):
        token_shards.write_shard(str(tmp_path), "s", [np.array([-1])], [{"id": "a"}], 300)


def test_corruption_and_version_are_detected(tmp_path):
    entry = token_shards.write_shard(str(tmp_path), "shard-00000", [np.arange(5)], [{"id": "a"}], 300)
    token_shards.write_manifest(str(tmp_path), name="c", shards=[entry], vocab_size=300, tokenizer_sha256="h")
    (tmp_path / "shard-00000.tokens").write_bytes(b"\x00" * 10)
    with pytest.raises(token_shards.FormatError, match="SHA-256"):
        list(token_shards.iter_shards(str(tmp_path)))
    m = json.loads((tmp_path / "manifest.json").read_text())
    m["format_version"] = 99
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(token_shards.FormatError, match="format_version 99"):
        token_shards.read_manifest(str(tmp_path))
    with pytest.raises(token_shards.FormatError, match="missing"):
        token_shards.read_manifest(str(tmp_path / "nowhere"))


def test_copy_shard_is_what_write_shard_writes(tmp_path):
    docs = [np.arange(7), np.arange(3) + 40]
    meta = [{"id": "a\u2028", "label": "1"}, {"id": "b"}]
    entry = token_shards.write_shard(str(tmp_path / "src"), "shard-00000", docs, meta, 300)
    assert token_shards.copy_shard(str(tmp_path / "src"), str(tmp_path / "dst"), entry) == entry
    again = token_shards.write_shard(str(tmp_path / "re"), "shard-00000", docs, meta, 300)
    for suffix in (token_shards.TOKENS_SUFFIX, token_shards.OFFSETS_SUFFIX, token_shards.DOCS_SUFFIX):
        name = "shard-00000" + suffix
        assert (tmp_path / "dst" / name).read_bytes() == (tmp_path / "re" / name).read_bytes()
    assert again == entry
    (tmp_path / "src" / ("shard-00000" + token_shards.DOCS_SUFFIX)).write_bytes(b"{}\n{}\n")
    with pytest.raises(token_shards.FormatError, match="SHA-256"):
        token_shards.copy_shard(str(tmp_path / "src"), str(tmp_path / "dst2"), entry)


def test_verified_docs_parse_as_one_array_and_equal_the_line_parser(tmp_path):
    from dpsynth.fileio import parse_jsonl

    docs = [{"id": "a\u2028b", "label": "x\ny"}, {"id": "c,d", "z": [1, {"e": "}\n{"}]}, {"id": "\u00e9\U0001F600"}]
    entry = token_shards.write_shard(str(tmp_path), "shard-00000", [np.arange(3)] * 3, docs, 100)
    raw = (tmp_path / "shard-00000.docs.jsonl").read_bytes()
    assert token_shards._parse_docs(raw, 3) == parse_jsonl(raw) == docs
    assert token_shards.read_shard(str(tmp_path), entry, "uint16").docs == docs
    # A count that the joined parse does not give falls back to the line parser (and its errors).
    assert token_shards._parse_docs(raw, 4) == docs
    with pytest.raises(ValueError):
        token_shards._parse_docs(b'{"id": "a"}\n{"id": \n', 2)
