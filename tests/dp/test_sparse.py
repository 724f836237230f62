"""Sparse-embedding clipping equals brute-force vmap(grad) clipping (dpsynth/dp/sparse.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpsynth.dp import clipping, sparse
from dpsynth.dp.strategy import DPSGDStrategy

VOCAB, D, T, B, H = 50, 8, 12, 6, 5
SPEC = sparse.EmbeddingSpec(param_path=("embed", "embedding"), ids_key="tokens")


def _params(seed=0):
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    return {"embed": {"embedding": jax.random.normal(k[0], (VOCAB, D))},
            "conv": {"kernel": 0.3 * jax.random.normal(k[1], (3, D, H)), "bias": jnp.zeros(H)},
            "out": {"kernel": jax.random.normal(k[2], (H, 3)), "bias": 0.1 * jnp.ones(3)}}


def _from_embedded(rest, frozen, batch, embedded, key):
    """Conv1D(kernel 3) + ReLU, masked mean pool, dense head; the key adds per-example noise."""
    del frozen
    m = (batch["tokens"] != 0)[..., None].astype(jnp.float32)
    x = embedded * m
    x = jax.lax.conv_general_dilated(x, rest["conv"]["kernel"], (1,), "SAME", dimension_numbers=("NWC", "WIO", "NWC"))
    x = jax.nn.relu(x + rest["conv"]["bias"])
    x = (x * m).sum(1) / jnp.maximum(m.sum(1), 1.0)
    logits = x @ rest["out"]["kernel"] + rest["out"]["bias"]
    logits = logits + 0.1 * jax.random.normal(key, logits.shape)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]), None


LOSS = sparse.EmbeddedLoss(SPEC, _from_embedded)


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 8, (B, T)).astype(np.int32)  # small id range: many repeats
    tokens[0, 8:] = 0  # trailing padding positions
    tokens[1] = 5  # one word repeated throughout
    tokens[2, ::2] = 0
    mask = np.ones(B, np.float32)
    mask[-1] = 0.0  # a padding row
    return {"tokens": jnp.asarray(tokens), "y": jnp.asarray(rng.integers(0, 3, B).astype(np.int32)),
            "mask": jnp.asarray(mask)}


def _close(a, b, rtol=1e-4, atol=1e-5):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol), a, b)


def test_split_merge_roundtrip():
    params = _params()
    table, rest = sparse.split_table(params, SPEC.param_path)
    assert "embed" not in rest and table.shape == (VOCAB, D)
    _close(sparse.merge_table(rest, SPEC.param_path, table), params)
    with pytest.raises(KeyError):
        sparse.split_table(params, ("nope",))


def test_norms_match_brute_force():
    params, batch, key = _params(), _batch(), jax.random.PRNGKey(3)
    ref = clipping.global_norms(clipping.per_example_grads(LOSS, params, {}, batch, key))
    _, _, norms = jax.jit(sparse.clipped_grad_sum_sparse_embedding, static_argnums=(0, 5))(
        LOSS, params, {}, batch, key, 1.0)
    np.testing.assert_allclose(np.asarray(norms), np.asarray(ref), rtol=1e-4)


@pytest.mark.parametrize("clip_norm", [1e-3, "median", 1e3])
def test_clipped_sum_matches_dense(clip_norm):
    params, batch, key = _params(1), _batch(1), jax.random.PRNGKey(7)
    ref_norms = np.asarray(clipping.global_norms(clipping.per_example_grads(LOSS, params, {}, batch, key)))
    if clip_norm == "median":  # some examples clipped, some not
        clip_norm = float(np.median(ref_norms[:-1]))
        assert (ref_norms[:-1] > clip_norm).any() and (ref_norms[:-1] < clip_norm).any()
    want, want_losses, _ = clipping.clipped_grad_sum(LOSS, params, {}, batch, key, clip_norm)
    got, losses, norms = sparse.clipped_grad_sum_sparse_embedding(LOSS, params, {}, batch, key, clip_norm)
    scale = max(1.0, float(optax.global_norm(want)))
    _close(got, want, atol=1e-5 * scale)
    np.testing.assert_allclose(np.asarray(losses), np.asarray(want_losses), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(norms), ref_norms, rtol=1e-4)


def test_neighbouring_batch_sensitivity():
    params, batch, key = _params(2), _batch(2), jax.random.PRNGKey(0)
    for clip_norm in (0.05, 0.5, 5.0):
        full, _, _ = sparse.clipped_grad_sum_sparse_embedding(LOSS, params, {}, batch, key, clip_norm)
        for i in range(B - 1):
            removed = dict(batch, mask=batch["mask"].at[i].set(0.0))
            less, _, _ = sparse.clipped_grad_sum_sparse_embedding(LOSS, params, {}, removed, key, clip_norm)
            diff = float(optax.global_norm(jax.tree.map(jnp.subtract, full, less)))
            assert diff <= clip_norm * (1 + 1e-5)


def test_nan_gradient_is_zeroed():
    params, batch = _params(), _batch()
    params["out"]["bias"] = params["out"]["bias"].at[0].set(jnp.nan)
    got, _, _ = sparse.clipped_grad_sum_sparse_embedding(LOSS, params, {}, batch, jax.random.PRNGKey(0), 1.0)
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(got))


def test_strategy_sparse_equals_dense():
    params, batch, key = _params(3), _batch(3), jax.random.PRNGKey(1)
    dense = DPSGDStrategy(clip_norm=0.3, noise_multiplier=1.0, expected_batch_size=4.0)
    sp = DPSGDStrategy(clip_norm=0.3, noise_multiplier=1.0, expected_batch_size=4.0, embedding=SPEC)
    acc_d, m_d = dense.accumulate(LOSS, params, {}, batch, key, dense.init_accumulator(params))
    acc_s, m_s = sp.accumulate(LOSS, params, {}, batch, key, sp.init_accumulator(params))
    _close(acc_s, acc_d)
    _close(m_s, m_d)
    with pytest.raises(TypeError):
        sp.accumulate(lambda p, f, b, k: LOSS(p, f, b, k), params, {}, batch, key, sp.init_accumulator(params))


def test_dp_wordcnn_step_sparse_equals_dense():
    """The DP-on-real WordCNN accumulate step: sparse path == dense vmap(grad) path."""
    from dpsynth.evaluate import classifiers, wordcnn
    from dpsynth.dp.plan import plan_privacy
    from dpsynth.evaluate import trainer as tr

    cfg = classifiers.WordCNNConfig(vocab_words=30, embed_dim=8, filters=6, hidden=5, max_len=10)
    texts = ["good tea good tea", "awful bland coffee", "the price was very very good", "sweet bread again"] * 3
    model = wordcnn.wordcnn_model(texts, 2, cfg)
    x = model.featurize(texts[:6] + ["tea tea tea tea tea tea tea tea tea tea", ""])
    batch = {"x": x, "y": np.array([0, 1, 0, 1, 1, 0, 1, 0], np.int32),
             "mask": np.array([1, 1, 1, 1, 1, 1, 1, 0], np.float32)}
    assert (x == x[:, :1]).all(axis=1).any()  # a row repeating one word
    norms = clipping.global_norms(clipping.per_example_grads(
        tr.classification_loss(model), model.params, {}, batch, jax.random.PRNGKey(0)))
    clip_norm = float(np.median(np.asarray(norms)[:7]))
    trainer = tr.Trainer(model)
    config = tr.TrainConfig(learning_rate=1e-2)
    sums = {}
    for sparse_embedding in (False, True):
        dp = tr.DPConfig(epsilon=1.0, clip_norm=clip_norm, sparse_embedding=sparse_embedding)
        plan = plan_privacy(dataset_size=80, expected_batch_size=8.0, steps=1, noise_multiplier=1.0)
        strategy, _ = trainer.dp_mechanism(dp, plan, num_units=80, seed=0)
        assert (strategy.embedding is not None) == sparse_embedding
        fns = trainer.fns(strategy, key=("test", sparse_embedding))
        state = trainer._init_state(fns, config)
        acc, metrics = fns.accumulate_step(state, fns.init_accumulator(state), fns.shard_batch(batch))
        sums[sparse_embedding] = (jax.device_get(acc), jax.device_get(metrics))
    assert 0 < sums[True][1]["clipped"] < 7  # some examples clipped, some not
    _close(sums[True], sums[False])
