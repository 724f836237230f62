"""PTransforms of the dedup job: cut every >= k-token overlap with sensitive data per public shard.

The job is one pipeline (`DedupCorpora`): it takes the token manifests of every corpus (the
public corpus first tokenized in the same pipeline, or read), builds the sensitive index
(`dpsynth.dedup.index.SensitiveIndex`) in one step and saves it as one file (any Beam
filesystem); each worker loads it and suffix-sorts it once, then runs
`dpsynth.dedup.match.dedup_shard` on one public shard per element (matched against that one
sorted sensitive set). Each DoFn writes its own outputs atomically:

```
STATE/tokens/public/, STATE/tokens/sensitive/NAME/         the token corpora (written before this; private)
STATE/index                                                the sensitive index (SensitiveIndex.save; private)
OUT/clean_tokens/shard-NNNNN.{tokens,offsets,docs.jsonl}   cleaned token shards (+ manifest.json)
OUT/clean/shard-NNNNN.jsonl                                {"id", "text"} per document with kept text
```

What may be published and what never is: `PUBLISHABLE` and `PRIVATE`, the one declaration
behind `layout_text()`, which `dpsynth dedup --help` prints and docs/formats.md quotes.

Nothing is cut (no index, no clean corpus, no report) when a corpus is empty, has more dead
letters than `--max-dead-letters` allows, or when a sensitive record could not be read
(unless `allow_unread_sensitive`, and the report then lists the unread records as not
protected): `check_inputs` decides, in the index step and again on the driver, which raises.

The clean text of a document is its kept token pieces (the complement of the cut ranges),
each decoded on its own and joined with a newline. Documents whose clean text is empty or only
whitespace (cut away entirely, say) are left out of the JSONL (and counted); the JSONL is
written in one native pass where the tokenizer allows (`clean_jsonl`). The last step writes
the manifests and `contamination.json`. When a corpus has no document, nothing after the token
corpora is written (the job then raises `EmptyDatasetError` naming it, from the manifests).
"""

from __future__ import annotations

import logging
import textwrap
import time
from collections.abc import Sequence

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from dpsynth import fileio, outdir
from dpsynth.beam.corpus import remove_stale_shards
from dpsynth.beam.corpus import dead_letter_summary
from dpsynth.data import dead_letters, readers, token_shards
from dpsynth.data.text import complement_ranges
from dpsynth.data.tokenizers import Tokenizer
from dpsynth.dedup import DEFAULT_MIN_TOKENS

logger = logging.getLogger("dpsynth")
NAMESPACE = "dpsynth"
CLEAN_TOKENS = "clean_tokens"
CLEAN_TEXT = "clean"
CONTAMINATION = "contamination.json"
INDEX_FILE = "index"
PUBLIC = "public"  # the public corpus's name among the token corpora
TOKENS_DIR = "tokens"  # STATE/tokens/public, STATE/tokens/sensitive/NAME: the token corpora (private)
PLAN = "plan"  # the index step's status element

# The dedup's output layout: (path, what it holds). OUT (`--out`) holds PUBLISHABLE and nothing
# else of the dedup's (besides the run record, `dpsynth.outdir`); everything PRIVATE lives in
# STATE (`--state-dir`, default OUT.private beside OUT), which is never published. The public
# corpus's own tokens are PRIVATE: they are the corpus BEFORE the cut, so they decode to every
# sensitive overlap the cut removed.
PUBLISHABLE = (
    (CLEAN_TEXT + "/", 'the public corpus after the cut: {"id", "text"} per document with kept text (the kept '
                       "pieces joined by a newline)"),
    (CLEAN_TOKENS + "/", "the same documents as a token corpus (shards and manifest.json)"),
    (CONTAMINATION, "the contamination report: counts, and the ids (never the text) of the sensitive examples "
                    "found"),
)
PRIVATE = (
    (f"{TOKENS_DIR}/{PUBLIC}/", "the public corpus BEFORE the cut as tokens, with its dead letters: it decodes to "
                                "every sensitive overlap the cut removed"),
    (f"{TOKENS_DIR}/sensitive/NAME/", "each sensitive dataset as tokens (they decode to its raw records), with its "
                                      "dead letters"),
    (INDEX_FILE, "the sensitive suffix-array index"),
)


def publishable_names() -> set[str]:
    """The top-level names of OUT that the dedup writes (`PUBLISHABLE`)."""
    return {path.split("/")[0] for path, _ in PUBLISHABLE}


