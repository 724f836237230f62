"""Training-test fixtures: a small public-like token corpus and tokenizer, toy labelled records and a
`tiny`-preset base model directory for the fine-tuning tests (no real data)."""

import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpsynth.data import token_shards
from dpsynth.data.tokenizer_training import train_tokenizer

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
    tok = train_tokenizer(texts, vocab_size=300)
    tok_path = str(root / "tok.model")
    tok.save(tok_path)
    corpus = root / "clean"
    entries = []
    for i, part in enumerate((texts[:30], texts[30:])):
        docs = [tok.encode(t) for t in part]
        metas = [{"id": f"doc-{i}-{j}"} for j in range(len(part))]
        entries.append(token_shards.write_shard(str(corpus), token_shards.shard_name(i), docs, metas, tok.vocab_size))
    token_shards.write_manifest(str(corpus), name="tiny", shards=entries, vocab_size=tok.vocab_size,
                                tokenizer_sha256=tok.sha256)
    return str(corpus), tok_path, tok


WORDS = ("good great tasty fresh awful bland stale sweet salty crunchy coffee tea bread cookie sauce price "
         "box bag would buy again never ever love hate taste smell flavor texture order shipping the a it was "
         "is and but not very really so too").split()


def make_records(n, seed, prefix="r"):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        label = rng.choice(["great", "other"])
        k = rng.randint(3, 14)
        text = " ".join(rng.choice(WORDS) for _ in range(k))
        out.append({"id": f"{prefix}{i}", "text": text, "label": label})
    return out


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory):
    """(base_dir, tokenizer): a randomly initialised `tiny` model saved as a model directory."""
    from dpsynth.models import Transformer, get_config
    from dpsynth.data.tokenizer_training import train_tokenizer
    from dpsynth.models.directory import save_model

    texts = [r["text"] for r in make_records(400, 123)] + ["[great] [other] great other"] * 20
    tok = train_tokenizer(texts, vocab_size=320)
    config = get_config("tiny", max_len=128)
    variables = Transformer(config).init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))
    base_dir = str(tmp_path_factory.mktemp("base") / "model")
    save_model(base_dir, config, {"params": variables["params"]}, tok,
               extra_manifest={"contamination_sha256": "c0" * 32})
    return base_dir, tok


def assert_each_example_moves_the_clipped_sum_by_at_most_c(loss_fn, params, frozen, batch, clip_norm):
    """Removing any one example (masking it) changes the clipped gradient sum by at most C, and clipping
    is active for every example (its gradient norm is above C): the per-example sensitivity."""
    import optax

    from dpsynth.dp import clipping

    key = jax.random.PRNGKey(0)
    f = jax.jit(lambda b: clipping.clipped_grad_sum(loss_fn, params, frozen, b, key, clip_norm))
    full, _, norms = f(batch)
    assert float(jnp.min(norms)) > clip_norm  # clipping is active for every example
    for drop in range(batch["mask"].shape[0]):
        neighbour = dict(batch, mask=batch["mask"].copy())
        neighbour["mask"][drop] = 0.0
        without, _, _ = f(neighbour)
        diff = float(optax.global_norm(jax.tree.map(jnp.subtract, full, without)))
        assert 0 < diff <= clip_norm * (1 + 1e-4)
