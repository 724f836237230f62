"""Tokenizers: a SentencePiece model (`Tokenizer`) or a Hugging Face `tokenizer.json`
(`HFTokenizer`), and the tokenizer files of a model directory.

A model directory holds one tokenizer file, `tokenizer.model` (SentencePiece model proto) or
`tokenizer.json` (Hugging Face), plus `special_ids.json` (`{"pad", "unk", "bos", "eos"}` ids)
when the special ids are not dpsynth's (pad 0, unk 1, bos 2, eos 3; `NATIVE_SPECIAL_IDS`).
`Tokenizer.sha256` identifies a tokenizer (the token-shard manifest records it,
`dpsynth.data.token_shards`). Training is in `dpsynth.data.tokenizer_training`. All paths go
through Beam's `FileSystems` (`gs://` too).

`Tokenizer.decode_spans` decodes with the native decoder (`native/decode.h`) through a piece
table built from the model, byte-identical to SentencePiece's `decode` (tested against it). It
falls back to SentencePiece, decided once per model (`_piece_table`), when the model has a
denormalizer (`denormalizer_spec.precompiled_charsmap`), a byte piece not spelled `<0xXX>`, an
empty `unk_surface` with an unknown piece starting with U+2581, a piece above 65535 bytes, an
unparsable proto, or when `dpsynth._native` is not built (or predates the decoder); and for
token arrays of a non-integer dtype.

`Tokenizer.decode_jsonl` writes `{"id", "text"}` JSON lines of documents made of spans in one
native pass (`native/decode.h`), byte-identical to its Python path (`_jsonl_of_texts`), which
it takes where `decode_spans` would not decode natively (and for `HFTokenizer`).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Sequence
from json.encoder import encode_basestring

import numpy as np
from apache_beam.io.filesystems import FileSystems

from dpsynth.errors import MissingFileError
from dpsynth.fileio import dumps_json, read_bytes_fs, sha256_bytes, write_bytes_fs

try:
    from dpsynth import _native
except ImportError:  # not built: SentencePiece decodes
    _native = None

# Special ids of every dpsynth SentencePiece model (imported tokenizers carry their own).
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
NATIVE_SPECIAL_IDS = {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID}
# Files of a tokenizer inside a model directory: one of the two tokenizer files, plus the
# special ids when they are not the native ones.
SP_FILE, HF_FILE, SPECIAL_IDS_FILE = "tokenizer.model", "tokenizer.json", "special_ids.json"


def _check_special_ids(special_ids: dict[str, int], vocab_size: int, where: str) -> dict[str, int]:
    ids = dict(special_ids)
    if set(ids) != set(NATIVE_SPECIAL_IDS):
        raise ValueError(f"{where}: special ids must name exactly {sorted(NATIVE_SPECIAL_IDS)}, got {sorted(ids)}")
    for name, value in ids.items():
        if not isinstance(value, int) or not 0 <= value < vocab_size:
            raise ValueError(f"{where}: special id {name}={value!r} is not a token id of this {vocab_size}-token "
                             "vocabulary")
    return ids


_SPACE = "\u2581"  # SentencePiece's whitespace symbol
_BYTE_PIECE = re.compile(r"<0x([0-9A-F]{2})>")
_NATIVE_DTYPES = tuple(np.dtype(t) for t in (np.uint16, np.uint32, np.int32, np.int64))
# Piece kinds of the native decoder (native/decode.h).
_VERBATIM, _LEADING_SPACE, _BYTE, _SKIP = 0, 1, 2, 3


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def _proto_fields(buf: bytes, wanted: set[int]) -> dict[int, list]:
    """The fields `wanted` of a serialized protobuf message: number -> values in order (varints
    as int, the rest as bytes). The installed `sentencepiece_model_pb2` may not import (it pins
    a protobuf runtime); `dpsynth.models.hf_tokenizer` reads more fields, a layer above."""
    fields: dict[int, list] = {}
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        else:
            if wire == 2:
                size, pos = _varint(buf, pos)
            elif wire in (1, 5):
                size = 8 if wire == 1 else 4
            else:
                raise ValueError(f"protobuf wire type {wire}")
            value, pos = (buf[pos:pos + size] if number in wanted else None), pos + size
        if number in wanted:
            fields.setdefault(number, []).append(value)
    if pos != len(buf):
        raise ValueError("truncated protobuf message")
    return fields


def _submessage(fields: dict[int, list], number: int, wanted: set[int]) -> dict[int, list]:
    return _proto_fields(b"".join(fields.get(number, [])), wanted)  # occurrences merge


def _piece_table(sp, model_proto: bytes, drop: set[int]) -> tuple | None:
    """The native decoder's piece table (`surface, offsets, kind, strip_all_leading`) of a
    SentencePiece model, ids in `drop` skipped; None when SentencePiece must decode (see the
    module docstring). Follows SentencePiece's Decode: control pieces empty, the unknown piece
    as `trainer_spec.unk_surface`, byte pieces merged into UTF-8, U+2581 as a space, a leading
    one dropped at the start of the text under add_dummy_prefix or remove_extra_whitespaces
    (every leading one under the latter)."""
    if not hasattr(_native, "decode_spans"):  # not built, or built before the decoder
        return None
    try:
        model = _proto_fields(model_proto, {2, 3, 5})
        trainer = _submessage(model, 2, {44})  # unk_surface
        normalizer = _submessage(model, 3, {3, 4})  # add_dummy_prefix, remove_extra_whitespaces
        denormalizer = _submessage(model, 5, {2})  # precompiled_charsmap
    except (ValueError, IndexError):
        return None
    if denormalizer.get(2, [b""])[-1]:
        return None
    unk_surface = trainer.get(44, [" \u2047 ".encode()])[-1]
    try:  # decoded text must be valid UTF-8 (decode_jsonl's whitespace test, the str of decode_spans)
        unk_surface.decode("utf-8")
    except UnicodeDecodeError:
        return None
    strip_all = bool(normalizer.get(4, [1])[-1])
    strip = strip_all or bool(normalizer.get(3, [1])[-1])
    surfaces, kinds = [], bytearray()
    for i, piece in enumerate(sp.id_to_piece(list(range(sp.get_piece_size())))):
        kind, surface = _VERBATIM, b""
        if i in drop:
            kind = _SKIP
        elif sp.is_byte(i):
            match = _BYTE_PIECE.fullmatch(piece)
            if match is None:
                return None
            kind, surface = _BYTE, bytes([int(match[1], 16)])
        elif sp.is_unknown(i):
            if not unk_surface and piece.startswith(_SPACE):
                return None
            surface = unk_surface
        elif not sp.is_control(i):
            surface = piece.replace(_SPACE, " ").encode()
            if strip and piece.startswith(_SPACE):
                kind = _LEADING_SPACE
        if len(surface) > 0xFFFF:
            return None
        surfaces.append(surface)
        kinds.append(kind)
    offsets = np.zeros(len(surfaces) + 1, np.int64)
    np.cumsum([len(x) for x in surfaces], out=offsets[1:])
    return (np.frombuffer(b"".join(surfaces), np.uint8), offsets, np.frombuffer(bytes(kinds), np.uint8),
            strip_all)


def _jsonl_of_texts(texts: Sequence[str], doc_spans: np.ndarray, ids: Sequence[str]) -> tuple[bytes, int]:
    """`Tokenizer.decode_jsonl` from the decoded spans `texts`, in Python (its reference)."""
    lines, left_out, bounds = [], 0, doc_spans.tolist()
    for j, doc_id in enumerate(ids):
        a, b = bounds[j], bounds[j + 1]
        text = texts[a] if b - a == 1 else "\n".join(t for t in texts[a:b] if t)
        if not text or text.isspace():  # `not text.strip()` without copying the text
            left_out += 1
            continue
        lines.append('{"id": ' + encode_basestring(doc_id) + ', "text": ' + encode_basestring(text) + "}\n")
    return "".join(lines).encode("utf-8"), left_out


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
        # The native decoder's piece table, or None: SentencePiece decodes (module docstring).
        self._pieces = _piece_table(self._sp, self.model_proto, {self.pad_id, self.bos_id, self.eos_id})

    @classmethod
    def load(cls, path: str) -> "Tokenizer":
        if not FileSystems.exists(path):
            raise MissingFileError(f"{path}: tokenizer model not found (train one with `dpsynth tokenizer train`)")
        return cls(read_bytes_fs(path))

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

    @functools.cached_property
    def sampling_banned_ids(self) -> tuple[int, ...]:
        """The ids a sampler never draws: PAD, BOS and every other control or unused piece (an
        imported model's `<unusedN>`, `<start_of_turn>`, `<mask>`, ...: decoding drops them, so a
        drawn one would be a silent, wasted step), EOS excepted (it ends a row)."""
        return tuple(sorted((self._control_ids() | {self.pad_id, self.bos_id}) - {self.eos_id}))

    def _control_ids(self) -> set[int]:
        sp = self._sp
        return {i for i in range(self.vocab_size) if sp.is_control(i) or sp.is_unused(i)}

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

        Natively (`native/decode.h`) where the model allows (module docstring): spans must then
        lie within `tokens` (ValueError) and an id outside the vocabulary raises IndexError, as
        SentencePiece does.
        """
        tokens = np.asarray(tokens).reshape(-1)
        starts, ends = np.asarray(starts, dtype=np.int64).reshape(-1), np.asarray(ends, dtype=np.int64).reshape(-1)
        if self._pieces is not None and tokens.dtype.kind in "iu":
            if tokens.dtype not in _NATIVE_DTYPES:  # other widths, non-native byte order
                tokens = tokens.astype(np.int64)
            return _native.decode_spans(*self._pieces, np.ascontiguousarray(tokens),
                                        np.ascontiguousarray(starts), np.ascontiguousarray(ends))
        return self._sp_decode_spans(tokens, starts, ends)

    def decode_jsonl(self, tokens: np.ndarray, starts: Sequence[int], ends: Sequence[int], doc_spans: Sequence[int],
                     ids: Sequence[str]) -> tuple[bytes, int]:
        """JSON lines of documents made of spans, and how many were left out.

        Document j is the spans `doc_spans[j]:doc_spans[j + 1]` (offsets from 0 to the number of
        spans) of `starts`/`ends`; its text is those spans decoded as by `decode_spans`, empty ones
        dropped, joined by "\\n". Documents whose text is empty or whitespace (`str.isspace`) are left
        out; each other one gives `json.dumps({"id": ids[j], "text": text}, ensure_ascii=False,
        sort_keys=True) + "\\n"`, as UTF-8. Natively in one pass where `decode_spans` decodes natively.
        """
        tokens = np.asarray(tokens).reshape(-1)
        starts, ends = np.asarray(starts, dtype=np.int64).reshape(-1), np.asarray(ends, dtype=np.int64).reshape(-1)
        doc_spans = np.asarray(doc_spans, dtype=np.int64).reshape(-1)
        if doc_spans.size != len(ids) + 1:
            raise ValueError(f"decode_jsonl: {doc_spans.size} document span offsets for {len(ids)} ids")
        if self._pieces is None or tokens.dtype.kind not in "iu":
            return self._py_decode_jsonl(tokens, starts, ends, doc_spans, ids)
        if tokens.dtype not in _NATIVE_DTYPES:  # other widths, non-native byte order
            tokens = tokens.astype(np.int64)
        encoded = [doc_id.encode("utf-8") for doc_id in ids]
        id_offsets = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)), out=id_offsets[1:])
        return _native.decode_jsonl(*self._pieces, np.ascontiguousarray(tokens), np.ascontiguousarray(starts),
                                    np.ascontiguousarray(ends), doc_spans, np.frombuffer(b"".join(encoded), np.uint8),
                                    id_offsets)

    def _py_decode_jsonl(self, tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray, doc_spans: np.ndarray,
                         ids: Sequence[str]) -> tuple[bytes, int]:
        """`decode_jsonl` in Python: `decode_spans`, then `_jsonl_of_texts`."""
        if doc_spans[0] != 0 or doc_spans[-1] != starts.size or (np.diff(doc_spans) < 0).any():
            raise ValueError(f"decode_jsonl: document span offsets must rise from 0 to the {starts.size} spans")
        return _jsonl_of_texts(self.decode_spans(tokens, starts, ends), doc_spans, ids)

    def _sp_decode_spans(self, tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[str]:
        """`decode_spans` through SentencePiece: pad/bos/eos dropped in one pass, one `tolist`,
        list slices (no NumPy call per span), one batched `decode`."""
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
        self._pieces = None  # no native decoding: decode_jsonl takes its Python path
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

    def _control_ids(self) -> set[int]:
        return {int(i) for i, t in self._tok.get_added_tokens_decoder().items() if t.special}

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def encode_batch(self, texts: Sequence[str], dtype=np.int32) -> list[np.ndarray]:
        return [np.array(e.ids, dtype=dtype) for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode(self._strip(ids).tolist(), skip_special_tokens=False)

    def decode_spans(self, tokens: np.ndarray, starts: Sequence[int], ends: Sequence[int]) -> list[str]:
        """`decode(tokens[starts[i]:ends[i]])` for every i, in one `decode_batch` call."""
        tokens = np.asarray(tokens).reshape(-1)
        bounds = zip(np.asarray(starts).tolist(), np.asarray(ends).tolist())
        spans = [self._strip(tokens[a:b]).tolist() for a, b in bounds]
        return self._tok.decode_batch(spans, skip_special_tokens=False) if spans else []

    def __getstate__(self):
        return {"json_bytes": self.json_bytes, "special_ids": self.special_ids}

    def __setstate__(self, state):
        self.__init__(state["json_bytes"], state["special_ids"])


def save_tokenizer(tokenizer: Tokenizer, directory: str) -> None:
    """Writes the tokenizer file (and its special ids when not dpsynth's) into a model directory."""
    tokenizer.save(FileSystems.join(directory, tokenizer.filename))
    if not tokenizer.native:
        write_bytes_fs(FileSystems.join(directory, SPECIAL_IDS_FILE),
                       dumps_json(tokenizer.special_ids).encode())


def load_tokenizer(directory: str) -> Tokenizer:
    """The tokenizer of a model directory: `tokenizer.json` or `tokenizer.model` (+ `special_ids.json`)."""
    special = None
    ids_path = FileSystems.join(directory, SPECIAL_IDS_FILE)
    if FileSystems.exists(ids_path):
        try:
            special = json.loads(read_bytes_fs(ids_path))
        except ValueError as e:
            raise ValueError(f"{ids_path}: not valid JSON ({e})") from e
    if FileSystems.exists(FileSystems.join(directory, HF_FILE)):
        if special is None:
            raise MissingFileError(f"{ids_path}: missing (a tokenizer.json needs its special ids)")
        return HFTokenizer(read_bytes_fs(FileSystems.join(directory, HF_FILE)), special)
    path = FileSystems.join(directory, SP_FILE)
    if not FileSystems.exists(path):
        raise MissingFileError(f"{directory}: holds neither {SP_FILE} nor {HF_FILE}")
    return Tokenizer(read_bytes_fs(path), special)
