"""Content-addressed stage outputs, completed atomically.

A stage instance (`plan.StageNode`) writes into `ROOT/stages/<stage>/.work-<hash16>/`; when
its function returns, the runner writes the marker `stage.json` (hash, config subset, input
hashes, timings, the function's summary) into that directory and renames it to
`ROOT/stages/<stage>/<hash16>/`. A directory without the `.work-` prefix is therefore always
complete, and an interrupted stage leaves only a work directory, which the next run wipes
(or hands back to the stage, for resumable stages such as pretraining, whose library resumes
from its own checkpoints). What a stage must not publish (non-DP losses, audits against
D_train) goes to its private state, `ROOT/private/<stage>/<hash16>/` (0700 directories,
0600 files), never into its stage directory. An exclusive `flock` per stage instance keeps two runners (or two
workers) from computing the same stage at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from dpsynth import fileio
from dpsynth.experiment.plan import HASH_PREFIX, StageNode, private_dir, stage_dir
from dpsynth.owner_only import make_private_dir

MARKER = "stage.json"
REPORT = "report.txt"
MARKER_FORMAT = "dpsynth.stage"
MARKER_VERSION = 1


class StageUnavailable(RuntimeError):
    """A stage's library has not been installed/implemented; names the stage and module."""

    def __init__(self, stage: str, reason: str):
        super().__init__(stage, reason)  # both in args, so it pickles across processes
        self.stage = stage
        self.reason = reason

    def __str__(self) -> str:
        return f"stage '{self.stage}' is not available: {self.reason}"


class StageFailed(RuntimeError):
    """A stage function raised; names the stage instance and its work directory."""


@dataclasses.dataclass(frozen=True)
class StageOutput:
    """A completed stage: its directory, hash and the summary its function returned."""

    key: str
    stage: str
    hash: str
    dir: str
    summary: Mapping[str, Any]
    seconds: float
    cached: bool

    def path(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    @property
    def report(self) -> str:
        """The human-readable report the stage wrote (`report.txt`), or ''."""
        try:
            with open(self.path(REPORT), encoding="utf-8") as f:
                return f.read()
        except FileNotFoundError:
            return ""


@dataclasses.dataclass(frozen=True)
class StageContext:
    """What a stage function sees: its config subset, its inputs, a directory to write.

    Attributes:
        key: the node key (e.g. `dp_tune[lora-eps3-lr0.001-C1]`).
        stage: the stage kind.
        config: the config subset (the stage must depend on nothing else).
        inputs: role -> `StageOutput` (or a tuple of them) of the upstream stages.
        out_dir: the (work) directory to write every output into.
        resume: True when `out_dir` holds a previous attempt's partial output (resumable
            stages only; for the others it is always a fresh, empty directory).
        private_dir: the stage instance's owner-only directory outside every stage directory
            (`ROOT/private/<stage>/<hash16>`, see `private_path`), or None (tests).
        data_dir: the embedded default's directory (`Plan.data_dir`; None: the reader's default).
        final_dir: where `out_dir` is renamed to when the stage completes: what a message that
            outlives the stage (its report) must name, never the temporary `out_dir`.
    """

    key: str
    stage: str
    hash: str
    config: Mapping[str, Any]
    inputs: Mapping[str, Any]
    out_dir: str
    resume: bool = False
    private_dir: str | None = None
    data_dir: str | None = None
    final_dir: str | None = None

    def private_path(self, *parts: str) -> str:
        """A path in the stage's private state (created 0700; write it with `dpsynth.owner_only`).

        Private state is what must never be published with the stage's output: non-DP
        train/valid losses, the memorisation audit, checkpoints holding secret seeds.
        """
        if self.private_dir is None:
            raise ValueError(f"stage {self.key}: no private state directory was given")
        make_private_dir(os.path.dirname(self.private_dir))  # ROOT/private/<stage> (and ROOT/private) 0700
        make_private_dir(self.private_dir)
        return os.path.join(self.private_dir, *parts)

    def report(self, text: str, echo: bool = True) -> None:
        """Prints a human summary and appends it to `report.txt` (shown again when cached).

        Never pass private text: counts, ids, hashes, metrics and SYNTHETIC examples only.
        `echo=False` stores without printing (when the library already printed it).
        """
        if echo:
            print(text, flush=True)
        with open(os.path.join(self.out_dir, REPORT), "a", encoding="utf-8") as f:
            f.write(text.rstrip("\n") + "\n")


StageFn = Callable[[StageContext], "Mapping[str, Any] | None"]


def read_marker(directory: str) -> dict[str, Any] | None:
    """The `stage.json` of a completed stage directory, or None if it is not complete."""
    try:
        marker = fileio.read_json(os.path.join(directory, MARKER))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except json.JSONDecodeError:
        return None
    return marker if marker.get("format") == MARKER_FORMAT else None


def cached_output(root: str, node: StageNode) -> StageOutput | None:
    """The completed output of `node` under `root`, or None."""
    directory = stage_dir(root, node)
    marker = read_marker(directory)
    if marker is None or marker.get("hash") != node.hash:
        return None
    return StageOutput(
        key=node.key,
        stage=node.stage,
        hash=node.hash,
        dir=directory,
        summary=marker.get("summary") or {},
        seconds=float(marker.get("seconds", 0.0)),
        cached=True,
    )


@contextlib.contextmanager
def _lock(path: str) -> Iterator[None]:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, allow_nan=True, default=str))


