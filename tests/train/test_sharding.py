import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from dpsynth.models import Transformer, get_config
from dpsynth.train import sharding


def test_logical_axes_by_path():
    config = get_config("tiny", vocab_size=64, lora_rank=2, prompt_length=3)
    shapes = jax.eval_shape(Transformer(config).init, jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))
    axes = jax.tree_util.tree_map_with_path(lambda p, x: sharding.logical_axes(p, x.shape), shapes)
    assert axes["params"]["embedding"] == ("vocab", "embed")
    assert axes["params"]["layer_0"]["attention"]["q"]["kernel"] == ("embed", "heads")
    assert axes["params"]["layer_0"]["attention"]["o"]["kernel"] == ("heads", "embed")
    assert axes["params"]["layer_1"]["mlp"]["down"]["kernel"] == ("mlp", "embed")
    assert axes["lora"]["layer_0"]["mlp"]["up"]["b"] == ("lora", "mlp")
    assert axes["prompt"]["embedding"] == ("prompt", "embed")
    assert sharding.logical_axes((), (3, 3)) == (None, None)


def test_specs_replicate_indivisible_dims():
    mesh = sharding.make_mesh(4, 2)
    assert sharding.spec_for(("embed", "mlp"), (64, 128), mesh) == P(None, "model")
    assert sharding.spec_for(("vocab", "embed"), (65, 64), mesh) == P(None, None)
    assert sharding.spec_for(("heads", "mlp"), (4, 4), mesh) == P("model", None)  # one use per mesh axis
    with pytest.raises(ValueError):
        sharding.make_mesh(3, 3)


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
