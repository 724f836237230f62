"""Tests for dpsynth.beam.corpus through the tokenize job (`dpsynth.beam.jobs.tokenize`)."""

import dataclasses
import hashlib
import json
import pathlib
import random
import stat
from collections import Counter

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_jobs import tokenize as tokenize_job
from dpsynth.beam import corpus, inputs
from dpsynth.beam.pipeline import make_pipeline_options
from dpsynth.data import dead_letters, readers, token_shards
from dpsynth.data.text import encode_document
from dpsynth.data.tokenizers import Tokenizer

from .conftest import make_text


def _tree_digest(root: pathlib.Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def _write_public(root: pathlib.Path, seed: int = 1):
    rng = random.Random(seed)
    (root / "books").mkdir(parents=True)
    texts = {}
    for i in range(3):
        texts[f"books/b{i}.txt"] = make_text(rng, 300)
        (root / f"books/b{i}.txt").write_text(texts[f"books/b{i}.txt"], encoding="utf-8")
    rows = [{"text": make_text(rng, 60)} for _ in range(6)] + [{"id": "given-7", "text": make_text(rng, 30)}]
    (root / "web.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    for n, r in enumerate(rows, start=1):
        texts[r.get("id", f"web.jsonl:{n}")] = r["text"]
    return texts


def test_tokenize_roundtrip_ids_and_manifest(tmp_path, tokenizer_path):
    texts = _write_public(tmp_path / "in")
    out = tmp_path / "out"
    manifest = tokenize_job.run(["--input", str(tmp_path / "in"), "--tokenizer", tokenizer_path,
                                 "--out", str(out), "--num-shards", "3"])
    tokenizer = Tokenizer.load(tokenizer_path)
    assert manifest["num_documents"] == len(texts) and manifest["records_in"] == len(texts)
    assert manifest["dead_lettered"] == 0 and manifest["tokenizer_sha256"] == tokenizer.sha256
    got = {}
    for shard in token_shards.iter_shards(str(out)):  # verifies the hashes
        assert all(corpus.shard_of(d["id"], 3) == int(shard.name[-5:]) for d in shard.docs)
        for i, d in enumerate(shard.docs):
            got[d["id"]] = shard.document(i)
    assert sorted(got) == sorted(texts)
    for doc_id, text in texts.items():
        np.testing.assert_array_equal(got[doc_id], tokenizer.encode(text))
    assert manifest["num_tokens"] == sum(len(v) for v in got.values())


def test_tokenize_is_byte_identical_across_reruns_and_runner_modes(tmp_path, tokenizer_path, repo_on_path):
    _write_public(tmp_path / "in", seed=2)
    args = ["--input", str(tmp_path / "in"), "--tokenizer", tokenizer_path, "--num-shards", "4"]
    tokenize_job.run(args + ["--out", str(tmp_path / "a")])
    first = _tree_digest(tmp_path / "a")
    tokenize_job.run(args + ["--out", str(tmp_path / "a")])  # rerun in place
    assert _tree_digest(tmp_path / "a") == first
    tokenize_job.run(args + ["--out", str(tmp_path / "b"), "--direct_running_mode=multi_processing",
                             "--direct_num_workers=2"])
    assert _tree_digest(tmp_path / "b") == first
    # A rerun with fewer shards leaves no stale shard files behind.
    manifest = tokenize_job.run(args[:-1] + ["1", "--out", str(tmp_path / "a")])
    assert sorted(p.name for p in (tmp_path / "a").glob("shard-*")) == [
        f"shard-00000{s}" for s in (".docs.jsonl", ".offsets", ".tokens")]
    assert len(manifest["shards"]) == 1


def test_dead_letters_are_counted_and_written(tmp_path, tokenizer_path):
    lines = [json.dumps({"text": "good food", "label": "great"}).encode(), b'{"text": "\xff", "label": "x"}',
             json.dumps({"text": "", "label": "x"}).encode(), json.dumps({"text": "nul\u0000", "label": "x"}).encode(),
             json.dumps({"text": "no label"}).encode(), json.dumps({"text": "fine too", "label": "other"}).encode()]
    (tmp_path / "s.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    argv = ["--input", str(tmp_path / "s.jsonl"), "--kind", "sensitive", "--tokenizer", tokenizer_path,
            "--out", str(tmp_path / "out")]
    with pytest.raises(dead_letters.TooManyDeadLetters, match=r"s: 4 of 6 records dead-lettered.*at most 3"):
        tokenize_job.run(argv + ["--max-dead-letters", "3"])  # (the default, 1%, refuses too)
    manifest = tokenize_job.run(argv + ["--max-dead-letters", "4"])
    assert manifest["records_in"] == len(lines) == manifest["num_documents"] + manifest["dead_lettered"]
    assert manifest["num_documents"] == 2 and manifest["labels"] == {"great": 1, "other": 1}
    dead = [json.loads(x) for x in (tmp_path / "out" / corpus.DEAD_LETTERS).read_text().splitlines()]
    assert [d["record"] for d in dead] == [2, 3, 4, 5]
    assert all(d["file"].endswith("s.jsonl") for d in dead)
    assert sum(manifest["dead_letter_reasons"].values()) == 4
    # A sensitive token corpus is owner-only: the directory 0700, every file 0600.
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o700
    assert {stat.S_IMODE(f.stat().st_mode) for f in (tmp_path / "out").iterdir()} == {0o600}


def test_the_sensitive_tokenize_command_leaves_only_owner_only_files_run_record_included(tmp_path, tokenizer_path):
    rows = [{"text": "good food here", "label": "great"}, {"text": "cold soup", "label": "bad"}]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "out"
    assert tokenize_job.main(["--input", str(tmp_path / "s.jsonl"), "--kind", "sensitive", "--tokenizer",
                              tokenizer_path, "--out", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o700 and (out / "dpsynth_run.json").exists()
    assert {f.name: stat.S_IMODE(f.stat().st_mode) for f in out.iterdir()} == {f.name: 0o600 for f in out.iterdir()}


def test_read_corpora_ptransform_keys(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "x y"}\n\n{"text": "z"}\n')
    source = inputs.plan_source(str(tmp_path), kind="public", name="c")
    with beam.Pipeline(options=make_pipeline_options()) as p:
        batches = p | corpus.ReadCorpora([source])
        assert_that(batches | beam.FlatMap(lambda nb: [(nb[0], it[0], it[1]) for it in nb[1]]),
                    equal_to([("c", "doc", (0, 1)), ("c", "dead", (0, 2)), ("c", "doc", (0, 3))]))


def test_shard_of_is_stable():
    assert [corpus.shard_of(f"doc-{i}", 7) for i in range(6)] == [
        int.from_bytes(hashlib.blake2b(f"doc-{i}".encode(), digest_size=8).digest(), "little") % 7 for i in range(6)
    ]


def test_unlabeled_sensitive_text(tmp_path, tokenizer_path):
    (tmp_path / "s.jsonl").write_text(json.dumps({"text": "good food", "label": "great"}) + "\n"
                                      + json.dumps({"text": "no label here"}) + "\n")
    manifest = tokenize_job.run(["--input", str(tmp_path / "s.jsonl"), "--kind", "sensitive", "--label-column", "",
                                 "--tokenizer", tokenizer_path, "--out", str(tmp_path / "out")])
    assert manifest["num_documents"] == 2 and "labels" not in manifest
    assert all("label" not in d for s in token_shards.iter_shards(str(tmp_path / "out")) for d in s.docs)


@pytest.mark.slow
def test_one_100mb_document_is_tokenized_in_bounded_chunks(tmp_path, tokenizer_path):
    rng = random.Random(5)
    block = make_text(rng, 2000) + "\n"
    text = block * ((100 << 20) // len(block) + 1)
    (tmp_path / "big.txt").write_text(text)
    manifest = tokenize_job.run(["--input", str(tmp_path / "big.txt"), "--tokenizer", tokenizer_path,
                                 "--out", str(tmp_path / "out")])
    assert manifest["num_documents"] == 1 and manifest["dead_lettered"] == 0
    tokenizer = Tokenizer.load(tokenizer_path)
    (shard,) = list(token_shards.iter_shards(str(tmp_path / "out")))
    np.testing.assert_array_equal(shard.document(0), encode_document(tokenizer, text))


def test_tokenize_corpus_ptransform_reports_counters(tmp_path, tokenizer_path):
    from apache_beam.metrics.metric import MetricsFilter

    texts = _write_public(tmp_path / "in", seed=3)
    (tmp_path / "in" / "bad.jsonl").write_bytes(b"\xff\n")
    tokenizer = Tokenizer.load(tokenizer_path)
    source = inputs.plan_source(str(tmp_path / "in"), kind="public")
    p = beam.Pipeline(options=make_pipeline_options())
    _ = p | corpus.TokenizeCorpus(source, tokenizer_path=tokenizer_path, vocab_size=tokenizer.vocab_size,
                                  tokenizer_sha256=tokenizer.sha256, out_dir=str(tmp_path / "out"), num_shards=2)
    result = p.run()
    result.wait_until_finish()
    counters = {r.key.metric.name: r.committed for r in result.metrics().query(MetricsFilter())["counters"]}
    manifest = token_shards.read_manifest(str(tmp_path / "out"))
    assert counters["documents_tokenized"] == len(texts) == manifest["num_documents"]
    assert counters["dead_letters"] == 1 == manifest["dead_lettered"]
    assert counters["tokens"] == manifest["num_tokens"]
    assert counters["shards_written"] == len(manifest["shards"])
    assert counters["records_read"] == len(texts) and counters["files_read"] == len(source.files)
    assert counters["text_bytes"] == sum(len(t.encode("utf-8")) for t in texts.values())


def test_tokenize_corpora_shares_its_steps_and_writes_what_each_corpus_alone_writes(tmp_path, tokenizer_path):
    _write_public(tmp_path / "pub", seed=4)
    (tmp_path / "s.jsonl").write_text('{"text": "good food", "label": "a"}\n\n{"text": "bad", "label": "b"}\n')
    public = inputs.plan_source(str(tmp_path / "pub"), kind="public")
    sensitive = inputs.plan_source(str(tmp_path / "s.jsonl"), kind="sensitive")
    memory = inputs.CorpusSource("mem", "sensitive", ("memory",), sensitive.columns,
                                 records=({"id": "m1", "text": "good good food", "label": "a"}, {"id": "m2", "text": " "}))
    with beam.Pipeline(options=make_pipeline_options()) as p:  # the read step: every file of every corpus
        read = p | corpus.ReadCorpora([public, sensitive])
        expected = [(src.name, item) for src in (public, sensitive) for item in _reader_items(src)]
        assert_that(read | beam.FlatMap(lambda kv: [(kv[0], item) for item in kv[1]]), equal_to(expected))

    tokenizer = Tokenizer.load(tokenizer_path)
    kw = dict(tokenizer_path=tokenizer_path, vocab_size=tokenizer.vocab_size, tokenizer_sha256=tokenizer.sha256)
    sources = (public, sensitive, memory)
    for src in sources:
        with beam.Pipeline(options=make_pipeline_options()) as p:
            _ = p | corpus.TokenizeCorpus(src, out_dir=str(tmp_path / "alone" / src.name), num_shards=2, **kw)
    outputs = {src.name: corpus.CorpusOutput(str(tmp_path / "shared" / src.name), 2, src.manifest_extra())
               for src in sources}
    p = beam.Pipeline(options=make_pipeline_options())
    manifests = p | corpus.TokenizeCorpora(sources, outputs, **kw)
    assert_that(manifests | beam.Map(lambda kv: kv[0]), equal_to([s.name for s in sources]))
    p.run().wait_until_finish()
    # One set of steps for all corpora: a third file corpus adds no step (Beam's Create has
    # fewer steps for one element than for several, so compare two corpora with three).
    other = dataclasses.replace(sensitive, name="other")
    assert _step_count([public, sensitive, other], kw) == _step_count([public, sensitive], kw)
    for src in sources:
        assert _tree_digest(tmp_path / "shared" / src.name) == _tree_digest(tmp_path / "alone" / src.name), src.name
    assert token_shards.read_manifest(str(tmp_path / "shared" / "mem"))["dead_lettered"] == 1
    assert token_shards.read_manifest(str(tmp_path / "shared" / "s"))["dead_lettered"] == 1
    with pytest.raises(ValueError, match="same, distinct corpora"):
        corpus.TokenizeCorpora(sources, {"pub": outputs["pub"]}, **kw)


@pytest.mark.parametrize("part_bytes", [1, 40, 1 << 30])
def test_read_corpora_reads_big_files_in_parts_with_the_same_items(tmp_path, part_bytes):
    (tmp_path / "a.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "x y"}\n\n{"text": "z", "id": "q"}\n[1]\n{"text": "w"}\n' * 3)
    (tmp_path / "b.csv").write_text("text\nhello\n")  # not a line format: one part
    source = inputs.plan_source(str(tmp_path), kind="public", name="c")
    read = corpus.ReadCorpora([source], part_bytes=part_bytes)
    parts = [e[4] for e in read.files]
    assert parts == ([(0, 1), (0, 1)] if part_bytes > 200 else
                     [(i, -(-source.files[0].size // part_bytes)) for i in range(-(-source.files[0].size // part_bytes))]
                     + [(0, 1)])
    with beam.Pipeline(options=make_pipeline_options()) as p:
        got = p | read | beam.FlatMap(lambda nb: [(nb[0], item) for item in nb[1]])
        assert_that(got, equal_to([("c", item) for item in _reader_items(source)]))


def _step_count(sources, kw):
    """The number of leaf transforms of a TokenizeCorpora pipeline over `sources`."""
    p = beam.Pipeline(options=make_pipeline_options())
    outputs = {s.name: corpus.CorpusOutput("/nonexistent/" + s.name, 2) for s in sources}
    _ = p | corpus.TokenizeCorpora(sources, outputs, **kw)
    leaves = []

    class Visitor(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            leaves.append(node.full_label)

    p.visit(Visitor())
    return len(leaves)


def _reader_items(src):
    """The Items `ReadCorpora` makes of a source's files, read directly."""
    for index, f in enumerate(src.files):
        for n, item in enumerate(readers.iter_file(f, src.columns), start=1):
            yield ("dead", (index, n), item.to_json()) if isinstance(item, readers.DeadLetter) else ("doc", (index, n), item)


def test_batch_items_limits():
    items = [("doc", (0, i), {"text": "x" * 10}) for i in range(10)] + [("dead", (0, 10), {})]
    batches = list(corpus.batch_items(items, max_records=4, max_bytes=1000))
    assert [len(b) for b in batches] == [4, 4, 3] and [it for b in batches for it in b] == items
    assert [len(b) for b in corpus.batch_items(items, max_records=100, max_bytes=25)] == [3, 3, 3, 2]


@pytest.mark.parametrize("vocab_size", [300, 70000])
def test_shard_parts_merge_to_what_write_shard_writes(tmp_path, vocab_size):
    # The shuffle carries a shard's documents as packed parts from any batches, in any order;
    # merged, they must give the bytes write_shard gives for the documents sorted by key.
    rng = np.random.default_rng(3)
    dtype = token_shards.token_dtype(vocab_size)
    docs = []
    for n in range(40):
        key = (int(rng.integers(0, 3)), n + 1)
        meta = {"id": f"d\"{n}\\é\n", **({"label": int(rng.integers(0, 3))} if n % 4 else {})}
        ids = rng.integers(0, vocab_size, size=int(rng.integers(0, 9))).astype(dtype)  # empty documents too
        docs.append((key, meta, ids.tobytes()))
    order = rng.permutation(len(docs))
    cuts = sorted(rng.choice(np.arange(1, len(docs)), size=5, replace=False).tolist())
    parts = [corpus.pack_shard_part([docs[i] for i in chunk]) for chunk in np.split(order, cuts)]
    tokens, offsets, docs_jsonl, labels = corpus.merge_shard_parts(parts[::-1], dtype)
    got = token_shards.write_shard_files(str(tmp_path / "got"), "shard-00000", tokens, offsets, docs_jsonl)
    ref_docs = sorted(docs, key=lambda d: d[0])
    want = token_shards.write_shard(str(tmp_path / "want"), "shard-00000", [np.frombuffer(d[2], dtype) for d in ref_docs],
                                    [d[1] for d in ref_docs], vocab_size)
    assert got == want
    assert _tree_digest(tmp_path / "got") == _tree_digest(tmp_path / "want")
    assert labels == Counter(str(d[1]["label"]) for d in docs if "label" in d[1])


def test_a_record_without_a_string_id_cannot_be_packed():
    with pytest.raises(ValueError, match="record \\(0, 1\\): no string 'id'"):
        corpus.pack_shard_part([((0, 1), {"id": 5}, b"")])


def test_merging_a_part_without_documents_gives_an_empty_shard():
    tokens, offsets, docs_jsonl, labels = corpus.merge_shard_parts([corpus.pack_shard_part([])], np.dtype(np.uint16))
    assert tokens.size == 0 and offsets.tolist() == [0] and docs_jsonl == b"" and not labels
