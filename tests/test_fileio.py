"""Tests of dpsynth.fileio (and the owner-only writes of dpsynth.owner_only built on it)."""

import hashlib
import json
import math
import os
import stat

import pytest

from dpsynth import fileio, owner_only


def _leftovers(directory):
    return [p for p in os.listdir(directory) if fileio.TMP_MARK in p]


def test_write_bytes_replaces_and_leaves_no_temp_file(tmp_path):
    path = str(tmp_path / "f.bin")
    assert fileio.write_bytes(path, b"old") == path
    fileio.write_bytes(path, b"new content")
    assert open(path, "rb").read() == b"new content"
    assert os.listdir(tmp_path) == ["f.bin"]


@pytest.mark.parametrize("fail_at", ["write", "replace"])
def test_failed_write_keeps_old_file_and_removes_temp(tmp_path, monkeypatch, fail_at):
    path = str(tmp_path / "f.json")
    fileio.write_json(path, {"a": 1})
    before = open(path, "rb").read()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync" if fail_at == "write" else "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        fileio.write_json(path, {"a": 2, "b": "x" * 100000})
    monkeypatch.undo()
    assert open(path, "rb").read() == before
    assert _leftovers(tmp_path) == []


def test_unserialisable_json_leaves_file_untouched(tmp_path):
    path = str(tmp_path / "f.json")
    fileio.write_json(path, [1])
    with pytest.raises(TypeError):
        fileio.write_json(path, {"x": object()})
    assert fileio.read_json(path) == [1]
    assert _leftovers(tmp_path) == []


def test_atomic_path_renames_on_success_and_cleans_up_on_failure(tmp_path):
    path = str(tmp_path / "out.dat")
    with fileio.atomic_path(path) as tmp:
        assert fileio.TMP_MARK in tmp and os.path.dirname(tmp) == str(tmp_path)
        with open(tmp, "wb") as f:
            f.write(b"done")
    assert open(path, "rb").read() == b"done"
    with pytest.raises(RuntimeError):
        with fileio.atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                f.write(b"half")
            raise RuntimeError("writer died")
    assert open(path, "rb").read() == b"done"
    assert _leftovers(tmp_path) == []


def test_temp_names_are_unique():
    assert len({fileio.temp_path("/x/y") for _ in range(100)}) == 100


def test_json_formats_match_json_dump(tmp_path):
    value = {"b": [1, 2.5, float("nan")], "a": {"z": None, "é": "ü"}}
    for kwargs, expected in (({}, json.dumps(value, indent=2, sort_keys=True) + "\n"),
                             ({"indent": 1, "newline": False}, json.dumps(value, indent=1, sort_keys=True)),
                             ({"sort_keys": False, "newline": False}, json.dumps(value, indent=2))):
        path = str(tmp_path / "v.json")
        fileio.write_json(path, value, **kwargs)
        assert open(path, encoding="utf-8").read() == expected
    back = fileio.read_json(path)
    assert math.isnan(back["b"][2]) and back["a"] == value["a"]


def test_read_jsonl_skips_blank_lines(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2}\n  \n', encoding="utf-8")
    assert fileio.read_jsonl(str(path)) == [{"a": 1}, {"a": 2}]


def test_sha256_file_equals_hashlib_on_a_multi_chunk_file(tmp_path):
    data = os.urandom(3 * 4096 + 17)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    expected = hashlib.sha256(data).hexdigest()
    assert fileio.sha256_file(str(path), chunk_bytes=4096) == expected
    assert fileio.sha256_file(str(path)) == expected
    assert fileio.sha256_bytes(data) == expected


def test_mode_is_forced_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        path = fileio.write_bytes(str(tmp_path / "secret"), b"s", mode=0o600)
        with fileio.atomic_path(str(tmp_path / "secret2"), mode=0o600) as tmp:
            open(tmp, "wb").close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "secret2").st_mode) == 0o600


def test_owner_only_writes_are_0600_in_0700_dirs(tmp_path):
    old = os.umask(0o022)
    try:
        path = owner_only.write_private_json(str(tmp_path / "private" / "deep" / "a.json"), {"loss": 1.5})
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "private").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "private" / "deep").st_mode) == 0o700
    assert open(path, encoding="utf-8").read() == json.dumps({"loss": 1.5}, indent=2, sort_keys=True) + "\n"
    assert _leftovers(tmp_path / "private" / "deep") == []


def test_write_bytes_fs_writes_through_filesystems(tmp_path):
    path = str(tmp_path / "via_beam.bin")
    fileio.write_bytes_fs(path, b"one")
    fileio.write_bytes_fs(path, b"two")
    assert open(path, "rb").read() == b"two"
    assert os.listdir(tmp_path) == ["via_beam.bin"]


def test_parse_jsonl_splits_at_newline_bytes_only():
    rows = [{"text": "a\u2028b\u2029c\x85d\x1ce"}, {"text": "é"}]
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8") + b"\n  \n"
    assert len(data.decode().splitlines()) > 3  # str.splitlines would cut the first record
    assert fileio.parse_jsonl(data) == rows
