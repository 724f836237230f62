"""The file helpers every stage shares: atomic writes, JSON, SHA-256, owner-only modes.

An atomic write goes to a uniquely named temporary sibling (`<path>.tmp-<pid>-<hex>`, so
concurrent writers of one path never share it) and is renamed onto `path` only once it is
complete: a reader sees the old file or the new one, never a partial one, and a failed write
removes its temporary file. `TMP_MARK` is the infix every temporary name carries, for code
that clears the leftovers of a killed process. Every file dpsynth publishes is written this way
(`write_bytes`, `write_json`, `open_atomic` for a streamed file, `copy_file`): on a full disk a
file appears whole or not at all, and the write raises `dpsynth.errors.DiskFullError` ("no
space left on device writing PATH", one line, exit 2) instead of a traceback; a rerun once there
is space writes the same bytes.

Local paths use `os`; `read_bytes_fs` and `write_bytes_fs` go through Beam's `FileSystems` (`gs://`, ...).
The owner-only policy for private state (directories `PRIVATE_DIR_MODE`, files `PRIVATE_FILE_MODE`)
lives in `dpsynth.owner_only`, which writes through `write_bytes(..., mode=PRIVATE_FILE_MODE)`; the
modes are declared here, the lowest layer, so that `dpsynth.outdir` (below `owner_only`) uses them too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from typing import IO, Any

from dpsynth import errors

PRIVATE_DIR_MODE = 0o700  # owner-only directories (private state, audits, probes)
PRIVATE_FILE_MODE = 0o600  # owner-only files
TMP_MARK = ".tmp-"
CHUNK_BYTES = 1 << 20


def temp_path(path: str) -> str:
    """A fresh temporary sibling name for `path` (unique per process and call)."""
    return f"{path}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex}"


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


@contextlib.contextmanager
def _failing_write(tmp: str, path: str) -> Iterator[None]:
    """Removes `tmp` when the block fails; a full disk becomes `DiskFullError` naming `path`."""
    try:
        yield
    except BaseException as e:
        _remove_quietly(tmp)
        if errors.is_disk_full(e) and not isinstance(e, errors.DiskFullError):
            raise errors.DiskFullError.of(path, e) from e
        raise


@contextlib.contextmanager
def atomic_path(path: str, *, mode: int | None = None) -> Iterator[str]:
    """Yields a temporary path to write (by any writer); renames it onto `path` on success.

    On an exception the temporary file is removed and `path` is left as it was (a full disk:
    `DiskFullError`). The writer flushes and syncs what it wrote (`open_atomic` does).

    Args:
        path: The final local path.
        mode: If given, the file's permission bits (set before the rename, whatever the umask).
    """
    tmp = temp_path(path)
    with _failing_write(tmp, path):
        yield tmp
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)


@contextlib.contextmanager
def open_atomic(path: str, mode: str = "w", *, encoding: str | None = "utf-8", newline: str | None = None,
                file_mode: int | None = None) -> Iterator[IO]:
    """Yields a file open for writing (`mode` "w" or "wb") on a temporary sibling of `path`; on
    success flushes, fsyncs and renames it onto `path` (`atomic_path`): for a file written piece by
    piece (a large split, a CSV, a report)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"open_atomic writes a new file (mode 'w' or 'wb'), got {mode!r}")
    with atomic_path(path, mode=file_mode) as tmp:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": encoding, "newline": newline})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())


def copy_file(src: str, dst: str, *, mode: int | None = None) -> str:
    """Copies the content of the local file `src` to `dst` atomically; returns `dst`.

    The copy is a new file: its mode is the umask's (or `mode`), not `src`'s (a release copied
    out of owner-only private state is not left 0600)."""
    with open(src, "rb") as fin, open_atomic(dst, "wb", file_mode=mode) as fout:
        shutil.copyfileobj(fin, fout, CHUNK_BYTES)
    return dst


def write_bytes(path: str, data: bytes, *, mode: int | None = None, fsync: bool = True) -> str:
    """Writes `data` to the local `path` atomically; returns `path`.

    Args:
        path: The final path (its directory must exist).
        data: The complete content.
        mode: If given, the permission bits of the new file, whatever the umask (the
            temporary file is created with them, so the content is never readable wider).
        fsync: Flush the content to disk before the rename.
    """
    tmp = temp_path(path)
    with _failing_write(tmp, path):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode)
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    return path


def copy_tree(src: str, dst: str) -> str:
    """Copies the local directory `src` into `dst` (made if missing; files already there are
    replaced), each file by `copy_file`; returns `dst`."""
    for root, _, files in os.walk(src):
        target = os.path.join(dst, os.path.relpath(root, src))
        os.makedirs(target, exist_ok=True)
        for name in files:
            copy_file(os.path.join(root, name), os.path.join(target, name))
    return dst


def write_text(path: str, text: str, *, mode: int | None = None) -> str:
    """`write_bytes` of `text` encoded as UTF-8; returns `path`."""
    return write_bytes(path, text.encode("utf-8"), mode=mode)


def dumps_json(value: Any, *, indent: int | None = 2, sort_keys: bool = True, newline: bool = True) -> str:
    """`value` as JSON text (NaN/inf allowed, as `json.dump` writes them), optionally `\\n`-terminated."""
    return json.dumps(value, indent=indent, sort_keys=sort_keys, allow_nan=True) + ("\n" if newline else "")


def write_json(path: str, value: Any, *, indent: int | None = 2, sort_keys: bool = True, newline: bool = True,
               mode: int | None = None) -> str:
    """Writes `value` as JSON (`dumps_json`) to `path` atomically; returns `path`.

    The value is serialised before anything is written, so an unserialisable value leaves
    `path` untouched.
    """
    return write_text(path, dumps_json(value, indent=indent, sort_keys=sort_keys, newline=newline), mode=mode)


def read_json(path: str) -> Any:
    """The JSON value stored in the local `path` (UTF-8)."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_jsonl(path: str) -> list[Any]:
    """The JSON values of the non-blank lines of the local `path` (UTF-8)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def parse_jsonl(data: bytes) -> list[Any]:
    """The JSON values of the non-blank lines of JSONL `data` (UTF-8 bytes).

    Lines end at b"\n" only: `json.dumps(..., ensure_ascii=False)` leaves U+2028, U+2029 and
    U+0085 unescaped, and `str.splitlines()` would cut a record there.
    """
    return [json.loads(line) for line in data.split(b"\n") if line.strip()]


def sha256_bytes(data: bytes) -> str:
    """Hex SHA-256 of `data`."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str, chunk_bytes: int = CHUNK_BYTES) -> str:
    """Hex SHA-256 of the local file `path`, read in chunks of `chunk_bytes`."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            h.update(block)
    return h.hexdigest()


def read_bytes_fs(path: str) -> bytes:
    """The bytes of `path`, read through Beam's `FileSystems` (`gs://` too)."""
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.open(path) as f:
        return f.read()


def write_bytes_fs(path: str, data: bytes) -> None:
    """Writes `data` to `path` through Beam's `FileSystems` via a temporary sibling and a rename.

    Atomic on local disks; on object stores the rename is a copy, so a reader may briefly see
    no file, never a partial one. A full local disk: `DiskFullError`, the temporary file removed.
    """
    from apache_beam.io.filesystems import FileSystems

    if "://" not in path:  # (Beam's local file system makes the parent directories too)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write_bytes(path, data)
        return
    tmp = temp_path(path)
    with FileSystems.create(tmp) as f:
        f.write(data)
    if FileSystems.exists(path):
        FileSystems.delete([path])
    FileSystems.rename([tmp], [path])
