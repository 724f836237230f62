"""The token-shard file format: writer, reader and its constants (this module alone owns the layout).

Token-shard format, version 1 (a "token corpus" is a directory):

```
CORPUS/manifest.json              JSON, see `write_manifest`
CORPUS/shard-00000.tokens         token ids of all documents of the shard, concatenated,
                                  little-endian `uint16` when vocab_size <= 65536, else `uint32`
CORPUS/shard-00000.offsets        little-endian int64, num_documents + 1 entries; document i
                                  is tokens[offsets[i]:offsets[i + 1]]; offsets[0] == 0
CORPUS/shard-00000.docs.jsonl     one JSON object per document, in order: {"id": str, ...}
                                  (extra fields such as "label" are carried through)
```

No separator tokens are stored: document boundaries live only in the offsets. The manifest
records `format` ("dpsynth.tokens"), `format_version`, `name`, `dtype`, `vocab_size`,
`tokenizer_sha256`, totals and per-shard counts and SHA-256 hashes of the three files, so a
reader can verify the shards and refuse a mismatched tokenizer. Token ids are checked against
the dtype when written: nothing is ever silently truncated.

All paths go through Beam's `FileSystems`, so `gs://...` works wherever Beam has the
filesystem installed. The tokenizers that produce the ids are in `dpsynth.data.tokenizers`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from apache_beam.io.filesystems import FileSystems

from dpsynth import outdir
from dpsynth.errors import DpsynthError
from dpsynth.fileio import dumps_json, parse_jsonl, read_bytes_fs, sha256_bytes, write_bytes_fs

FORMAT = "dpsynth.tokens"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TOKENS_SUFFIX = ".tokens"
OFFSETS_SUFFIX = ".offsets"
DOCS_SUFFIX = ".docs.jsonl"
# A docs.jsonl line: `json.dumps(meta, ensure_ascii=False, sort_keys=True)` without building an
# encoder per call.
encode_meta = json.JSONEncoder(ensure_ascii=False, sort_keys=True).encode


class FormatError(DpsynthError, ValueError):
    """A token corpus does not match the documented format (names the file and the problem)."""


# ----------------------------------------------------------------------------- file helpers


def _join(*parts: str) -> str:
    return FileSystems.join(*parts)


def sha256_file(path: str) -> str:
    """Hex SHA-256 of a file read through `FileSystems` (`gs://` too)."""
    return sha256_bytes(read_bytes_fs(path))


# ----------------------------------------------------------------------------- dtypes


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest stored dtype for `vocab_size` ids: uint16 up to 65,536, else uint32."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if vocab_size <= 1 << 16:
        return np.dtype("<u2")
    if vocab_size <= 1 << 32:
        return np.dtype("<u4")
    raise ValueError(f"vocab_size {vocab_size} does not fit in uint32")


def _checked_cast(tokens: np.ndarray, dtype: np.dtype, where: str) -> np.ndarray:
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() > np.iinfo(dtype).max):
        raise ValueError(
            f"{where}: token id range [{tokens.min()}, {tokens.max()}] does not fit {dtype.name}"
        )
    return tokens.astype(dtype, copy=False)


# ----------------------------------------------------------------------------- shards


@dataclasses.dataclass(frozen=True)
class TokenShard:
    """One shard in memory: concatenated `tokens`, `offsets` (n + 1) and per-document `docs`."""

    name: str
    tokens: np.ndarray
    offsets: np.ndarray
    docs: list[dict[str, Any]]

    @property
    def num_documents(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def document(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    def documents(self) -> Iterator[np.ndarray]:
        for i in range(self.num_documents):
            yield self.document(i)


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def _ensure_dir(directory: str) -> None:
    """Creates `directory` unless it exists; safe when several writers race to create it."""
    if FileSystems.exists(directory):
        return
    try:
        FileSystems.mkdirs(directory)
    except OSError:  # Beam's local filesystem raises when another writer created it first
        if not FileSystems.exists(directory):
            raise


def write_shard(
    directory: str,
    name: str,
    documents: Sequence[np.ndarray],
    docs: Sequence[dict[str, Any]],
    vocab_size: int,
) -> dict[str, Any]:
    """Writes one shard (three files, each atomically) and returns its manifest entry.

    Args:
      directory: the corpus directory (created if missing).
      name: shard name, e.g. `shard_name(3)`.
      documents: token ids per document (any integer dtype; range-checked).
      docs: one metadata dict per document; each needs a string "id".
      vocab_size: selects the stored dtype (see `token_dtype`).
    """
    if len(documents) != len(docs):
        raise ValueError(f"{name}: {len(documents)} documents but {len(docs)} metadata rows")
    dtype = token_dtype(vocab_size)
    lengths = np.fromiter((len(d) for d in documents), dtype=np.int64, count=len(documents))
    offsets = np.zeros(len(documents) + 1, dtype="<i8")
    np.cumsum(lengths, out=offsets[1:])
    if documents:
        flat = np.concatenate([np.asarray(d).reshape(-1) for d in documents])
    else:
        flat = np.zeros(0, dtype=np.int64)
    flat = _checked_cast(flat, dtype, f"{_join(directory, name)}{TOKENS_SUFFIX}")
    lines = []
    for i, meta in enumerate(docs):
        if not isinstance(meta.get("id"), str):
            raise ValueError(f"{name}: document {i} has no string 'id'")
        lines.append(encode_meta(meta))
    return write_shard_files(directory, name, flat, offsets, ("\n".join(lines) + ("\n" if lines else "")).encode("utf-8"))


def write_shard_files(directory: str, name: str, tokens: np.ndarray, offsets: np.ndarray,
                      docs_jsonl: bytes) -> dict[str, Any]:
    """Writes one shard from its encoded parts (three files, each atomically); returns its
    manifest entry. `write_shard` validates and encodes; this writes what a caller already
    holds in the stored form: `tokens` in the corpus dtype, int64 `offsets` (n + 1) and the
    docs.jsonl bytes (one `encode_meta` line per document, each ended by a newline)."""
    offsets = np.asarray(offsets, dtype="<i8")
    payloads = {
        TOKENS_SUFFIX: np.ascontiguousarray(tokens).tobytes(),
        OFFSETS_SUFFIX: offsets.tobytes(),
        DOCS_SUFFIX: docs_jsonl,
    }
    _ensure_dir(directory)
    hashes = {}
    for suffix, data in payloads.items():
        write_bytes_fs(_join(directory, name + suffix), data)
        hashes[suffix.lstrip(".")] = sha256_bytes(data)
    return {
        "name": name,
        "num_documents": int(offsets.size - 1),
        "num_tokens": int(offsets[-1]),
        "sha256": hashes,
    }


def copy_shard(src_dir: str, dst_dir: str, entry: dict[str, Any]) -> dict[str, Any]:
    """Copies the three files of a shard listed in a manifest; returns the same entry.

    For a shard that a stage leaves unchanged: the files `write_shard` would write are the
    same bytes, so they are copied, not re-serialised.
    """
    _ensure_dir(dst_dir)
    for suffix in (TOKENS_SUFFIX, OFFSETS_SUFFIX, DOCS_SUFFIX):
        data = read_bytes_fs(_join(src_dir, entry["name"] + suffix))
        if sha256_bytes(data) != entry["sha256"][suffix.lstrip(".")]:
            raise FormatError(f"{_join(src_dir, entry['name'] + suffix)}: SHA-256 does not match the manifest")
        write_bytes_fs(_join(dst_dir, entry["name"] + suffix), data)
    return dict(entry)


def write_manifest(
    directory: str,
    *,
    name: str,
    shards: Sequence[dict[str, Any]],
    vocab_size: int,
    tokenizer_sha256: str,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Writes `manifest.json` for a corpus whose shards are already written; returns it."""
    shards = sorted(shards, key=lambda s: s["name"])
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        outdir.KIND_FIELD: outdir.TOKENS,
        "name": name,
        "dtype": token_dtype(vocab_size).name,
        "vocab_size": int(vocab_size),
        "tokenizer_sha256": tokenizer_sha256,
        "num_documents": int(sum(s["num_documents"] for s in shards)),
        "num_tokens": int(sum(s["num_tokens"] for s in shards)),
        "shards": list(shards),
    }
    if extra:
        manifest.update(extra)
    data = dumps_json(manifest).encode("utf-8")
    write_bytes_fs(_join(directory, MANIFEST), data)
    return manifest


