"""The local multi-process runner's workers: a worker process that dies fails the job.

Beam's `FnApiRunner` in multi-process mode (`--direct_running_mode=multi_processing
--direct_num_workers=N`) runs each worker as a subprocess it talks to over gRPC. When one of
them dies (killed, out of memory), Beam 2.x only notes it in a thread of its own: the bundle
that worker was processing never answers, and the driver waits for it forever (Beam's Docker
worker handler watches its container; the subprocess one does not).

`install()` registers `WatchedSubprocessWorkerHandler` for Beam's subprocess environment. It
behaves as Beam's own handler, and in addition, when its worker process exits with a nonzero
status, answers every request still pending on that worker (and any sent to it later) with an
error response. The bundle then fails through Beam's ordinary error path: the other workers
finish the bundles they hold, and `Pipeline.run` raises `RuntimeError` naming the worker and
its exit status. Jobs whose outputs are written per unit of work (the generation shards) are
then resumed by running them again. Nothing changes while every worker lives.

`worker_processes(session)` lists the worker processes of a job started in its own session
(Linux `/proc`), for benchmarks and tests that measure or kill them.
"""

from __future__ import annotations

import logging
import os
import threading

from apache_beam.portability import python_urns
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.portability import local_job_service
from apache_beam.runners.portability.fn_api_runner import worker_handlers

logger = logging.getLogger(__name__)

WORKER_LOST = "Beam worker process lost"  # the start of the error message of a failed bundle


class _WatchedControl:
    """The runner's side of one worker's control connection that can fail what is pending.

    Delegates everything to Beam's `ControlConnection`; `push` also remembers each request's
    future until it is answered, and once `lost(message)` was called every pending and every
    later request is answered with an error response carrying `message`.
    """

    def __init__(self, conn):
        self._conn = conn
        self._lock = threading.Lock()
        self._pending = []
        self._lost: str | None = None

    def push(self, req):
        future = self._conn.push(req)
        if future is None:  # the end-of-stream marker
            return None
        with self._lock:
            self._pending = [f for f in self._pending if not f.is_done()]
            if self._lost is None:
                self._pending.append(future)
                return future
        _fail(future, self._lost)
        return future

    def lost(self, message: str) -> None:
        with self._lock:
            self._lost = message
            pending, self._pending = self._pending, []
        for future in pending:
            if not future.is_done():
                _fail(future, message)

    def __getattr__(self, name):
        return getattr(self._conn, name)


def _fail(future, message: str) -> None:
    future.set(beam_fn_api_pb2.InstructionResponse(instruction_id=future.instruction_id, error=message))


class WatchedSubprocessWorkerHandler(worker_handlers.SubprocessSdkWorkerHandler):
    """Beam's subprocess worker handler, failing the worker's requests when its process dies."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.control_conn = _WatchedControl(self.control_conn)

    def start_worker(self):
        self.worker = local_job_service.SubprocessSdkWorker(
            self._worker_command_line, self.control_address, self.provision_info, self.worker_id)
        self.worker_thread = threading.Thread(name="run_worker", target=self._run_and_watch)
        self.worker_thread.start()

    def _run_and_watch(self) -> None:
        try:
            self.worker.run()  # returns when the process exits with status 0
        except Exception as e:  # noqa: BLE001 - Beam raises RuntimeError for a nonzero exit status
            message = f"{WORKER_LOST}: {self.worker_id} ({e})"
            logger.error("%s; failing its pending bundles", message)
            self.control_conn.lost(message)


def install() -> None:
    """Registers `WatchedSubprocessWorkerHandler` for Beam's subprocess environment (idempotent)."""
    worker_handlers.WorkerHandler.register_environment(python_urns.SUBPROCESS_SDK, bytes)(
        WatchedSubprocessWorkerHandler)


WORKER_MAIN = "apache_beam.runners.worker.sdk_worker_main"  # the module each worker process runs


def worker_processes(session: int) -> list[int]:
    """PIDs of the Beam worker processes (Python, not their `sh -c` wrappers) in a session.

    Args:
      session: the session id: the PID of a job started as a session leader (e.g.
        `subprocess.Popen(..., start_new_session=True)`), so that other jobs' workers on the
        machine are never listed.
    """
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:  # exited meanwhile
            continue
        fields = stat[stat.rindex(b")") + 2:].split()  # after "pid (comm) ": state ppid pgrp session ...
        if int(fields[3]) == session and WORKER_MAIN.encode() in argv and os.path.basename(argv[0]) != b"sh":
            pids.append(int(name))
    return sorted(pids)
