"""Worker pinning: claims are disjoint, match the process's affinity, and die with the process."""

import json
import os
import subprocess
import sys

import pytest

from dpsynth.beam import affinity

_CLAIMER = r"""
import json, os, sys
from dpsynth.beam.affinity import claim_cores
cores = claim_cores(int(sys.argv[1]), sys.argv[2])
again = claim_cores(int(sys.argv[1]), sys.argv[2])
print(json.dumps({"cores": cores, "again": again, "affinity": sorted(os.sched_getaffinity(0))}), flush=True)
sys.stdin.read()  # hold the claim until the test closes stdin
"""


def _claimer(n, lock_dir):
    proc = subprocess.Popen([sys.executable, "-c", _CLAIMER, str(n), str(lock_dir)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    return proc, json.loads(proc.stdout.readline())


def test_workers_claim_disjoint_core_sets_until_they_exit(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    n = max(1, len(allowed) // 2)
    slots = len(allowed) // n
    procs, claims = [], []
    try:
        for _ in range(slots + 1):
            proc, claim = _claimer(n, tmp_path)
            procs.append(proc)
            claims.append(claim)
        held = [c["cores"] for c in claims[:slots]]
        assert all(c is not None and len(c) == n for c in held)
        assert len({core for c in held for core in c}) == n * slots  # disjoint
        assert all(c["affinity"] == c["cores"] == c["again"] for c in claims[:slots])  # pinned, idempotent
        assert claims[slots]["cores"] is None and claims[slots]["affinity"] == allowed  # none free: unpinned
        procs[0].stdin.close()
        procs[0].wait(timeout=30)
        proc, claim = _claimer(n, tmp_path)  # the exited worker's set is free again
        procs.append(proc)
        assert claim["cores"] == held[0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.stdin.close()
                p.wait(timeout=30)


def test_rejects_zero_cores(tmp_path):
    with pytest.raises(ValueError, match="must be >= 1"):
        affinity.claim_cores(0, str(tmp_path))
