"""Tests for dpsynth.beam.workers: a lost worker fails its requests; listing a job's workers.

The end-to-end case (SIGKILL one of two worker processes of a generation job; the job fails
instead of hanging, a rerun resumes) is
`tests/generate/test_job.py::test_killed_worker_fails_the_job_then_rerun_resumes_exactly`.
"""

import os
import signal
import subprocess
import sys
import time

import pytest
from apache_beam.portability import python_urns
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.portability.fn_api_runner import worker_handlers

from dpsynth.beam import workers


class FakeConnection:
    """Beam's `ControlConnection` as the runner sees it: `push` returns a `ControlFuture`."""

    def __init__(self):
        self.futures = {}
        self.closed = False

    def push(self, req):
        if req is None:
            return None
        future = worker_handlers.ControlFuture(req.instruction_id)
        self.futures[req.instruction_id] = future
        return future

    def answer(self, instruction_id):
        self.futures[instruction_id].set(beam_fn_api_pb2.InstructionResponse(instruction_id=instruction_id))

    def close(self):
        self.closed = True


def _req(i):
    return beam_fn_api_pb2.InstructionRequest(instruction_id=f"bundle_{i}")


def test_lost_worker_fails_pending_and_later_requests_only():
    conn = FakeConnection()
    control = workers._WatchedControl(conn)
    answered, pending = control.push(_req(1)), control.push(_req(2))
    conn.answer("bundle_1")
    assert control.push(None) is None  # the end-of-stream marker passes through
    control.lost("Beam worker process lost: worker_1 (exit 137)")
    assert answered.get().error == ""
    assert pending.is_done() and pending.get().error == "Beam worker process lost: worker_1 (exit 137)"
    assert pending.get().instruction_id == "bundle_2"
    later = control.push(_req(3))
    assert later.is_done() and later.get().error.startswith(workers.WORKER_LOST)
    control.close()  # everything else is the connection's own
    assert conn.closed


def test_no_change_while_the_worker_lives():
    conn = FakeConnection()
    control = workers._WatchedControl(conn)
    futures = [control.push(_req(i)) for i in range(3)]
    assert not any(f.is_done() for f in futures)
    for i in range(3):
        conn.answer(f"bundle_{i}")
    assert all(f.get().error == "" for f in futures)


def test_install_registers_the_watched_handler():
    workers.install()
    workers.install()  # idempotent
    constructor, payload = worker_handlers.WorkerHandler._registered_environments[python_urns.SUBPROCESS_SDK]
    assert constructor is workers.WatchedSubprocessWorkerHandler and payload is bytes


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_worker_processes_lists_the_python_workers_of_one_session_only():
    sleeper = "import time; time.sleep(60)"
    job = subprocess.Popen(["sh", "-c", f"{sys.executable} -c '{sleeper}' {workers.WORKER_MAIN} & wait"],
                           start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", sleeper, workers.WORKER_MAIN], start_new_session=True)
    try:
        deadline = time.time() + 30
        while not workers.worker_processes(job.pid) and time.time() < deadline:
            time.sleep(0.02)
        listed = workers.worker_processes(job.pid)
        assert len(listed) == 1 and listed[0] not in (job.pid, other.pid)  # the python child, not its sh
        assert workers.worker_processes(other.pid) == [other.pid]
    finally:
        for proc in (job, other):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