def read_manifest(directory: str) -> dict[str, Any]:
    """Reads and validates a corpus manifest; raises `FormatError` naming the file."""
    path = _join(directory, MANIFEST)
    if not FileSystems.exists(path):
        raise FormatError(f"{path}: missing; is {directory!r} a token corpus written by `dpsynth tokenize`?")
    try:
        manifest = json.loads(read_bytes_fs(path))
    except (ValueError, UnicodeDecodeError) as e:
        raise FormatError(f"{path}: not valid JSON ({e})") from e
    if manifest.get("format") != FORMAT:
        raise FormatError(f"{path}: format is {manifest.get('format')!r}, expected {FORMAT!r}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise FormatError(
            f"{path}: format_version {manifest.get('format_version')} is not supported "
            f"(this dpsynth reads version {FORMAT_VERSION}); re-run `dpsynth tokenize`"
        )
    return manifest


def _parse_docs(data: bytes, count: int) -> list[dict[str, Any]]:
    """`parse_jsonl(data)` of a docs file whose bytes match its manifest (one JSON object per
    line, as `write_shard` wrote them), parsed as one JSON array: one call instead of one per
    document. Falls back to `parse_jsonl` unless that gives `count` objects."""
    if not data:
        return []
    try:
        docs = json.loads(b"[" + data.rstrip(b"\n").replace(b"\n", b",") + b"]")
    except ValueError:
        docs = None
    if not isinstance(docs, list) or len(docs) != count or not all(isinstance(d, dict) for d in docs):
        return parse_jsonl(data)
    return docs


