"""Fixtures for the Beam job tests: a small SentencePiece model trained on synthetic public text."""

import os
import pathlib
import random

import pytest

from dpsynth.data.tokenizer_training import train_tokenizer

REPO = pathlib.Path(__file__).resolve().parents[2]
WORDS = ("the food was good and the service bad or fine with sauce tea coffee dog cat bread "
         "sweet salty chips box order price taste flavor great other never always quick slow "
         "little big fresh stale happy sad would buy again love hate").split()


def make_text(rng: random.Random, n_words: int) -> str:
    """Synthetic text from a small word list (lines of 8-15 words)."""
    words, out = [], []
    for _ in range(n_words):
        words.append(rng.choice(WORDS))
        if len(words) >= rng.randint(8, 15):
            out.append(" ".join(words) + ".")
            words = []
    if words:
        out.append(" ".join(words) + ".")
    return "\n".join(out)


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory):
    rng = random.Random(0)
    texts = [make_text(rng, 400) for _ in range(20)]
    path = tmp_path_factory.mktemp("tok") / "tok.model"
    train_tokenizer(texts, vocab_size=400).save(str(path))
    return str(path)


@pytest.fixture
def repo_on_path(monkeypatch):
    """Worker processes (multi-process runner, Dask) import dpsynth from the repository root."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return REPO
