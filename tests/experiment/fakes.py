"""Fake stage functions for the runner's tests (never used outside tests).

Each fake writes `out.json` (its node key, config subset and what it read from its inputs)
and appends `<key>` to the call log named by `$FAKE_STAGE_LOG`, so a test can see exactly
which stage instances ran. They are module-level (picklable) so `--jobs N` workers, which
are spawned processes, can run them; they are steered by environment variables, which
spawned workers inherit:

* `FAKE_STAGE_FAIL=<stage kind>`: that stage raises.
* `FAKE_STAGE_BLOCK=<stage kind>`: that stage writes `$FAKE_STAGE_LOG.blocked` and sleeps
  (the test kills the process).
"""

from __future__ import annotations

import json
import os
import time

LOG_ENV = "FAKE_STAGE_LOG"
FAIL_ENV = "FAKE_STAGE_FAIL"
BLOCK_ENV = "FAKE_STAGE_BLOCK"


def _read_input(out) -> dict:
    with open(out.path("out.json"), encoding="utf-8") as f:
        return json.load(f)


def _fake(ctx):
    log = os.environ.get(LOG_ENV)
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(ctx.key + "\n")
    preexisting = sorted(os.listdir(ctx.out_dir))
    # Partial output first, so an interrupted stage leaves a work directory behind.
    with open(os.path.join(ctx.out_dir, "partial"), "w") as f:
        f.write("x")
    if os.environ.get(BLOCK_ENV) == ctx.stage:
        with open(log + ".blocked", "w") as f:
            f.write(ctx.key)
        time.sleep(600)
    if os.environ.get(FAIL_ENV) == ctx.stage:
        raise RuntimeError(f"fake failure in {ctx.key}")
    read = {}
    for role, value in ctx.inputs.items():
        outs = value if isinstance(value, tuple) else (value,)
        read[role] = [_read_input(o)["key"] for o in outs]
    record = {"key": ctx.key, "config": dict(ctx.config), "read": read, "resume": ctx.resume, "preexisting": preexisting}
    with open(os.path.join(ctx.out_dir, "out.json"), "w", encoding="utf-8") as f:
        json.dump(record, f)
    ctx.report(f"fake report of {ctx.key}")
    summary = {"fake": True}
    if ctx.stage == "sensitive":
        summary["num_train"] = 1000
    return summary


REGISTRY = {
    s: _fake for s in ("sensitive", "public", "dedup", "tokenizer", "pretrain", "dp_tune", "labels", "generate", "evaluate")
}


def calls(log_path) -> list[str]:
    """The node keys the fakes ran, in order."""
    if not os.path.exists(log_path):
        return []
    with open(log_path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def run_in_child(config_data: dict, root: str, log_path: str, block: str) -> None:
    """Target of a spawned process that runs an experiment with the fakes (for kill tests)."""
    os.environ[LOG_ENV] = log_path
    os.environ[BLOCK_ENV] = block
    from dpsynth.experiment.config import from_dict
    from dpsynth.experiment.runner import run_experiment

    run_experiment(from_dict(config_data), root=root, registry=REGISTRY)
