import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpsynth.models import PRESETS, ModelConfig, Transformer, get_config


def _count(config: ModelConfig) -> dict[str, int]:
    shapes = jax.eval_shape(Transformer(config).init, jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))
    return {c: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree)) for c, tree in shapes.items()}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_parameter_counts_match_formula(preset):
    config = get_config(preset)
    counts = _count(config)
    assert set(counts) == {"params"}
    assert counts["params"] == config.num_params()


@pytest.mark.parametrize("targets", ["attention", "mlp", "all"])
def test_lora_and_prompt_counts_match_formula(targets):
    config = get_config("small", lora_rank=8, lora_targets=targets, prompt_length=5)
    counts = _count(config)
    assert counts == {c: config.num_params((c,)) for c in ("params", "lora", "prompt")}


def test_paper_scale_sizes():
    # Independent arithmetic (not the formula): 1b ~ 1.1B, 8b ~ 8.7B parameters.
    assert 1.0e9 < get_config("1b").num_params() < 1.3e9
    assert 8.0e9 < get_config("8b").num_params() < 9.0e9
    assert 1.5e6 < get_config("cpu").num_params() < 2.5e6 and get_config("cpu").vocab_size == 8192
    c = get_config("8b")
    manual = 32000 * 4096 + 32 * (2 * 4096 + 4 * 4096 * 4096 + 3 * 4096 * 16384) + 4096
    assert c.num_params() == manual


def test_overrides_and_validation():
    assert get_config("tiny", vocab_size=1000).vocab_size == 1000
    assert get_config("tiny").preset == "tiny"
    with pytest.raises(ValueError, match="unknown model preset"):
        get_config("huge")
    with pytest.raises(ValueError, match="head_dim"):
        get_config("tiny", head_dim=15)
    with pytest.raises(ValueError, match="lora_targets"):
        get_config("tiny", lora_targets="everything")
    with pytest.raises(ValueError, match="d_model"):
        get_config("tiny", d_model=0)
    config = get_config("tiny", lora_rank=4, prompt_length=2)
    assert config.base() == get_config("tiny")
    assert ModelConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="unknown fields"):
        ModelConfig.from_dict({**config.to_dict(), "bogus": 1})


ADAPTER_VALUES = [dict(lora_rank=r, lora_alpha=a, lora_targets=t, prompt_length=p)
                  for r in (0, 3) for a in (16.0, 8.0, 0.5) for t in ("all", "attention", "mlp") for p in (0, 4)]


@pytest.mark.parametrize("adapters", ADAPTER_VALUES, ids=lambda a: "-".join(str(v) for v in a.values()))
def test_base_clears_every_adapter_field(adapters):
    """A tuned config's base equals the base it was tuned from, whatever the adapter settings."""
    from dpsynth.models.config import ADAPTER_FIELDS

    assert set(adapters) == set(ADAPTER_FIELDS)
    base = get_config("tiny", num_kv_heads=2, tie_embeddings=False)  # non-adapter fields off their defaults
    tuned = base.replace(**adapters)
    assert tuned.base() == base and tuned.base().base() == base
    assert base.replace(rope_base=500.0, **adapters).base() == base.replace(rope_base=500.0)  # the rest is kept


def test_adapter_fields_name_every_adapter_setting():
    """A new LoRA/prompt field must join ADAPTER_FIELDS (or `base()` keeps it and tuned models stop loading)."""
    import dataclasses

    from dpsynth.models.config import ADAPTER_FIELDS

    names = {f.name for f in dataclasses.fields(ModelConfig)}
    assert set(ADAPTER_FIELDS) <= names
    assert {n for n in names if n.startswith(("lora_", "prompt_"))} == set(ADAPTER_FIELDS)
