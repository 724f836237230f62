"""Text helpers shared by the tokenization and dedup stages.

`encode_document` tokenizes arbitrarily long documents in bounded memory: the text is cut
into chunks of at most `max_chunk_chars` characters at line breaks (else at whitespace,
else anywhere) and the chunks are encoded one by one. For documents shorter than one chunk
the result is exactly `Tokenizer.encode(text)`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np

DEFAULT_MAX_CHUNK_CHARS = 1 << 20
_SPACE = re.compile(r"\s")


def split_chunks(text: str, max_chunk_chars: int = DEFAULT_MAX_CHUNK_CHARS) -> Iterator[str]:
    """Cuts `text` into consecutive pieces of <= `max_chunk_chars` chars; their concatenation is `text`."""
    if max_chunk_chars <= 0:
        raise ValueError(f"max_chunk_chars must be positive, got {max_chunk_chars}")
    start, n = 0, len(text)
    while n - start > max_chunk_chars:
        end = start + max_chunk_chars
        cut = text.rfind("\n", start + 1, end)
        if cut < 0:
            m = None
            for m in _SPACE.finditer(text, start + 1, end):
                pass
            cut = m.start() if m else end - 1
        yield text[start : cut + 1]
        start = cut + 1
    if start < n:
        yield text[start:]


def encode_document(tokenizer, text: str, max_chunk_chars: int = DEFAULT_MAX_CHUNK_CHARS) -> np.ndarray:
    """Token ids (int32) of one document of any length (see the module docstring)."""
    if len(text) <= max_chunk_chars:
        return tokenizer.encode(text)
    parts = [tokenizer.encode(chunk) for chunk in split_chunks(text, max_chunk_chars)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def complement_ranges(length: int, ranges) -> list[tuple[int, int]]:
    """The half-open pieces of `[0, length)` not covered by sorted, disjoint `ranges`."""
    pieces, pos = [], 0
    for a, b in ranges:
        if a > pos:
            pieces.append((pos, a))
        pos = max(pos, b)
    if pos < length:
        pieces.append((pos, length))
    return pieces
