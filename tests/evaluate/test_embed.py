import numpy as np
import pytest

from dpsynth.evaluate import embed


def test_hashing_embedder_is_deterministic_and_similarity_tracks_overlap():
    e = embed.make_embedder("hashing:256")
    x = e.embed(["great tea great price", "great tea good price", "terrible broken blender"])
    assert x.shape == (3, 256) and x.dtype == np.float32
    np.testing.assert_array_equal(x, embed.HashingEmbedder(256).embed(["great tea great price", "great tea good price", "terrible broken blender"]))
    n = x / np.linalg.norm(x, axis=1, keepdims=True)
    assert n[0] @ n[1] > n[0] @ n[2]


def test_unknown_spec_raises():
    with pytest.raises(ValueError, match="unknown embedder"):
        embed.make_embedder("bert")
