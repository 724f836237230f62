"""The tokenizer side of an exported Hugging Face directory, written without transformers.

`transformers.AutoTokenizer` picks a tokenizer class from `tokenizer_config.json`, else from
`config.json`'s `model_type` (e.g. `GemmaTokenizer`, which rebuilds a SentencePiece pipeline
and cannot encode with a byte-level `tokenizer.json`), and takes the special tokens from that
file too. So an export writes:

- `tokenizer.json`: the model's own file; for a SentencePiece model (`tokenizer.model`) an
  equivalent `tokenizer.json` built here (`sentencepiece_tokenizer_json`), so the export loads
  with `PreTrainedTokenizerFast` alone (no sentencepiece or protobuf at the user's end). The
  conversion follows the model's own settings: BPE merges ranked by piece score (or the
  Unigram lattice), byte fallback, the precompiled normalisation map, extra-whitespace removal,
  whitespace escaping to U+2581, the dummy prefix, user-defined pieces kept whole; the bos
  token is added by the post-processor, as transformers' SentencePiece tokenizers do. Before it
  is written, it must encode `SELF_CHECK_TEXTS` to exactly SentencePiece's ids (else
  `HFFormatError`).
- `tokenizer_config.json` (`tokenizer_config`): the source checkpoint's, when it had one, with
  bos/eos/pad/unk set to the tokens of the model's special ids; otherwise
  `tokenizer_class: PreTrainedTokenizerFast`, those four tokens and `model_max_length`. A
  converted SentencePiece tokenizer is always `PreTrainedTokenizerFast` (adding bos unless the
  source's `add_bos_token` says otherwise).
- `generation_config.json` (`generation_config`): the source's, when it had one, with the
  model's eos id included (and bos/pad filled in when absent); otherwise bos/eos/pad ids.

The SentencePiece model file is a protobuf (`sentencepiece_model.proto`); the few fields used
here are read with a minimal wire-format reader (`read_sentencepiece`), because the generated
protobuf module of the sentencepiece package requires a particular protobuf runtime.
"""

from __future__ import annotations

import dataclasses
import re
import struct
from typing import Any

from dpsynth.models.hf_files import HFFormatError

TOKENIZER_JSON, TOKENIZER_CONFIG, GENERATION_CONFIG = (
    "tokenizer.json", "tokenizer_config.json", "generation_config.json")
SPECIAL_NAMES = ("bos", "eos", "pad", "unk")
META_SPACE = "\u2581"  # "▁", SentencePiece's escaped space
# SentencePiece piece types and model types (sentencepiece_model.proto).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
UNIGRAM, BPE = 1, 2
# Texts the converted tokenizer.json must encode exactly as SentencePiece does before export:
# words, punctuation, digits, repeated/leading/trailing spaces, tabs and newlines, accents,
# scripts and emoji the vocabulary has no piece for (byte fallback or unk), the meta space.
SELF_CHECK_TEXTS = (
    "the quick brown fox", "Hello, world! 42", "privacy is a property of the mechanism, not of the output",
    "  two  spaces  ", "tab\there\nnew line\n\n", " leading", "trailing ", "naïve café ÅÄÖ", "日本語のテキスト",
    "emoji 😀 and ∑ symbols", "1234567890 3.14159", f"{META_SPACE}meta{META_SPACE} space", "a", "",
    "MiXeD CaSe WoRdS", "don't won't it's", "e-mail: someone@example.com", "(brackets) [and] {braces}",
    f"trailing meta {META_SPACE}", f"{META_SPACE}",
)


# ============================================================================ SentencePiece model file


@dataclasses.dataclass(frozen=True)
class SentencePieceModel:
    """The fields of a SentencePiece `ModelProto` that decide how text is encoded."""

    pieces: tuple[tuple[str, float, int], ...]  # (piece, score, type) by id
    model_type: int = UNIGRAM
    byte_fallback: bool = False
    treat_whitespace_as_suffix: bool = False
    precompiled_charsmap: bytes = b""
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True


