"""The embedded default dataset, read from Debian packages of R data without R.

Public corpus: Jane Austen's six novels (Debian `r-cran-janeaustenr`). Sensitive labeled
dataset: Amazon fine-food reviews `small_fine_foods` (Debian `r-cran-modeldata`):
`training_data` (4,000 reviews) split 90/10 into train/valid as in the paper, and
`testing_data` (1,000) as test; label `great` or `other`.

`make data` fetches the two `.deb` files with `apt-get download` and unpacks them with
`dpkg-deb -x` under `data/embedded/root`; this module only reads that tree. Both packages
store their data as R lazy-load databases (`data/Rdata.rdx` index + `data/Rdata.rdb`
blobs); each blob is a 4-byte big-endian length, a 1-byte compression tag and an R
serialization stream, which the PyPI package `rdata` parses.
"""

from __future__ import annotations

import bz2
import lzma
import os
import struct
import warnings
import zlib
from typing import Any

from dpsynth.errors import MissingFileError

AUSTEN_BOOKS = ("sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey", "persuasion")
_R_LIB = os.path.join("usr", "lib", "R", "site-library")
ENV_DIR = "DPSYNTH_EMBEDDED_DIR"
DEFAULT_DIR = os.path.join("data", "embedded")
VALID_FRACTION = 0.1


class EmbeddedDataMissing(MissingFileError):
    """The Debian packages have not been fetched (run `make data`)."""


def embedded_dir(data_dir: str | None = None) -> str:
    return data_dir or os.environ.get(ENV_DIR) or DEFAULT_DIR


def _package_data(data_dir: str | None, package: str) -> str:
    base = os.path.join(embedded_dir(data_dir), "root", _R_LIB, package, "data", "Rdata")
    if not os.path.exists(base + ".rdx"):
        raise EmbeddedDataMissing(
            f"{base}.rdx: not found. Fetch the embedded default with `make data` (apt-get download "
            f"r-cran-janeaustenr r-cran-modeldata), or run the stages on your own files (README: 'Your own data')."
        )
    return base


def _decompress(blob: bytes, where: str) -> bytes:
    tag, payload = blob[4:5], blob[5:]
    if tag == b"Z":  # R's xz: raw LZMA2 stream (R_compress3)
        return lzma.decompress(payload, format=lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}])
    if tag == b"2":
        return bz2.decompress(payload)
    if tag == b"0":
        return payload
    try:  # R_compress1: 4-byte length then a zlib stream
        return zlib.decompress(blob[4:])
    except zlib.error as e:
        raise ValueError(f"{where}: unknown lazy-load compression") from e


def read_lazyload(base: str, name: str) -> Any:
    """Reads object `name` from an R lazy-load database `base`.rdx/.rdb, converted by `rdata`."""
    import rdata

    with warnings.catch_warnings():  # rdata warns about R classes it maps (tbl_df) and the .rdx type
        warnings.simplefilter("ignore", UserWarning)
        return _read_lazyload(rdata, base, name)


def _read_lazyload(rdata, base: str, name: str) -> Any:
    index = rdata.read_rds(base + ".rdx")
    variables = {str(k): v for k, v in index["variables"].items()}
    if name not in variables:
        raise KeyError(f"{base}.rdx: no object {name!r} (has {sorted(variables)})")
    offset, length = (int(x) for x in variables[name])
    with open(base + ".rdb", "rb") as f:
        f.seek(offset)
        blob = f.read(length)
    (expected,) = struct.unpack(">i", blob[:4])
    data = _decompress(blob, f"{base}.rdb:{name}")
    if len(data) != expected:
        raise ValueError(f"{base}.rdb:{name}: decompressed {len(data)} bytes, header says {expected}")
    return rdata.conversion.convert(rdata.parser.parse_data(data))


def austen_documents(data_dir: str | None = None) -> list[dict[str, str]]:
    """The six novels as documents `{"id": book, "text": ...}` (lines joined by newlines)."""
    base = _package_data(data_dir, "janeaustenr")
    return [{"id": book, "text": "\n".join(str(x) for x in read_lazyload(base, book))} for book in AUSTEN_BOOKS]


def fine_food_splits(data_dir: str | None = None) -> dict[str, list[dict[str, str]]]:
    """`{"train", "valid", "test"}` lists of `{"id", "text", "label"}`.

    train/valid are the first 90% / last 10% of `training_data` in its stored order (the
    paper's split); test is `testing_data`. Ids are `train-<row>` / `test-<row>`.
    """
    base = _package_data(data_dir, "modeldata")
    out: dict[str, list[dict[str, str]]] = {}
    for split, obj in (("train", "training_data"), ("test", "testing_data")):
        frame = read_lazyload(base, obj)
        rows = [
            {"id": f"{split}-{i:05d}", "text": str(text), "label": str(label)}
            for i, (text, label) in enumerate(zip(frame["review"], frame["score"]))
        ]
        out[split] = rows
    n_valid = int(round(len(out["train"]) * VALID_FRACTION))
    out["valid"] = out["train"][len(out["train"]) - n_valid :]
    out["train"] = out["train"][: len(out["train"]) - n_valid]
    return out
