"""Per-worker CPU pinning: several worker processes on one machine, each on its own cores.

XLA:CPU sizes its thread pools from the process's CPU affinity when its client starts. Two
unpinned JAX workers on one machine therefore each start pools over *all* its cores and
oversubscribe them; pinned before their first JAX call, each computes on its own cores.

Workers claim disjoint core sets through lock files (`flock`, released by the kernel when the
process exits, so a killed worker never leaks its claim). Claiming is opt-in: pinning the
process that also runs the rest of a pipeline (Beam's in-process runner) would slow it down.
"""

from __future__ import annotations

import fcntl
import logging
import os
import tempfile

logger = logging.getLogger(__name__)

# (cores, fd) of this process's claim; the fd stays open for the life of the process.
_claim: tuple[tuple[int, ...], int] | None = None


def default_lock_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"dpsynth-cores-{os.getuid()}")


def claim_cores(n: int, lock_dir: str | None = None) -> tuple[int, ...] | None:
    """Pins this process to `n` cores no other claiming process on this machine holds.

    The cores this process may use are cut into consecutive sets of `n`; the first set whose
    lock file is free is locked and the process is pinned to it. Idempotent within a process.

    Args:
      n: cores per worker (>= 1).
      lock_dir: directory of the lock files (default: one per user under the temp dir).

    Returns:
      The claimed cores, or None when no set is free (more workers than sets: the process
      stays unpinned and a warning is logged).
    """
    global _claim
    if n < 1:
        raise ValueError(f"cores per worker must be >= 1, got {n}")
    if _claim is not None:
        return _claim[0]
    allowed = sorted(os.sched_getaffinity(0))
    lock_dir = lock_dir or default_lock_dir()
    os.makedirs(lock_dir, exist_ok=True)
    for slot in range(len(allowed) // n):
        fd = os.open(os.path.join(lock_dir, f"cores-{n}-{slot}.lock"), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        cores = tuple(allowed[slot * n:(slot + 1) * n])
        os.sched_setaffinity(0, cores)
        _claim = (cores, fd)
        logger.info("worker %d pinned to cores %s", os.getpid(), list(cores))
        return cores
    logger.warning("worker %d: all %d sets of %d cores are claimed; running unpinned", os.getpid(), len(allowed) // n, n)
    return None
