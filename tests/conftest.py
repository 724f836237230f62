"""Test-wide settings: 8 host CPU devices for sharding tests, fast XLA compiles, quiet TensorFlow,
float32 JAX.

Set before anything imports jax, so every test process sees
`--xla_force_host_platform_device_count=8` (single-device code still runs on device 0) and
`FAST_COMPILE`.
"""

import os

# XLA:CPU's backend optimisation off: the tests' tiny models spend most of their time compiling, and
# these flags cut the suite's time by about two fifths (docs/measured.md). They change how XLA lowers
# a program to machine code, not what it computes: every property a test checks holds at either
# setting (docs/scaling.md measured the same memory plan to the byte). Commands and benchmarks run
# at XLA's default.
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"

os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {FAST_COMPILE}")
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


# JAX's persistent compilation cache, one for the whole run: the same tiny models compile the same
# steps in many modules, on both xdist workers and in the commands tests run as subprocesses.
# The size cap turns on JAX's file lock, so two workers never read an entry while it is written.
_CACHE_SETTINGS = {"jax_compilation_cache_dir": None, "jax_persistent_cache_min_compile_time_secs": 0.2,
                   "jax_compilation_cache_max_size": 8 * 2**30}


@pytest.fixture(scope="session", autouse=True)
def _compilation_cache(tmp_path_factory):
    """Points this process and its subprocesses at the run's compilation cache (under the xdist
    workers' common base directory, so the workers share it); a fresh run starts it empty."""
    import jax

    base = tmp_path_factory.getbasetemp()
    directory = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "jax_cache"
    directory.mkdir(exist_ok=True)
    settings = dict(_CACHE_SETTINGS, jax_compilation_cache_dir=str(directory))
    for key, value in settings.items():
        jax.config.update(key, value)
        os.environ[key.upper()] = str(value)
    yield
