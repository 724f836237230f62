"""The training fixtures (a tiny tokenizer and base model), shared with tests/train."""

import numpy as np

from tests.train.conftest import tiny_base, tiny_corpus  # noqa: F401


class WordTokenizer:
    """Words -> ids (a fixed vocabulary grown on first sight); enough for the suffix-array measures."""

    vocab_size = 200

    def __init__(self):
        self.ids = {}

    def encode_batch(self, texts):
        return [np.array([self.ids.setdefault(w, len(self.ids) + 4) for w in t.split()], np.int64) for t in texts]
