"""Benchmark: decoding token documents back to text, our native decoder vs SentencePiece; and
writing them as the dedup job's JSON lines, natively vs in Python.

Ours: `Tokenizer.decode_spans` (native/decode.h, a piece table built from the model), every
document of a shard in one call, as the dedup job's `clean_texts` calls it.
Peer: the SentencePiece path it replaced, kept as `Tokenizer._sp_decode_spans` (pad/bos/eos
dropped, one `tolist`, list slices, one batched `SentencePieceProcessor.decode`), same spans.
Both must return equal strings for every document (checked). Each shard is decoded by both in
turn; the figures are CPU seconds of this process (SentencePiece's batched decode may use
threads), MB/s of decoded UTF-8 text per CPU-second, the ratio, and wall seconds.

Second pair, the `{"id", "text"}` JSON lines of a shard (`dpsynth.beam.dedup.clean_jsonl`,
documents without cuts): ours, `Tokenizer.decode_jsonl` (one native pass, text decoded and
escaped straight into the bytes); peer, its Python path `Tokenizer._py_decode_jsonl` (the
native `decode_spans`, then a `json.encoder.encode_basestring` line per document, joined and
encoded), as the job wrote them before. Both must return equal bytes (checked).

Data, the first that applies:

* `--corpus DIR --tokenizer MODEL`: a token corpus written by `dpsynth tokenize` (its
  manifest's shards) and its SentencePiece model;
* the public text of `../shared/data` (`DPSYNTH_SHARED_DATA`; `--public` names the
  directories, default Austen + KJV + one enwiki file), encoded with a tokenizer trained on
  it (`--vocab-size`), documents of about 2,000 characters, shards of `--shard-tokens`;
* else the embedded default's Austen novels (`make data`), the same way.

    .venv/bin/python bench/decode.py                                  # ~1 min on 2 cores
    .venv/bin/python bench/decode.py --corpus out.private/tokens/public --tokenizer tok.model
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
SHARED = os.environ.get("DPSYNTH_SHARED_DATA", os.path.join(os.path.dirname(REPO), "shared", "data"))

from dpsynth.data import readers, token_shards  # noqa: E402
from dpsynth.data.tokenizer_training import train_tokenizer  # noqa: E402
from dpsynth.data.tokenizers import Tokenizer  # noqa: E402


def corpus_shards(directory: str):
    """(tokens, offsets, document ids) of every shard of a token corpus."""
    manifest = token_shards.read_manifest(directory)
    for entry in manifest["shards"]:
        shard = token_shards.read_shard(directory, entry, manifest["dtype"], verify=False)
        yield shard.tokens, shard.offsets, [doc["id"] for doc in shard.docs]


def text_shards(texts: list[str], vocab_size: int, shard_tokens: int):
    """A tokenizer trained on `texts`, and (tokens, offsets, document ids) shards of about
    `shard_tokens` tokens of their ~2,000-character documents."""
    tok = train_tokenizer(texts, vocab_size=vocab_size)
    docs = [t[i:i + 2000] for t in texts for i in range(0, len(t), 2000)]
    arrays = tok.encode_batch(docs, dtype=token_shards.token_dtype(tok.vocab_size))
    sizes = np.array([a.size for a in arrays])
    shard_of = (np.cumsum(sizes) - sizes) // shard_tokens  # by the tokens before each document
    shards = []
    for k in np.unique(shard_of):
        index = np.flatnonzero(shard_of == k)
        group = [arrays[i] for i in index]
        shards.append((np.concatenate(group), np.concatenate([[0], np.cumsum([a.size for a in group])]),
                       [f"doc-{i}" for i in index]))
    return tok, shards


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", help="a token corpus directory (with --tokenizer)")
    p.add_argument("--tokenizer", help="the corpus's SentencePiece model")
    p.add_argument("--public", nargs="+", help="public text directories/files (default: see above)")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--shard-tokens", type=int, default=2_600_000)
    args = p.parse_args(argv)

    if args.corpus:
        if not args.tokenizer:
            p.error("--corpus needs --tokenizer")
        tok = Tokenizer.load(args.tokenizer)
        shards, desc = corpus_shards(args.corpus), f"token corpus {args.corpus}"
    else:
        if args.public or os.path.isdir(SHARED):
            paths = args.public or [f"{SHARED}/public/austen", f"{SHARED}/public/kjv",
                                    f"{SHARED}/public/enwiki/enwiki-01.jsonl.gz"]
            texts = list(readers.iter_public_texts(paths))
        else:
            from dpsynth.data import embedded

            paths, texts = ["the embedded default's Austen novels"], [d["text"] for d in embedded.austen_documents()]
        t0 = time.time()
        tok, shards = text_shards(texts, args.vocab_size, args.shard_tokens)
        desc = f"{', '.join(paths)} (tokenizer and shards built in {time.time() - t0:.0f}s)"
    print(f"data: {desc}; {tok.vocab_size}-piece tokenizer, native decoder "
          f"{'on' if tok._pieces is not None else 'OFF (SentencePiece fallback)'}", flush=True)

    names = ("ours", "sentencepiece", "ours jsonl", "python jsonl")
    cpu, wall = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0.0)
    n_shards = n_docs = n_tokens = n_bytes = n_jsonl = mismatches = jsonl_mismatches = 0
    for tokens, offsets, ids in shards:
        starts, ends = offsets[:-1], offsets[1:]
        t, w = time.process_time(), time.perf_counter()
        ours = tok.decode_spans(tokens, starts, ends)
        cpu["ours"] += time.process_time() - t
        wall["ours"] += time.perf_counter() - w
        t, w = time.process_time(), time.perf_counter()
        peer = tok._sp_decode_spans(np.asarray(tokens), starts, ends)
        cpu["sentencepiece"] += time.process_time() - t
        wall["sentencepiece"] += time.perf_counter() - w
        mismatches += sum(a != b for a, b in zip(ours, peer)) + abs(len(ours) - len(peer))
        n_shards, n_docs, n_tokens = n_shards + 1, n_docs + len(peer), n_tokens + tokens.size
        n_bytes += sum(len(s.encode("utf-8")) for s in peer)
        del ours, peer
        doc_spans = np.arange(len(ids) + 1)  # one span per document: no cuts
        t, w = time.process_time(), time.perf_counter()
        ours = tok.decode_jsonl(tokens, starts, ends, doc_spans, ids)
        cpu["ours jsonl"] += time.process_time() - t
        wall["ours jsonl"] += time.perf_counter() - w
        t, w = time.process_time(), time.perf_counter()
        peer = tok._py_decode_jsonl(np.asarray(tokens), np.asarray(starts), np.asarray(ends), doc_spans, ids)
        cpu["python jsonl"] += time.process_time() - t
        wall["python jsonl"] += time.perf_counter() - w
        jsonl_mismatches += ours != peer
        n_jsonl += len(peer[0])
        del ours, peer
    print(f"{n_shards} shards, {n_docs:,} documents, {n_tokens:,} tokens, {n_bytes / 1e6:.1f} MB of text; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    for name, seconds in cpu.items():
        if name == "ours jsonl":
            print(f"JSON lines of the same documents, {n_jsonl / 1e6:.1f} MB:")
        print(f"  {name:14s} {seconds:7.2f} CPU-s  {n_bytes / 1e6 / seconds:8.1f} MB/s  "
              f"{n_tokens / 1e6 / seconds:7.1f} M tokens/s per CPU-s   ({wall[name]:.2f} s wall)")
    print(f"ratio ours / sentencepiece: {cpu['sentencepiece'] / cpu['ours']:.1f}x in CPU time, "
          f"{wall['sentencepiece'] / wall['ours']:.1f}x in wall time")
    print(f"ratio ours jsonl / python jsonl: {cpu['python jsonl'] / cpu['ours jsonl']:.1f}x in CPU time, "
          f"{wall['python jsonl'] / wall['ours jsonl']:.1f}x in wall time")
    print(f"documents equal: {mismatches == 0} ({mismatches} differ); "
          f"JSON lines equal: {jsonl_mismatches == 0} ({jsonl_mismatches} shards differ)")
    return 0 if mismatches == 0 and jsonl_mismatches == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
