"""Fixtures for the DP tests: a tiny tokenizer + `tiny`-preset base model directory and toy data."""

import random

import jax
import jax.numpy as jnp
import pytest

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
    from dpsynth.tokens import train_tokenizer
    from dpsynth.train.checkpoint import save_model

    texts = [r["text"] for r in make_records(400, 123)] + ["[great] [other] great other"] * 20
    tok = train_tokenizer(texts, vocab_size=320)
    config = get_config("tiny", max_len=128)
    variables = Transformer(config).init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))
    base_dir = str(tmp_path_factory.mktemp("base") / "model")
    save_model(base_dir, config, {"params": variables["params"]}, tok,
               extra_manifest={"contamination_sha256": "c0" * 32})
    return base_dir, tok


@pytest.fixture(scope="session", autouse=True)
def _compilation_cache(tmp_path_factory):
    """Reuses identical compiled steps across the tuner runs of one session (resume tests rerun
    the same computation three times); restored afterwards so other test areas are unaffected."""
    old = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
    jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("jax_cache")))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    yield
    jax.config.update("jax_compilation_cache_dir", old[0])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", old[1])
