import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpsynth.evaluate import classifiers, text

CFG = classifiers.WordCNNConfig(vocab_words=50, embed_dim=8, filters=6, hidden=5, max_len=10)


def _init(cfg=CFG, vocab=52, classes=3):
    m = classifiers.WordCNN(vocab, classes, cfg)
    return m, m.init(jax.random.PRNGKey(0), jnp.zeros((1, cfg.max_len), jnp.int32))


def test_wordcnn_architecture_and_paper_defaults():
    paper = classifiers.WordCNNConfig()
    assert (paper.vocab_words, paper.embed_dim, paper.filters, paper.kernel_size, paper.hidden) == (30_000, 384, 256, 3, 256)
    _, v = _init()
    p = v["params"]
    assert p["embed"]["embedding"].shape == (52, 8)
    assert p["conv"]["kernel"].shape == (3, 8, 6)
    assert p["dense"]["kernel"].shape == (6, 5) and p["out"]["kernel"].shape == (5, 3)


def _reference_forward(p, tokens):
    """Independent NumPy forward: embed, SAME conv (k=3), ReLU, max over non-pad, dense ReLU, out."""
    e = np.asarray(p["embed"]["embedding"])[tokens] * (tokens != 0)[..., None]
    k, b = np.asarray(p["conv"]["kernel"]), np.asarray(p["conv"]["bias"])
    padded = np.pad(e, ((0, 0), (1, 1), (0, 0)))
    conv = np.stack([sum(padded[:, t + j] @ k[j] for j in range(3)) + b for t in range(tokens.shape[1])], axis=1)
    conv = np.maximum(conv, 0)
    masked = np.where((tokens != 0)[..., None], conv, -np.inf).max(1)
    masked = np.where(np.isfinite(masked), masked, 0)
    h = np.maximum(masked @ np.asarray(p["dense"]["kernel"]) + np.asarray(p["dense"]["bias"]), 0)
    return h @ np.asarray(p["out"]["kernel"]) + np.asarray(p["out"]["bias"])


def test_wordcnn_matches_numpy_reference_and_ignores_padding():
    m, v = _init()
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 52, size=(4, 10)).astype(np.int32)
    tokens[1, 6:] = 0
    tokens[3] = 0
    out = np.asarray(m.apply(v, tokens))
    np.testing.assert_allclose(out, _reference_forward(v["params"], tokens), rtol=1e-4, atol=1e-5)
    # Extra padding changes nothing (padding embeds to zero, like SAME padding):
    longer = np.concatenate([tokens, np.zeros((4, 5), np.int32)], axis=1)
    m2 = classifiers.WordCNN(52, 3, classifiers.WordCNNConfig(vocab_words=50, embed_dim=8, filters=6, hidden=5, max_len=15))
    np.testing.assert_allclose(np.asarray(m2.apply(v, longer)), out, rtol=1e-5, atol=1e-6)


def test_featurizers_and_label_map():
    feat = classifiers.WordFeaturizer.fit(["Great tea, great price!", "bad tea"], CFG)
    assert feat.vocab.tokens[:2] == ("great", "tea") and feat.vocab_size == len(feat.vocab.tokens) + 2
    ids = feat(["GREAT unknownword"])
    assert ids.shape == (1, 10) and ids[0, :3].tolist() == [2, text.OOV, 0]
    lm = classifiers.LabelMap.from_labels(["b", "a", "b"])
    assert lm.labels == ("a", "b") and lm.encode(["b", "a"]).tolist() == [1, 0]
    with pytest.raises(ValueError, match="unknown labels"):
        lm.encode(["c"])
    with pytest.raises(ValueError):
        classifiers.WordCNNConfig(filters=0)


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_backbone_classifier_pools_only_real_tokens(tiny_lm, pooling):
    cfg, variables, _ = tiny_lm
    m = classifiers.BackboneClassifier(cfg, 2, pooling)
    tokens = np.array([[2, 10, 11, 12, 0, 0]], np.int32)
    params = m.init(jax.random.PRNGKey(1), tokens)["params"]
    params = {**params, "backbone": variables["params"]}
    out = m.apply({"params": params}, tokens)
    from dpsynth.models import Transformer

    _, hidden = Transformer(cfg).apply(variables, tokens[:, :4], return_hidden=True)
    pooled = hidden[0].mean(0) if pooling == "mean" else hidden[0, -1]
    ref = pooled @ params["head"]["kernel"] + params["head"]["bias"]
    np.testing.assert_allclose(np.asarray(out[0]), np.asarray(ref), rtol=1e-4, atol=1e-5)
