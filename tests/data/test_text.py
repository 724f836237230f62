"""Tests for dpsynth.data.text: chunked encoding of long documents and range complements."""

import random

import numpy as np
import pytest

from dpsynth.data import text
from dpsynth.data.tokenizer_training import train_tokenizer


def test_split_chunks_partitions_the_text():
    rng = random.Random(0)
    for _ in range(200):
        s = "".join(rng.choice("ab \n") for _ in range(rng.randint(0, 80)))
        size = rng.randint(1, 12)
        chunks = list(text.split_chunks(s, size))
        assert "".join(chunks) == s
        assert all(0 < len(c) <= size for c in chunks)


def test_split_prefers_line_breaks():
    assert list(text.split_chunks("aaaa\nbb\ncc", 6)) == ["aaaa\n", "bb\ncc"]
    assert list(text.split_chunks("aa bb cc", 4)) == ["aa ", "bb ", "cc"]
    with pytest.raises(ValueError):
        list(text.split_chunks("x", 0))


def test_encode_document_matches_whole_encoding_on_line_boundaries():
    words = "pear apple plum fig kiwi lime".split()
    rng = random.Random(1)
    lines = [" ".join(rng.choice(words) for _ in range(8)) for _ in range(40)]
    tokenizer = train_tokenizer(lines, vocab_size=300)
    doc = "\n".join(lines)
    whole = tokenizer.encode(doc)
    np.testing.assert_array_equal(text.encode_document(tokenizer, doc), whole)  # shorter than a chunk
    chunked = text.encode_document(tokenizer, doc, max_chunk_chars=100)
    # Line-aligned chunks: SentencePiece treats a newline as whitespace, so the ids agree.
    np.testing.assert_array_equal(chunked, whole)


@pytest.mark.parametrize("length,ranges,expected", [
    (10, [], [(0, 10)]),
    (10, [(0, 10)], []),
    (10, [(0, 3), (5, 7)], [(3, 5), (7, 10)]),
    (10, [(2, 4), (4, 10)], [(0, 2)]),
    (0, [], []),
])
def test_complement_ranges(length, ranges, expected):
    assert text.complement_ranges(length, ranges) == expected
