"""Readers for public corpora and sensitive labeled datasets, with dead letters.

Inputs are paths, directories or globs, resolved through Beam's `FileSystems` (so
`gs://bucket/dir/*.jsonl` works wherever Beam has that filesystem). A directory stands for
every non-hidden file below it. The format comes from the suffix (after an optional
compression suffix `.gz`, `.bz2`, `.zst`, `.deflate`, `.xz`):

| suffix            | one record is                    | text / label / id                       |
|-------------------|----------------------------------|-----------------------------------------|
| `.txt`            | the whole file (public only)     | file contents / - / `<relpath>`         |
| `.jsonl`, `.json` | one line holding a JSON object   | `text_column` / `label_column` / `id`   |
| `.csv`            | one data row (header required)   | `text_column` / `label_column` / `id`   |
| `.tsv`, `.tab`    | one data row, tab-separated (as `.csv`) | `text_column` / `label_column` / `id` |
| `.parquet`        | one row                          | `text_column` / `label_column` / `id`   |
| `label_text`      | one line `<label> <text>`        | after the first space / before it / `<relpath>:<line>` |

`label_text` (SST-2's `stsa.binary.*` layout) has no suffix of its own: name it with
`format="label_text"` (the experiment config's `sensitive.format`), which also overrides the
suffix of every other file. Each format is one `Format` entry of `REGISTRY` (reader function,
suffixes, what it can hold); the CLI, the Beam jobs and the experiment config take their
choices and checks from it, so a new input format is one entry here and its reader. `Columns.extra` fields (e.g. a CSV's `split` column) are carried
into the records as strings, for `dpsynth.data.splits`.

With a user column (`user_column`, for user-level DP: `dpsynth.dp.users`) every record also
gets `"user"` (the column's value as a string; integral floats as integers). A CSV/Parquet
file without that column, or a JSONL file none of whose records has it, is fatal
(`InputError` naming the file); a record with a null or empty user is dead-lettered.

Document ids are stable: the record's own `id` field when present, else
`<relpath>:<record number>` (1-based; the JSONL line, the CSV data row, the Parquet row),
where `relpath` is the file's path relative to the directory or glob base it was found
under (its basename for a single file). Given ids must be unique within a dataset.

Text files are decoded with `encoding` (default UTF-8; any ASCII-compatible codec Python
knows, e.g. `cp1252` or `latin-1` for a spreadsheet export): every reader takes it, from
`--encoding` or the experiment file's `encoding` key, and records it on each `InputFile`.
A byte that is not valid in the encoding dead-letters its record. Parquet strings are UTF-8 by
the format, whatever `encoding` says.

Failure policy (records in = records out + dead-lettered):

* Fatal (`InputError`, naming the file): a path that matches nothing, an unknown file type,
  a CSV/Parquet file without the text (or, for sensitive data, label) column, a `.txt` file
  given as a labeled dataset, and a dataset with no valid record at all (`EmptyDatasetError`).
* Fatal too: an `encoding` Python does not know, or one that is not ASCII-compatible (UTF-16/32:
  convert the file to UTF-8).
* Dead-lettered (`DeadLetter`: file, record number, reason; never the text): invalid UTF-8 (or
  bytes invalid in the given `encoding`),
  invalid JSON or a line that is not an object, a missing/null/non-string text or a missing
  label in one record, an empty or whitespace-only document, a NUL byte, a CSV row with the
  wrong number of fields, and a document larger than `max_document_bytes`.
"""

from __future__ import annotations

import bz2
import codecs
import csv
import dataclasses
import json
import lzma
import os
import re
import sys
import zlib
from collections.abc import Iterator, Sequence
from typing import Any, Union

from apache_beam.io.filesystem import CompressionTypes
from isal import igzip, isal_zlib
from apache_beam.io.filesystems import FileSystems

from dpsynth import fileio
from dpsynth.errors import DpsynthError

