"""Comparing two runs' ledgers up to their run ids (`dpsynth.dp.ledger`, `"run"`)."""

import copy

import pytest


def merged(entries):
    """`entries` without run ids, consecutive entries equal but for `steps` merged (as one ledger
    object records them): a resumed run's ledger then equals an uninterrupted one's."""
    out = []
    for e in entries:
        e = {k: v for k, v in e.items() if k != "run"}
        last = out[-1] if out else None
        if last is not None and "steps" in e and {k: v for k, v in last.items() if k != "steps"} == {
                k: v for k, v in e.items() if k != "steps"}:
            last["steps"] += e["steps"]
        else:
            out.append(copy.deepcopy(e))
    return out


def without_runs(report):
    """A privacy report with its ledger `merged`."""
    out = copy.deepcopy(report)
    out["ledger"]["entries"] = merged(out["ledger"]["entries"])
    return out


def without_run(entry):
    """One ledger entry without its run id."""
    return {k: v for k, v in entry.items() if k != "run"}


def same_epsilon(report, rel=1e-12):
    """`report["epsilon"]` up to float round-off: a resumed run's ledger holds the steps after the
    resume in an entry of their own, whose composition (PLD above all) may differ in the last digits."""
    return {k: (pytest.approx(v, rel=rel) if isinstance(v, float) else v) for k, v in report["epsilon"].items()}
