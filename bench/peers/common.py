"""What the peer benchmarks share: running a peer script in the peers' venv, and peak memory.

The peers (llama.cpp through llama-cpp-python, transformers, PEFT, Opacus on CPU torch) are never
dependencies of dpsynth: they live in their own venv, `.venv-peers` (`make bench-peers` builds it),
and each peer script under bench/peers/ runs there as a subprocess that prints one JSON object as
its last line of output. A peer that cannot be imported answers {"unavailable": reason}, so the
benchmark names it and why instead of dropping it. This module is stdlib-only: both venvs import it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEERS_PY = os.environ.get("DPSYNTH_PEERS_PYTHON", os.path.join(REPO, ".venv-peers", "bin", "python"))


def run_peer(script: str, args: list[str], timeout: float = 1800) -> dict:
    """Runs bench/peers/`script` with `args` in the peers' venv; its last stdout line as JSON, or
    {"unavailable": reason} when the venv or the peer is missing or the script fails."""
    if not os.path.exists(PEERS_PY):
        return {"unavailable": f"no peers venv at {PEERS_PY} (make bench-peers builds it)"}
    cmd = [PEERS_PY, os.path.join(REPO, "bench", "peers", script), *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"unavailable": f"{script} ran past {timeout:.0f}s"}
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"unavailable": f"{script} failed (exit {proc.returncode}): {tail[:300]}"}
    return json.loads(lines[-1])


def reset_peak_rss() -> None:
    """Resets this process's peak resident set size (VmHWM) to its current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss() -> int:
    """This process's peak resident set size in bytes since start or the last `reset_peak_rss`."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def versions(names: list[str]) -> dict[str, str]:
    """{distribution: version} of the installed ones among `names`."""
    from importlib import metadata

    out = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            pass
    return out


def emit(result: dict) -> None:
    """A peer script's answer: one JSON line, last."""
    sys.stdout.flush()
    print(json.dumps(result), flush=True)


def generate_parser(doc: str):
    """The command line every generation peer answers (`bench/generate.py --peers` passes these):
    the GGUF file, the prompts (a JSON list of token-id lists, BOS included), new tokens per row, threads."""
    import argparse

    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--gguf", required=True)
    p.add_argument("--prompts", required=True, help="JSON file: a list of token-id lists (BOS included)")
    p.add_argument("--new-tokens", type=int, required=True)
    p.add_argument("--threads", type=int, default=2)
    return p
