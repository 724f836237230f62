"""The Beam jobs as library functions (the `beam_jobs/` entry points only parse flags).

`tokenize(...)`: one corpus -> a token corpus. `dedup(...)`: in one pipeline, tokenize the
public and sensitive inputs, build the sensitive index once (one step), cut every >= k-token
overlap from each public shard in parallel, write the cleaned corpus and the contamination
report. `release_tokenizer(...)`: the tokenizer to release, trained on the cleaned corpus
only (the dedup's own tokenizer has seen the overlaps it cut), and the cleaned corpus
re-tokenized with it. All run on any Beam runner (see `dpsynth.beam.pipeline`, which also describes the
`test_pipeline` test hook).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from dpsynth import owner_only
from dpsynth.beam import corpus
from dpsynth.beam import dedup as bdedup
from dpsynth.beam.dedup import PUBLIC, TOKENS_DIR
from dpsynth.beam.inputs import DEFAULT_SHARD_BYTES, CorpusSource, check_not_empty, plan_source
from dpsynth.beam.pipeline import PipelineFactory, run_pipeline
from dpsynth.data import dead_letters, readers, token_shards
from dpsynth.data.tokenizer_training import TokenizerConfig
from dpsynth.data.tokenizers import Tokenizer
from dpsynth.dedup import DEFAULT_MIN_TOKENS

logger = logging.getLogger("dpsynth")


def summarize_manifest(manifest: dict[str, Any], out_dir: str) -> str:
    """One line: counts only (never text)."""
    line = (
        f"{manifest['name']}: {manifest['num_documents']} documents, {manifest['num_tokens']} tokens "
        f"in {len(manifest['shards'])} shards ({manifest['dtype']}) -> {out_dir}"
    )
    if manifest.get("dead_lettered"):
        line += f"; {manifest['dead_lettered']} dead-lettered {manifest.get('dead_letter_reasons', {})}"
    return line


def tokenize(
    inputs: Sequence[str] | str,
    *,
    tokenizer_path: str,
    out_dir: str,
    kind: str = "public",
    name: str | None = None,
    text_column: str = "text",
    label_column: str | None = "label",
    num_shards: int | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    max_document_bytes: int = readers.DEFAULT_MAX_DOCUMENT_BYTES,
    tfds_data_dir: str | None = None,
    encoding: str | None = None,
    max_dead_letters: str | int | None = None,
    beam_args: Sequence[str] | None = None,
    test_pipeline: PipelineFactory | None = None,
) -> dict[str, Any]:
    """Tokenizes one corpus into `out_dir`; returns its manifest.

    `encoding`: the text files' (default UTF-8). A sensitive corpus is owner-only (`out_dir`
    0700, its files 0600, on a local file system). `beam_args` are Beam flags; `test_pipeline`
    replaces the pipeline they make (tests).

    Raises:
      readers.InputError: fatal input problems (before the pipeline starts), an empty corpus
        (`EmptyDatasetError`, after it), or more dead letters than `max_dead_letters`
        (`dead_letters.TooManyDeadLetters`, after it: a later dedup refuses the corpus too).
    """
    start = time.monotonic()
    limit = dead_letters.parse_limit(max_dead_letters)
    tokenizer = Tokenizer.load(tokenizer_path)
    source = plan_source(inputs, kind=kind, name=name, text_column=text_column,
                         label_column=label_column, tfds_data_dir=tfds_data_dir, encoding=encoding)
    if source.token_dir is not None:
        raise readers.InputError(f"{source.token_dir}: already a token corpus; nothing to tokenize")
    shards = num_shards or source.num_shards(shard_bytes)
    logger.info("tokenize: %s: %d input files, %d bytes, %d shards", source.name, len(source.files), source.total_bytes, shards)
    private = kind == "sensitive" and "://" not in out_dir
    if private:  # before anything is written into it
        owner_only.make_private_dir(out_dir)

    def build(p):
        _ = p | f"Tokenize[{source.name}]" >> corpus.TokenizeCorpus(
            source, tokenizer_path=tokenizer_path, vocab_size=tokenizer.vocab_size,
            tokenizer_sha256=tokenizer.sha256, out_dir=out_dir, num_shards=shards,
            max_document_bytes=max_document_bytes,
        )

    run_pipeline(build, beam_args=beam_args, test_pipeline=test_pipeline)
    if private:
        owner_only.restrict_tree(out_dir)
    manifest = token_shards.read_manifest(out_dir)
    check_not_empty(manifest, source)
    elapsed = time.monotonic() - start
    print(f"tokenize: {summarize_manifest(manifest, out_dir)} "
          f"[{source.total_bytes / 1e6 / max(elapsed, 1e-9):.2f} MB/s, {elapsed:.1f}s]")
    dead_letters.enforce([corpus.dead_letter_summary(out_dir, manifest, source.name, limit)],
                         FileSystems.join(out_dir, corpus.DEAD_LETTERS))
    return manifest


# ----------------------------------------------------------------------------- dedup


def parse_named(spec: str) -> tuple[str | None, str]:
    """`NAME=PATH` -> (NAME, PATH); a plain path -> (None, PATH)."""
    head, sep, tail = spec.partition("=")
    if sep and head and "/" not in head and ":" not in head:
        return head, tail
    return None, spec


def dedup(
    public: Sequence[str] | str,
    sensitive: Sequence[str],
    *,
    tokenizer_path: str,
    out_dir: str,
    min_tokens: int = DEFAULT_MIN_TOKENS,
    text_column: str = "text",
    label_column: str | None = "label",
    num_shards: int | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    max_document_bytes: int = readers.DEFAULT_MAX_DOCUMENT_BYTES,
    tfds_data_dir: str | None = None,
    threads: int = 1,
    state_dir: str | None = None,
    encoding: str | None = None,
    public_encoding: str | None = None,
    max_dead_letters: str | int | None = None,
    allow_unread_sensitive: bool = False,
    beam_args: Sequence[str] | None = None,
    test_pipeline: PipelineFactory | None = None,
) -> dict[str, Any]:
    """Removes every >= `min_tokens` token sequence shared with sensitive data from a public corpus.

    One pipeline: tokenize every input that is not a token corpus yet, build the sensitive
    index (one step), cut the overlaps of every public shard in parallel, write the report
    (`dpsynth.beam.dedup.DedupCorpora`).

    Args:
      public: the public corpus (paths/dirs/globs) or one token corpus directory.
      sensitive: one entry per sensitive dataset: `[NAME=]PATH` (files/dir/glob, a token corpus
        directory, or `tfds:NAME`).
      state_dir: the private state (default `OUT.private`, never inside `out_dir`; 0700, files
        0600): the token corpora (`tokens/public/`, the public corpus BEFORE the cut, and
        `tokens/sensitive/NAME/`, with their dead letters) and the sensitive index. `out_dir`
        holds only what may be published: the clean corpus and the report
        (`dpsynth.beam.dedup.PUBLISHABLE`). A `tokens/public/` that an older dpsynth left in
        `out_dir` is removed (it is made again in `state_dir`); a `public` token corpus inside
        `out_dir` is refused.
      encoding: the sensitive text files' encoding (default UTF-8; the same `--encoding` as every
        other stage that reads them); `public_encoding`: the public corpus's.
      max_dead_letters: dead letters tolerated per corpus (`--max-dead-letters`, default 1%).
      allow_unread_sensitive: go on when a sensitive record could not be read (it is then listed
        in the report as not protected); by default that is refused.
      beam_args: Beam flags (`--runner`, `--direct_num_workers`, ...).
      test_pipeline: returns the pipeline to use instead (tests).

    Returns:
      The contamination report (also written to `out_dir/contamination.json`).

    Raises:
      readers.InputError: fatal input problems (before the pipeline starts; a `public` token
        corpus inside `out_dir`), or, after it and
        with nothing cut or written but the token corpora: a corpus without a valid document
        (`EmptyDatasetError`), past `max_dead_letters` (`TooManyDeadLetters`), an unread
        sensitive record (`UnreadSensitiveError`).
    """
    from dpsynth.dedup import report as dedup_report

    if min_tokens < 1:
        raise ValueError(f"min_tokens must be >= 1, got {min_tokens}")
    if not sensitive:
        raise readers.InputError("dedup needs at least one --sensitive dataset")
    start = time.monotonic()
    tokenizer = Tokenizer.load(tokenizer_path)
    state_dir = state_dir or dead_letters.private_dir(out_dir)
    local = "://" not in state_dir
    if local:
        owner_only.check_outside(state_dir, out_dir, "the private state directory")
    sources = _dedup_sources(public, sensitive, text_column=text_column, label_column=label_column,
                             tfds_data_dir=tfds_data_dir, encoding=encoding, public_encoding=public_encoding)
    dirs = _token_dirs(sources, tokenizer, tokenizer_path, state_dir)
    if "://" not in out_dir:
        _remove_unpublishable(out_dir, sources[0], dirs[PUBLIC])
        os.makedirs(out_dir, exist_ok=True)
    if local:  # before anything is written into it
        owner_only.make_private_dir(state_dir)

    def build(p):
        manifests = _token_manifests(p, sources, dirs, tokenizer, tokenizer_path, num_shards=num_shards,
                                     shard_bytes=shard_bytes, max_document_bytes=max_document_bytes)
        _ = manifests | "DedupCorpora" >> bdedup.DedupCorpora(
            token_dirs=dirs, dtype=token_shards.token_dtype(tokenizer.vocab_size).name,
            tokenizer_path=tokenizer_path, out_dir=out_dir, vocab_size=tokenizer.vocab_size,
            tokenizer_sha256=tokenizer.sha256, min_tokens=min_tokens, threads=threads, state_dir=state_dir,
            max_dead_letters=max_dead_letters, allow_unread_sensitive=allow_unread_sensitive)

    run_pipeline(build, beam_args=beam_args, test_pipeline=test_pipeline)
    if local:
        owner_only.restrict_tree(state_dir)
    manifests = {}
    for s in sources:
        manifests[s.name] = token_shards.read_manifest(dirs[s.name])
        check_not_empty(manifests[s.name], s)
        print(f"dedup: tokens {summarize_manifest(manifests[s.name], dirs[s.name])}")
    bdedup.check_inputs(manifests, dirs, limit=max_dead_letters, allow_unread_sensitive=allow_unread_sensitive)
    with FileSystems.open(FileSystems.join(out_dir, bdedup.CONTAMINATION)) as f:
        report = json.loads(f.read())
    print(dedup_report.summary_text(report))
    print(f"dedup: done in {time.monotonic() - start:.1f}s -> {out_dir}")
    return report


def _dedup_sources(public: Sequence[str] | str, sensitive: Sequence[str], *, text_column: str,
                   label_column: str | None, tfds_data_dir: str | None,
                   encoding: str | None = None, public_encoding: str | None = None) -> list[CorpusSource]:
    """The public source, then one per `[NAME=]PATH` sensitive spec (names must be unique)."""
    sources = [plan_source(public, kind="public", name=PUBLIC, text_column=text_column, encoding=public_encoding)]
    names = set()
    for spec in sensitive:
        name, path = parse_named(spec)
        src = plan_source(path, kind="sensitive", name=name, text_column=text_column,
                          label_column=label_column, tfds_data_dir=tfds_data_dir, encoding=encoding)
        if src.name in names or src.name == PUBLIC:
            raise readers.InputError(f"{spec}: dataset name {src.name!r} is used twice; name it with NAME=PATH")
        names.add(src.name)
        sources.append(src)
    return sources


def _remove_unpublishable(out_dir: str, public: CorpusSource, public_tokens: str) -> None:
    """Keeps the uncleaned public corpus out of the local `out_dir`, which may be published.

    Raises `readers.InputError` when the `public` input is a token corpus inside `out_dir`
    (it would stay there); removes the `out_dir/tokens/public/` an older dpsynth wrote (the
    tokens now go to the private state, where this run writes them again) and `out_dir/tokens/`
    when that leaves it empty. `public_tokens`: where this run's public tokens are (for the log).
    """
    if public.token_dir is not None and owner_only.is_inside(public.token_dir, out_dir):
        raise readers.InputError(
            f"{public.token_dir}: the public token corpus lies inside --out {out_dir}, which may be published, "
            "and it is the corpus before the cut: move it out of --out (e.g. to the private state, as this "
            "job's own tokenizing does) and pass that")
    legacy = os.path.join(out_dir, TOKENS_DIR)
    if os.path.isdir(os.path.join(legacy, PUBLIC)):
        logger.warning("dedup: removing %s (the public corpus before the cut, left there by an older dpsynth: it "
                       "may not be published); this run's public tokens: %s", os.path.join(legacy, PUBLIC), public_tokens)
        shutil.rmtree(os.path.join(legacy, PUBLIC))
        if not os.listdir(legacy):
            os.rmdir(legacy)


def _token_dirs(sources: Sequence[CorpusSource], tokenizer: Tokenizer, tokenizer_path: str,
                state_dir: str) -> dict[str, str]:
    """Source name -> its token corpus: given (same tokenizer, checked), else in the private
    `state_dir`: `tokens/public` (the corpus before the cut) or `tokens/sensitive/NAME`, in the
    order of `sources`."""
    dirs = {}
    for src in sources:
        if src.token_dir is not None:
            m = token_shards.read_manifest(src.token_dir)
            if m["tokenizer_sha256"] != tokenizer.sha256:
                raise readers.InputError(
                    f"{src.token_dir}: tokenized with tokenizer {m['tokenizer_sha256'][:12]}, not "
                    f"{tokenizer.sha256[:12]} ({tokenizer_path}); re-tokenize or pass the matching model")
            check_not_empty(m, src)
            dirs[src.name] = src.token_dir
        else:
            sub = [PUBLIC] if src.kind == "public" else ["sensitive", src.name]
            dirs[src.name] = FileSystems.join(state_dir, TOKENS_DIR, *sub)
    return dirs


def _token_manifests(p: beam.Pipeline, sources: Sequence[CorpusSource], dirs: dict[str, str],
                     tokenizer: Tokenizer, tokenizer_path: str, *, num_shards: int | None, shard_bytes: int,
                     max_document_bytes: int) -> beam.PCollection:
    """PCollection[(source name, token manifest)] of every source: those that are not token
    corpora yet are tokenized in `p`, all through the same steps (`corpus.TokenizeCorpora`: a
    runner spreads the files of all of them over its workers and runs each step once, not
    once per corpus); the others' manifests are read now."""
    to_tokenize = [s for s in sources if s.token_dir is None]
    given = [(s.name, token_shards.read_manifest(dirs[s.name])) for s in sources if s.token_dir is not None]
    parts = [p | "GivenCorpora" >> beam.Create(given)] if given else []
    if to_tokenize:
        outputs = {s.name: corpus.CorpusOutput(
            dirs[s.name], (num_shards if s.kind == "public" else None) or s.num_shards(shard_bytes), s.manifest_extra())
            for s in to_tokenize}
        parts.append(p | "TokenizeCorpora" >> corpus.TokenizeCorpora(
            to_tokenize, outputs, tokenizer_path=tokenizer_path, vocab_size=tokenizer.vocab_size,
            tokenizer_sha256=tokenizer.sha256, max_document_bytes=max_document_bytes))
    return parts[0] if len(parts) == 1 else tuple(parts) | "AllManifests" >> beam.Flatten()


