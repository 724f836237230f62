"""Tests for dpsynth.data.tokenizers: the SentencePiece wrapper (special ids, batching, pickling)."""

import random

import numpy as np
import pytest

from dpsynth.data.tokenizer_training import train_tokenizer
from dpsynth.data.tokenizers import BOS_ID, EOS_ID, PAD_ID, Tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    rng = random.Random(0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    texts = [" ".join(rng.choice(words) for _ in range(200)) for _ in range(10)]
    return train_tokenizer(texts, vocab_size=300)


def test_tokenizer_special_ids_roundtrip_and_pickle(tmp_path, tokenizer):
    import pickle

    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
    text = "alpha beta gamma, Ünïcode ✓ 🙂"
    ids = tokenizer.encode(text)
    assert ids.dtype == np.int32 and ids.min() > 3
    assert tokenizer.decode(ids) == text  # byte fallback keeps unseen characters
    assert tokenizer.decode([BOS_ID, *ids, EOS_ID, PAD_ID]) == text
    batch = tokenizer.encode_batch([text, "beta"])
    np.testing.assert_array_equal(batch[0], ids)
    tokenizer.save(str(tmp_path / "m.model"))
    loaded = Tokenizer.load(str(tmp_path / "m.model"))
    assert loaded.sha256 == tokenizer.sha256
    clone = pickle.loads(pickle.dumps(tokenizer))
    np.testing.assert_array_equal(clone.encode(text), ids)


def test_decode_spans_equals_decode_of_each_span(tokenizer):
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, tokenizer.vocab_size, size=400)
    tokens[[5, 6, 100, 399]] = [PAD_ID, BOS_ID, EOS_ID, PAD_ID]  # dropped, as by decode
    starts = np.array([0, 3, 3, 50, 120, 399, 0])
    ends = np.array([10, 3, 101, 200, 400, 400, 400])
    expected = [tokenizer.decode(tokens[a:b]) for a, b in zip(starts, ends)]
    assert tokenizer.decode_spans(tokens, starts, ends) == expected
    assert tokenizer.decode_batch([tokens[a:b] for a, b in zip(starts, ends)]) == expected
    assert tokenizer.decode_batch([]) == [] and tokenizer.decode_spans(tokens, [], []) == []
