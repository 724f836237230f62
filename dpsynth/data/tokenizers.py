"""Tokenizers: a SentencePiece model (`Tokenizer`) or a Hugging Face `tokenizer.json`
(`HFTokenizer`), and the tokenizer files of a model directory.

A model directory holds one tokenizer file, `tokenizer.model` (SentencePiece model proto) or
`tokenizer.json` (Hugging Face), plus `special_ids.json` (`{"pad", "unk", "bos", "eos"}` ids)
when the special ids are not dpsynth's (pad 0, unk 1, bos 2, eos 3; `NATIVE_SPECIAL_IDS`).
`Tokenizer.sha256` identifies a tokenizer (the token-shard manifest records it,
`dpsynth.data.token_shards`). Training is in `dpsynth.data.tokenizer_training`. All paths go
through Beam's `FileSystems` (`gs://` too).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import numpy as np
from apache_beam.io.filesystems import FileSystems

from dpsynth.errors import MissingFileError
from dpsynth.fileio import dumps_json, read_bytes_fs, sha256_bytes, write_bytes_fs

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
