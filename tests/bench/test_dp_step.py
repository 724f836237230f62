"""bench/dp_step.py: the per-operation profile of a compiled step (`trace_ops`)."""

import jax
import jax.numpy as jnp
import numpy as np

from bench import dp_step as bench


def test_trace_ops_sums_the_ops_of_one_call_by_kind():
    """A traced call of a matmul and an element-wise op: op events are found, summed by kind (no
    ".N" suffixes), sorted by time, and the wall time covers the call."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal((256, 256)), jnp.float32)
    step = jax.jit(lambda a: jnp.exp(a @ a) + 1.0)
    calls = []

    def run():
        calls.append(1)
        return step(x)

    out = bench.trace_ops(run, top=3)
    assert len(calls) == 2  # one untraced call (compiles), one traced
    assert out["wall_s"] > 0 and out["op_s"] > 0 and 1 <= len(out["top"]) <= 3
    kinds = [k for k, _, _ in out["top"]]
    assert all(not k.rsplit(".", 1)[-1].isdigit() for k in kinds) and len(set(kinds)) == len(kinds)
    seconds = [s for _, s, _ in out["top"]]
    assert seconds == sorted(seconds, reverse=True) and all(n >= 1 for _, _, n in out["top"])
    assert sum(seconds) <= out["op_s"] * (1 + 1e-9)  # (a subset of the same positive terms; summation order aside)
