"""The Beam jobs as library functions (the `beam_jobs/` entry points only parse flags).

`tokenize(...)`: one corpus -> a token corpus. `dedup(...)`: tokenize the public and
sensitive inputs, build the sensitive index once on the driver, cut every >= k-token
overlap from each public shard in parallel, write the cleaned corpus and the contamination
report. Both run on any Beam runner (see `dpsynth.beam.options`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import apache_beam as beam

from dpsynth import tokens as tok
from dpsynth.beam import corpus
from dpsynth.beam.options import make_pipeline_options
from dpsynth.data import readers

logger = logging.getLogger("dpsynth")


def _run_pipeline(build, beam_args: Sequence[str] | None, pipeline: beam.Pipeline | None) -> None:
    """Builds the graph with `build(pipeline)` and runs it to completion."""
    p = pipeline if pipeline is not None else beam.Pipeline(options=make_pipeline_options(beam_args))
    build(p)
    result = p.run()
    result.wait_until_finish()


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
    label_column: str = "label",
    num_shards: int | None = None,
    shard_bytes: int = corpus.DEFAULT_SHARD_BYTES,
    max_document_bytes: int = readers.DEFAULT_MAX_DOCUMENT_BYTES,
    tfds_data_dir: str | None = None,
    beam_args: Sequence[str] | None = None,
    pipeline: beam.Pipeline | None = None,
) -> dict[str, Any]:
    """Tokenizes one corpus into `out_dir`; returns its manifest.

    Raises:
      readers.InputError: fatal input problems (before the pipeline starts), or an empty
        corpus (`EmptyDatasetError`, after it).
    """
    start = time.monotonic()
    tokenizer = tok.Tokenizer.load(tokenizer_path)
    source = corpus.plan_source(inputs, kind=kind, name=name, text_column=text_column,
                                label_column=label_column, tfds_data_dir=tfds_data_dir)
    if source.token_dir is not None:
        raise readers.InputError(f"{source.token_dir}: already a token corpus; nothing to tokenize")
    shards = num_shards or source.num_shards(shard_bytes)
    logger.info("tokenize: %s: %d input files, %d bytes, %d shards", source.name, len(source.files), source.total_bytes, shards)

    def build(p):
        _ = p | f"Tokenize[{source.name}]" >> corpus.TokenizeCorpus(
            source, tokenizer_path=tokenizer_path, vocab_size=tokenizer.vocab_size,
            tokenizer_sha256=tokenizer.sha256, out_dir=out_dir, num_shards=shards,
            max_document_bytes=max_document_bytes,
        )

    _run_pipeline(build, beam_args, pipeline)
    manifest = tok.read_manifest(out_dir)
    corpus.check_not_empty(manifest, source)
    elapsed = time.monotonic() - start
    print(f"tokenize: {summarize_manifest(manifest, out_dir)} "
          f"[{source.total_bytes / 1e6 / max(elapsed, 1e-9):.2f} MB/s, {elapsed:.1f}s]")
    return manifest