# ----------------------------------------------------------------------------- the released tokenizer

RELEASED_TOKENIZER = "tokenizer.model"
RELEASED_TOKENS_DIR = "clean_tokens"


def release_tokenizer(
    clean_corpus: Sequence[str] | str,
    *,
    out_dir: str,
    config: TokenizerConfig = TokenizerConfig(),
    num_shards: int | None = None,
    beam_args: Sequence[str] | None = None,
    test_pipeline: PipelineFactory | None = None,
) -> dict[str, Any]:
    """The tokenizer to release, trained on the DEDUPLICATED public corpus only, and that corpus
    re-tokenized with it.

    The dedup job needs a tokenizer before any overlap is cut, so its tokenizer has seen the
    uncleaned public corpus, sensitive overlaps included: it may serve the dedup only and is
    never released. This trains a fresh SentencePiece model on `clean_corpus` (the dedup
    job's `OUT/clean`), saves it as `out_dir/tokenizer.model` and tokenizes the clean corpus
    with it into `out_dir/clean_tokens` (what pretraining reads). Nothing that was cut can
    shape a piece of this tokenizer.

    Returns:
      {"tokenizer": path, "tokens": dir, "vocab_size", "sha256", "manifest": the token manifest}.
    """
    from dpsynth.data.tokenizer_training import train_public_tokenizer

    if "://" not in out_dir:
        os.makedirs(out_dir, exist_ok=True)
    tokenizer_path = FileSystems.join(out_dir, RELEASED_TOKENIZER)
    tokenizer = train_public_tokenizer(clean_corpus, out=tokenizer_path, config=config)
    tokens_dir = FileSystems.join(out_dir, RELEASED_TOKENS_DIR)
    manifest = tokenize(clean_corpus, tokenizer_path=tokenizer_path, out_dir=tokens_dir, kind="public",
                        name="public", num_shards=num_shards, beam_args=beam_args,
                        test_pipeline=test_pipeline)
    return {"tokenizer": tokenizer_path, "tokens": tokens_dir, "vocab_size": tokenizer.vocab_size,
            "sha256": tokenizer.sha256, "manifest": manifest}