def _varint(buf: bytes, i: int, where: str) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if i >= len(buf):
            raise HFFormatError(f"{where}: truncated protobuf (not a SentencePiece model?)")
        b = buf[i]
        value |= (b & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if not b & 0x80:
            return value, i


def _fields(buf: bytes, where: str):
    """(field number, value) of each field of one protobuf message: an int for varints, the
    raw bytes for length-delimited and fixed-width fields."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i, where)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i, where)
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            value, i = buf[i:i + n], i + n
        elif wire == 2:
            n, i = _varint(buf, i, where)
            value, i = buf[i:i + n], i + n
        else:
            raise HFFormatError(f"{where}: protobuf wire type {wire} of field {number} is not valid here "
                                "(not a SentencePiece model?)")
        if i > len(buf):
            raise HFFormatError(f"{where}: truncated protobuf (not a SentencePiece model?)")
        yield number, value


def read_sentencepiece(model_proto: bytes, where: str = "tokenizer.model") -> SentencePieceModel:
    """Reads the encoding-relevant fields of a serialized SentencePiece `ModelProto`."""
    pieces, kw = [], {}
    for number, value in _fields(model_proto, where):
        if number == 1:  # SentencePiece {piece = 1, score = 2 (float), type = 3}
            piece = {1: b"", 2: struct.pack("<f", 0.0), 3: NORMAL}
            piece.update(dict(_fields(value, where)))
            pieces.append((piece[1].decode("utf-8"), struct.unpack("<f", piece[2])[0], int(piece[3])))
        elif number == 2:  # TrainerSpec
            spec = dict(_fields(value, where))
            kw.update(model_type=int(spec.get(3, UNIGRAM)), byte_fallback=bool(spec.get(35, 0)),
                      treat_whitespace_as_suffix=bool(spec.get(24, 0)))
        elif number == 3:  # NormalizerSpec
            spec = dict(_fields(value, where))
            kw.update(precompiled_charsmap=bytes(spec.get(2, b"")), add_dummy_prefix=bool(spec.get(3, 1)),
                      remove_extra_whitespaces=bool(spec.get(4, 1)), escape_whitespaces=bool(spec.get(5, 1)))
    if not pieces:
        raise HFFormatError(f"{where}: no pieces (not a SentencePiece model?)")
    return SentencePieceModel(pieces=tuple(pieces), **kw)


def _bpe_merges(model: SentencePieceModel) -> list[tuple[str, str]]:
    """Merges that rebuild every normal piece, ranked as SentencePiece merges: by the merged
    piece's score (highest first), then its id."""
    normal = {p: (score, i) for i, (p, score, kind) in enumerate(model.pieces) if kind == NORMAL}
    ranked = []
    for piece, (score, i) in normal.items():
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in normal and right in normal:
                ranked.append((-score, i, left, right))
    return [(left, right) for _, _, left, right in sorted(ranked)]


def sentencepiece_tokenizer(model_proto: bytes, bos_token: str | None, where: str = "tokenizer.model"):
    """A `tokenizers.Tokenizer` that encodes like the SentencePiece model (module docstring)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    model = read_sentencepiece(model_proto, where)
    if model.treat_whitespace_as_suffix:
        raise HFFormatError(f"{where}: treat_whitespace_as_suffix=true cannot be converted to a tokenizer.json")
    unk = [i for i, (_, _, kind) in enumerate(model.pieces) if kind == UNKNOWN]
    if len(unk) != 1:
        raise HFFormatError(f"{where}: has {len(unk)} unknown pieces (SentencePiece models have exactly one)")
    user_defined = [p for p, _, kind in model.pieces if kind == USER_DEFINED]
    if model.model_type == BPE:
        vocab = {p: i for i, (p, _, _) in enumerate(model.pieces)}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=_bpe_merges(model), unk_token=model.pieces[unk[0]][0],
                                   fuse_unk=True, byte_fallback=model.byte_fallback, ignore_merges=bool(user_defined)))
    elif model.model_type == UNIGRAM:
        tok = Tokenizer(models.Unigram([(p, s) for p, s, _ in model.pieces], unk_id=unk[0],
                                       byte_fallback=model.byte_fallback))
    else:
        raise HFFormatError(f"{where}: SentencePiece model_type {model.model_type} (word/char) cannot be converted "
                            "to a tokenizer.json (BPE and Unigram can)")
    steps = []  # in SentencePiece's order
    if model.precompiled_charsmap:
        steps.append(normalizers.Precompiled(model.precompiled_charsmap))
    space = META_SPACE if model.escape_whitespaces else " "
    if model.remove_extra_whitespaces:  # leading spaces and runs of them; only " ": tabs and newlines stay
        steps += [normalizers.Replace(Regex(r"\A +"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    if model.escape_whitespaces:
        steps.append(normalizers.Replace(" ", META_SPACE))
    if model.add_dummy_prefix:  # Prepend leaves an empty text empty, as SentencePiece does
        steps.append(normalizers.Prepend(space))
    if model.remove_extra_whitespaces:  # trailing: after escaping, so a literal U+2581 goes too
        steps.append(normalizers.Replace(Regex(re.escape(space) + r"+\z"), ""))
    if steps:
        tok.normalizer = normalizers.Sequence(steps)
    if user_defined:  # SentencePiece emits user-defined pieces whole and never merges across them
        pattern = "|".join(re.escape(p) for p in sorted(user_defined, key=len, reverse=True))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    steps = [decoders.Replace(META_SPACE, " ")] if model.escape_whitespaces else []
    if model.byte_fallback:
        steps.append(decoders.ByteFallback())
    steps.append(decoders.Fuse())
    if model.add_dummy_prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    tok.decoder = decoders.Sequence(steps)
    tok.add_special_tokens([AddedToken(p, normalized=False, special=True)
                            for p, _, kind in model.pieces if kind in (UNKNOWN, CONTROL)])
    if bos_token is not None:
        bos_id = tok.token_to_id(bos_token)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos_token}:0 $A:0", pair=f"{bos_token}:0 $A:0 {bos_token}:1 $B:1",
            special_tokens=[(bos_token, bos_id)])
    return tok


def sentencepiece_tokenizer_json(model_proto: bytes, bos_id: int | None, where: str = "tokenizer.model") -> str:
    """The `tokenizer.json` text of a SentencePiece model, checked against SentencePiece.

    Raises:
      HFFormatError: the model cannot be converted, or the conversion encodes one of
        `SELF_CHECK_TEXTS` differently from SentencePiece.
    """
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=model_proto)
    bos = sp.id_to_piece(bos_id) if bos_id is not None else None
    tok = sentencepiece_tokenizer(model_proto, bos, where)
    for text in SELF_CHECK_TEXTS:
        want, got = list(sp.encode(text)), tok.encode(text, add_special_tokens=False).ids
        if want != got:
            raise HFFormatError(f"{where}: its tokenizer.json conversion encodes {text!r} as {got}, SentencePiece as "
                                f"{want}; this tokenizer cannot be exported as a tokenizer.json")
    return tok.to_str()


# ============================================================================ configs


def token_strings(tokenizer, ids) -> list[str]:
    """The strings of ids of a dpsynth tokenizer (SentencePiece pieces or tokenizer.json tokens)."""
    if tokenizer.kind == "hf":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(tokenizer.json_bytes.decode("utf-8"))
        return [tok.id_to_token(int(i)) for i in ids]
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=tokenizer.model_proto)
    return [sp.id_to_piece(int(i)) for i in ids]


def tokenizer_config(tokenizer, special_ids: dict[str, int], max_len: int,
                     source: dict[str, Any] | None) -> dict[str, Any]:
    """`tokenizer_config.json`: the source's (if any) with the model's special tokens (module docstring)."""
    config = dict(source or {})
    config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    config.setdefault("model_max_length", int(max_len))
    config.setdefault("clean_up_tokenization_spaces", False)
    tokens = token_strings(tokenizer, [special_ids[name] for name in SPECIAL_NAMES])
    config.update({f"{name}_token": token for name, token in zip(SPECIAL_NAMES, tokens)})
    if tokenizer.kind == "sentencepiece":  # the export's converted tokenizer.json: read it as it is
        config["tokenizer_class"] = "PreTrainedTokenizerFast"  # (a SentencePiece class rebuilds its own pipeline)
        config.setdefault("add_bos_token", True)  # as the converted post-processor does
        config.setdefault("add_eos_token", False)
    return config


def generation_config(special_ids: dict[str, int], source: dict[str, Any] | None) -> dict[str, Any]:
    """`generation_config.json`: the source's (if any) with the model's eos id among its eos ids."""
    config = dict(source or {})
    eos = config.get("eos_token_id")
    if eos is None:
        config["eos_token_id"] = special_ids["eos"]
    elif special_ids["eos"] not in (eos if isinstance(eos, list) else [eos]):
        config["eos_token_id"] = [special_ids["eos"], *(eos if isinstance(eos, list) else [eos])]
    for name in ("bos", "pad"):
        if config.get(f"{name}_token_id") is None:
            config[f"{name}_token_id"] = special_ids[name]
    return config
