"""Secret seeds for the DP randomness (Poisson sampling and Gaussian noise).

DP-SGD's guarantee holds over the randomness of the sampling and the noise: whoever knows
the seed can regenerate the noise, subtract it from the released updates and undo the
guarantee. So the tuner draws its seed from the operating system's entropy pool by default
(`secret_seed`, 64 bits), keeps it only in the private training checkpoint (for an exact
resume), and never writes it into the privacy report or the model manifest. A seed given
by the user (tests, debugging) makes the run reproducible by anyone who knows it, and the
privacy report says so as a side channel.

Multi-host runs (several JAX processes) need ONE seed: every process must draw the same
Poisson batches, and the noise key must be the same everywhere so that the noise is added
once to the global sum. `shared_secret_seed` draws it on process 0 only and broadcasts it over
the devices' collectives (`multihost_utils.broadcast_one_to_all`), never through a file or log.
"""

from __future__ import annotations

import secrets

import numpy as np

SEED_BITS = 64


def secret_seed() -> int:
    """A fresh 64-bit seed from the OS entropy pool (`secrets`)."""
    return secrets.randbits(SEED_BITS)


def shared_secret_seed() -> int:
    """`secret_seed()` drawn once on process 0 and broadcast to every process (multi-host).

    On a single process this is `secret_seed()`. Every process must call it at the same point
    (it is a collective).
    """
    import jax

    if jax.process_count() == 1:
        return secret_seed()
    from jax.experimental import multihost_utils

    seed = secret_seed() if jax.process_index() == 0 else 0
    words = np.asarray([seed >> 32, seed & 0xFFFFFFFF], dtype=np.uint32)  # exact: an integer psum
    shared = multihost_utils.broadcast_one_to_all(words)
    return (int(shared[0]) << 32) | int(shared[1])


def jax_key(seed: int) -> np.ndarray:
    """A raw JAX PRNG key (uint32[2]) holding all 64 bits of `seed`.

    `jax.random.PRNGKey(seed)` keeps only 32 bits of a Python int when 64-bit mode is off;
    this keeps both halves, so a 64-bit secret seed gives 64 bits of key.
    """
    seed = int(seed) % (1 << SEED_BITS)
    return np.asarray([seed >> 32, seed & 0xFFFFFFFF], dtype=np.uint32)
