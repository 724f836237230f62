"""PTransforms that read text corpora and write token corpora (the `dpsynth tokenize` job).

What to read is planned on the driver (`dpsynth.beam.inputs`: `plan_source` -> `CorpusSource`);
the shard files are those of `dpsynth.data.token_shards`.

Elements flowing between the transforms are plain tuples, so every runner can carry them:

* `Item = (kind, key, payload)` with `kind` "doc" or "dead"; `key = (file_index, record)`
  orders documents deterministically; a "doc" payload is a record dict
  (`{"id", "text"[, "label"]}`), after `TokenizeDocuments` a `(meta, tokens)` pair where
  `meta` is the record without its text and `tokens` the ids as raw bytes in the stored
  dtype (bytes cross Beam's coders without a pickle per document); a "dead" payload is a `DeadLetter.to_json()` dict.
* Items travel in batches (`list[Item]`, consecutive records of one file, at most
  `BATCH_RECORDS` records or `BATCH_BYTES` of text), which keeps Beam's per-element cost
  negligible for corpora of many small documents; each batch is tagged with its corpus
  name, `(name, batch)`, so that several corpora share every step (`TokenizeCorpora`).
* Into the shuffle that groups documents by shard, each batch goes as one `ShardPart` per
  shard it touches (`pack_shard_part`: keys, token bytes and docs.jsonl lines packed into a
  few bytes objects), so the shuffle moves a few large values instead of a tuple and a dict
  per document; the shard writer merges the parts (`merge_shard_parts`).

Runner portability: no tagged outputs, side inputs or `finish_bundle` outputs (Beam's
DaskRunner drops or mixes those); each job ends in one step that depends on every branch
(the DaskRunner computes only the last transform and its ancestors). Shard files are
written by the DoFns themselves, each file atomically (temporary file + rename), so a retried
or duplicated bundle rewrites identical bytes.

Determinism: a document goes to shard `blake2b(id) mod num_shards`; inside a shard documents
are sorted by `key`; the manifest is written from the sorted list of shard entries. Rerunning
on the same inputs gives byte-identical files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from dpsynth import fileio
from dpsynth.beam.inputs import CorpusSource
from dpsynth.data import readers, token_shards
from dpsynth.data.text import DEFAULT_MAX_CHUNK_CHARS, encode_document
from dpsynth.data.tokenizers import Tokenizer

logger = logging.getLogger("dpsynth")
NAMESPACE = "dpsynth"
DEAD_LETTERS = "dead_letters.jsonl"
BATCH_RECORDS = 512
BATCH_BYTES = 16 << 20
PART_BYTES = 8 << 20  # ReadCorpora: file bytes (compressed, as stored) per part of a big file


def shard_of(doc_id: str, num_shards: int) -> int:
    """Stable shard index of a document id (independent of process and Python hash seed)."""
    digest = hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % num_shards


def reason_category(reason: str) -> str:
    """A dead-letter reason with its numbers masked, for counting by kind."""
    return re.sub(r"\d+", "N", reason)


def remove_stale_shards(directory: str, keep: set[str]) -> int:
    """Deletes `shard-*` files in a job-owned output directory whose shard is not in `keep`.

    A rerun with fewer shards would otherwise leave old shards next to the new ones (readers
    follow the manifest, but globbing readers of `clean/*.jsonl` would not). Returns the count.
    """
    try:
        found = [m.path for m in FileSystems.match([FileSystems.join(directory, "shard-*")])[0].metadata_list]
    except Exception:  # nothing there yet
        return 0
    stale = [p for p in found if p.rsplit("/", 1)[-1].split(".", 1)[0] not in keep]
    if stale:
        FileSystems.delete(stale)
    return len(stale)


def dead_letter_summary(token_dir: str, manifest: dict[str, Any], name: str, limit=None):
    """The `dpsynth.data.dead_letters.Summary` of a written token corpus: its manifest's counts
    and the dead letters of its `dead_letters.jsonl` (`limit`: `--max-dead-letters`)."""
    from dpsynth.data import dead_letters

    dead = ()
    if manifest.get("dead_lettered"):
        rows = fileio.parse_jsonl(fileio.read_bytes_fs(FileSystems.join(token_dir, DEAD_LETTERS)))
        dead = tuple(readers.DeadLetter(r["file"], r["record"], r["reason"]) for r in rows)
    used = manifest["num_documents"]
    return dead_letters.Summary(name=name, records_in=manifest.get("records_in", used + len(dead)), used=used,
                                dead=dead, limit=dead_letters.parse_limit(limit))


# ----------------------------------------------------------------------------- reading


def batch_items(items, max_records: int = BATCH_RECORDS, max_bytes: int = BATCH_BYTES):
    """Groups consecutive Items into lists of <= max_records records and about <= max_bytes of text."""
    batch, size = [], 0
    for item in items:
        batch.append(item)
        if item[0] == "doc" and isinstance(item[2], dict):
            size += len(item[2].get("text", ""))
        if len(batch) >= max_records or size >= max_bytes:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


class _ReadFileFn(beam.DoFn):
    """(corpus name, file_index, InputFile, Columns, (part, parts)) -> (corpus name, batch of
    the Items of the records of that part of the file)."""

    def __init__(self, max_document_bytes: int):
        self.max_document_bytes = max_document_bytes
        self.docs = Metrics.counter(NAMESPACE, "records_read")
        self.dead = Metrics.counter(NAMESPACE, "dead_letters")
        self.files = Metrics.counter(NAMESPACE, "files_read")

    def process(self, element):
        name, index, f, columns, part = element
        if part[0] == 0:
            self.files.inc()
        for batch in batch_items(self._items(index, f, columns, part)):
            dead = sum(1 for item in batch if item[0] == "dead")
            self.dead.inc(dead)  # once per batch, not per record
            self.docs.inc(len(batch) - dead)
            yield name, batch

    def _items(self, index, f, columns, part):
        # A part holds lines part[0] + 1, part[0] + 1 + part[1], ... (one Item per line).
        for j, item in enumerate(readers.iter_file(f, columns, self.max_document_bytes, part)):
            n = part[0] + 1 + j * part[1]
            if isinstance(item, readers.DeadLetter):
                yield ("dead", (index, n), item.to_json())
            else:
                yield ("doc", (index, n), item)


class ReadCorpora(beam.PTransform):
    """Reads the files of one or more corpora in ONE step, big line-format files in parts.

    A runner that executes its steps one after another (Beam's local `FnApiRunner`, also
    in multi-process mode) spreads the elements of one step over its workers; with one read
    step per corpus, a corpus of one file is read by one worker while the others wait.
    Reading every file of every corpus in one step lets the workers read them side by side,
    and a JSONL (or label_text) file of more than `part_bytes` is read as
    ceil(size / part_bytes) parts (every k-th line each; each part decompresses the whole
    file but parses only its own lines), so that the work is spread evenly and the text
    is tokenized where it is read, without a shuffle of the raw text.
    File indices (the first part of an Item's key) count within each corpus.
    """

    def __init__(self, sources: Sequence[CorpusSource],
                 max_document_bytes: int = readers.DEFAULT_MAX_DOCUMENT_BYTES, part_bytes: int = PART_BYTES):
        super().__init__()
        if any(s.records is not None or s.token_dir is not None for s in sources):
            raise ValueError("ReadCorpora reads text files only (not in-memory records or token corpora)")
        self.files = [(s.name, i, f, s.columns, (p, parts)) for s in sources for i, f in enumerate(s.files)
                      for parts in [_num_parts(f, s.columns, part_bytes)] for p in range(parts)]
        self.max_document_bytes = max_document_bytes

    def expand(self, pbegin):
        """PBegin -> PCollection[(corpus name, list[Item])] (batches of "doc" records and "dead" letters)."""
        return (
            pbegin
            | "ListFiles" >> beam.Create(self.files)
            | "SpreadFiles" >> beam.Reshuffle()
            | "ReadRecords" >> beam.ParDo(_ReadFileFn(self.max_document_bytes))
        )


def _num_parts(f: readers.InputFile, columns: readers.Columns, part_bytes: int) -> int:
    if f.format not in readers.LINE_FORMATS or columns.user is not None:
        return 1
    return max(1, math.ceil(f.size / part_bytes))


def validate_records(records: Sequence[dict[str, Any]], source: str,
                     max_document_bytes: int = readers.DEFAULT_MAX_DOCUMENT_BYTES) -> list[tuple]:
    """In-memory records as Items (key = (0, position + 1)); invalid texts become dead letters."""
    items = []
    for n, r in enumerate(records, start=1):
        reason = readers.check_text(r.get("text"), "text", max_document_bytes)
        if reason:
            items.append(("dead", (0, n), readers.DeadLetter(source, n, reason).to_json()))
        else:
            items.append(("doc", (0, n), r))
    return items


class CreateDocuments(beam.PTransform):
    """In-memory records (e.g. a TFDS dataset loaded by the driver) as Items of corpus `name`."""

    def __init__(self, records: Sequence[dict[str, Any]], name: str, source: str = "memory",
                 max_document_bytes: int = readers.DEFAULT_MAX_DOCUMENT_BYTES):
        super().__init__()
        self.batches = [(name, b) for b in batch_items(validate_records(records, source, max_document_bytes))]

    def expand(self, pbegin):
        """PBegin -> PCollection[(corpus name, list[Item])] (batches of "doc" records and "dead" letters)."""
        return pbegin | "CreateRecords" >> beam.Create(self.batches)


# ----------------------------------------------------------------------------- tokenizing


class _TokenizeFn(beam.DoFn):
    """Encodes the "doc" Items of a (corpus name, batch) with the tokenizer loaded once per worker."""

    def __init__(self, tokenizer_path: str, max_chunk_chars: int):
        self.tokenizer_path, self.max_chunk_chars = tokenizer_path, max_chunk_chars
        self.tokenizer = None
        self.docs = Metrics.counter(NAMESPACE, "documents_tokenized")
        self.tokens = Metrics.counter(NAMESPACE, "tokens")
        self.bytes = Metrics.counter(NAMESPACE, "text_bytes")

    def setup(self):
        self.tokenizer = Tokenizer.load(self.tokenizer_path)
        self.dtype = token_shards.token_dtype(self.tokenizer.vocab_size)  # uint16 halves the shuffle

    def process(self, element):
        name, batch = element
        # Documents up to max_chunk_chars go through SentencePiece's batched encoder in one
        # call (C++ threads, no per-document Python call); longer ones are chunked.
        short = [i for i, item in enumerate(batch)
                 if item[0] == "doc" and len(item[2]["text"]) <= self.max_chunk_chars]
        texts = [batch[i][2]["text"] for i in short]
        encoded = dict(zip(short, self.tokenizer.encode_batch(texts, self.dtype)))  # ids < vocab_size: exact
        out = [self._encode(item, encoded.get(i)) for i, item in enumerate(batch)]
        self._count(batch, out)
        yield name, out

    def _encode(self, item, ids=None):
        kind, key, payload = item
        if kind != "doc":
            return item
        if ids is None:
            ids = encode_document(self.tokenizer, payload["text"], self.max_chunk_chars)
        meta = {k: v for k, v in payload.items() if k != "text"}
        return ("doc", key, (meta, ids.astype(self.dtype, copy=False).tobytes()))  # ids < vocab_size: exact

    def _count(self, batch, out):
        """Updates the counters once per batch (not three Beam counter updates per document)."""
        docs = [(item, enc) for item, enc in zip(batch, out) if item[0] == "doc"]
        self.docs.inc(len(docs))
        self.tokens.inc(sum(len(enc[2][1]) for _, enc in docs) // self.dtype.itemsize)
        self.bytes.inc(sum(readers.utf8_size(item[2]["text"]) for item, _ in docs))


class TokenizeDocuments(beam.PTransform):
    """Tokenizes documents with a SentencePiece model (`dpsynth.data.tokenizers.Tokenizer`)."""

    def __init__(self, tokenizer_path: str, max_chunk_chars: int = DEFAULT_MAX_CHUNK_CHARS):
        super().__init__()
        self.tokenizer_path, self.max_chunk_chars = tokenizer_path, max_chunk_chars

    def expand(self, items):
        """PCollection[(corpus name, list[Item(doc=record)])]
        -> PCollection[(corpus name, list[Item(doc=(meta, token bytes in the stored dtype))])]."""
        return items | "Encode" >> beam.ParDo(_TokenizeFn(self.tokenizer_path, self.max_chunk_chars))


# ----------------------------------------------------------------------------- writing


@dataclasses.dataclass(frozen=True)
class CorpusOutput:
    """Where and how one corpus is written: its directory, shard count and manifest extras."""

    out_dir: str
    num_shards: int
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.num_shards < 1:
            raise ValueError(f"{self.out_dir}: num_shards must be >= 1, got {self.num_shards}")


class _WriteShardFn(beam.DoFn):
    """((corpus name, shard_index), [ShardPart, ...]) -> (corpus name, shard result); writes the shard."""

    def __init__(self, out_dirs: dict[str, str], vocab_size: int):
        self.out_dirs, self.vocab_size = out_dirs, vocab_size
        self.dtype = token_shards.token_dtype(vocab_size)
        self.shards = Metrics.counter(NAMESPACE, "shards_written")

    def process(self, element):
        (name, index), parts = element
        out_dir = self.out_dirs[name]
        tokens, offsets, docs_jsonl, labels = merge_shard_parts(list(parts), self.dtype)
        entry = token_shards.write_shard_files(out_dir, token_shards.shard_name(index), tokens, offsets, docs_jsonl)
        self.shards.inc()
        logger.info("tokenize: wrote %s/%s (%d documents, %d tokens)", out_dir, entry["name"],
                    entry["num_documents"], entry["num_tokens"])
        yield name, ("shard", index, {"entry": entry, "labels": dict(labels)})


def pack_shard_part(docs: Sequence[tuple]) -> tuple:
    """[(key, meta, token bytes)] of one shard -> ShardPart `(keys, sizes, tokens, metas, labels)`:
    int64 (file, record) key pairs, int64 byte sizes of the tokens, the token bytes concatenated, the
    docs.jsonl lines (`token_shards.encode_meta`, UTF-8, joined by newlines) and the label
    counts. A handful of bytes objects cross Beam's coders and the shuffle in one piece, where
    a tuple and a dict per document would each be encoded and decoded."""
    lines, labels = [], Counter()
    for key, meta, _ in docs:
        if not isinstance(meta.get("id"), str):
            raise ValueError(f"record {key}: no string 'id'")
        lines.append(token_shards.encode_meta(meta))
        if "label" in meta:
            labels[str(meta["label"])] += 1
    keys = np.array([d[0] for d in docs], np.int64).reshape(-1, 2)
    sizes = np.array([len(d[2]) for d in docs], np.int64)
    return (keys.tobytes(), sizes.tobytes(), b"".join(d[2] for d in docs),
            "\n".join(lines).encode("utf-8"), dict(labels))


def merge_shard_parts(parts: Sequence[tuple], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, bytes, Counter]:
    """ShardParts (any order) -> (tokens, offsets, docs.jsonl bytes, label counts) of the shard,
    its documents sorted by key: what `token_shards.write_shard` would write for them."""
    keys = np.concatenate([np.frombuffer(p[0], np.int64).reshape(-1, 2) for p in parts])
    sizes = np.concatenate([np.frombuffer(p[1], np.int64) for p in parts]) // dtype.itemsize
    tokens = np.concatenate([np.frombuffer(p[2], dtype) for p in parts])
    lines = [line for p in parts if p[3] for line in p[3].split(b"\n")]  # JSON lines hold no raw newline
    labels = Counter()
    for p in parts:
        labels.update(p[4])
    order = np.lexsort((keys[:, 1], keys[:, 0]))
    offsets = np.zeros(sizes.size + 1, np.int64)
    np.cumsum(sizes[order], out=offsets[1:])
    # Copied in runs of documents that follow each other in the input too (no per-token index:
    # a shard of 100M+ tokens would need GBs for one).
    begin = (np.cumsum(sizes) - sizes)[order]
    end = begin + sizes[order]
    cuts = np.flatnonzero(begin[1:] != end[:-1]) + 1
    firsts, lasts = np.concatenate([[0], cuts]), np.concatenate([cuts, [order.size]]) - 1
    runs = zip(firsts.tolist(), lasts.tolist()) if order.size else []
    flat = np.concatenate([tokens[:0]] + [tokens[begin[a]:end[b]] for a, b in runs])
    docs_jsonl = b"\n".join([lines[i] for i in order.tolist()]) + (b"\n" if lines else b"")
    return flat, offsets, docs_jsonl, labels


def _docs_by_shard(element, num_shards: dict[str, int]):
    """(corpus name, tokenized batch) -> ((name, shard), ShardPart) for each shard it touches."""
    name, batch = element
    by_shard: dict[int, list] = {}
    for kind, key, payload in batch:
        if kind == "doc":
            meta, ids = payload
            by_shard.setdefault(shard_of(meta["id"], num_shards[name]), []).append((key, meta, ids))
    return [((name, shard), pack_shard_part(docs)) for shard, docs in sorted(by_shard.items(), key=lambda kv: kv[0])]


def _dead_letters(element):
    name, batch = element
    return [(name, item) for item in batch if item[0] == "dead"]


class WriteTokenCorpora(beam.PTransform):
    """Groups the tokenized documents of one or more corpora into shards, writes them, the
    dead letters and each corpus's manifest, in steps shared by all corpora.

    A runner that executes its steps one after another (Beam's local `FnApiRunner`) pays a
    round over its workers per step; shared steps keep that cost independent of the number
    of corpora.

    Each manifest's `extra` fields: `records_in`, `dead_lettered`, `dead_letter_reasons`
    (counts by reason with numbers masked), `labels` (label counts, labeled data only) and
    the corpus's `CorpusOutput.extra` (inputs, columns). `DIR/dead_letters.jsonl` lists every
    rejected record as `{"file", "record", "reason"}`, sorted; it never holds text.
    """

    def __init__(self, outputs: dict[str, CorpusOutput], *, vocab_size: int, tokenizer_sha256: str):
        super().__init__()
        if not outputs:
            raise ValueError("WriteTokenCorpora needs at least one corpus")
        self.outputs, self.vocab_size, self.tokenizer_sha256 = dict(outputs), vocab_size, tokenizer_sha256

    def expand(self, items):
        """PCollection[(corpus name, list[Item(doc=(meta, tokens)) | Item(dead)])]
        -> PCollection[(corpus name, manifest dict)] (one per corpus)."""
        dead = items | "KeepDead" >> beam.FlatMap(_dead_letters)
        written = (
            items
            | "KeyByShard" >> beam.FlatMap(_docs_by_shard, {n: o.num_shards for n, o in self.outputs.items()})
            | "GroupShards" >> beam.GroupByKey()
            | "WriteShards" >> beam.ParDo(_WriteShardFn({n: o.out_dir for n, o in self.outputs.items()}, self.vocab_size))
        )
        seed = items.pipeline | "Seed" >> beam.Create(  # a manifest even when a corpus is empty
            [(name, ("seed", None, None)) for name in sorted(self.outputs)])
        return (
            (written, dead, seed)
            | "MergeResults" >> beam.Flatten()
            | "GatherResults" >> beam.GroupByKey()
            | "WriteManifest" >> beam.ParDo(_WriteManifestFn(self.outputs, self.vocab_size, self.tokenizer_sha256))
        )


class _WriteManifestFn(beam.DoFn):
    """(corpus name, [shard results and dead letters]) -> (corpus name, manifest); writes
    dead_letters.jsonl and the manifest."""

    def __init__(self, outputs: dict[str, CorpusOutput], vocab_size: int, tokenizer_sha256: str):
        self.outputs, self.vocab_size, self.tokenizer_sha256 = outputs, vocab_size, tokenizer_sha256

    def process(self, element):
        name, results = element
        output = self.outputs[name]
        entries, labels, dead = [], Counter(), []
        for kind, key, payload in results:
            if kind == "shard":
                entries.append(payload["entry"])
                labels.update(payload["labels"])
            elif kind == "dead":
                dead.append((key, payload))
        dead.sort(key=lambda d: d[0])
        dead_rows = [d[1] for d in dead]
        data = "".join(json.dumps(d, sort_keys=True) + "\n" for d in dead_rows).encode("utf-8")
        fileio.write_bytes_fs(FileSystems.join(output.out_dir, DEAD_LETTERS), data)
        num_docs = sum(e["num_documents"] for e in entries)
        extra = dict(output.extra)
        extra.update(
            records_in=num_docs + len(dead_rows),
            dead_lettered=len(dead_rows),
            dead_letter_reasons=dict(sorted(Counter(reason_category(d["reason"]) for d in dead_rows).items())),
        )
        if labels:
            extra["labels"] = dict(sorted(labels.items()))
        remove_stale_shards(output.out_dir, {e["name"] for e in entries})
        yield name, token_shards.write_manifest(
            output.out_dir, name=name, shards=entries, vocab_size=self.vocab_size,
            tokenizer_sha256=self.tokenizer_sha256, extra=extra,
        )


class TokenizeCorpora(beam.PTransform):
    """Read -> tokenize -> write shards, dead letters and manifest for several `CorpusSource`s,
    every step shared by all of them (see `ReadCorpora`, `WriteTokenCorpora`)."""

    def __init__(self, sources: Sequence[CorpusSource], outputs: dict[str, CorpusOutput], *, tokenizer_path: str,
                 vocab_size: int, tokenizer_sha256: str,
                 max_document_bytes: int = readers.DEFAULT_MAX_DOCUMENT_BYTES,
                 max_chunk_chars: int = DEFAULT_MAX_CHUNK_CHARS):
        super().__init__()
        names = [s.name for s in sources]
        if not sources or len(set(names)) != len(names) or set(names) != set(outputs):
            raise ValueError(f"sources {names} and outputs {sorted(outputs)} must name the same, distinct corpora")
        for s in sources:
            if s.token_dir is not None:
                raise ValueError(f"{s.token_dir}: already tokenized; nothing to do")
        self.sources, self.outputs, self.tokenizer_path = list(sources), dict(outputs), tokenizer_path
        self.vocab_size, self.tokenizer_sha256 = vocab_size, tokenizer_sha256
        self.max_document_bytes, self.max_chunk_chars = max_document_bytes, max_chunk_chars

    def expand(self, pbegin):
        """PBegin -> PCollection[(corpus name, manifest dict)] (one per source, after every shard is written)."""
        files = [s for s in self.sources if s.records is None]
        parts = [pbegin | "ReadCorpora" >> ReadCorpora(files, self.max_document_bytes)] if files else []
        parts += [pbegin | f"Create[{s.name}]" >> CreateDocuments(s.records, s.name, ",".join(s.specs),
                                                                  self.max_document_bytes)
                  for s in self.sources if s.records is not None]
        items = parts[0] if len(parts) == 1 else tuple(parts) | "AllCorpora" >> beam.Flatten()
        return (
            items
            | "Tokenize" >> TokenizeDocuments(self.tokenizer_path, self.max_chunk_chars)
            | "Write" >> WriteTokenCorpora(self.outputs, vocab_size=self.vocab_size,
                                           tokenizer_sha256=self.tokenizer_sha256)
        )


class TokenizeCorpus(beam.PTransform):
    """`TokenizeCorpora` of one `CorpusSource`."""

    def __init__(self, source: CorpusSource, *, tokenizer_path: str, vocab_size: int, tokenizer_sha256: str,
                 out_dir: str, num_shards: int | None = None,
                 max_document_bytes: int = readers.DEFAULT_MAX_DOCUMENT_BYTES,
                 max_chunk_chars: int = DEFAULT_MAX_CHUNK_CHARS):
        super().__init__()
        output = CorpusOutput(out_dir, num_shards or source.num_shards(), source.manifest_extra())
        self.corpora = TokenizeCorpora([source], {source.name: output}, tokenizer_path=tokenizer_path,
                                       vocab_size=vocab_size, tokenizer_sha256=tokenizer_sha256,
                                       max_document_bytes=max_document_bytes, max_chunk_chars=max_chunk_chars)

    def expand(self, pbegin):
        """PBegin -> PCollection[manifest dict] (one element, after every shard is written)."""
        return pbegin | "Corpora" >> self.corpora | "DropName" >> beam.Map(lambda kv: kv[1])
