"""The sampler's configuration: logit filters against brute force, options, identities, errors."""

import dataclasses
import json

import numpy as np
import pytest

from dpsynth import binding
from dpsynth.generate.sampler_config import NEG_INF, OPTION, SamplerConfig, SamplingOptions, filter_logits


def _reference(scaled, top_k, min_p):
    """Brute force: token x is kept iff fewer than k tokens score above it (top-k) and its
    probability is at least min_p times the row's largest (min-p)."""
    out = scaled.copy()
    for r, row in enumerate(scaled):
        p = np.exp(row - row.max())
        p /= p.sum()
        for x in range(len(row)):
            if (top_k and (row > row[x]).sum() >= top_k) or p[x] < min_p * p.max():
                out[r, x] = NEG_INF
    return out


@pytest.mark.parametrize("top_k", [0, 1, 3, 50])
@pytest.mark.parametrize("min_p", [0.0, 0.05, 0.3, 1.0])
def test_filter_logits_keeps_exactly_the_brute_force_set(top_k, min_p):
    rng = np.random.default_rng(top_k * 7 + int(min_p * 100))
    scaled = (rng.normal(size=(6, 20)) * 3).astype(np.float32)
    got = np.asarray(filter_logits(scaled, SamplerConfig(top_k=top_k, min_p=min_p)))
    want = _reference(scaled, top_k, min_p)
    np.testing.assert_array_equal(got <= NEG_INF / 2, want <= NEG_INF / 2)
    np.testing.assert_array_equal(got[got > NEG_INF / 2], scaled[got > NEG_INF / 2])  # kept logits unchanged
    assert np.all((got > NEG_INF / 2).sum(axis=1) >= 1)  # the most likely token is always kept


def test_an_unset_min_p_leaves_the_identity_and_hash_of_earlier_jobs():
    old = {"temperature": 1.0, "top_k": 0, "num_decodes": 1, "max_len": 512, "batch_size": 16, "prompt_bucket": 16,
           "eos_id": 3, "pad_id": 0, "vocab_limit": None, "banned_ids": (0, 2)}  # the identity before min-p
    assert SamplerConfig().identity() == old
    assert json.dumps(SamplerConfig().identity()) == json.dumps(old)
    assert SamplerConfig(min_p=0.1).identity() == {**old, "min_p": 0.1}
    assert SamplerConfig(guidance=2.0, guidance_contrast="null").identity() == {**old, "guidance": 2.0}


def test_sampling_options_are_the_option_fields_declared_once():
    options = [f.name for f in dataclasses.fields(SamplerConfig) if f.metadata.get(OPTION)]
    assert [f.name for f in dataclasses.fields(SamplingOptions)] == options
    assert {"temperature", "top_k", "min_p", "num_decodes", "guidance", "guidance_contrast"} == set(options)
    for f in dataclasses.fields(SamplingOptions):
        assert f.metadata.get(binding.HELP), f"{f.name}: an option needs its help text"
    assert SamplingOptions(min_p=0.05).sampler(max_len=40).min_p == 0.05
    assert SamplingOptions(min_p=0.05, top_k=3).label == "t1-k3-n1-p0.05"
    assert SamplingOptions().identity() == {"temperature": 1.0, "top_k": 0, "num_decodes": 1}  # stage hashes hold
    assert SamplingOptions(min_p=0.05).identity()["min_p"] == 0.05


@pytest.mark.parametrize("field,value", [("min_p", -0.1), ("min_p", 1.5), ("temperature", -1.0), ("top_k", -1),
                                         ("guidance", float("nan")), ("guidance_contrast", "bogus")])
def test_a_bad_option_names_its_field(field, value):
    with pytest.raises(binding.SettingError) as err:
        SamplingOptions(**{field: value}).validate()
    assert err.value.field == field