def layout_text(width: int = 92) -> str:
    """`PUBLISHABLE` and `PRIVATE` as plain text (`dpsynth dedup --help`; docs/formats.md quotes it)."""
    col = max(len(f"  STATE/{path}") for path, _ in PUBLISHABLE + PRIVATE) + 2

    def entries(rows, root):
        return [textwrap.fill(what, width, initial_indent=f"  {root}{path}".ljust(col),
                              subsequent_indent=" " * col, break_on_hyphens=False) for path, what in rows]

    return "\n".join(
        [f"What may be published: OUT (--out) holds this and the run record {outdir.RUN_FILE} (flag digests):"]
        + entries(PUBLISHABLE, "OUT/")
        + ["Never published: STATE (--state-dir, default OUT.private beside OUT; 0700, files 0600):"]
        + entries(PRIVATE, "STATE/"))


class UnreadSensitiveError(readers.InputError):
    """A sensitive record could not be read: the dedup cannot cut a public copy of it."""


def check_inputs(manifests: dict[str, dict], token_dirs: dict[str, str], *, limit=None,
                 allow_unread_sensitive: bool = False) -> dict[str, list[dict]]:
    """The unread (dead-lettered) records of every sensitive corpus, `{name: [{"file", "record"}]}`,
    after checking that the dedup may go on with them.

    Raises:
      dead_letters.TooManyDeadLetters: a corpus (public or sensitive) has more dead letters than
        `limit` (`--max-dead-letters`) allows.
      UnreadSensitiveError: a sensitive record was dead-lettered and not `allow_unread_sensitive`.
    """
    summaries = {name: dead_letter_summary(token_dirs[name], m, "public corpus" if name == PUBLIC else
                                           f"sensitive {name!r}", limit) for name, m in manifests.items()}
    for name in sorted(summaries, key=lambda n: (n != PUBLIC, n)):
        dead_letters.enforce([summaries[name]], FileSystems.join(token_dirs[name], "dead_letters.jsonl"))
    unread = {name: [{"file": d.file, "record": d.record} for d in s.dead]
              for name, s in summaries.items() if name != PUBLIC}
    bad = [name for name, rows in sorted(unread.items()) if rows]
    if bad and not allow_unread_sensitive:
        first = summaries[bad[0]].dead[0]
        decoding = any("invalid " in reason for name in bad for reason, _ in summaries[name].reasons)
        raise UnreadSensitiveError(
            "; ".join(summaries[n].describe(FileSystems.join(token_dirs[n], "dead_letters.jsonl")) for n in bad)
            + f" (first: {first.file} record {first.record}: {first.reason}). "
            "The dedup cannot cut a public copy of a record it could not read: fix the input"
            + (" (its --encoding, e.g. cp1252?)" if decoding else "")
            + ", or pass --allow-unread-sensitive (the report then lists them as not protected)")
    return unread


def clean_text(tokenizer, document, ranges) -> str:
    """The kept pieces of one tokenized document, decoded one by one and joined by newlines."""
    document = np.asarray(document)
    return clean_texts(tokenizer, document, np.array([0, document.size]), [ranges])[0]


def clean_texts(tokenizer, tokens, offsets, ranges) -> list[str]:
    """`clean_text` of every document of a shard (`tokens`, `offsets`): the documents without
    cuts (nearly all) in one batched decode, the kept pieces of the others in another."""
    texts = tokenizer.decode_spans(tokens, offsets[:-1], offsets[1:])
    touched = [j for j, cut in enumerate(ranges) if cut]
    starts, ends, owner = [], [], []
    for j in touched:
        start = int(offsets[j])
        for a, b in complement_ranges(int(offsets[j + 1]) - start, ranges[j]):
            starts.append(start + a)
            ends.append(start + b)
            owner.append(j)
    kept: dict[int, list[str]] = {j: [] for j in touched}
    for j, text in zip(owner, tokenizer.decode_spans(tokens, starts, ends) if starts else []):
        if text:
            kept[j].append(text)
    for j, pieces in kept.items():
        texts[j] = "\n".join(pieces)
    return texts


