"""Training the SentencePiece tokenizer on public corpora (`dpsynth tokenizer train`).

`sample_lines` draws the bounded uniform sample of lines that `train_tokenizer` trains on;
`train_public_tokenizer` reads the public files and saves the model. `TokenizerConfig` is the one
declaration of the training settings: `dpsynth tokenizer train`'s flags, the experiment's
`tokenizer:` section and the released tokenizer (`dpsynth.beam.jobs.release_tokenizer`) all take it.
"""

from __future__ import annotations

import dataclasses
import heapq
import io
import os
import random
import time
from collections.abc import Iterable, Iterator, Sequence

from dpsynth import binding
from dpsynth.data import readers
from dpsynth.data.tokenizers import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer


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


MODEL_TYPES = ("unigram", "bpe")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenizerConfig:
    """How a SentencePiece tokenizer is trained on a bounded random sample of a public corpus.

    Attributes:
        vocab_size: pieces in the vocabulary (>= 16).
        max_sentences: at most this many lines in the sample.
        max_sample_mb: at most this many MiB of lines in the sample (training memory follows it:
            about 0.3 GB + 25x this, docs/data.md).
        model_type: SentencePiece's model type.
        seed: the seed of the line sample.
    """

    vocab_size: int = binding.setting(8000, help="pieces in the vocabulary (>= 16)")
    max_sentences: int = binding.setting(1_000_000, help="sample at most this many lines")
    max_sample_mb: float = binding.setting(DEFAULT_SAMPLE_BYTES / 2**20,
                                           help="and at most this many MiB of lines (peak ~0.3 GB + ~25x this, "
                                                "docs/data.md)")
    model_type: str = binding.setting("unigram", choices=MODEL_TYPES, help="SentencePiece model type")
    seed: int = binding.setting(0, help="the seed of the line sample")

    def __post_init__(self):
        for name in ("vocab_size", "max_sentences", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise binding.SettingError(name, f"must be an integer, got {value!r}")
        if self.vocab_size < 16:
            raise binding.SettingError("vocab_size", f"must be >= 16, got {self.vocab_size}")
        if self.max_sentences < 1:
            raise binding.SettingError("max_sentences", f"must be >= 1, got {self.max_sentences}")
        if isinstance(self.max_sample_mb, bool) or not isinstance(self.max_sample_mb, (int, float)) \
                or not 0 < self.max_sample_mb < float("inf"):
            raise binding.SettingError("max_sample_mb", f"must be a number > 0, got {self.max_sample_mb!r}")
        if self.model_type not in MODEL_TYPES:
            raise binding.SettingError("model_type", f"must be one of {', '.join(MODEL_TYPES)}, got {self.model_type!r}")

    @property
    def max_sample_bytes(self) -> int:
        return max(1, int(self.max_sample_mb * 2**20))


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


def train_public_tokenizer(
    corpus: Sequence[str] | str,
    *,
    out: str,
    config: TokenizerConfig = TokenizerConfig(),
    text_column: str = "text",
    encoding: str | None = None,
) -> Tokenizer:
    """Trains on a random sample of lines of a PUBLIC corpus (text in `encoding`, default UTF-8)
    and saves the model to `out`.

    The sample holds at most `config.max_sample_mb` MiB and `config.max_sentences` lines
    (`sample_lines`); memory follows the sample, not the corpus.

    Raises:
      readers.InputError: unreadable inputs, or no usable text.
    """
    start = time.monotonic()
    files = readers.resolve_inputs(corpus, encoding=encoding)
    texts = readers.iter_public_texts([f.path for f in files], text_column=text_column, encoding=encoding)
    try:
        tokenizer = train_tokenizer(texts, vocab_size=config.vocab_size, max_sentences=config.max_sentences,
                                    max_sample_bytes=config.max_sample_bytes, model_type=config.model_type,
                                    seed=config.seed)
    except ValueError as e:
        raise readers.InputError(f"{', '.join(map(str, corpus))}: {e}") from e
    tokenizer.save(out)
    print(f"tokenizer: {tokenizer.vocab_size} pieces from {len(files)} public files "
          f"-> {out} (sha256 {tokenizer.sha256[:12]}, {time.monotonic() - start:.1f}s)")
    return tokenizer
