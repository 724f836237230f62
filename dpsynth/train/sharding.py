"""Device meshes, batches across processes, and multi-host start-up.

A mesh has the axes `data` (examples are split across it) and `model` (tensor parallelism);
how the model's parameters are split over them is `dpsynth.models.sharding`. Every helper
here also works across processes: a process supplies and reads only its own rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dpsynth.errors import DpsynthError
from dpsynth.models.sharding import DATA_AXIS, MODEL_AXIS


class DistributedError(DpsynthError, ValueError):
    """A bad combination of the multi-host flags, or a multi-host start-up that JAX refused."""


def global_devices() -> list[jax.Device]:
    """Every device of every process, each process's devices contiguous (by process, then id).

    On one process this is `jax.devices()`. With several, a mesh row-major over this order
    gives each process a contiguous block of the `data` axis, so a process holds a contiguous
    range of every batch (the rows it reads, see `process_rows`).
    """
    devices = jax.devices()
    if jax.process_count() == 1:
        return list(devices)
    return sorted(devices, key=lambda d: (d.process_index, d.id))


def make_mesh(data: int = -1, model: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 2-D mesh with axes ("data", "model") over `devices` (default: `global_devices()`, all
    processes' devices); `data=-1` uses all remaining devices."""
    devices = list(global_devices() if devices is None else devices)
    if model <= 0 or len(devices) % model:
        raise ValueError(f"model axis {model} does not divide the {len(devices)} devices")
    if data == -1:
        data = len(devices) // model
    if data * model > len(devices):
        raise ValueError(f"mesh {data}x{model} needs {data * model} devices, only {len(devices)} available")
    grid = np.asarray(devices[: data * model], dtype=object).reshape(data, model)
    return Mesh(grid, (DATA_AXIS, MODEL_AXIS))


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


def process_rows(sharding: jax.sharding.Sharding, global_rows: int) -> np.ndarray:
    """The global row indices of an array of `global_rows` rows (sharded by `sharding` on its
    leading dimension) that this process's devices hold, in the order
    `jax.make_array_from_process_local_data` expects them (ascending). All rows on one process.
    """
    if jax.process_count() == 1:
        return np.arange(global_rows)
    rows: set[int] = set()
    for index in sharding.addressable_devices_indices_map((global_rows,)).values():
        rows.update(range(*index[0].indices(global_rows)))
    return np.asarray(sorted(rows), dtype=np.int64)


def put_process_local(tree: Any, sharding: jax.sharding.Sharding, global_rows: int) -> Any:
    """Global arrays of `global_rows` rows from this process's rows only (`process_rows`).

    Every leaf of `tree` holds exactly the rows `process_rows(sharding, global_rows)` of the
    global value, so a process reads and transfers only its share of a batch. On one process
    this is `put(tree, sharding)`.
    """
    if jax.process_count() == 1:
        return put(tree, sharding)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(
        sharding, np.asarray(x), (global_rows,) + np.shape(x)[1:]), tree)


def gather(tree: Any) -> Any:
    """Host (numpy) copies of possibly multi-process sharded arrays (all-gathered when needed)."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def initialize_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None) -> None:
    """Multi-host start-up: joins this process to the others (`jax.distributed.initialize`).

    Call it once per process, before any other JAX call. Two ways:

    * Nothing given: the cluster is discovered (Cloud TPU VMs, SLURM, Open MPI, Kubernetes
      indexed jobs), so the same command runs on every host, e.g. `gcloud compute tpus tpu-vm
      ssh NAME --worker=all --command="dpsynth pretrain --distributed ..."`.
    * All three given: `coordinator_address` "HOST:PORT" of process 0 (it listens there; the
      others connect), `num_processes` N and this process's `process_id` in [0, N). This is
      what the multi-process tests run (N processes on 127.0.0.1, CPU devices, gloo).

    Afterwards `jax.devices()` lists every process's devices and meshes span all of them.

    Raises:
      DistributedError: only some of the three given, an id outside [0, N), or JAX refused
        (e.g. nothing given and no cluster detected).
    """
    given = [v is not None for v in (coordinator_address, num_processes, process_id)]
    if any(given) and not all(given):
        raise DistributedError("multi-host start-up needs all of --coordinator-address, --num-processes and "
                               "--process-id, or none of them (cluster auto-detection on TPU VMs, SLURM, Open MPI)")
    if all(given):
        if num_processes < 1 or not 0 <= process_id < num_processes:
            raise DistributedError(f"--process-id {process_id} must be in [0, --num-processes {num_processes})")
        if ":" not in coordinator_address:
            raise DistributedError(f"--coordinator-address {coordinator_address!r} must be HOST:PORT")
    try:
        jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                                   process_id=process_id)
    except ValueError as e:
        raise DistributedError(str(e)) from e
