"""The parameter layout rules (`dpsynth.models.sharding`): logical axes by path, specs on a mesh."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from dpsynth.models import Transformer, get_config
from dpsynth.models import sharding as model_sharding
from dpsynth.train.sharding import make_mesh


def test_logical_axes_by_path():
    config = get_config("tiny", vocab_size=64, lora_rank=2, prompt_length=3)
    shapes = jax.eval_shape(Transformer(config).init, jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))
    axes = jax.tree_util.tree_map_with_path(lambda p, x: model_sharding.logical_axes(p, x.shape), shapes)
    assert axes["params"]["embedding"] == ("vocab", "embed")
    assert axes["params"]["layer_0"]["attention"]["q"]["kernel"] == ("embed", "heads")
    assert axes["params"]["layer_0"]["attention"]["o"]["kernel"] == ("heads", "embed")
    assert axes["params"]["layer_1"]["mlp"]["down"]["kernel"] == ("mlp", "embed")
    assert axes["lora"]["layer_0"]["mlp"]["up"]["b"] == ("lora", "mlp")
    assert axes["prompt"]["embedding"] == ("prompt", "embed")
    assert model_sharding.logical_axes((), (3, 3)) == (None, None)


def test_specs_replicate_indivisible_dims():
    mesh = make_mesh(4, 2)
    assert model_sharding.spec_for(("embed", "mlp"), (64, 128), mesh) == P(None, "model")
    assert model_sharding.spec_for(("vocab", "embed"), (65, 64), mesh) == P(None, None)
    assert model_sharding.spec_for(("heads", "mlp"), (4, 4), mesh) == P("model", None)  # one use per mesh axis
    with pytest.raises(ValueError):
        make_mesh(3, 3)