COMPRESSION_SUFFIXES = (".gz", ".bz2", ".zst", ".deflate", ".xz")
DEFAULT_MAX_DOCUMENT_BYTES = 256 << 20
DEFAULT_ENCODING = "utf-8"
ENCODING_HELP = ("text encoding of the input files (default utf-8; e.g. cp1252 or latin-1 for a spreadsheet "
                 "export); a byte invalid in it dead-letters its record")
_GLOB = re.compile(r"[*?\[]")

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


class InputError(DpsynthError, ValueError):
    """A fatal problem with an input (names the file and the reason)."""


class EmptyDatasetError(InputError):
    """An input yielded no valid record."""


@dataclasses.dataclass(frozen=True)
class InputFile:
    """One resolved input file.

    Attributes:
      path: full path (any Beam filesystem).
      relpath: path relative to the directory/glob base it was found under; used in ids.
      format: one of `FORMATS`.
      size: size in bytes (compressed size for compressed files).
      encoding: the text encoding its bytes are decoded with (`check_encoding`'s name).
    """

    path: str
    relpath: str
    format: str
    size: int
    encoding: str = DEFAULT_ENCODING

    @property
    def invalid(self) -> str:
        """How a dead letter names bytes that do not decode: "invalid UTF-8", "invalid cp1252"."""
        return "invalid UTF-8" if self.encoding == DEFAULT_ENCODING else f"invalid {self.encoding}"


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """A rejected record: where it was and why; never its text."""

    file: str
    record: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "record": self.record, "reason": self.reason}


Record = dict[str, Any]
RecordOrDead = Union[Record, DeadLetter]


@dataclasses.dataclass(frozen=True)
class Columns:
    """Which fields hold the text, the label (None for public corpora), the id and the user (optional)."""

    text: str = "text"
    label: str | None = "label"
    id: str = "id"
    extra: tuple[str, ...] = ()
    user: str | None = None

    @classmethod
    def public(cls, text: str = "text") -> "Columns":
        return cls(text=text, label=None)


# ----------------------------------------------------------------------------- resolving


def file_format(path: str) -> str:
    """The record format of `path` from its suffix; raises `InputError` when unknown."""
    name = path.rsplit("/", 1)[-1].lower()
    for comp in COMPRESSION_SUFFIXES:
        if name.endswith(comp):
            name = name[: -len(comp)]
            break
    _, ext = os.path.splitext(name)
    if ext not in _SUFFIX_FORMAT:
        raise InputError(
            f"{path}: unknown file type {ext or '(no suffix)'!r}; expected one of "
            f"{sorted(_SUFFIX_FORMAT)} (optionally compressed: {', '.join(COMPRESSION_SUFFIXES)})"
        )
    return _SUFFIX_FORMAT[ext]


def check_encoding(encoding: str | None) -> str:
    """The canonical name of a text encoding (`None`: UTF-8); `InputError` when unknown or not
    ASCII-compatible (the line-based readers split on the byte of `\\n`)."""
    if encoding is None:
        return DEFAULT_ENCODING
    try:
        name = codecs.lookup(encoding).name
    except LookupError:
        raise InputError(f"--encoding: unknown text encoding {encoding!r} (e.g. utf-8, cp1252, latin-1)") from None
    try:
        ascii_compatible = "\n,\"a".encode(name) == b"\n,\"a"
    except (UnicodeError, LookupError):
        ascii_compatible = False
    if not ascii_compatible:
        raise InputError(f"--encoding: {encoding!r} is not ASCII-compatible; convert the file to UTF-8")
    return name


def _is_local(path: str) -> bool:
    return "://" not in path


def _match(pattern: str) -> list[tuple[str, int]]:
    try:
        result = FileSystems.match([pattern])[0]
    except Exception:  # Beam raises BeamIOError when nothing matches on some filesystems
        return []
    return [(m.path, int(m.size_in_bytes)) for m in result.metadata_list]


def _hidden(relpath: str) -> bool:
    return any(part.startswith((".", "_")) for part in relpath.split("/"))


