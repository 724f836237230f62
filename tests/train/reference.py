"""Independent reference implementations for the training tests (not used by the product)."""

import jax
import jax.numpy as jnp


def prefix_lm_loss(logits: jnp.ndarray, targets: jnp.ndarray, weights: jnp.ndarray) -> jnp.ndarray:
    """Per-example loss [B]: mean token cross-entropy over each row's weighted targets.

    Rows with no weighted target (padding rows) get loss 0.
    """
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    total = jnp.sum(nll * weights, axis=-1)
    return total / jnp.maximum(jnp.sum(weights, axis=-1), 1.0)
