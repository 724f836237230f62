"""The SentencePiece model of a GGUF file, rebuilt from its `tokenizer.ggml.*` metadata.

llama.cpp's converter copies a SentencePiece `tokenizer.model` into the GGUF as three arrays
(`tokenizer.ggml.tokens`, `.scores`, `.token_type`; the types are SentencePiece's own piece
types, NORMAL 1 ... BYTE 6), the special ids (`bos_token_id`, `eos_token_id`,
`unknown_token_id`, `padding_token_id`) and `add_space_prefix`. `tokenizer.ggml.model` "llama"
is llama.cpp's SentencePiece tokenizer: pieces merged by score, which is SentencePiece's BPE
model, so `sentencepiece_proto` writes a BPE `ModelProto` with

- the pieces, scores and types in id order (user-defined pieces with spaces, which the converter
  writes unescaped, with U+2581 again; a file that marks no piece UNKNOWN gets its
  `unknown_token_id` piece typed UNKNOWN: SentencePiece needs exactly one);
- `trainer_spec`: model_type BPE, byte_fallback (when the vocabulary has the 256 byte
  pieces `<0x00>`..`<0xFF>`), whitespace-only pieces allowed, the special ids and pieces;
- `normalizer_spec`: "identity" (no NFKC), whitespace escaped to U+2581, the dummy prefix
  only when `add_space_prefix` says so (Gemma: no), extra whitespace kept.

That file is the model directory's `tokenizer.model`, loaded by `dpsynth.data.tokenizers.Tokenizer`
like any SentencePiece model. The protobuf is written by hand (a few fields, wire format), as
`hf_tokenizer.read_sentencepiece` reads it, so no protobuf runtime is needed.
"""

from __future__ import annotations

import struct
from typing import Sequence

from dpsynth.models.hf_tokenizer import BPE, BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED

PIECE_TYPES = (NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE)


def _varint(value: int) -> bytes:
    if value < 0:  # int32 fields: negative values are 10-byte two's complement varints
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _int(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(int(value))


def _bytes(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _float(number: int, value: float) -> bytes:
    return _varint(number << 3 | 5) + struct.pack("<f", value)


def sentencepiece_proto(tokens: Sequence[str], scores: Sequence[float], types: Sequence[int], *,
                        special_ids: dict[str, int], add_dummy_prefix: bool) -> bytes:
    """A serialized SentencePiece BPE `ModelProto` (module docstring).

    Args:
      tokens, scores, types: `tokenizer.ggml.tokens/scores/token_type`, by id (equal lengths, checked
        by the caller).
      special_ids: "bos", "eos", "pad", "unk" ids.
      add_dummy_prefix: `tokenizer.ggml.add_space_prefix`.
    """
    types = [int(t) for t in types]
    if UNKNOWN not in types:
        types[special_ids["unk"]] = UNKNOWN
    # llama.cpp's converter writes user-defined whitespace pieces with plain spaces (Gemma's "  " ... );
    # SentencePiece matches them in the escaped text, so they are written back with U+2581.
    tokens = [t.replace(" ", "\u2581") if kind == USER_DEFINED else t for t, kind in zip(tokens, types)]
    pieces = set(tokens)
    byte_fallback = all(f"<0x{b:02X}>" in pieces for b in range(256))
    out = bytearray()
    for piece, score, kind in zip(tokens, scores, types):
        body = _bytes(1, piece.encode("utf-8")) + _float(2, float(score))
        if kind != NORMAL:
            body += _int(3, kind)
        out += _bytes(1, body)
    trainer = (_int(3, BPE) + _int(4, len(tokens)) + _int(26, 1) + _int(35, int(byte_fallback))
               + _int(40, special_ids["unk"]) + _int(41, special_ids["bos"]) + _int(42, special_ids["eos"])
               + _int(43, special_ids["pad"]))
    for number, name in ((45, "unk"), (46, "bos"), (47, "eos"), (48, "pad")):
        trainer += _bytes(number, tokens[special_ids[name]].encode("utf-8"))
    out += _bytes(2, trainer)
    out += _bytes(3, _bytes(1, b"identity") + _int(3, int(add_dummy_prefix)) + _int(4, 0) + _int(5, 1))
    return bytes(out)
