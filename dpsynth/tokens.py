"""Tokenizers (SentencePiece, and Hugging Face `tokenizer.json`) and the token-shard file format
(this module alone owns the layout).

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
filesystem installed.
"""

from __future__ import annotations

import dataclasses
import heapq
import io
import json
import os
import random
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from apache_beam.io.filesystems import FileSystems

from dpsynth.errors import DpsynthError, MissingFileError
from dpsynth.fileio import dumps_json, parse_jsonl, sha256_bytes, write_bytes_fs

FORMAT = "dpsynth.tokens"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TOKENS_SUFFIX = ".tokens"
OFFSETS_SUFFIX = ".offsets"
DOCS_SUFFIX = ".docs.jsonl"

# Special ids of every dpsynth SentencePiece model (imported tokenizers carry their own).
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
NATIVE_SPECIAL_IDS = {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID}
# Files of a tokenizer inside a model directory: one of the two tokenizer files, plus the
# special ids when they are not the native ones.
SP_FILE, HF_FILE, SPECIAL_IDS_FILE = "tokenizer.model", "tokenizer.json", "special_ids.json"


class FormatError(DpsynthError, ValueError):
    """A token corpus does not match the documented format (names the file and the problem)."""


# ----------------------------------------------------------------------------- file helpers


def _join(*parts: str) -> str:
    return FileSystems.join(*parts)


def _read_bytes(path: str) -> bytes:
    with FileSystems.open(path) as f:
        return f.read()