def run_stage(root: str, node: StageNode, fn: StageFn, inputs: Mapping[str, Any], *,
              data_dir: str | None = None) -> StageOutput:
    """Runs `fn` for `node` unless its output is cached; completes atomically.

    Args:
        root: the experiment's output root.
        node: the stage instance.
        fn: the stage function, `fn(StageContext) -> summary dict | None`.
        inputs: role -> upstream `StageOutput` (or tuple of them), as in `node.inputs`.
        data_dir: the embedded default's directory, passed to `fn` as `ctx.data_dir`.

    Returns:
        The stage's `StageOutput` (`cached=True` when nothing ran).

    Raises:
        StageUnavailable: the stage's library is missing (nothing is written).
        StageFailed: `fn` raised; the partial work directory is kept for inspection and
            wiped (or resumed, for resumable stages) by the next run.
    """
    done = cached_output(root, node)
    if done is not None:
        return done
    final = stage_dir(root, node)
    parent = os.path.dirname(final)
    work = os.path.join(parent, f".work-{node.hash[:HASH_PREFIX]}")
    with _lock(os.path.join(parent, f".lock-{node.hash[:HASH_PREFIX]}")):
        done = cached_output(root, node)  # another process may have finished it meanwhile
        if done is not None:
            return done
        resume = os.path.isdir(work) and node.resumable and bool(os.listdir(work))
        if os.path.isdir(work) and not resume:
            shutil.rmtree(work)
        os.makedirs(work, exist_ok=True)
        ctx = StageContext(
            key=node.key, stage=node.stage, hash=node.hash, config=node.config, inputs=inputs, out_dir=work, resume=resume,
            private_dir=private_dir(root, node), data_dir=data_dir, final_dir=final,
        )
        started, t0 = _now(), time.perf_counter()
        try:
            summary = fn(ctx) or {}
        except StageUnavailable:
            shutil.rmtree(work, ignore_errors=True)
            raise
        except Exception as e:
            raise StageFailed(f"stage {node.key} failed ({type(e).__name__}: {e}); partial output in {work}") from e
        seconds = time.perf_counter() - t0
        marker = {
            "format": MARKER_FORMAT,
            "format_version": MARKER_VERSION,
            "key": node.key,
            "stage": node.stage,
            "hash": node.hash,
            "config": _jsonable(dict(node.config)),
            "inputs": {
                role: ([o.hash for o in v] if isinstance(v, tuple) else v.hash) for role, v in inputs.items()
            },
            "started": started,
            "finished": _now(),
            "seconds": round(seconds, 3),
            "resumed": resume,
            "host": socket.gethostname(),
            "python": sys.version.split()[0],
            "summary": _jsonable(dict(summary)),
        }
        fileio.write_json(os.path.join(work, MARKER), marker, newline=False)
        if os.path.exists(final):  # an incomplete leftover (no valid marker): replace it
            shutil.rmtree(final)
        os.rename(work, final)
    return StageOutput(
        key=node.key, stage=node.stage, hash=node.hash, dir=final, summary=marker["summary"], seconds=seconds, cached=False
    )
