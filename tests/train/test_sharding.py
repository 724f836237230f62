import numpy as np
import pytest

from dpsynth.train import sharding


def test_process_rows_single_process_is_every_row():
    mesh = sharding.make_mesh(8, 1)
    np.testing.assert_array_equal(sharding.process_rows(sharding.batch_sharding(mesh), 16), np.arange(16))
    x = sharding.put_process_local({"a": np.arange(16.0)}, sharding.batch_sharding(mesh), 16)
    np.testing.assert_array_equal(np.asarray(x["a"]), np.arange(16.0))


def test_process_local_batches_in_two_processes():
    """2 processes x 4 CPU devices: each feeds only its rows; a jitted reduction sees all 16."""
    from tests import multiprocess

    results = multiprocess.run("tests.train.multihost_cases:sharding_case", num_processes=2, devices=4,
                               timeout=120)
    full = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
    assert [r["rows"] for r in results] == [list(range(8)), list(range(8, 16))]
    for r in results:
        assert r["sum"] == pytest.approx(float(np.sum(full * full)))
        np.testing.assert_array_equal(np.asarray(r["gathered"]), full)
        assert len(set(r["devices"])) == 8
