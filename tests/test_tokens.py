"""Tests for dpsynth.tokens: the token-shard format and the SentencePiece wrapper."""

import json
import random

import numpy as np
import pytest

from dpsynth import tokens as tok


@pytest.fixture(scope="module")
def tokenizer():
    rng = random.Random(0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    texts = [" ".join(rng.choice(words) for _ in range(200)) for _ in range(10)]
    return tok.train_tokenizer(texts, vocab_size=300)


def test_token_dtype_boundaries():
    assert tok.token_dtype(65536) == np.dtype("<u2")
    assert tok.token_dtype(65537) == np.dtype("<u4")
    with pytest.raises(ValueError):
        tok.token_dtype(0)


@pytest.mark.parametrize("vocab_size", [300, 70000])
def test_shard_roundtrip_and_manifest(tmp_path, vocab_size):
    rng = np.random.default_rng(vocab_size)
    docs = [rng.integers(0, vocab_size, size=n) for n in (0, 1, 17, 5)]
    meta = [{"id": f"d{i}\u2028\x85", "label": "x\u2029"} for i in range(len(docs))]  # not line breaks in JSONL
    entry = tok.write_shard(str(tmp_path), tok.shard_name(0), docs, meta, vocab_size)
    manifest = tok.write_manifest(str(tmp_path), name="c", shards=[entry], vocab_size=vocab_size, tokenizer_sha256="h")
    assert manifest["num_tokens"] == 23 and manifest["num_documents"] == 4
    (shard,) = list(tok.iter_shards(str(tmp_path)))
    assert shard.tokens.dtype == tok.token_dtype(vocab_size)
    for i, d in enumerate(docs):
        np.testing.assert_array_equal(shard.document(i), d)
    assert shard.docs == meta
    whole = tok.read_corpus(str(tmp_path))
    assert whole.num_tokens == 23


def test_out_of_range_ids_are_refused(tmp_path):
    with pytest.raises(ValueError, match="does not fit uint16"):
        tok.write_shard(str(tmp_path), "s", [np.array([70000])], [{"id": "a"}], 300)
    with pytest.raises(ValueError, match="does not fit"):
        tok.write_shard(str(tmp_path), "s", [np.array([-1])], [{"id": "a"}], 300)


def test_corruption_and_version_are_detected(tmp_path):
    entry = tok.write_shard(str(tmp_path), "shard-00000", [np.arange(5)], [{"id": "a"}], 300)
    tok.write_manifest(str(tmp_path), name="c", shards=[entry], vocab_size=300, tokenizer_sha256="h")
    (tmp_path / "shard-00000.tokens").write_bytes(b"\x00" * 10)
    with pytest.raises(tok.FormatError, match="SHA-256"):
        list(tok.iter_shards(str(tmp_path)))
    m = json.loads((tmp_path / "manifest.json").read_text())
    m["format_version"] = 99
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(tok.FormatError, match="format_version 99"):
        tok.read_manifest(str(tmp_path))
    with pytest.raises(tok.FormatError, match="missing"):
        tok.read_manifest(str(tmp_path / "nowhere"))


def test_tokenizer_special_ids_roundtrip_and_pickle(tmp_path, tokenizer):
    import pickle

    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
    text = "alpha beta gamma, Ünïcode ✓ 🙂"
    ids = tokenizer.encode(text)
    assert ids.dtype == np.int32 and ids.min() > 3
    assert tokenizer.decode(ids) == text  # byte fallback keeps unseen characters
    assert tokenizer.decode([tok.BOS_ID, *ids, tok.EOS_ID, tok.PAD_ID]) == text
    batch = tokenizer.encode_batch([text, "beta"])
    np.testing.assert_array_equal(batch[0], ids)
    tokenizer.save(str(tmp_path / "m.model"))
    loaded = tok.Tokenizer.load(str(tmp_path / "m.model"))
    assert loaded.sha256 == tokenizer.sha256
    clone = pickle.loads(pickle.dumps(tokenizer))
    np.testing.assert_array_equal(clone.encode(text), ids)


def test_train_tokenizer_rejects_empty_text():
    with pytest.raises(ValueError, match="no non-empty lines"):
        tok.train_tokenizer(["", "  \n "], vocab_size=300)


def test_sample_lines_is_bounded_in_bytes_and_lines_and_keeps_corpus_order():
    rng = random.Random(1)
    texts = ["\n".join("x" * rng.randint(1, 300) + f" {i}-{j}" for j in range(50)) for i in range(40)]
    lines = [ln for t in texts for ln in t.splitlines()]
    sample = tok.sample_lines(texts, max_bytes=20_000, seed=3)
    assert 0 < sum(len(s.encode()) for s in sample) <= 20_000
    positions = [lines.index(s) for s in sample]
    assert positions == sorted(positions)  # corpus order
    assert sample == tok.sample_lines(texts, max_bytes=20_000, seed=3)  # deterministic
    assert len(tok.sample_lines(texts, max_bytes=10**9, max_lines=7, seed=3)) == 7
    assert tok.sample_lines(texts, max_bytes=10**9, seed=3) == lines  # everything fits: all lines
    assert tok.sample_lines(["a\n" + "b" * 50, "c"], max_bytes=100, max_line_bytes=10) == ["a", "c"]
    with pytest.raises(ValueError):
        tok.sample_lines(texts, max_bytes=0)


def test_sample_lines_does_not_favour_short_lines():
    # Half the lines are 10x longer; a sample of a quarter of the bytes keeps both kinds at the
    # same rate (a fill-until-full sampler would keep mostly short lines).
    texts = [f"s{i} " + "a" * 20 + f"\nl{i} " + "b" * 200 for i in range(4000)]
    sample = tok.sample_lines(texts, max_bytes=(4000 * 230) // 4, seed=0)
    short = sum(s.startswith("s") for s in sample)
    long = len(sample) - short
    assert long > 100 and 0.85 < short / long < 1.18


def test_sample_lines_memory_follows_the_sample_not_the_corpus():
    import tracemalloc

    def corpus():  # 8 MB of text, streamed
        for i in range(8_000):
            yield "\n".join(f"{i} {j} " + "w" * 95 for j in range(10))

    tracemalloc.start()
    sample = tok.sample_lines(corpus(), max_bytes=1 << 18, seed=0)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert sum(len(s) for s in sample) <= 1 << 18
    assert peak < 1 << 20  # the 256 KiB sample with per-line overhead, not 8 MB


def test_train_tokenizer_uses_lines_longer_than_sentencepiece_accepts():
    from dpsynth.tokens import _sentences, train_tokenizer

    words = [f"w{i % 50}" for i in range(3000)]
    line = " ".join(words)  # ~11 KB on one line: SentencePiece alone would drop it (max 8192 bytes)
    chunks = list(_sentences(line + "\n\n short line \n", 8192))
    assert chunks[-1] == "short line" and " ".join(chunks[:-1]) == line
    assert all(len(c.encode()) <= 8192 for c in chunks)
    tok = train_tokenizer([line], vocab_size=400)  # used to fail: no sentence left
    assert tok.decode(tok.encode("w1 w2 w3")) == "w1 w2 w3"


def test_decode_spans_equals_decode_of_each_span(tokenizer):
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, tokenizer.vocab_size, size=400)
    tokens[[5, 6, 100, 399]] = [tok.PAD_ID, tok.BOS_ID, tok.EOS_ID, tok.PAD_ID]  # dropped, as by decode
    starts = np.array([0, 3, 3, 50, 120, 399, 0])
    ends = np.array([10, 3, 101, 200, 400, 400, 400])
    expected = [tokenizer.decode(tokens[a:b]) for a, b in zip(starts, ends)]
    assert tokenizer.decode_spans(tokens, starts, ends) == expected
    assert tokenizer.decode_batch([tokens[a:b] for a, b in zip(starts, ends)]) == expected
    assert tokenizer.decode_batch([]) == [] and tokenizer.decode_spans(tokens, [], []) == []


def test_copy_shard_is_what_write_shard_writes(tmp_path):
    docs = [np.arange(7), np.arange(3) + 40]
    meta = [{"id": "a\u2028", "label": "1"}, {"id": "b"}]
    entry = tok.write_shard(str(tmp_path / "src"), "shard-00000", docs, meta, 300)
    assert tok.copy_shard(str(tmp_path / "src"), str(tmp_path / "dst"), entry) == entry
    again = tok.write_shard(str(tmp_path / "re"), "shard-00000", docs, meta, 300)
    for suffix in (tok.TOKENS_SUFFIX, tok.OFFSETS_SUFFIX, tok.DOCS_SUFFIX):
        name = "shard-00000" + suffix
        assert (tmp_path / "dst" / name).read_bytes() == (tmp_path / "re" / name).read_bytes()
    assert again == entry
    (tmp_path / "src" / ("shard-00000" + tok.DOCS_SUFFIX)).write_bytes(b"{}\n{}\n")
    with pytest.raises(tok.FormatError, match="SHA-256"):
        tok.copy_shard(str(tmp_path / "src"), str(tmp_path / "dst2"), entry)