def kept_spans(offsets, ranges) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, ends, doc_spans): the kept pieces of every document of a shard as token spans,
    document j's being spans `doc_spans[j]:doc_spans[j + 1]` (`Tokenizer.decode_jsonl`'s layout).
    A document without cuts is one span; only the touched ones are looked at one by one."""
    offsets = np.asarray(offsets, dtype=np.int64)
    counts = np.ones(offsets.size - 1, np.int64)
    touched = {j: complement_ranges(int(offsets[j + 1] - offsets[j]), cut) for j, cut in enumerate(ranges) if cut}
    for j, pieces in touched.items():
        counts[j] = len(pieces)
    doc_spans = np.zeros(counts.size + 1, np.int64)
    np.cumsum(counts, out=doc_spans[1:])
    starts, ends = np.repeat(offsets[:-1], counts), np.repeat(offsets[1:], counts)
    for j, pieces in touched.items():
        if pieces:
            span = slice(doc_spans[j], doc_spans[j + 1])
            starts[span] = offsets[j] + np.array([a for a, _ in pieces])
            ends[span] = offsets[j] + np.array([b for _, b in pieces])
    return starts, ends, doc_spans


def clean_jsonl(tokenizer, tokens, offsets, ranges, ids) -> tuple[bytes, int]:
    """The clean JSONL file of a shard and the number of documents left out: a line
    `{"id": ids[j], "text": clean_texts(...)[j]}` (`json.dumps(..., ensure_ascii=False,
    sort_keys=True)`) per document whose clean text is not empty or whitespace, in order."""
    return tokenizer.decode_jsonl(tokens, *kept_spans(offsets, ranges), ids)


class _DedupShardFn(beam.DoFn):
    """Manifest entry of a public shard -> ("shard", name, {entry, stats, counts}); writes outputs."""

    def __init__(self, public_dir: str, dtype: str, index_path: str, tokenizer_path: str,
                 out_dir: str, vocab_size: int, min_tokens: int, threads: int):
        self.public_dir, self.dtype, self.index_path = public_dir, dtype, index_path
        self.tokenizer_path, self.out_dir, self.vocab_size = tokenizer_path, out_dir, vocab_size
        self.min_tokens, self.threads = min_tokens, threads
        self.index = self.tokenizer = None
        self.c_docs = Metrics.counter(NAMESPACE, "public_documents")
        self.c_touched = Metrics.counter(NAMESPACE, "public_documents_touched")
        self.c_tokens = Metrics.counter(NAMESPACE, "public_tokens")
        self.c_removed = Metrics.counter(NAMESPACE, "public_tokens_removed")
        self.c_shards = Metrics.counter(NAMESPACE, "public_shards_deduped")

    def _load(self):
        # On first use, not in setup(): the index is written by an earlier step of the same pipeline.
        from dpsynth.dedup.index import SensitiveIndex

        self.index = SensitiveIndex.load(self.index_path)  # any Beam filesystem
        self.index.sorted_suffixes(self.threads)  # the sensitive suffix array, once per worker
        self.tokenizer = Tokenizer.load(self.tokenizer_path)

    def process(self, entry):
        from dpsynth.dedup.match import dedup_shard

        if self.index is None:
            self._load()
        start = time.monotonic()
        shard = token_shards.read_shard(self.public_dir, entry, self.dtype)
        result = dedup_shard(self.index, shard, min_tokens=self.min_tokens, threads=self.threads)
        cleaned, clean_dir = result.cleaned, FileSystems.join(self.out_dir, CLEAN_TOKENS)
        if result.stats.tokens_removed:
            clean_entry = token_shards.write_shard(clean_dir, shard.name,
                                                   [cleaned.document(i) for i in range(cleaned.num_documents)],
                                                   cleaned.docs, self.vocab_size)
        else:  # nothing cut: write_shard would write the same bytes
            clean_entry = token_shards.copy_shard(self.public_dir, clean_dir, entry)
        data, emptied = clean_jsonl(self.tokenizer, shard.tokens, shard.offsets, result.ranges,
                                    [doc["id"] for doc in shard.docs])
        touched = sum(1 for ranges in result.ranges if ranges)
        removed = sum(b - a for ranges in result.ranges for a, b in ranges)
        fileio.write_bytes_fs(FileSystems.join(self.out_dir, CLEAN_TEXT, shard.name + ".jsonl"), data)
        self.c_docs.inc(shard.num_documents)
        self.c_touched.inc(touched)
        self.c_tokens.inc(shard.num_tokens)
        self.c_removed.inc(removed)
        self.c_shards.inc()
        elapsed = time.monotonic() - start
        logger.info("dedup: %s done: %d documents, %d tokens, %d removed from %d documents; %.3g tokens/s",
                    shard.name, shard.num_documents, shard.num_tokens, removed, touched,
                    shard.num_tokens / max(elapsed, 1e-9))
        counts = {"documents": shard.num_documents, "documents_touched": touched, "tokens": shard.num_tokens,
                  "tokens_removed": removed, "jsonl_documents": shard.num_documents - emptied,
                  "documents_emptied": emptied}
        yield ("shard", shard.name, {"entry": clean_entry, "stats": result.stats, "counts": counts})


class DedupShards(beam.PTransform):
    """Runs `dedup_shard` on every public shard and writes the cleaned shards and JSONL text."""

    def __init__(self, *, public_dir: str, dtype: str, index_path: str, tokenizer_path: str,
                 out_dir: str, vocab_size: int, min_tokens: int = DEFAULT_MIN_TOKENS, threads: int = 1):
        super().__init__()
        self.fn = _DedupShardFn(public_dir, dtype, index_path, tokenizer_path, out_dir, vocab_size, min_tokens, threads)

    def expand(self, entries):
        """PCollection[shard manifest entry] -> PCollection[("shard", name, {entry, stats, counts})]."""
        return entries | "SpreadShards" >> beam.Reshuffle() | "CutOverlaps" >> beam.ParDo(self.fn)


class _FinishFn(beam.DoFn):
    """(None, [plan status and shard results]) -> report dict; writes the clean manifest and
    contamination.json (nothing when the plan step found an empty corpus)."""

    def __init__(self, out_dir: str, index_path: str, public_dir: str, vocab_size: int, tokenizer_sha256: str,
                 min_tokens: int, token_dirs: dict[str, str], checks: dict):
        self.out_dir, self.index_path, self.public_dir = out_dir, index_path, public_dir
        self.vocab_size, self.tokenizer_sha256, self.min_tokens = vocab_size, tokenizer_sha256, min_tokens
        self.token_dirs, self.checks = token_dirs, checks

    def process(self, element):
        if any(r[0] == PLAN and r[1] for r in element[1]):  # else an empty corpus: the job raises
            yield self._write(element[1])

    def _write(self, elements) -> dict:
        from dpsynth.dedup import report as dedup_report
        from dpsynth.dedup.index import SensitiveIndex

        results = sorted((r for r in elements if r[0] == "shard"), key=lambda r: r[1])
        counts: dict[str, int] = {}
        for _, _, r in results:
            for k, v in r["counts"].items():
                counts[k] = counts.get(k, 0) + v
        index = SensitiveIndex.load(self.index_path)
        manifests = {name: token_shards.read_manifest(d) for name, d in self.token_dirs.items()}
        unread = check_inputs(manifests, self.token_dirs, **self.checks)  # (passed in the index step)
        rep = dedup_report.build_report(index, [r[2]["stats"] for r in results], self.min_tokens, unread=unread)
        names = {r[1] for r in results}
        for sub in (CLEAN_TOKENS, CLEAN_TEXT):
            remove_stale_shards(FileSystems.join(self.out_dir, sub), names)
        public_manifest = token_shards.sha256_file(FileSystems.join(self.public_dir, token_shards.MANIFEST))
        token_shards.write_manifest(
            FileSystems.join(self.out_dir, CLEAN_TOKENS), name="clean", shards=[r[2]["entry"] for r in results],
            vocab_size=self.vocab_size, tokenizer_sha256=self.tokenizer_sha256,
            extra={"kind": "public", "min_tokens": self.min_tokens, "contamination_sha256": rep["report_sha256"],
                   "jsonl_documents": counts.get("jsonl_documents", 0), "public_manifest_sha256": public_manifest},
        )
        data = fileio.dumps_json(rep).encode("utf-8")
        fileio.write_bytes_fs(FileSystems.join(self.out_dir, CONTAMINATION), data)
        return rep


class WriteDedupReport(beam.PTransform):
    """The last step of the dedup job: gathers the plan status and every shard result, writes the reports."""

    def __init__(self, **kwargs):
        super().__init__()
        self.fn = _FinishFn(**kwargs)

    def expand(self, results):
        """PCollection[(PLAN, ok, None) (one) and ("shard", name, result)] -> PCollection[report dict] (one, or
        none after an empty corpus)."""
        return (
            results
            | "KeyAll" >> beam.Map(lambda x: (None, x))
            | "GatherShardResults" >> beam.GroupByKey()
            | "WriteReports" >> beam.ParDo(self.fn)
        )


class _IndexFn(beam.DoFn):
    """(None, [(corpus name, manifest)]) -> (PLAN, ok, None) once, then ("entry", public shard
    entry, None) per public shard; writes the sensitive index first (when every corpus has a
    document)."""

    def __init__(self, sensitive: Sequence[str], token_dirs: dict[str, str], index_path: str, checks: dict):
        self.sensitive, self.token_dirs, self.index_path = list(sensitive), dict(token_dirs), index_path
        self.checks = checks  # check_inputs' keyword arguments

    def process(self, element):
        from dpsynth.dedup.index import SensitiveIndex

        manifests = dict(element[1])
        if set(manifests) != set(self.token_dirs):
            raise ValueError(f"manifests of {sorted(manifests)}, expected {sorted(self.token_dirs)}")
        empty = sorted(name for name, m in manifests.items() if m["num_documents"] == 0)
        refused = None
        if empty:
            logger.warning("dedup: no valid document in %s; nothing is cut", ", ".join(empty))
        else:
            try:
                check_inputs(manifests, self.token_dirs, **self.checks)
            except readers.InputError as e:  # the driver raises it again, from the same manifests
                refused = e
        if refused is not None:
            logger.debug("dedup: nothing is cut (the job raises it): %s", refused)
        elif not empty:
            index = SensitiveIndex.build([(name, token_shards.read_corpus(self.token_dirs[name]))
                                         for name in self.sensitive])
            index.save(self.index_path)
        ok = not empty and refused is None
        yield PLAN, ok, None
        for entry in manifests[PUBLIC]["shards"] if ok else []:
            yield "entry", entry, None


class DedupCorpora(beam.PTransform):
    """The dedup after tokenizing: the sensitive index (one step), every public shard cut in
    parallel (`DedupShards`), then the report (`WriteDedupReport`).

    Args:
      token_dirs: corpus name -> its token corpus directory; "public" is the public corpus,
        every other name a sensitive dataset (indexed in the order given).
      out_dir: the job's output directory (clean corpus, report).
      state_dir: the job's private state (the sensitive index; default `out_dir`, for tests).
      max_dead_letters, allow_unread_sensitive: what `check_inputs` tolerates.
    """

    def __init__(self, *, token_dirs: dict[str, str], dtype: str, tokenizer_path: str, out_dir: str,
                 vocab_size: int, tokenizer_sha256: str, min_tokens: int = DEFAULT_MIN_TOKENS, threads: int = 1,
                 state_dir: str | None = None, max_dead_letters=None, allow_unread_sensitive: bool = False):
        super().__init__()
        if PUBLIC not in token_dirs or len(token_dirs) < 2:
            raise ValueError(f"DedupCorpora needs the {PUBLIC!r} corpus and at least one sensitive one")
        index_path = FileSystems.join(state_dir or out_dir, INDEX_FILE)
        checks = {"limit": dead_letters.parse_limit(max_dead_letters), "allow_unread_sensitive": allow_unread_sensitive}
        self.index_fn = _IndexFn([n for n in token_dirs if n != PUBLIC], token_dirs, index_path, checks)
        self.shards = DedupShards(public_dir=token_dirs[PUBLIC], dtype=dtype, index_path=index_path,
                                  tokenizer_path=tokenizer_path, out_dir=out_dir, vocab_size=vocab_size,
                                  min_tokens=min_tokens, threads=threads)
        self.report = WriteDedupReport(out_dir=out_dir, index_path=index_path, public_dir=token_dirs[PUBLIC],
                                       vocab_size=vocab_size, tokenizer_sha256=tokenizer_sha256,
                                       min_tokens=min_tokens, token_dirs=dict(token_dirs), checks=checks)

    def expand(self, manifests):
        """PCollection[(corpus name, token manifest)] (one per corpus) -> PCollection[report dict]."""
        plan = (
            manifests
            | "KeyManifests" >> beam.Map(lambda kv: (None, kv))
            | "GatherManifests" >> beam.GroupByKey()
            | "BuildIndex" >> beam.ParDo(self.index_fn)
        )
        results = (
            plan
            | "PublicShards" >> beam.FlatMap(lambda x: [x[1]] if x[0] == "entry" else [])
            | "Dedup" >> self.shards
        )
        status = plan | "PlanStatus" >> beam.Filter(lambda x: x[0] == PLAN)
        return (results, status) | "MergeResults" >> beam.Flatten() | "Report" >> self.report
