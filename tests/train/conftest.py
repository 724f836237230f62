"""A small public-like token corpus and tokenizer for the training tests (no real data)."""

import numpy as np
import pytest

from dpsynth import tokens

_WORDS = ("the a quiet house garden letter morning sister walked read wrote said long evening visit ball "
          "brother mother father friend carriage rain sun river town village hope heart").split()


def _texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(_WORDS, size=int(rng.integers(20, 120)))) + "." for _ in range(n)]


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory):
    """(corpus_dir, tokenizer_path, tokenizer): 60 documents in two shards, vocab ~300."""
    root = tmp_path_factory.mktemp("corpus")
    texts = _texts(60, seed=0)
    tok = tokens.train_tokenizer(texts, vocab_size=300)
    tok_path = str(root / "tok.model")
    tok.save(tok_path)
    corpus = root / "clean"
    entries = []
    for i, part in enumerate((texts[:30], texts[30:])):
        docs = [tok.encode(t) for t in part]
        metas = [{"id": f"doc-{i}-{j}"} for j in range(len(part))]
        entries.append(tokens.write_shard(str(corpus), tokens.shard_name(i), docs, metas, tok.vocab_size))
    tokens.write_manifest(str(corpus), name="tiny", shards=entries, vocab_size=tok.vocab_size,
                          tokenizer_sha256=tok.sha256)
    return str(corpus), tok_path, tok
