"""Training the SentencePiece tokenizer on public corpora (`dpsynth tokenizer train`)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from dpsynth import tokens as tok
from dpsynth.data import readers


def train_public_tokenizer(
    corpus: Sequence[str] | str,
    *,
    vocab_size: int,
    out: str,
    text_column: str = "text",
    max_sentences: int | None = 1_000_000,
    max_sample_bytes: int = tok.DEFAULT_SAMPLE_BYTES,
    model_type: str = "unigram",
    seed: int = 0,
) -> tok.Tokenizer:
    """Trains on a random sample of lines of a PUBLIC corpus and saves the model to `out`.

    The sample holds at most `max_sample_bytes` bytes and `max_sentences` lines
    (`dpsynth.tokens.sample_lines`); memory follows the sample, not the corpus.

    Raises:
      readers.InputError: unreadable inputs, or no usable text.
    """
    start = time.monotonic()
    files = readers.resolve_inputs(corpus)
    texts = readers.iter_public_texts([f.path for f in files], text_column=text_column)
    try:
        tokenizer = tok.train_tokenizer(texts, vocab_size=vocab_size, max_sentences=max_sentences,
                                        max_sample_bytes=max_sample_bytes, model_type=model_type, seed=seed)
    except ValueError as e:
        raise readers.InputError(f"{', '.join(map(str, corpus))}: {e}") from e
    tokenizer.save(out)
    print(f"tokenizer: {tokenizer.vocab_size} pieces from {len(files)} public files "
          f"-> {out} (sha256 {tokenizer.sha256[:12]}, {time.monotonic() - start:.1f}s)")
    return tokenizer