def sha256_file(path: str) -> str:
    """Hex SHA-256 of a file read through `FileSystems` (`gs://` too)."""
    return sha256_bytes(_read_bytes(path))


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
        lines.append(json.dumps(meta, ensure_ascii=False, sort_keys=True))
    payloads = {
        TOKENS_SUFFIX: flat.tobytes(),
        OFFSETS_SUFFIX: offsets.tobytes(),
        DOCS_SUFFIX: ("\n".join(lines) + ("\n" if lines else "")).encode("utf-8"),
    }
    _ensure_dir(directory)
    hashes = {}
    for suffix, data in payloads.items():
        write_bytes_fs(_join(directory, name + suffix), data)
        hashes[suffix.lstrip(".")] = sha256_bytes(data)
    return {
        "name": name,
        "num_documents": int(len(documents)),
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
        data = _read_bytes(_join(src_dir, entry["name"] + suffix))
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
        manifest = json.loads(_read_bytes(path))
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


def read_shard(directory: str, entry: dict[str, Any], dtype: str | np.dtype, verify: bool = True) -> TokenShard:
    """Reads one shard listed in a manifest; with `verify`, checks hashes and counts."""
    name = entry["name"]
    raw = {}
    for suffix in (TOKENS_SUFFIX, OFFSETS_SUFFIX, DOCS_SUFFIX):
        path = _join(directory, name + suffix)
        if not FileSystems.exists(path):
            raise FormatError(f"{path}: missing shard file listed in the manifest")
        raw[suffix] = _read_bytes(path)
        if verify and sha256_bytes(raw[suffix]) != entry["sha256"][suffix.lstrip(".")]:
            raise FormatError(f"{path}: SHA-256 does not match the manifest (corrupt or replaced shard)")
    tokens = np.frombuffer(raw[TOKENS_SUFFIX], dtype=np.dtype(dtype).newbyteorder("<"))
    offsets = np.frombuffer(raw[OFFSETS_SUFFIX], dtype="<i8")
    docs = parse_jsonl(raw[DOCS_SUFFIX])
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


# ----------------------------------------------------------------------------- tokenizer


def _check_special_ids(special_ids: dict[str, int], vocab_size: int, where: str) -> dict[str, int]:
    ids = dict(special_ids)
    if set(ids) != set(NATIVE_SPECIAL_IDS):
        raise ValueError(f"{where}: special ids must name exactly {sorted(NATIVE_SPECIAL_IDS)}, got {sorted(ids)}")
    for name, value in ids.items():
        if not isinstance(value, int) or not 0 <= value < vocab_size:
            raise ValueError(f"{where}: special id {name}={value!r} is not a token id of this {vocab_size}-token "
                             "vocabulary")
    return ids


class Tokenizer:
    """A SentencePiece model. Special ids: dpsynth's (pad 0, unk 1, bos 2, eos 3) by default, or
    those of an imported model (`special_ids`, e.g. Llama 2's bos 1 / eos 2)."""

    kind, filename = "sentencepiece", SP_FILE

    def __init__(self, model_proto: bytes, special_ids: dict[str, int] | None = None):
        import sentencepiece as spm

        self.model_proto = bytes(model_proto)
        self._sp = spm.SentencePieceProcessor(model_proto=self.model_proto)
        self.native = special_ids is None or dict(special_ids) == NATIVE_SPECIAL_IDS
        ids = NATIVE_SPECIAL_IDS if self.native else _check_special_ids(special_ids, self.vocab_size, "tokenizer")
        self.special_ids = dict(ids)
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = ids["pad"], ids["unk"], ids["bos"], ids["eos"]
        self.sha256 = sha256_bytes(self.model_proto if self.native else
                                   self.model_proto + json.dumps(ids, sort_keys=True).encode())

    @classmethod
    def load(cls, path: str) -> "Tokenizer":
        if not FileSystems.exists(path):
            raise MissingFileError(f"{path}: tokenizer model not found (train one with `dpsynth tokenizer train`)")
        return cls(_read_bytes(path))

    def save(self, path: str) -> None:
        write_bytes_fs(path, self.model_proto)

    @property
    def vocab_size(self) -> int:
        return int(self._sp.get_piece_size())

    def encode(self, text: str) -> np.ndarray:
        """Token ids of one text (no bos/eos added), as int32."""
        return np.asarray(self._sp.encode(text), dtype=np.int32)

    def encode_batch(self, texts: Sequence[str], dtype=np.int32) -> list[np.ndarray]:
        """`encode` of each text in one call to SentencePiece's batched encoder, as `dtype`
        (an unsigned dtype too small for an id raises OverflowError)."""
        return [np.array(ids, dtype=dtype) for ids in self._sp.encode(list(texts))]

    def _strip(self, ids: Iterable[int]) -> np.ndarray:
        arr = np.asarray(ids if isinstance(ids, np.ndarray) else list(ids), dtype=np.int64).reshape(-1)
        return arr[(arr != self.pad_id) & (arr != self.bos_id) & (arr != self.eos_id)]  # vectorized: corpora decode fast

    def decode(self, ids: Iterable[int]) -> str:
        return self._sp.decode(self._strip(ids).tolist())

    def decode_batch(self, docs: Sequence[np.ndarray]) -> list[str]:
        """`decode` of each array, in one call to SentencePiece's batched (threaded) decoder."""
        arrays = [np.asarray(ids).reshape(-1) for ids in docs]
        if not arrays:
            return []
        sizes = np.array([a.size for a in arrays], np.int64)
        ends = np.cumsum(sizes)
        return self.decode_spans(np.concatenate(arrays), ends - sizes, ends)

    def decode_spans(self, tokens: np.ndarray, starts: Sequence[int], ends: Sequence[int]) -> list[str]:
        """`decode(tokens[starts[i]:ends[i]])` for every i, in one batched call.

        One pass over `tokens` (pad/bos/eos dropped, one `tolist`), then list slices: no
        NumPy call per span, which dominated for many short documents.
        """
        tokens = np.asarray(tokens).reshape(-1)
        starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
        special = (tokens == self.pad_id) | (tokens == self.bos_id) | (tokens == self.eos_id)  # as `decode`
        if special.any():  # spans in the coordinates of the kept tokens
            kept = np.zeros(tokens.size + 1, np.int64)
            np.cumsum(~special, out=kept[1:])
            starts, ends, tokens = kept[starts], kept[ends], tokens[~special]
        ids = tokens.tolist()
        pieces = [ids[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
        return list(self._sp.decode(pieces)) if pieces else []

    def __getstate__(self):
        return {"model_proto": self.model_proto, "special_ids": None if self.native else self.special_ids}

    def __setstate__(self, state):
        self.__init__(state["model_proto"], state.get("special_ids"))


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizer.json` (through the `tokenizers` library) with explicit special ids.

    `encode` adds no special tokens (dpsynth adds bos/eos itself); `decode` drops pad/bos/eos.
    """

    kind, filename = "hf", HF_FILE

    def __init__(self, json_bytes: bytes, special_ids: dict[str, int]):
        from tokenizers import Tokenizer as _HF

        self.json_bytes = bytes(json_bytes)
        self._tok = _HF.from_str(self.json_bytes.decode("utf-8"))
        self.native = False
        ids = _check_special_ids(special_ids, self.vocab_size, "tokenizer.json")
        self.special_ids = dict(ids)
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = ids["pad"], ids["unk"], ids["bos"], ids["eos"]
        self.sha256 = sha256_bytes(self.json_bytes + json.dumps(ids, sort_keys=True).encode())

    @classmethod
    def load(cls, path: str) -> "HFTokenizer":
        raise TypeError("load an HFTokenizer with load_tokenizer(directory) (it needs its special ids)")

    def save(self, path: str) -> None:
        write_bytes_fs(path, self.json_bytes)

    @property
    def model_proto(self):
        raise TypeError("a Hugging Face tokenizer.json has no SentencePiece model proto")

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def encode_batch(self, texts: Sequence[str], dtype=np.int32) -> list[np.ndarray]:
        return [np.array(e.ids, dtype=dtype) for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode(self._strip(ids).tolist(), skip_special_tokens=False)

    def __getstate__(self):
        return {"json_bytes": self.json_bytes, "special_ids": self.special_ids}

    def __setstate__(self, state):
        self.__init__(state["json_bytes"], state["special_ids"])


def save_tokenizer(tokenizer: Tokenizer, directory: str) -> None:
    """Writes the tokenizer file (and its special ids when not dpsynth's) into a model directory."""
    tokenizer.save(_join(directory, tokenizer.filename))
    if not tokenizer.native:
        write_bytes_fs(_join(directory, SPECIAL_IDS_FILE),
                       dumps_json(tokenizer.special_ids).encode())


def load_tokenizer(directory: str) -> Tokenizer:
    """The tokenizer of a model directory: `tokenizer.json` or `tokenizer.model` (+ `special_ids.json`)."""
    special = None
    ids_path = _join(directory, SPECIAL_IDS_FILE)
    if FileSystems.exists(ids_path):
        try:
            special = json.loads(_read_bytes(ids_path))
        except ValueError as e:
            raise ValueError(f"{ids_path}: not valid JSON ({e})") from e
    if FileSystems.exists(_join(directory, HF_FILE)):
        if special is None:
            raise MissingFileError(f"{ids_path}: missing (a tokenizer.json needs its special ids)")
        return HFTokenizer(_read_bytes(_join(directory, HF_FILE)), special)
    path = _join(directory, SP_FILE)
    if not FileSystems.exists(path):
        raise MissingFileError(f"{directory}: holds neither {SP_FILE} nor {HF_FILE}")
    return Tokenizer(_read_bytes(path), special)


def _sentences(text: str, max_bytes: int) -> Iterator[str]:
    """The non-empty lines of `text`, lines above `max_bytes` UTF-8 bytes split at whitespace.

    SentencePiece silently drops sentences longer than its `max_sentence_length`; a document
    whose line breaks were lost (the dedup job's clean text is decoded token pieces, in which
    newlines became spaces) would otherwise contribute nothing.
    """
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if len(line.encode("utf-8")) <= max_bytes:
            yield line
            continue
        chunk: list[str] = []
        size = 0
        for word in line.split():
            n = len(word.encode("utf-8")) + 1
            if chunk and size + n > max_bytes // 2:
                yield " ".join(chunk)
                chunk, size = [], 0
            if n <= max_bytes:  # a single "word" longer than the limit cannot be a sentence
                chunk.append(word)
                size += n
        if chunk:
            yield " ".join(chunk)


# Default bound of the tokenizer-training sample: SentencePiece's trainer needs about 12-25
# bytes of memory per sampled byte (measured in docs/data.md), so 32 MiB of lines stays near
# 1 GB whatever the corpus size.
DEFAULT_SAMPLE_BYTES = 32 << 20


def sample_lines(
    texts: Iterable[str], *, max_bytes: int, max_lines: int | None = None, max_line_bytes: int | None = None,
    seed: int = 0,
) -> list[str]:
    """A uniform random sample of the non-empty lines of `texts`, bounded in UTF-8 bytes.

    Every line gets an independent random priority; the sample is every line whose priority
    is below a threshold, lowered (by evicting the highest priority kept) whenever the kept
    lines exceed `max_bytes` (or `max_lines`). Memory is therefore bounded by the sample,
    whatever the corpus size and whatever a line is (a sentence or a whole review), and the
    choice does not depend on line length. Lines are stripped; lines longer than
    `max_line_bytes` are split at whitespace (`_sentences`; SentencePiece would drop them).

    Returns:
      The sampled lines in corpus order.
    """
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
    if max_lines is not None and max_lines < 1:
        raise ValueError(f"max_lines must be >= 1, got {max_lines}")
    rng = random.Random(seed)
    heap: list[tuple[float, int, str, int]] = []  # (-priority, order, line, bytes): max-heap
    total = 0
    threshold = 2.0  # every priority in [0, 1) is below it until the first eviction
    order = 0
    for text in texts:
        lines = _sentences(text, max_line_bytes) if max_line_bytes else (x.strip() for x in text.splitlines())
        for line in lines:
            if not line:
                continue
            priority = rng.random()
            order += 1
            if priority >= threshold:
                continue
            size = len(line.encode("utf-8"))
            heapq.heappush(heap, (-priority, order, line, size))
            total += size
            while heap and (total > max_bytes or (max_lines is not None and len(heap) > max_lines)):
                neg, _, _, dropped = heapq.heappop(heap)
                total -= dropped
                threshold = min(threshold, -neg)
    heap.sort(key=lambda item: item[1])
    return [item[2] for item in heap]


def train_tokenizer(
    texts: Iterable[str],
    *,
    vocab_size: int,
    max_sentences: int | None = 1_000_000,
    max_sample_bytes: int = DEFAULT_SAMPLE_BYTES,
    max_sentence_length: int = 8192,
    seed: int = 0,
    model_type: str = "unigram",
    character_coverage: float = 0.9995,
) -> Tokenizer:
    """Trains SentencePiece on a random sample of lines of `texts` (PUBLIC text only).

    The sample (`sample_lines`) holds at most `max_sample_bytes` UTF-8 bytes and
    `max_sentences` lines (None: no line bound), so training memory follows the sample, not
    the corpus (about 12-25 bytes per sampled byte, docs/data.md).

    A tokenizer trained on sensitive text can leak it through its vocabulary, so callers must
    pass public text only; `dpsynth tokenizer train` only accepts public corpora.
    """
    import sentencepiece as spm

    sample = sample_lines(texts, max_bytes=max_sample_bytes, max_lines=max_sentences,
                          max_line_bytes=max_sentence_length, seed=seed)
    if not sample:
        raise ValueError("tokenizer training: the corpus has no non-empty lines")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sample),
        model_writer=model,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        max_sentence_length=max_sentence_length,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        byte_fallback=True,
        hard_vocab_limit=False,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        num_threads=os.cpu_count() or 1,
        minloglevel=2,
    )
    return Tokenizer(model.getvalue())
