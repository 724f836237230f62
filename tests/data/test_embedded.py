"""Tests for dpsynth.data.embedded on small R lazy-load databases written here (no R needed)."""

import bz2
import lzma
import os
import struct
import warnings
import zlib

import numpy as np
import pandas as pd
import pytest
import rdata

from dpsynth.data import embedded


def _serialize(obj, tmp_path) -> bytes:
    path = tmp_path / "obj.rds"
    rdata.write_rds(path, obj, compression=None)
    return path.read_bytes()


def _blob(data: bytes, how: str) -> bytes:
    head = struct.pack(">i", len(data))
    if how == "xz":
        return head + b"Z" + lzma.compress(data, format=lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA2, "preset": 6}])
    if how == "bz2":
        return head + b"2" + bz2.compress(data)
    if how == "none":
        return head + b"0" + data
    return head + zlib.compress(data)  # R_compress1: length + zlib stream


def _write_db(base: str, objects: dict, how: str, tmp_path) -> None:
    """An R lazy-load database: `.rdb` blobs and an `.rdx` RDS index of [offset, length] per object."""
    rdb, variables = b"", {}
    for name, obj in objects.items():
        blob = _blob(_serialize(obj, tmp_path), how)
        variables[name] = np.array([len(rdb), len(blob)], dtype=np.int32)
        rdb += blob
    with open(base + ".rdb", "wb") as f:
        f.write(rdb)
    rdata.write_rds(base + ".rdx", {"variables": variables, "references": {}, "compressed": np.array([3], np.int32)})


def _frame(n: int, prefix: str) -> pd.DataFrame:
    return pd.DataFrame({
        "review": pd.Series([f"{prefix} review {i}" for i in range(n)], dtype=object),
        "score": pd.Categorical(["great" if i % 3 else "other" for i in range(n)], categories=["great", "other"]),
    })


@pytest.fixture(params=["xz", "bz2", "none", "zlib"])
def data_dir(request, tmp_path):
    lib = tmp_path / "root" / "usr" / "lib" / "R" / "site-library"
    (lib / "janeaustenr" / "data").mkdir(parents=True)
    (lib / "modeldata" / "data").mkdir(parents=True)
    books = {b: np.array([f"{b} line 1", "", f"{b} line 3"], dtype=object) for b in embedded.AUSTEN_BOOKS}
    _write_db(str(lib / "janeaustenr" / "data" / "Rdata"), books, request.param, tmp_path)
    _write_db(str(lib / "modeldata" / "data" / "Rdata"),
              {"training_data": _frame(20, "tr"), "testing_data": _frame(5, "te")}, request.param, tmp_path)
    return str(tmp_path)


def test_reads_books_and_splits_quietly(data_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # rdata's warnings are silenced inside
        books = embedded.austen_documents(data_dir)
        splits = embedded.fine_food_splits(data_dir)
    assert [b["id"] for b in books] == list(embedded.AUSTEN_BOOKS)
    assert books[1]["text"] == "prideprejudice line 1\n\nprideprejudice line 3"
    assert {k: len(v) for k, v in splits.items()} == {"train": 18, "valid": 2, "test": 5}
    assert [r["id"] for r in splits["train"] + splits["valid"]] == [f"train-{i:05d}" for i in range(20)]
    assert splits["valid"][0] == {"id": "train-00018", "text": "tr review 18", "label": "other"}
    assert splits["test"][1]["label"] == "great"


def test_unknown_object_and_missing_data(data_dir, tmp_path):
    base = os.path.join(data_dir, "root", "usr", "lib", "R", "site-library", "modeldata", "data", "Rdata")
    with pytest.raises(KeyError, match="no object 'nope'"):
        embedded.read_lazyload(base, "nope")
    with pytest.raises(embedded.EmbeddedDataMissing, match="make data"):
        embedded.fine_food_splits(str(tmp_path / "absent"))


def test_real_embedded_data_when_fetched():
    try:
        splits = embedded.fine_food_splits()
    except embedded.EmbeddedDataMissing:
        pytest.skip("embedded data not fetched (make data)")
    assert {k: len(v) for k, v in splits.items()} == {"train": 3600, "valid": 400, "test": 1000}
    assert {r["label"] for r in splits["train"]} == {"great", "other"}
