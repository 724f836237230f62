"""Functions run inside each process of a multi-process test (`tests.multiprocess.run`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dpsynth.train import sharding


def sharding_case() -> dict:
    """Process-local rows of a global batch, a jitted cross-process sum, and a gather."""
    mesh = sharding.make_mesh(-1, 1)
    sh = sharding.batch_sharding(mesh)
    rows = sharding.process_rows(sh, 16)
    full = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
    x = sharding.put_process_local(full[rows], sh, 16)
    total = jax.jit(lambda a: jnp.sum(a * a), out_shardings=sharding.replicated(mesh))(x)
    return {"process": jax.process_index(), "rows": rows, "sum": float(total), "gathered": sharding.gather(x),
            "devices": [d.id for d in mesh.devices.flat]}


def pretrain_case(corpus: str, tokenizer: str, out: str, config: dict, resume: bool = False,
                  stop_after: int | None = None) -> dict:
    """`run_pretrain` with `config` (PretrainConfig fields) on every process."""
    from dpsynth.train import pretrain

    summary = pretrain.run_pretrain(corpus, tokenizer, out, pretrain.PretrainConfig(**config), resume=resume,
                                    stop_after=stop_after)
    return {"process": jax.process_index(), "processes": jax.process_count(), "devices": jax.device_count(),
            "summary": summary}


def fail_case(hang: bool = False) -> dict:
    """Process 1 raises; every other process waits forever (or all do, with `hang`)."""
    import time

    if jax.process_index() == 1 and not hang:
        raise RuntimeError("boom from process 1")
    while True:
        time.sleep(1)


def pretrain_cli_case(argv: list[str], coordinator_address: str, num_processes: int, process_id: int) -> dict:
    """`dpsynth pretrain --distributed` with the documented coordinator/process flags."""
    from trainers import pretrain as cli

    rc = cli.main(argv + ["--distributed", "--coordinator-address", coordinator_address,
                          "--num-processes", str(num_processes), "--process-id", str(process_id)])
    return {"rc": rc, "process": jax.process_index(), "processes": jax.process_count(),
            "devices": jax.device_count()}


def finetune_case(base_dir: str, out: str, modes: list[str], config: dict, train: list[dict], valid: list[dict],
                  mesh: list[int], resume: bool = False, stop_after: int | None = None) -> dict:
    """`finetune.dp_tune` in each mode (into out/<mode>), recording per process how often it wrote
    the privacy report and a hash of every Poisson microbatch it drew (never the indices)."""
    import hashlib

    from dpsynth.dp import report, sampling
    from dpsynth.train import finetune, tune_config

    writes = {"n": 0}
    batches: list[str] = []
    real_write, real_microbatches = report.write_report, sampling.PoissonSampler.microbatches

    def counting_write(*args, **kwargs):
        writes["n"] += 1
        return real_write(*args, **kwargs)

    def hashing_microbatches(self, step):
        mbs = real_microbatches(self, step)
        batches.append(hashlib.sha256(b"".join(np.asarray(m, np.int64).tobytes() for m in mbs)).hexdigest())
        return mbs

    report.write_report, sampling.PoissonSampler.microbatches = counting_write, hashing_microbatches
    out_modes = {}
    try:
        for mode in modes:
            writes["n"], batches[:] = 0, []
            res = finetune.dp_tune(base_dir, train, valid, f"{out}/{mode}",
                                   tune_config.TuneConfig(**{**config, "mode": mode}), mesh=tuple(mesh), resume=resume,
                                   stop_after=stop_after, progress_interval=1e9)
            out_modes[mode] = {"steps": res.steps, "train_loss": res.train_loss, "valid_loss": res.valid_loss,
                               "epsilon": res.epsilon, "report_writes": writes["n"], "batches": list(batches)}
    finally:
        report.write_report, sampling.PoissonSampler.microbatches = real_write, real_microbatches
    return {"process": jax.process_index(), "processes": jax.process_count(), "modes": out_modes}


def agreed_size_case(sizes: list[int]) -> dict:
    """`resources.agreed_size` with process i's search finding sizes[i] (0: its search fails)."""
    from dpsynth.train import resources

    def search():
        m = sizes[jax.process_index()]
        if m <= 0:
            raise resources.PlanError(f"no microbatch fits on process {jax.process_index()}")
        return resources.MicrobatchChoice(microbatch=m, peak_bytes=1, budget_bytes=2, limit_bytes=2, headroom=0.0,
                                          tried=((m, 1),))

    try:
        size, _ = resources.agreed_size(search)
    except resources.PlanError as e:
        return {"process": jax.process_index(), "error": str(e)}
    return {"process": jax.process_index(), "size": size}
