"""How the model's parameters are laid out on a device mesh (logical axes -> mesh axes).

Parameters get *logical* axis names from their path in the variable tree (e.g. a q/k/v
`kernel` is ("embed", "heads"), the embedding is ("vocab", "embed")); `LOGICAL_RULES` maps
logical names to the mesh axes `data` and `model`:

    batch -> data            (data parallelism: examples are split across `data`)
    vocab, heads, mlp -> model (tensor parallelism, Megatron-style column/row splits)
    embed, lora, prompt -> replicated

A dimension whose size is not divisible by its mesh axis stays replicated, so any model
runs on any mesh. Parameters the rules do not know (e.g. a classifier's) are replicated:
the core stays generic. `sync`, the barrier of every process, is here because saving a model
directory needs it; meshes, batches and multi-host start-up are `dpsynth.train.sharding`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS, MODEL_AXIS = "data", "model"

LOGICAL_RULES: tuple[tuple[str, str | None], ...] = (
    ("batch", DATA_AXIS),
    ("vocab", MODEL_AXIS),
    ("heads", MODEL_AXIS),
    ("mlp", MODEL_AXIS),
    ("embed", None),
    ("lora", None),
    ("prompt", None),
)

# FSDP (ZeRO-3 style): parameters are also split over `data` along their `embed` dimension; XLA
# gathers each where it is used. Per-device parameter memory falls by the data axis, at the cost of
# those all-gathers (`dpsynth plan --fsdp`, `dpsynth.train.tune_model.make_step_functions(fsdp=True)`).
FSDP_RULES: tuple[tuple[str, str | None], ...] = tuple(
    (name, DATA_AXIS if name == "embed" else axis) for name, axis in LOGICAL_RULES)

_IN_OUT = {  # projection name -> (input logical axis, output logical axis)
    "q": ("embed", "heads"), "k": ("embed", "heads"), "v": ("embed", "heads"), "o": ("heads", "embed"),
    "gate": ("embed", "mlp"), "up": ("embed", "mlp"), "down": ("mlp", "embed"),
}
_MATRICES = {"lm_head": ("embed", "vocab"), "position_embedding": (None, "embed")}  # untied head, GPT-2 positions


def _key_name(entry: Any) -> str:
    return str(getattr(entry, "key", getattr(entry, "name", getattr(entry, "idx", entry))))


def logical_axes(path: Sequence[Any], shape: Sequence[int]) -> tuple[str | None, ...]:
    """Logical axis names of the variable at `path` (a tree path) with `shape`."""
    names = [_key_name(p) for p in path]
    leaf, parent = names[-1] if names else "", names[-2] if len(names) > 1 else ""
    ndim = len(shape)
    if leaf == "embedding" and ndim == 2:
        return ("prompt", "embed") if "prompt" in names[:1] else ("vocab", "embed")
    if leaf in _MATRICES and ndim == 2:
        return _MATRICES[leaf]
    if parent in _IN_OUT and ndim == 2:
        d_in, d_out = _IN_OUT[parent]
        if leaf == "kernel":
            return (d_in, d_out)
        if leaf == "a":
            return (d_in, "lora")
        if leaf == "b":
            return ("lora", d_out)
    if leaf == "scale" and ndim == 1:
        return ("embed",)
    return (None,) * ndim


def spec_for(axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
             rules: Sequence[tuple[str, str | None]] = LOGICAL_RULES) -> PartitionSpec:
    """Maps logical axes to a PartitionSpec, replicating dimensions the mesh axis does not divide."""
    table = dict(rules)
    out, used = [], set()
    for name, size in zip(axes, shape):
        mesh_axis = table.get(name) if name else None
        if mesh_axis is None or mesh_axis in used or size % mesh.shape[mesh_axis]:
            out.append(None)
        else:
            out.append(mesh_axis)
            used.add(mesh_axis)
    return PartitionSpec(*out)


def param_shardings(tree: Any, mesh: Mesh, rules: Sequence[tuple[str, str | None]] = LOGICAL_RULES) -> Any:
    """A tree of NamedShardings for a variable tree (arrays or ShapeDtypeStructs)."""
    def one(path, x):
        shape = np.shape(x)
        return NamedSharding(mesh, spec_for(logical_axes(path, shape), shape, mesh, rules))
    return jax.tree_util.tree_map_with_path(one, tree)


def sync(name: str) -> None:
    """A barrier of every process (nothing on one process); `name` must match across them."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
