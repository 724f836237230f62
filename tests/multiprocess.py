"""Runs a function in N JAX processes on this machine: multi-host code tested for real.

Each process is a fresh Python interpreter with `devices` host CPU devices
(`--xla_force_host_platform_device_count`), gloo CPU collectives and
`jax.distributed.initialize(coordinator_address="127.0.0.1:PORT", num_processes=N,
process_id=i)` on a free loopback port: the same code paths (global meshes, process-local
data, cross-process collectives, Orbax multi-host checkpoints) as a TPU pod slice or a
multi-GPU cluster, where each host runs one process. With N = 1 no distributed system is
started (the single-process reference a multi-process run is compared with).

    results = run("tests.train.multihost_cases:pretrain_case", num_processes=2, devices=4,
                  kwargs={"out": str(tmp_path)}, timeout=240)
    results[0]   # what process 0's function returned (a JSON-serializable dict)

The target is "module:function"; it is called as `function(**kwargs)` after start-up and its
return value comes back as JSON (NumPy arrays become lists). If any process fails or the
timeout passes, every process is killed and `MultiprocessError` carries each one's exit
status and the tail of its stderr.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

from tests.conftest import FAST_COMPILE

REPO = pathlib.Path(__file__).resolve().parents[1]
STDERR_TAIL = 4000


class MultiprocessError(RuntimeError):
    """A process of a multi-process run failed or timed out (message holds every stderr tail)."""


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (the coordinator binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE}", JAX_PLATFORMS="cpu",
               CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2", PYTHONHASHSEED="0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def run(target: str, num_processes: int = 2, devices: int = 4, kwargs: dict[str, Any] | None = None,
        timeout: float = 300.0, initialize: bool = True, with_stderr: bool = False) -> list[dict[str, Any]]:
    """Runs `target(**kwargs)` in `num_processes` processes; returns their results by process id.

    Args:
      target: "package.module:function", importable from the repository root.
      num_processes: N; 1 runs a single process without `jax.distributed`.
      devices: CPU devices per process.
      kwargs: JSON-serializable keyword arguments (the same for every process).
      timeout: seconds for the whole run; then every process is killed.
      initialize: start `jax.distributed` before calling the target (through
        `dpsynth.train.sharding.initialize_distributed`); with False the target does it itself
        and gets `coordinator_address`, `num_processes` and `process_id` as extra kwargs.
      with_stderr: add each process's whole stderr (and stdout) to its result as "stderr".

    Raises:
      MultiprocessError: a process exited non-zero, returned nothing, or the timeout passed.
    """
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="dpsynth-mp-") as tmp:
        procs, errs, outs = [], [], []
        for i in range(num_processes):
            out = os.path.join(tmp, f"result-{i}.json")
            err = open(os.path.join(tmp, f"stderr-{i}.txt"), "w+")
            cmd = [sys.executable, "-m", "tests.multiprocess", "--target", target, "--port", str(port),
                   "--num-processes", str(num_processes), "--process-id", str(i), "--out", out,
                   "--kwargs", json.dumps(kwargs or {})] + ([] if initialize else ["--no-initialize"])
            procs.append(subprocess.Popen(cmd, cwd=REPO, env=_env(devices), stdout=err, stderr=subprocess.STDOUT,
                                          start_new_session=True))
            errs.append(err)
            outs.append(out)
        deadline = time.monotonic() + timeout
        failed = None
        try:
            while any(p.poll() is None for p in procs):
                bad = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
                if bad:
                    failed = f"process {bad[0]} exited with status {procs[bad[0]].returncode}"
                    break
                if time.monotonic() > deadline:
                    failed = f"timed out after {timeout:.0f}s"
                    break
                time.sleep(0.05)
            if failed is None:
                bad = [i for i, p in enumerate(procs) if p.returncode != 0]
                if bad:
                    failed = f"process {bad[0]} exited with status {procs[bad[0]].returncode}"
        finally:
            for p in procs:  # kills only the processes (and their groups) started here
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, 9)
                    except ProcessLookupError:
                        pass
                    p.wait()
        texts = []
        for err in errs:
            err.seek(0)
            texts.append(err.read())
            err.close()
        tails = [t[-STDERR_TAIL:] for t in texts]
        if failed is not None:
            detail = "\n".join(f"--- process {i} (status {p.returncode}):\n{t}" for i, (p, t) in
                               enumerate(zip(procs, tails)))
            raise MultiprocessError(f"{target} in {num_processes} processes: {failed}\n{detail}")
        results = []
        for i, out in enumerate(outs):
            if not os.path.exists(out):
                raise MultiprocessError(f"{target}: process {i} returned no result\n{tails[i]}")
            with open(out) as f:
                results.append(json.load(f))
            if with_stderr:
                results[-1]["stderr"] = texts[i]
        return results


def _jsonable(x: Any) -> Any:
    import numpy as np

    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "__array__") and not isinstance(x, (str, bytes)):
        return np.asarray(x).tolist()
    return x


def _child(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="one process of tests.multiprocess.run")
    p.add_argument("--target", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--num-processes", type=int, required=True)
    p.add_argument("--process-id", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--kwargs", default="{}")
    p.add_argument("--no-initialize", dest="initialize", action="store_false")
    args = p.parse_args(argv)
    import jax

    from dpsynth.train import sharding

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    address = f"127.0.0.1:{args.port}"
    kwargs = json.loads(args.kwargs)
    if not args.initialize:
        kwargs.update(coordinator_address=address, num_processes=args.num_processes, process_id=args.process_id)
    elif args.num_processes > 1:
        sharding.initialize_distributed(coordinator_address=address, num_processes=args.num_processes,
                                        process_id=args.process_id)
    module, _, name = args.target.partition(":")
    try:
        result = getattr(importlib.import_module(module), name)(**kwargs)
    except BaseException:  # exit at once: jax.distributed's exit hook would wait for the others
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_jsonable(result if result is not None else {}), f)
    os.replace(tmp, args.out)
    if args.num_processes > 1 and jax.distributed.is_initialized():
        jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(_child())
