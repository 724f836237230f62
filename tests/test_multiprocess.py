"""The multi-process test launcher itself: results, failures and timeouts."""

import time

import pytest

from tests import multiprocess


def test_failure_kills_the_others_and_reports_stderr():
    t0 = time.monotonic()
    with pytest.raises(multiprocess.MultiprocessError, match=r"process 1 exited(.|\n)*boom from process 1"):
        multiprocess.run("tests.train.multihost_cases:fail_case", num_processes=2, devices=1, timeout=120)
    assert time.monotonic() - t0 < 60  # process 0 (waiting forever) was killed, not awaited


def test_timeout_kills_every_process():
    with pytest.raises(multiprocess.MultiprocessError, match="timed out"):
        multiprocess.run("tests.train.multihost_cases:fail_case", num_processes=1, devices=1,
                         kwargs={"hang": True}, timeout=3)
