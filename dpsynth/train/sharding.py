"""Device meshes and logical-axis sharding rules for parameters and batches.

Parameters get *logical* axis names from their path in the variable tree (e.g. a q/k/v
`kernel` is ("embed", "heads"), the embedding is ("vocab", "embed")); `LOGICAL_RULES` maps
logical names to the mesh axes `data` and `model`:

    batch -> data            (data parallelism: examples are split across `data`)
    vocab, heads, mlp -> model (tensor parallelism, Megatron-style column/row splits)
    embed, lora, prompt -> replicated

A dimension whose size is not divisible by its mesh axis stays replicated, so any model
runs on any mesh. Parameters the rules do not know (e.g. a classifier's) are replicated:
the core stays generic.
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

_IN_OUT = {  # projection name -> (input logical axis, output logical axis)
    "q": ("embed", "heads"), "k": ("embed", "heads"), "v": ("embed", "heads"), "o": ("heads", "embed"),
    "gate": ("embed", "mlp"), "up": ("embed", "mlp"), "down": ("mlp", "embed"),
}
_MATRICES = {"lm_head": ("embed", "vocab"), "position_embedding": (None, "embed")}  # untied head, GPT-2 positions


def make_mesh(data: int = -1, model: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 2-D mesh with axes ("data", "model"); `data=-1` uses all remaining devices."""
    devices = list(jax.devices() if devices is None else devices)
    if model <= 0 or len(devices) % model:
        raise ValueError(f"model axis {model} does not divide the {len(devices)} devices")
    if data == -1:
        data = len(devices) // model
    if data * model > len(devices):
        raise ValueError(f"mesh {data}x{model} needs {data * model} devices, only {len(devices)} available")
    grid = np.asarray(devices[: data * model], dtype=object).reshape(data, model)
    return Mesh(grid, (DATA_AXIS, MODEL_AXIS))


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


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (example) dimension split over `data`, the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def put(tree: Any, shardings: Any) -> Any:
    """`jax.device_put`, also across processes: each process supplies its addressable slices of
    the (identical on every process) global values. `shardings` is a tree or one sharding."""
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)
    if isinstance(shardings, jax.sharding.Sharding):
        shardings = jax.tree.map(lambda _: shardings, tree)

    def one(x, sh):
        if isinstance(x, jax.Array) and x.is_fully_addressable is False:
            return jax.device_put(x, sh)
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sh, lambda index: host[index])

    return jax.tree.map(one, tree, shardings)


def gather(tree: Any) -> Any:
    """Host (numpy) copies of possibly multi-process sharded arrays (all-gathered when needed)."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def initialize_distributed(**kwargs: Any) -> None:
    """Multi-host start-up: `jax.distributed.initialize(**kwargs)` when more than one process.

    On Cloud TPU VMs the coordinator, process count and id are discovered automatically, so
    the same command runs on every host (`gcloud compute tpus tpu-vm ssh NAME --worker=all
    --command="dpsynth pretrain --distributed ..."`); elsewhere pass coordinator_address,
    num_processes and process_id (or set JAX_COORDINATOR_ADDRESS etc.).
    """
    jax.distributed.initialize(**kwargs)