def resolve_inputs(paths: Sequence[str] | str, format: str | None = None,
                   encoding: str | None = None) -> list[InputFile]:
    """Expands paths, directories and globs into files, in a stable (sorted) order.

    `format` (one of `FORMATS`) overrides the suffix-based type of every file; `encoding`
    (default UTF-8, `check_encoding`) is how every file's text is decoded.

    Raises:
      InputError: a path matches nothing, or a matched file has an unknown type. Hidden
        files and files under `_`/`.`-prefixed folders found by a directory/glob are skipped.
    """
    if isinstance(paths, str):
        paths = [paths]
    encoding = check_encoding(encoding)
    if format is not None and format not in FORMATS:
        raise InputError(f"{', '.join(map(str, paths))}: unknown format {format!r}; expected one of {FORMATS}")
    out: list[InputFile] = []
    for spec in paths:
        spec = str(spec)
        if _GLOB.search(spec):
            base = spec[: _GLOB.search(spec).start()].rsplit("/", 1)[0]
            matches, expanded = _match(spec), True
        elif (_is_local(spec) and os.path.isdir(spec)) or (
            not _is_local(spec) and not _match(spec) and _match(spec.rstrip("/") + "/**")
        ):
            base = spec.rstrip("/")
            matches, expanded = _match(base + "/**"), True
        else:
            base = spec.rsplit("/", 1)[0] if "/" in spec else ""
            matches, expanded = _match(spec), False
        if not matches:
            raise InputError(f"{spec}: no such file, or nothing matches")
        found = []
        for path, size in sorted(matches):
            if _is_local(path) and os.path.isdir(path):
                continue
            rel = path[len(base) :].lstrip("/") if base and path.startswith(base) else path.rsplit("/", 1)[-1]
            if expanded and _hidden(rel):
                continue
            found.append(InputFile(path=path, relpath=rel, format=format or file_format(path), size=size,
                                   encoding=encoding))
        if not found:
            raise InputError(f"{spec}: matches no data file")
        out.extend(found)
    seen: dict[str, str] = {}
    for f in out:
        if f.relpath in seen and seen[f.relpath] != f.path:
            raise InputError(
                f"{f.path}: same relative name {f.relpath!r} as {seen[f.relpath]}; document ids would "
                "collide (pass the common parent directory instead)"
            )
        seen[f.relpath] = f.path
    return out


# ----------------------------------------------------------------------------- validation


