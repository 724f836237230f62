"""Secret seeds: 64 bits of key, and one seed shared by every process of a multi-host run."""

import numpy as np
import pytest

from dpsynth.dp import seeds


def test_jax_key_keeps_64_bits():
    a, b = seeds.jax_key(1), seeds.jax_key(1 + (1 << 32))
    assert a.dtype == np.uint32 and a.shape == (2,) and not np.array_equal(a, b)
    assert seeds.shared_secret_seed() != seeds.shared_secret_seed()  # one process: a fresh draw each time


@pytest.mark.slow
def test_shared_secret_seed_is_one_draw_for_all_processes():
    from tests import multiprocess

    results = multiprocess.run("tests.dp.multihost_cases:seed_case", num_processes=2, devices=2, timeout=120)
    assert results[0]["first"] == results[1]["first"] and results[0]["second"] == results[1]["second"]
    assert results[0]["first"] != results[0]["second"]
