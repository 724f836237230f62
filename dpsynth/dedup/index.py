"""The sensitive index: every sensitive document, built once per job and broadcast to workers.

The index keeps the sensitive token ids, per-document offsets, the dataset table and the
document ids (never text). Its suffix array (`sorted_suffixes`, dpsynth.dedup.sensitive_sa)
is built on first use and kept with the index, so every public shard a worker processes is
matched against the same sorted sensitive suffixes (never re-sorted).

File format (one file, `SensitiveIndex.save`/`load`, any Beam `FileSystems` path): an
uncompressed NumPy `.npz` with

* `tokens`: all sensitive documents' token ids, concatenated (uint16 or uint32);
* `offsets`: int64, num_documents + 1 entries; document d is tokens[offsets[d]:offsets[d+1]];
* `meta`: UTF-8 JSON bytes: `format` ("dpsynth.sensitive_index"), `format_version`,
  `datasets` ([{"name", "num_examples", "first_doc"}] in order), `doc_ids` (per document,
  global order), `token_bound` (1 + the largest token id) and `sha256` (see `_content_hash`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import zipfile
from collections.abc import Sequence

import numpy as np
from apache_beam.io.filesystems import FileSystems

from dpsynth.data.token_shards import FormatError, TokenShard
from dpsynth.fileio import write_bytes_fs

FORMAT = "dpsynth.sensitive_index"
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """One sensitive dataset: its documents are first_doc .. first_doc + num_examples - 1."""

    name: str
    num_examples: int
    first_doc: int


def check_token_arrays(shard: TokenShard, where: str) -> tuple[np.ndarray, np.ndarray]:
    """A shard's (tokens, int64 offsets), checked: 1-D integer ids in [0, 2**32), offsets a
    non-decreasing partition of the tokens. Errors name `where`."""
    tokens = np.asarray(shard.tokens)
    offsets = np.asarray(shard.offsets, dtype=np.int64)
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"{where}: tokens must be a 1-D integer array, got {tokens.dtype} {tokens.shape}")
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) > np.iinfo(np.uint32).max):
        raise ValueError(f"{where}: token ids outside [0, 2**32 - 1]")
    if offsets.ndim != 1 or offsets.size < 1 or offsets[0] != 0 or offsets[-1] != tokens.size:
        raise ValueError(f"{where}: offsets must start at 0 and end at the token count")
    if np.any(np.diff(offsets) < 0):
        raise ValueError(f"{where}: offsets decrease")
    return tokens, offsets


def _validate_shard(name: str, shard: TokenShard) -> tuple[np.ndarray, np.ndarray]:
    where = f"sensitive dataset {name!r}, shard {shard.name!r}"
    tokens, offsets = check_token_arrays(shard, where)
    if len(shard.docs) != offsets.size - 1:
        raise ValueError(f"{where}: {offsets.size - 1} documents but {len(shard.docs)} metadata rows")
    for i, doc in enumerate(shard.docs):
        if not isinstance(doc.get("id"), str):
            raise ValueError(f"{where}: document {i} has no string 'id'")
    return tokens, offsets


def _content_hash(tokens: np.ndarray, offsets: np.ndarray, datasets, doc_ids) -> str:
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(tokens.astype("<u4")).tobytes())
    h.update(np.ascontiguousarray(offsets.astype("<i8")).tobytes())
    table = [[d.name, d.num_examples, d.first_doc] for d in datasets]
    h.update(json.dumps({"datasets": table, "doc_ids": list(doc_ids)}, sort_keys=True).encode())
    return h.hexdigest()


@dataclasses.dataclass(frozen=True, eq=False)
class SensitiveIndex:
    """All sensitive documents (token ids only), with dataset and document ids.

    Build with `SensitiveIndex.build`; ship to workers with `save`/`load` (one file).
    """

    datasets: tuple[DatasetInfo, ...]
    doc_ids: tuple[str, ...]
    tokens: np.ndarray
    offsets: np.ndarray
    token_bound: int
    sha256: str
    # Holds the SensitiveSuffixArray once built (a cache; not part of the content).
    _sorted: list = dataclasses.field(default_factory=list, init=False, repr=False, compare=False)

    def sorted_suffixes(self, threads: int = 1):
        """The sensitive suffix array and matching tables (`SensitiveSuffixArray`), built on
        first use with `threads` native threads and kept for the index's lifetime (about 16
        bytes per sensitive token)."""
        if not self._sorted:
            from dpsynth.dedup.sensitive_sa import SensitiveSuffixArray

            self._sorted.append(SensitiveSuffixArray.build(self.tokens, self.offsets, self.token_bound, threads))
        return self._sorted[0]

    @property
    def num_documents(self) -> int:
        return len(self.doc_ids)

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def dataset_of(self, doc: int) -> DatasetInfo:
        """The dataset holding global document index `doc`."""
        for d in self.datasets:
            if d.first_doc <= doc < d.first_doc + d.num_examples:
                return d
        raise IndexError(f"document {doc} is outside the index ({self.num_documents} documents)")

    @classmethod
    def build(cls, datasets: Sequence[tuple[str, TokenShard]]) -> "SensitiveIndex":
        """Collects the sensitive datasets into one index.

        Args:
          datasets: (dataset name, shard) pairs; several shards of one dataset may be given
            under the same name (they are appended in order). Documents need string "id"s.

        Returns:
          The index. Its `sha256` identifies the exact token content and ids.
        """
        # A linear concatenation: the suffix sort happens once, on first use (sorted_suffixes).
        order: list[str] = []
        parts: dict[str, list[tuple[np.ndarray, np.ndarray, list]]] = {}
        for name, shard in datasets:
            if not isinstance(name, str) or not name:
                raise ValueError(f"sensitive dataset names must be non-empty strings, got {name!r}")
            tokens, offsets = _validate_shard(name, shard)
            if name not in parts:
                order.append(name)
                parts[name] = []
            parts[name].append((tokens, offsets, shard.docs))
        token_chunks: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        infos: list[DatasetInfo] = []
        doc_ids: list[str] = []
        for name in order:
            first = len(doc_ids)
            for tokens, offsets, docs in parts[name]:
                token_chunks.append(tokens.astype(np.uint32))
                lengths.append(np.diff(offsets))
                doc_ids.extend(str(doc["id"]) for doc in docs)
            infos.append(DatasetInfo(name=name, num_examples=len(doc_ids) - first, first_doc=first))
        all_tokens = np.concatenate(token_chunks) if token_chunks else np.zeros(0, np.uint32)
        bound = int(all_tokens.max()) + 1 if all_tokens.size else 1
        if bound <= 1 << 16:
            all_tokens = all_tokens.astype(np.uint16)
        offsets = np.zeros(len(doc_ids) + 1, dtype=np.int64)
        if lengths:
            np.cumsum(np.concatenate(lengths), out=offsets[1:])
        return cls(
            datasets=tuple(infos),
            doc_ids=tuple(doc_ids),
            tokens=all_tokens,
            offsets=offsets,
            token_bound=bound,
            sha256=_content_hash(all_tokens, offsets, infos, doc_ids),
        )

    def save(self, path: str) -> None:
        """Writes the index as one `.npz` file (local path or any Beam filesystem)."""
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "datasets": [dataclasses.asdict(d) for d in self.datasets],
            "doc_ids": list(self.doc_ids),
            "token_bound": self.token_bound,
            "sha256": self.sha256,
        }
        buf = io.BytesIO()
        np.savez(
            buf,
            tokens=self.tokens,
            offsets=self.offsets,
            meta=np.frombuffer(json.dumps(meta, sort_keys=True).encode("utf-8"), dtype=np.uint8),
        )
        write_bytes_fs(path, buf.getvalue())

    @classmethod
    def load(cls, path: str) -> "SensitiveIndex":
        """Reads and verifies an index written by `save` (raises FormatError naming the file)."""
        if not FileSystems.exists(path):
            raise FormatError(f"{path}: sensitive index not found")
        with FileSystems.open(path) as f:
            data = f.read()
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                tokens, offsets = z["tokens"], z["offsets"]
                meta = json.loads(z["meta"].tobytes().decode("utf-8"))
        except (ValueError, KeyError, OSError, EOFError, zipfile.BadZipFile) as e:
            raise FormatError(f"{path}: not a readable dpsynth sensitive index, corrupt? ({e})") from e
        if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
            raise FormatError(
                f"{path}: format {meta.get('format')!r} v{meta.get('format_version')} is not "
                f"{FORMAT!r} v{FORMAT_VERSION}"
            )
        infos = tuple(DatasetInfo(**d) for d in meta["datasets"])
        if _content_hash(tokens, offsets, infos, meta["doc_ids"]) != meta["sha256"]:
            raise FormatError(f"{path}: content does not match its SHA-256 (corrupt file)")
        return cls(
            datasets=infos,
            doc_ids=tuple(meta["doc_ids"]),
            tokens=tokens,
            offsets=offsets,
            token_bound=int(meta["token_bound"]),
            sha256=meta["sha256"],
        )
