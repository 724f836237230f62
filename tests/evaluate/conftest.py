"""Small shared fixtures for the evaluation tests: toy labeled corpora and a tiny LM."""

import numpy as np
import pytest

POS = "great tasty love excellent perfect yummy fresh".split()
NEG = "bad awful stale broken terrible bland soggy".split()
FILLER = "the a food tea coffee it was is and box this my price".split()


def make_records(n: int, seed: int, signal: int = 2, prefix: str = "") -> list[dict]:
    """Two-class toy reviews: `signal` label words among 8 filler words."""
    r = np.random.default_rng(seed)
    out = []
    for i in range(n):
        lab = int(r.integers(2))
        words = list(r.choice(FILLER, 8)) + list(r.choice(POS if lab else NEG, signal))
        r.shuffle(words)
        out.append({"id": f"{prefix}{i}", "text": " ".join(words).capitalize() + ".", "label": "great" if lab else "other"})
    return out


@pytest.fixture(scope="session")
def tiny_lm():
    """A randomly initialised `tiny` Transformer with a tokenizer trained on toy public text."""
    import jax

    from dpsynth.models import Transformer, get_config
    from dpsynth.data.tokenizer_training import train_tokenizer

    texts = [r["text"] for r in make_records(400, 99)] + ["[great] [other] great: other:"] * 5
    tok = train_tokenizer(texts, vocab_size=400)
    cfg = get_config("tiny", vocab_size=tok.vocab_size, max_len=64)
    variables = jax.jit(Transformer(cfg).init)(jax.random.PRNGKey(0), np.zeros((1, 8), np.int32))
    return cfg, variables, tok