def read_shard(directory: str, entry: dict[str, Any], dtype: str | np.dtype, verify: bool = True) -> TokenShard:
    """Reads one shard listed in a manifest; with `verify`, checks hashes and counts."""
    name = entry["name"]
    raw = {}
    for suffix in (TOKENS_SUFFIX, OFFSETS_SUFFIX, DOCS_SUFFIX):
        path = _join(directory, name + suffix)
        if not FileSystems.exists(path):
            raise FormatError(f"{path}: missing shard file listed in the manifest")
        raw[suffix] = read_bytes_fs(path)
        if verify and sha256_bytes(raw[suffix]) != entry["sha256"][suffix.lstrip(".")]:
            raise FormatError(f"{path}: SHA-256 does not match the manifest (corrupt or replaced shard)")
    tokens = np.frombuffer(raw[TOKENS_SUFFIX], dtype=np.dtype(dtype).newbyteorder("<"))
    offsets = np.frombuffer(raw[OFFSETS_SUFFIX], dtype="<i8")
    docs = _parse_docs(raw[DOCS_SUFFIX], entry["num_documents"]) if verify else parse_jsonl(raw[DOCS_SUFFIX])
    where = _join(directory, name)
    if len(offsets) != entry["num_documents"] + 1 or len(docs) != entry["num_documents"]:
        raise FormatError(f"{where}: document count does not match the manifest")
    if offsets[0] != 0 or offsets[-1] != len(tokens) or np.any(np.diff(offsets) < 0):
        raise FormatError(f"{where}: offsets are not a non-decreasing partition of the tokens")
    return TokenShard(name=name, tokens=tokens, offsets=offsets, docs=docs)


def iter_shards(directory: str, verify: bool = True) -> Iterator[TokenShard]:
    """Yields every shard of a corpus, in name order."""
    manifest = read_manifest(directory)
    for entry in manifest["shards"]:
        yield read_shard(directory, entry, manifest["dtype"], verify=verify)


def read_corpus(directory: str, verify: bool = True) -> TokenShard:
    """Reads a whole corpus as one in-memory shard (for corpora that fit in memory)."""
    shards = list(iter_shards(directory, verify=verify))
    manifest = read_manifest(directory)
    dtype = np.dtype(manifest["dtype"])
    if not shards:
        return TokenShard("all", np.zeros(0, dtype), np.zeros(1, np.int64), [])
    tokens = np.concatenate([s.tokens for s in shards])
    offsets = [np.zeros(1, np.int64)]
    base = 0
    for s in shards:
        offsets.append(s.offsets[1:] + base)
        base += s.num_tokens
    docs = [d for s in shards for d in s.docs]
    return TokenShard("all", tokens, np.concatenate(offsets), docs)
