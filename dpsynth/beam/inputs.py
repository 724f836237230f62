"""Driver-side planning of the tokenize job's inputs: what to read, and how many shards to write.

`plan_source` resolves input specs (paths, directories, globs, one `tfds:NAME`, or one
already tokenized corpus) into a `CorpusSource` on the driver, before any pipeline runs, so
fatal input errors (missing columns, a `.txt` file for labeled data, no input) fail fast with
a clear message. `CorpusSource.num_shards` sizes the output (about `DEFAULT_SHARD_BYTES` of
input text per shard); `check_not_empty` refuses a written corpus without a document. The
Beam transforms that read and tokenize a `CorpusSource` are in `dpsynth.beam.corpus`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from dpsynth.data import read_config, readers, token_shards

DEFAULT_SHARD_BYTES = int(read_config.DEFAULT_SHARD_MB * (1 << 20))

TFDS_PREFIX = "tfds:"


@dataclasses.dataclass(frozen=True)
class CorpusSource:
    """One corpus to tokenize, resolved on the driver.

    Exactly one of `files` (text files), `records` (in-memory, e.g. TFDS) or `token_dir`
    (already tokenized: the job reuses it) is set.
    """

    name: str
    kind: str  # "public" | "sensitive"
    specs: tuple[str, ...]
    columns: readers.Columns
    files: tuple[readers.InputFile, ...] = ()
    records: tuple[dict[str, Any], ...] | None = None
    token_dir: str | None = None

    @property
    def total_bytes(self) -> int:
        if self.records is not None:
            return sum(len(r["text"].encode("utf-8")) for r in self.records)
        return sum(f.size for f in self.files)

    def num_shards(self, shard_bytes: int = DEFAULT_SHARD_BYTES) -> int:
        """Shards of about `shard_bytes` of input text (at least one)."""
        return max(1, math.ceil(self.total_bytes / shard_bytes))

    def manifest_extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"kind": self.kind, "inputs": list(self.specs), "text_column": self.columns.text}
        if self.columns.label is not None:
            extra["label_column"] = self.columns.label
        encodings = sorted({f.encoding for f in self.files} - {readers.DEFAULT_ENCODING})
        if encodings:  # (absent for UTF-8: the manifests of UTF-8 inputs stay as they were)
            extra["encoding"] = encodings[0]
        return extra


def is_token_corpus(path: str) -> bool:
    """Whether `path` is a directory written by `dpsynth tokenize` (has a dpsynth manifest)."""
    if "*" in path or path.startswith(TFDS_PREFIX):
        return False
    try:
        token_shards.read_manifest(path)
        return True
    except (token_shards.FormatError, OSError, ValueError):
        return False


def _preflight(files: Sequence[readers.InputFile], columns: readers.Columns) -> None:
    """Fails fast on the driver for fatal per-file problems (missing columns, .txt labels)."""
    for f in files:
        fmt = readers.REGISTRY[f.format]
        if not fmt.labeled and columns.label is not None:
            raise readers.InputError(f"{f.path}: a .{f.format} file has no label; labeled datasets must be one of "
                                     f"{', '.join(readers.LABELED_FORMATS)}")
        if fmt.header:
            it = readers.iter_file(f, columns)
            next(it, None)  # reading the first record checks the header / schema
            it.close()


def plan_source(
    specs: Sequence[str] | str,
    *,
    kind: str,
    name: str | None = None,
    text_column: str = "text",
    label_column: str | None = "label",
    tfds_data_dir: str | None = None,
    encoding: str | None = None,
) -> CorpusSource:
    """Resolves input specs into a `CorpusSource` (fatal input errors raise here, on the driver).

    Args:
      specs: paths, directories or globs; or one already tokenized corpus directory; or one
        `tfds:NAME` (sensitive data from an already prepared TFDS `data_dir`, all splits).
      kind: "public" (no label) or "sensitive" (labeled).
      name: corpus name (default: the stem of the first spec).
      encoding: the text files' encoding (default UTF-8; `readers.check_encoding`).
    """
    if isinstance(specs, str):
        specs = [specs]
    specs = tuple(str(s) for s in specs)
    readers.check_encoding(encoding)  # (also for a token corpus or tfds: input, which ignore it)
    if not specs:
        raise readers.InputError(f"no input given for the {kind} corpus")
    if kind not in ("public", "sensitive"):
        raise ValueError(f"kind must be 'public' or 'sensitive', got {kind!r}")
    columns = readers.Columns(text=text_column, label=label_column) if kind == "sensitive" else readers.Columns.public(text_column)
    if name is None:
        first = specs[0][len(TFDS_PREFIX):] if specs[0].startswith(TFDS_PREFIX) else specs[0]
        name = first.rstrip("/").rsplit("/", 1)[-1].split(".")[0].split("*")[0] or kind
    if any(s.startswith(TFDS_PREFIX) for s in specs):
        if len(specs) != 1:
            raise readers.InputError(f"{specs}: a tfds: input must be the only input of its dataset")
        from dpsynth.data import tfds_source as tfds_io

        splits = tfds_io.load_tfds(specs[0][len(TFDS_PREFIX):], data_dir=tfds_data_dir)
        records = tuple(r for split in ("train", "valid", "test") for r in splits.get(split, []))
        return CorpusSource(name, kind, specs, columns, records=records)
    if len(specs) == 1 and is_token_corpus(specs[0]):
        return CorpusSource(name, kind, specs, columns, token_dir=specs[0])
    files = tuple(readers.resolve_inputs(list(specs), encoding=encoding))
    _preflight(files, columns)
    return CorpusSource(name, kind, specs, columns, files=files)


def check_not_empty(manifest: dict[str, Any], source: CorpusSource) -> None:
    """Raises `EmptyDatasetError` naming the inputs when a written corpus has no document."""
    if manifest["num_documents"] == 0:
        raise readers.EmptyDatasetError(
            f"{', '.join(source.specs)}: no valid document ({manifest.get('dead_lettered', 0)} dead-lettered; "
            f"reasons: {manifest.get('dead_letter_reasons', {})})"
        )
