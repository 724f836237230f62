"""The training fixtures (a tiny tokenizer and base model), shared with tests/train."""

from tests.train.conftest import tiny_base, tiny_corpus  # noqa: F401
