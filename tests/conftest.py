"""Test-wide settings: 8 host CPU devices for sharding tests, quiet TensorFlow, float32 JAX.

Set before anything imports jax, so every test process sees
`--xla_force_host_platform_device_count=8` (single-device code still runs on device 0).
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture
def shared_data():
    """Path to ../shared/data; skips (with a message) when absent, as on a fresh clone."""
    if not SHARED_DATA.exists():
        pytest.skip(f"{SHARED_DATA} not present (real-data test)")
    return SHARED_DATA


def persistent_compilation_cache(directory):
    """Generator body for a module fixture: JAX's persistent compilation cache in `directory`
    (identical compiled steps are reused across the tuner runs of one module), restored after."""
    import jax

    keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    old = tuple(getattr(jax.config, k) for k in keys)
    jax.config.update(keys[0], str(directory))
    jax.config.update(keys[1], 0.5)
    yield
    for key, value in zip(keys, old):
        jax.config.update(key, value)
