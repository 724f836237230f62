"""Stage cache hashes are stable: every pinned experiment plans to the hashes recorded on main.

`plan_hashes.json` was written by `plan_hashes.py` from main before the settings refactor of
issue 25 (one declaration per setting, defaults dropped from the hashes generically). A change
that moves a hash invalidates every cache made with it (a multi-hour study among them): if it
is intended, bump the stage's `STAGE_VERSIONS` entry and rewrite the fixture in the same change.
"""

from __future__ import annotations

import json

import pytest

from tests.experiment import plan_hashes


def _fixture() -> dict:
    return json.loads(plan_hashes.FIXTURE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def recorded():
    return {k: v for k, v in _fixture().items() if k != plan_hashes.SHARED_KEY}


def test_every_pinned_experiment_is_still_listed(recorded):
    assert sorted(plan_hashes.experiments()) == sorted(recorded)


@pytest.mark.parametrize("name", sorted(k for k in _fixture() if k != plan_hashes.SHARED_KEY))
def test_stage_hashes_are_unchanged(recorded, monkeypatch, request, name):
    if name in plan_hashes.READS_SHARED_DATA or name.startswith("paper-"):
        shared = request.getfixturevalue("shared_data")  # their data fingerprints need ../shared/data (skips without)
        if str(shared) != _fixture()[plan_hashes.SHARED_KEY]:
            pytest.skip(f"pinned with ../shared/data at {_fixture()[plan_hashes.SHARED_KEY]} (paths enter the hashes)")
    monkeypatch.chdir(plan_hashes.REPO)  # demo.yaml has no relative paths, but the resolver reads the cwd
    cfg = plan_hashes.experiments()[name]
    assert plan_hashes.plan_hashes(cfg) == recorded[name]
