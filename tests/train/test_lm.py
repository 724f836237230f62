import jax
import jax.numpy as jnp
import numpy as np

from dpsynth.train import lm


def test_cross_entropy_and_z_loss_against_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 7)).astype(np.float32) * 3
    targets = rng.integers(0, 7, (2, 3))
    ce, z = lm.cross_entropy_with_z_loss(jnp.asarray(logits), jnp.asarray(targets), z_loss=1e-4)
    log_z = np.log(np.exp(logits.astype(np.float64)).sum(-1))
    ref_ce = log_z - np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(ce, ref_ce, rtol=1e-5)
    np.testing.assert_allclose(z, 1e-4 * log_z**2, rtol=1e-5)


def test_lm_loss_is_weighted_mean_per_example():
    vocab = 5

    class Fake:  # a "model" whose logits are fixed per token id
        table = jnp.asarray(np.random.default_rng(1).normal(size=(vocab, vocab)), jnp.float32)

        def apply(self, variables, inputs, segment_ids=None, positions=None):
            return self.table[inputs] * variables["params"]["s"]

    loss_fn = lm.make_lm_loss(Fake(), z_loss=0.0)
    inputs = jnp.asarray([[1, 2, 3, 4], [0, 1, 2, 3]])
    targets = jnp.asarray([[2, 3, 4, 0], [1, 2, 3, 4]])
    weights = jnp.asarray([[1, 1, 0, 0], [0, 0, 0, 1.0]])
    per_example, aux = loss_fn({"params": {"s": 1.0}}, {}, {"inputs": inputs, "targets": targets,
                                                             "weights": weights, "mask": jnp.ones(2)}, None)
    ce, _ = lm.cross_entropy_with_z_loss(Fake.table[inputs], targets, 0.0)
    np.testing.assert_allclose(per_example[0], (ce[0, 0] + ce[0, 1]) / 2, rtol=1e-6)
    np.testing.assert_allclose(per_example[1], ce[1, 3], rtol=1e-6)
    np.testing.assert_allclose(aux["tokens"], [2, 1])
    np.testing.assert_allclose(aux["ce_sum"], [ce[0, 0] + ce[0, 1], ce[1, 3]], rtol=1e-6)