def utf8_size(text: str) -> int:
    """`len(text.encode("utf-8"))`, without encoding an ASCII text (UnicodeEncodeError on lone surrogates)."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def check_text(text: Any, column: str, max_document_bytes: int) -> str | None:
    """Why `text` is not a valid document (None when it is)."""
    if text is None:
        return f"{column!r} is null"
    if not isinstance(text, str):
        return f"{column!r} is not a string ({type(text).__name__})"
    try:
        size = utf8_size(text)
    except UnicodeEncodeError as e:  # lone surrogates: bytes that were not valid UTF-8
        return f"invalid UTF-8 at character {e.start} of {column!r}"
    if size > max_document_bytes:
        return f"document of {size} bytes exceeds max_document_bytes={max_document_bytes}"
    if not text or text.isspace():  # `not text.strip()` without copying the text
        return "empty document"
    nul = text.find("\x00")
    if nul >= 0:
        return f"NUL byte at character {nul}"
    return None


def _label(value: Any, column: str, what: str = "label") -> tuple[str | None, str | None]:
    if value is None:
        return None, f"{what} column {column!r} is missing or null"
    if isinstance(value, (list, tuple, dict)) or hasattr(value, "shape"):  # a JSON array/object, a Parquet list
        return None, f"{what} column {column!r} is not a scalar ({type(value).__name__})"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    label = str(value)
    try:
        label.encode("utf-8")
    except UnicodeEncodeError:
        return None, f"invalid UTF-8 in {what} column {column!r}"
    if not label.strip():
        return None, f"{what} column {column!r} is empty"
    return label, None


def _make_record(
    fields: dict[str, Any], f: InputFile, n: int, columns: Columns, max_document_bytes: int
) -> RecordOrDead:
    if columns.text not in fields:
        return DeadLetter(f.path, n, f"no {columns.text!r} field")
    reason = check_text(fields[columns.text], columns.text, max_document_bytes)
    if reason:
        return DeadLetter(f.path, n, reason.replace("invalid UTF-8", f.invalid))
    given = fields.get(columns.id)
    rec: Record = {"id": str(given) if given not in (None, "") else f"{f.relpath}:{n}", "text": fields[columns.text]}
    if columns.label is not None:
        label, reason = _label(fields.get(columns.label), columns.label)
        if reason:
            return DeadLetter(f.path, n, reason.replace("invalid UTF-8", f.invalid))
        rec["label"] = label
    if columns.user is not None:
        user, reason = _label(fields.get(columns.user), columns.user, "user")
        if reason:
            return DeadLetter(f.path, n, reason.replace("invalid UTF-8", f.invalid))
        rec["user"] = user
    for name in columns.extra:
        if fields.get(name) is not None:
            rec[name] = str(fields[name])
    return rec


# ----------------------------------------------------------------------------- per format


# Decompressed by modules that raise on a truncated or corrupt stream (Beam's CompressedFile ends
# a truncated gzip file silently, losing every record in it): gzip through ISA-L (`isal`, the
# same format, checks and multi-member handling as Python's `gzip`, inflating ~3x faster),
# bz2 and xz through Python's own modules.
_PY_DECOMPRESSORS = {".gz": igzip.GzipFile, ".bz2": bz2.BZ2File, ".xz": lzma.LZMAFile}
_STREAM_ERRORS = (EOFError, zlib.error, isal_zlib.error, lzma.LZMAError, OSError)


class _CheckedStream:
    """A (decompressing) input stream whose read errors name the file and the line they came after."""

    def __init__(self, fh, path: str, closers=()):
        self._fh, self._path, self._closers, self.lines = fh, path, (fh, *closers), 0

    def _fail(self, e: Exception):
        raise InputError(f"{self._path}: truncated or corrupt compressed file after line {self.lines} "
                         f"({type(e).__name__}: {e})") from e

    def readline(self) -> bytes:
        try:
            line = self._fh.readline()
        except _STREAM_ERRORS as e:
            self._fail(e)
        self.lines += bool(line)
        return line

    def read(self, size: int = -1) -> bytes:
        try:
            return self._fh.read(size)
        except _STREAM_ERRORS as e:
            self._fail(e)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for c in self._closers:
            c.close()


def _open(path: str, compressed: bool = True):
    if not compressed:
        return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    suffix = os.path.splitext(path.rsplit("/", 1)[-1].lower())[1]
    if suffix in _PY_DECOMPRESSORS:
        raw = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
        return _CheckedStream(_PY_DECOMPRESSORS[suffix](fileobj=raw, mode="rb"), path, (raw,))
    return _CheckedStream(FileSystems.open(path, compression_type=CompressionTypes.AUTO), path)


def _iter_txt(f: InputFile, columns: Columns, max_document_bytes: int) -> Iterator[RecordOrDead]:
    if columns.label is not None:
        raise InputError(f"{f.path}: a .txt file has no label; labeled datasets must be CSV, JSONL or Parquet")
    with _open(f.path) as fh:
        data = fh.read(max_document_bytes + 1)
        too_big = len(data) > max_document_bytes
        size = len(data)
        while len(chunk := fh.read(1 << 24)):  # count the rest without keeping it
            size += len(chunk)
    if too_big:
        yield DeadLetter(f.path, 1, f"document of {size} bytes exceeds max_document_bytes={max_document_bytes}")
        return
    try:
        text = data.decode(f.encoding)
    except UnicodeDecodeError as e:
        yield DeadLetter(f.path, 1, f"{f.invalid} at byte {e.start}")
        return
    yield _make_record({columns.text: text, columns.id: f.relpath}, f, 1, columns, max_document_bytes)


def _iter_jsonl(f: InputFile, columns: Columns, max_document_bytes: int,
                part: tuple[int, int] = (0, 1)) -> Iterator[RecordOrDead]:
    seen_user = False
    index, parts = part
    with _open(f.path) as fh:
        for n, raw in enumerate(iter(fh.readline, b""), start=1):
            if (n - 1) % parts != index:  # another part's line: skipped before parsing
                continue
            line = raw.rstrip(b"\r\n")
            if n == 1 and line.startswith(b"\xef\xbb\xbf") and f.encoding == DEFAULT_ENCODING:  # UTF-8 byte order mark
                line = line[3:]
            if not line.strip():
                yield DeadLetter(f.path, n, "empty line")
                continue
            if len(line) > max_document_bytes + 1024:
                yield DeadLetter(f.path, n, f"line of {len(line)} bytes exceeds max_document_bytes={max_document_bytes}")
                continue
            try:
                obj = json.loads(line.decode(f.encoding))
            except UnicodeDecodeError as e:
                yield DeadLetter(f.path, n, f"{f.invalid} at byte {e.start} of the line")
                continue
            except ValueError as e:
                yield DeadLetter(f.path, n, f"invalid JSON ({str(e).split(':')[0]})")
                continue
            if not isinstance(obj, dict):
                yield DeadLetter(f.path, n, f"not a JSON object ({type(obj).__name__})")
                continue
            seen_user = seen_user or (columns.user is not None and columns.user in obj)
            yield _make_record(obj, f, n, columns, max_document_bytes)
    if columns.user is not None and not seen_user:
        raise InputError(f"{f.path}: no record has the user column {columns.user!r} (choose with --user-column)")


def _check_columns(f: InputFile, available: Sequence[str], columns: Columns) -> None:
    needed = ([columns.text] + ([columns.label] if columns.label is not None else [])
              + ([columns.user] if columns.user is not None else []))
    missing = [c for c in needed if c not in available]
    if missing:
        flag = ("--text-column" if columns.text in missing else
                "--label-column" if columns.label in missing else "--user-column")
        raise InputError(
            f"{f.path}: missing column(s) {missing}; it has {list(available)} (choose with {flag})"
        )


def _iter_csv(f: InputFile, columns: Columns, max_document_bytes: int, delimiter: str = ",") -> Iterator[RecordOrDead]:
    kind = f.format.upper()  # CSV, TSV
    with _open(f.path) as raw:
        lines = (line.decode(f.encoding, errors="surrogateescape") for line in iter(raw.readline, b""))
        reader = csv.reader(lines, delimiter=delimiter)  # undecodable bytes become lone surrogates -> dead letters
        try:
            header = next(reader)
        except StopIteration:
            raise InputError(f"{f.path}: empty {kind} file (no header row)") from None
        header = [h.lstrip("\ufeff") for h in header]
        twice = sorted({h for h in header if header.count(h) > 1})
        if twice:  # dict(zip(header, row)) would keep the last one silently
            raise InputError(f"{f.path}: duplicate column(s) {twice} in the header {header}; rename them")
        _check_columns(f, header, columns)
        n = 0
        while True:
            n += 1
            first_line = reader.line_num + 1
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as e:
                yield DeadLetter(f.path, n, f"malformed {kind} row ({e})")
                continue
            if len(row) != len(header):
                spans = (f" (it spans lines {first_line}-{reader.line_num}: an unterminated quote?)"
                         if reader.line_num > first_line and len(row) < len(header) else "")
                yield DeadLetter(f.path, n, f"row has {len(row)} fields, the header has {len(header)}{spans}")
                continue
            yield _make_record(dict(zip(header, row)), f, n, columns, max_document_bytes)


def _iter_parquet(f: InputFile, columns: Columns, max_document_bytes: int) -> Iterator[RecordOrDead]:
    import pyarrow.parquet as pq

    with _open(f.path, compressed=False) as fh:
        pf = pq.ParquetFile(fh)
        names = pf.schema_arrow.names
        _check_columns(f, names, columns)
        wanted = [c for c in (columns.text, columns.label, columns.id, columns.user) if c is not None and c in names]
        n = 0
        for batch in pf.iter_batches(columns=wanted, batch_size=1024):
            for row in batch.to_pylist():
                n += 1
                yield _make_record(row, f, n, columns, max_document_bytes)


def _iter_label_text(f: InputFile, columns: Columns, max_document_bytes: int,
                     part: tuple[int, int] = (0, 1)) -> Iterator[RecordOrDead]:
    if columns.label is None:
        raise InputError(f"{f.path}: format label_text is for labeled datasets (`<label> <text>` lines)")
    index, parts = part
    with _open(f.path) as fh:
        for n, raw in enumerate(iter(fh.readline, b""), start=1):
            if (n - 1) % parts != index:
                continue
            line = raw.rstrip(b"\r\n")
            if not line.strip():
                yield DeadLetter(f.path, n, "empty line")
                continue
            try:
                text = line.decode(f.encoding)
            except UnicodeDecodeError as e:
                yield DeadLetter(f.path, n, f"{f.invalid} at byte {e.start} of the line")
                continue
            label, sep, body = text.partition(" ")
            if not sep:
                yield DeadLetter(f.path, n, "no space between label and text (expected `<label> <text>`)")
                continue
            yield _make_record({columns.text: body, columns.label: label}, f, n, columns, max_document_bytes)


def _iter_tsv(f: InputFile, columns: Columns, max_document_bytes: int) -> Iterator[RecordOrDead]:
    return _iter_csv(f, columns, max_document_bytes, delimiter="\t")


@dataclasses.dataclass(frozen=True)
class Format:
    """One input format.

    Attributes:
      name: what `format=` (and the experiment's `sensitive.format`) calls it.
      read: `(InputFile, Columns, max_document_bytes[, part]) -> records and DeadLetters`.
      suffixes: file suffixes that mean this format; none: it is only ever named (`format=`).
      labeled: it can hold a labeled (sensitive) dataset.
      header: its files start with a header or schema that the driver checks before any
        pipeline runs (`dpsynth.beam.inputs`).
      lines: one record per line, so a file splits into parts (`iter_file(part=...)`).
    """

    name: str
    read: Any
    suffixes: tuple[str, ...] = ()
    labeled: bool = True
    header: bool = False
    lines: bool = False


REGISTRY: dict[str, Format] = {f.name: f for f in (
    Format("txt", _iter_txt, (".txt", ".text"), labeled=False),
    Format("jsonl", _iter_jsonl, (".jsonl", ".json", ".ndjson"), lines=True),
    Format("csv", _iter_csv, (".csv",), header=True),
    Format("parquet", _iter_parquet, (".parquet",), header=True),
    Format("label_text", _iter_label_text, lines=True),
    Format("tsv", _iter_tsv, (".tsv", ".tab"), header=True),
)}
FORMATS = tuple(REGISTRY)
LABELED_FORMATS = tuple(name for name, f in REGISTRY.items() if f.labeled)
LINE_FORMATS = tuple(name for name, f in REGISTRY.items() if f.lines)  # splittable into parts
_SUFFIX_FORMAT = {suffix: f.name for f in REGISTRY.values() for suffix in f.suffixes}


def iter_file(
    f: InputFile, columns: Columns, max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES,
    part: tuple[int, int] = (0, 1),
) -> Iterator[RecordOrDead]:
    """Yields every record of one file as a `{"id", "text"[, "label"]}` dict or a `DeadLetter`.

    With `part=(i, k)` (line formats only, `LINE_FORMATS`, and no user column, whose presence
    is checked over the whole file), only lines i + 1, i + 1 + k, ... are parsed and yielded:
    the k parts of a file, read by k readers side by side, yield its records together.

    Raises:
      InputError: fatal problems (missing column, `.txt` as a labeled dataset, empty CSV).
    """
    if part != (0, 1):
        if f.format not in LINE_FORMATS or columns.user is not None or not 0 <= part[0] < part[1]:
            raise ValueError(f"{f.path}: cannot read part {part} of a {f.format} file"
                             f"{' with a user column' if columns.user is not None else ''}")
        return REGISTRY[f.format].read(f, columns, max_document_bytes, part)
    return REGISTRY[f.format].read(f, columns, max_document_bytes)


# ----------------------------------------------------------------------------- in memory


@dataclasses.dataclass
class Dataset:
    """Records read in memory plus what was rejected (`records_in == len(records) + len(dead)`)."""

    records: list[Record]
    dead_letters: list[DeadLetter]
    files: list[str]

    @property
    def records_in(self) -> int:
        return len(self.records) + len(self.dead_letters)


def read_records(
    paths: Sequence[str] | str,
    *,
    columns: Columns,
    max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES,
    allow_empty: bool = False,
    format: str | None = None,
    encoding: str | None = None,
) -> Dataset:
    """Reads every record of `paths` in memory (small datasets; use the Beam jobs for big ones).

    `format` overrides the suffix-based file type, `encoding` the UTF-8 default (see `resolve_inputs`).

    Raises:
      InputError: fatal input problems; `EmptyDatasetError` when no record is valid (unless
        `allow_empty`).
    """
    files = resolve_inputs(paths, format, encoding)
    records: list[Record] = []
    dead: list[DeadLetter] = []
    for f in files:
        for item in iter_file(f, columns, max_document_bytes):
            (dead if isinstance(item, DeadLetter) else records).append(item)
    if not records and not allow_empty:
        raise EmptyDatasetError(
            f"{', '.join(f.path for f in files)}: no valid record ({len(dead)} dead-lettered"
            + (f"; first: record {dead[0].record}: {dead[0].reason}" if dead else "")
            + ")"
        )
    return Dataset(records=records, dead_letters=dead, files=[f.path for f in files])


def read_sensitive(
    paths: Sequence[str] | str,
    *,
    text_column: str = "text",
    label_column: str = "label",
    user_column: str | None = None,
    max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES,
    format: str | None = None,
    extra_columns: Sequence[str] = (),
    encoding: str | None = None,
) -> Dataset:
    """A labeled dataset: records `{"id", "text", "label"[, "user"]}` (labels and users as strings).

    `format` overrides the file type (`"label_text"` for `<label> <text>` lines);
    `extra_columns` are carried into each record as strings (e.g. a `split` column).
    """
    return read_records(paths, columns=Columns(text=text_column, label=label_column, user=user_column,
                                               extra=tuple(extra_columns)),
                        max_document_bytes=max_document_bytes, format=format, encoding=encoding)


def read_public(
    paths: Sequence[str] | str,
    *,
    text_column: str = "text",
    max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES,
    encoding: str | None = None,
) -> Dataset:
    """A public corpus: records `{"id", "text"}`."""
    return read_records(paths, columns=Columns.public(text_column), max_document_bytes=max_document_bytes,
                        encoding=encoding)


def iter_public_texts(paths: Sequence[str] | str, *, text_column: str = "text",
                      encoding: str | None = None) -> Iterator[str]:
    """Streams the valid texts of a public corpus (for tokenizer training), skipping dead letters."""
    for f in resolve_inputs(paths, encoding=encoding):
        for item in iter_file(f, Columns.public(text_column)):
            if not isinstance(item, DeadLetter):
                yield item["text"]


def write_jsonl(path: str, records: Sequence[Record]) -> None:
    """Writes records as JSONL (one object per line, keys sorted), via `FileSystems`."""
    data = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records).encode("utf-8")
    fileio.write_bytes_fs(path, data)  # (atomic; makes a local parent directory)
