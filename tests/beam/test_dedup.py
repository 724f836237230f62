"""Tests for the dedup job (dpsynth.beam.dedup + dpsynth.beam.jobs.dedup) against a brute-force reference.

The reference works on the job's own token corpora: a public position is cut iff it lies in
some k-token window that also occurs inside one sensitive document (the union of all shared
sequences of length >= k, never across document boundaries), and a sensitive example is
contaminated iff one of its k-token windows occurs in a public document.
"""

import csv
import hashlib
import io
import json
import os
import pathlib
import random
import stat

import apache_beam as beam
import numpy as np
import pytest

from beam_jobs import dedup as dedup_job
from dpsynth import outdir
from dpsynth.beam import jobs
from dpsynth.beam.dedup import clean_text
from dpsynth.beam.pipeline import make_pipeline_options
from dpsynth.data import token_shards
from dpsynth.data.text import complement_ranges
from dpsynth.data.tokenizer_training import train_tokenizer
from dpsynth.data.tokenizers import Tokenizer

from .conftest import make_text

K = 12
DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"


def _tree_digest(root: pathlib.Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def reference(public: token_shards.TokenShard, sensitive: token_shards.TokenShard, k: int):
    """(ranges per public doc id, contaminated sensitive ids) by brute force over k-grams."""
    grams: dict[tuple, set] = {}
    for j in range(sensitive.num_documents):
        d = sensitive.document(j).tolist()
        for i in range(len(d) - k + 1):
            grams.setdefault(tuple(d[i:i + k]), set()).add(sensitive.docs[j]["id"])
    ranges, hit = {}, set()
    for j in range(public.num_documents):
        d = public.document(j).tolist()
        covered = np.zeros(len(d), bool)
        for i in range(len(d) - k + 1):
            ids = grams.get(tuple(d[i:i + k]))
            if ids:
                covered[i:i + k] = True
                hit |= ids
        runs, i = [], 0
        while i < len(d):
            if covered[i]:
                e = i
                while e < len(d) and covered[e]:
                    e += 1
                runs.append((i, e))
                i = e
            else:
                i += 1
        ranges[public.docs[j]["id"]] = runs
    return ranges, hit


def longest_shared(public: token_shards.TokenShard, sensitive: token_shards.TokenShard) -> int:
    """The longest token sequence inside one sensitive document that occurs in a public document."""
    pub = [public.document(j).tolist() for j in range(public.num_documents)]
    alive = [sensitive.document(j).tolist() for j in range(sensitive.num_documents)]
    best, length = 0, 1
    while alive:
        grams = {tuple(d[i:i + length]) for d in pub for i in range(len(d) - length + 1)}
        alive = [d for d in alive if any(tuple(d[i:i + length]) in grams for i in range(len(d) - length + 1))]
        if alive:
            best = length
        length += 1
    return best


def _reported_ids(report) -> set:
    found = set()
    for entry in report["sensitive"]:
        for key in ("shared_example_ids",):
            found.update(entry.get(key, []))
    return found


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """Public files with planted sensitive passages (whole reviews, parts, at starts and ends)."""
    rng = random.Random(7)
    root = tmp_path_factory.mktemp("dedup_in")
    sens = [{"id": f"s{i}", "text": make_text(rng, rng.randint(10, 60)), "label": ["great", "other"][i % 2]}
            for i in range(30)]
    (root / "sens").mkdir()
    (root / "sens" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sens[:24]))
    (root / "sens" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sens[24:]))
    (root / "pub").mkdir()
    docs = [make_text(rng, rng.randint(30, 200)) for _ in range(14)]
    docs[0] = sens[3]["text"] + "\n" + docs[0]                       # at a document start
    docs[1] = docs[1] + "\n" + sens[5]["text"]                       # at a document end
    words = sens[8]["text"].split()
    docs[2] = docs[2] + " " + " ".join(words[5:25]) + " " + docs[3]  # a middle part only
    docs[4] = sens[10]["text"]                                       # the whole document
    docs[6] = docs[6] + "\n" + sens[12]["text"] + "\n" + sens[12]["text"]  # twice, touching
    for i in range(4):
        (root / "pub" / f"book{i}.txt").write_text(docs[i])
    (root / "pub" / "web.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[4:]))
    return root


def _run(corpora, tokenizer_path, out, extra=(), test_pipeline=None):
    return dedup_job.run(["--public", str(corpora / "pub"), "--sensitive", f"reviews={corpora / 'sens'}",
                          "--tokenizer", tokenizer_path, "--out", str(out), "--min-tokens", str(K),
                          "--num-shards", "3", *extra], test_pipeline=test_pipeline)


def _private(out: pathlib.Path) -> pathlib.Path:
    """The dedup's default private state: OUT.private beside OUT."""
    return out.parent / (out.name + ".private")


def _check_against_reference(out: pathlib.Path, tokenizer_path: str, report: dict):
    tokenizer = Tokenizer.load(tokenizer_path)
    public = token_shards.read_corpus(str(_private(out) / "tokens" / "public"))
    sensitive = token_shards.read_corpus(str(_private(out) / "tokens" / "sensitive" / "reviews"))
    ranges, hit = reference(public, sensitive, K)
    assert hit, "the planted passages must be found"
    assert _reported_ids(report) == hit
    clean = {}
    for path in sorted((out / "clean").glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            clean[row["id"]] = row["text"]
    for j, doc in enumerate(public.docs):
        expected = clean_text(tokenizer, public.document(j), ranges[doc["id"]])
        if expected.strip():
            assert clean[doc["id"]] == expected, doc["id"]
        else:
            assert doc["id"] not in clean
    removed = sum(b - a for r in ranges.values() for a, b in r)
    assert report["public"]["tokens_removed"] == removed
    assert report["public"]["documents_touched"] == sum(1 for r in ranges.values() if r)
    (entry,) = report["sensitive"]
    assert entry["num_examples"] == sensitive.num_documents
    assert entry["longest_shared_tokens"] == longest_shared(public, sensitive)
    assert token_shards.read_manifest(str(out / "clean_tokens"))["num_tokens"] == public.num_tokens - removed
    kept = token_shards.read_corpus(str(out / "clean_tokens"))
    by_id = {d["id"]: kept.document(i) for i, d in enumerate(kept.docs)}
    for j, doc in enumerate(public.docs):
        pieces = complement_ranges(len(public.document(j)), ranges[doc["id"]])
        want = np.concatenate([public.document(j)[a:b] for a, b in pieces] or [np.zeros(0, np.int64)])
        np.testing.assert_array_equal(by_id.get(doc["id"], np.zeros(0)), want)
    return hit


def test_dedup_matches_brute_force_and_reruns_identically(corpora, tokenizer_path, tmp_path, capsys):
    report = _run(corpora, tokenizer_path, tmp_path / "out")
    hit = _check_against_reference(tmp_path / "out", tokenizer_path, report)
    assert {"s3", "s5", "s10", "s12"} <= hit
    assert "contamination" in capsys.readouterr().out.lower()
    first = _tree_digest(tmp_path / "out")
    made = []  # the test hook: one fresh pipeline per pipeline the job runs (one)

    def factory():
        made.append(beam.Pipeline(options=make_pipeline_options()))
        return made[-1]

    _run(corpora, tokenizer_path, tmp_path / "out", test_pipeline=factory)
    assert _tree_digest(tmp_path / "out") == first
    assert len(made) == 1

    # Already tokenized inputs are accepted and give the same clean corpus and report.
    again = dedup_job.run(["--public", str(_private(tmp_path / "out") / "tokens" / "public"), "--sensitive",
                           f"reviews={_private(tmp_path / 'out') / 'tokens' / 'sensitive' / 'reviews'}",
                           "--tokenizer", tokenizer_path, "--out", str(tmp_path / "pre"), "--min-tokens", str(K)])
    assert again == report
    pre = _tree_digest(tmp_path / "pre")
    assert {k: v for k, v in pre.items() if k.startswith(("clean", "contamination"))} == \
        {k: v for k, v in first.items() if k.startswith(("clean", "contamination"))}


def test_mismatched_tokenizer_is_refused(corpora, tokenizer_path, tmp_path):
    _run(corpora, tokenizer_path, tmp_path / "out")
    other = train_tokenizer([make_text(random.Random(3), 400)], vocab_size=350)
    other.save(str(tmp_path / "other.model"))
    from dpsynth.data.readers import InputError

    with pytest.raises(InputError, match="tokenized with tokenizer"):
        jobs.dedup([str(_private(tmp_path / "out") / "tokens" / "public")], [str(corpora / "sens")],
                   tokenizer_path=str(tmp_path / "other.model"), out_dir=str(tmp_path / "o2"))


def test_dedup_on_a_dask_cluster(corpora, tokenizer_path, tmp_path, repo_on_path):
    distributed = pytest.importorskip("distributed")
    local = _run(corpora, tokenizer_path, tmp_path / "local")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        report = _run(corpora, tokenizer_path, tmp_path / "dask", [f"--runner={DASK_RUNNER}",
                                                  f"--dask_client_address={cluster.scheduler_address}"])
    assert report == local
    assert _tree_digest(tmp_path / "dask") == _tree_digest(tmp_path / "local")


@pytest.mark.parametrize("empty", ["public", "sensitive"])
def test_a_corpus_without_a_valid_document_stops_the_job_before_the_index(corpora, tokenizer_path, tmp_path, empty):
    """The index step finds the empty corpus: nothing after the token corpora is written, and the
    job raises EmptyDatasetError naming the inputs (as it did when the index was built on the driver)."""
    from dpsynth.data.readers import EmptyDatasetError

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "   "}\n{"no_text": 1}\n')
    public = str(bad) if empty == "public" else str(corpora / "pub")
    sensitive = f"reviews={bad}" if empty == "sensitive" else f"reviews={corpora / 'sens'}"
    with pytest.raises(EmptyDatasetError, match=r"bad.jsonl: no valid document \(2 dead-lettered"):
        jobs.dedup([public], [sensitive], tokenizer_path=tokenizer_path, out_dir=str(tmp_path / "out"),
                   min_tokens=K)
    assert not list((tmp_path / "out").iterdir())  # the token corpora are in the private state
    assert (_private(tmp_path / "out") / "tokens" / "public" / "manifest.json").is_file()


def test_clean_texts_equal_sentencepiece_on_each_kept_piece(tokenizer_path):
    """Reference: SentencePiece's own decode of every kept piece (non-empty ones joined by a
    newline); documents without cuts, cut at either end, cut away entirely, and empty."""
    from dpsynth.beam.dedup import clean_texts

    tokenizer = Tokenizer.load(tokenizer_path)
    rng = random.Random(5)
    docs = [tokenizer.encode(make_text(rng, rng.randint(5, 60))) for _ in range(30)] + [np.zeros(0, np.int32)]
    ranges = [[] for _ in docs]
    ranges[1] = [(0, 3)]
    ranges[2] = [(len(docs[2]) - 4, len(docs[2]))]
    ranges[3] = [(1, 2), (4, 7)]
    ranges[4] = [(0, len(docs[4]))]
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    got = clean_texts(tokenizer, np.concatenate(docs).astype(np.uint16), offsets, ranges)
    for doc, cut, text in zip(docs, ranges, got):
        pieces = [tokenizer._sp.decode(doc[a:b].tolist()) for a, b in complement_ranges(len(doc), cut)]
        assert text == "\n".join(p for p in pieces if p)
    assert got[4] == "" and got[-1] == "" and "\n" in got[3]


def test_clean_jsonl_equals_json_lines_of_clean_texts(tokenizer_path, monkeypatch):
    """Reference: `clean_texts` and json.dumps per document whose text is not only whitespace,
    natively and through SentencePiece; random cuts (at either end, adjacent, emptying
    documents), empty documents, whitespace-only pieces, characters JSON escapes, odd ids."""
    from dpsynth.beam.dedup import clean_jsonl, clean_texts, kept_spans
    from dpsynth.data import tokenizers

    tokenizer = Tokenizer.load(tokenizer_path)
    sp, rng = tokenizer._sp, random.Random(9)
    byte = {int(sp.id_to_piece(i)[3:5], 16): i for i in range(tokenizer.vocab_size) if sp.is_byte(i)}
    blanks = [" ", "\u3000", "\xa0", "\u2028", "\x85", "\n\t "]
    odd = ['"', "\\", "\x00", "\x1f", "\x7f", "\U0001f600", "é", 'a"b\\c\r']
    docs, ranges = [], []
    for _ in range(80):
        parts = []
        for _ in range(rng.randint(0, 6)):
            r = rng.random()
            if r < 0.4:
                parts += tokenizer.encode(make_text(rng, rng.randint(1, 6))).tolist()
            else:
                parts += [byte[b] for b in rng.choice(blanks if r < 0.75 else odd).encode()]
        docs.append(np.array(parts, np.int64))
        n, r = len(parts), rng.random()
        points = sorted(rng.choices(range(n + 1), k=2 * rng.randint(1, 4)))  # repeats: adjacent cuts
        ranges.append([] if r < 0.3 or not n else [(0, n)] if r < 0.4 else
                      [(a, b) for a, b in zip(points[::2], points[1::2]) if a < b])
    ids = [rng.choice(["", 'x"\\', "é\U0001f600", "\x00\n", "\u2028"]) + str(j) for j in range(len(docs))]
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    tokens = np.concatenate(docs).astype(np.uint16)

    texts = clean_texts(tokenizer, tokens, offsets, ranges)
    kept = [j for j, text in enumerate(texts) if text.strip()]
    expected = ("".join(json.dumps({"id": ids[j], "text": texts[j]}, ensure_ascii=False, sort_keys=True) + "\n"
                        for j in kept).encode(), len(docs) - len(kept))
    assert any(t and not t.strip() for t in texts) and expected[1] > sum(not t for t in texts) > 0
    assert clean_jsonl(tokenizer, tokens, offsets, ranges, ids) == expected
    starts, ends, doc_spans = kept_spans(offsets, ranges)
    for j, (doc, cut) in enumerate(zip(docs, ranges)):
        span = slice(doc_spans[j], doc_spans[j + 1])
        spans = list(zip(starts[span] - offsets[j], ends[span] - offsets[j]))
        assert spans == (complement_ranges(len(doc), cut) if cut else [(0, len(doc))])
    monkeypatch.setattr(tokenizers, "_native", None)  # SentencePiece decodes, Python writes the lines
    fallback = Tokenizer.load(tokenizer_path)
    assert fallback._pieces is None
    assert clean_jsonl(fallback, tokens, offsets, ranges, ids) == expected


# ----------------------------------------------------------------------------- unread sensitive records (issue 35)


@pytest.fixture
def cp1252_case(tmp_path):
    """The issue's case: a Windows-1252 CSV export (3 of 12 reviews hold a byte that is not UTF-8)
    and one of those reviews planted in the (UTF-8) public corpus."""
    rng = random.Random(11)
    reviews = [make_text(rng, 70) for _ in range(12)]
    for i in (2, 5, 9):
        reviews[i] = reviews[i].replace(" ", " café ", 1)  # é is byte 0xE9 in cp1252: invalid UTF-8
    rows = io.StringIO()
    csv.writer(rows).writerows([["id", "text", "label"]] + [[f"r{i}", t, i % 2] for i, t in enumerate(reviews)])
    (tmp_path / "sens.csv").write_bytes(rows.getvalue().encode("cp1252"))
    (tmp_path / "pub").mkdir()
    public = [make_text(rng, 120) for _ in range(5)]
    public[1] += "\n" + reviews[5]  # the planted review
    (tmp_path / "pub" / "web.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in public),
                                                encoding="utf-8")
    return tmp_path


def _unread_argv(case, tokenizer_path, out, *extra):
    return ["--public", str(case / "pub"), "--sensitive", f"reviews={case / 'sens.csv'}", "--tokenizer",
            tokenizer_path, "--out", str(out), "--min-tokens", str(K), "--max-dead-letters", "50%", *extra]


def _clean_text(out: pathlib.Path) -> str:
    return "".join(p.read_text(encoding="utf-8") for p in sorted((out / "clean").glob("*.jsonl")))


def test_an_unread_sensitive_record_is_refused_one_line(cp1252_case, tokenizer_path, capsys):
    out = cp1252_case / "out"
    assert dedup_job.main(_unread_argv(cp1252_case, tokenizer_path, out)) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and err[0].startswith("dpsynth dedup: error: sensitive 'reviews': 3 of 12 records")
    assert "record 3: invalid UTF-8" in err[0] and "--encoding" in err[0] and "--allow-unread-sensitive" in err[0]
    assert not out.exists() or outdir.without_run_files(os.listdir(out)) == []  # nothing cut, no report, no tokens


def test_allow_unread_sensitive_lists_the_records_not_protected(cp1252_case, tokenizer_path, capsys):
    out = cp1252_case / "out"
    report = dedup_job.run(_unread_argv(cp1252_case, tokenizer_path, out, "--allow-unread-sensitive"))
    (entry,) = report["sensitive"]
    assert entry["num_examples"] == 9 and entry["num_unread"] == 3
    assert [(pathlib.Path(r["file"]).name, r["record"]) for r in entry["unread_records"]] == \
        [("sens.csv", 3), ("sens.csv", 6), ("sens.csv", 10)]
    assert json.loads((out / "contamination.json").read_text()) == report
    headline = capsys.readouterr().out.split("Contamination report", 1)[1].splitlines()[0]
    assert "3 sensitive records could NOT be read and are NOT protected" in headline
    assert report["public"]["tokens_removed"] == 0 and "café" in _clean_text(out)  # the planted review stays


def test_the_right_encoding_reads_every_record_and_cuts_the_planted_review(cp1252_case, tokenizer_path):
    out = cp1252_case / "out"
    report = dedup_job.run(_unread_argv(cp1252_case, tokenizer_path, out, "--encoding", "cp1252"))
    (entry,) = report["sensitive"]
    assert entry["num_examples"] == 12 and entry["num_unread"] == 0 and "unread_records" not in entry
    assert entry["shared_example_ids"] == ["r5"] and "café" not in _clean_text(out)


def test_sensitive_material_is_owner_only_state_outside_out(cp1252_case, tokenizer_path):
    out, state = cp1252_case / "out", cp1252_case / "state"
    dedup_job.run(_unread_argv(cp1252_case, tokenizer_path, out, "--encoding", "cp1252", "--state-dir", str(state)))
    assert sorted(p.name for p in out.iterdir()) == ["clean", "clean_tokens", "contamination.json"]
    assert (state / "index").is_file() and (state / "tokens" / "sensitive" / "reviews" / "manifest.json").is_file()
    assert (state / "tokens" / "public" / "manifest.json").is_file()
    for p in [state, *state.rglob("*")]:
        assert stat.S_IMODE(p.stat().st_mode) == (0o700 if p.is_dir() else 0o600), p
    with pytest.raises(ValueError, match="inside the released directory"):
        dedup_job.run(_unread_argv(cp1252_case, tokenizer_path, out, "--state-dir", str(out / "private")))


def test_max_dead_letters_refuses_the_public_corpus_too(cp1252_case, tokenizer_path):
    from dpsynth.data.dead_letters import TooManyDeadLetters

    with (cp1252_case / "pub" / "web.jsonl").open("a") as f:
        f.write("not json\n")
    with pytest.raises(TooManyDeadLetters, match=r"public corpus: 1 of 6 records dead-lettered"):
        jobs.dedup([str(cp1252_case / "pub")], [f"reviews={cp1252_case / 'sens.csv'}"], tokenizer_path=tokenizer_path,
                   out_dir=str(cp1252_case / "out"), min_tokens=K, encoding="cp1252")


@pytest.mark.parametrize("flag, value", [("--min-tokens", "0"), ("--threads", "-2")])
def test_a_bad_cut_setting_is_one_line_before_anything_is_written(tmp_path, capsys, flag, value):
    from beam_jobs.dedup import main

    out = tmp_path / "out"
    rc = main(["--public", str(tmp_path), "--sensitive", f"d={tmp_path}", "--tokenizer", "t.model", "--out", str(out),
               flag, value])
    err = capsys.readouterr().err
    assert rc == 2 and f"{flag[2:].replace('-', '_')}: must be an integer >= 1" in err and "Traceback" not in err
    assert not out.exists()


# ----------------------------------------------------------------------------- what OUT may hold (publishable)


def _planted(case: pathlib.Path) -> str:
    """The review the `cp1252_case` planted in its public corpus (r5 of its sensitive CSV)."""
    rows = list(csv.DictReader(io.StringIO((case / "sens.csv").read_bytes().decode("cp1252"))))
    (text,) = [r["text"] for r in rows if r["id"] == "r5"]
    return text


def _everything_in(out: pathlib.Path, tokenizer_path: str) -> list[str]:
    """Every file under `out` as text, and every token corpus under it decoded document by document."""
    tokenizer = Tokenizer.load(tokenizer_path)
    texts = [p.read_bytes().decode("utf-8", "replace") for p in sorted(out.rglob("*")) if p.is_file()]
    for manifest in sorted(out.rglob(token_shards.MANIFEST)):
        if json.loads(manifest.read_text()).get("format") == "dpsynth.tokens":
            corpus = token_shards.read_corpus(str(manifest.parent))
            texts += [tokenizer.decode(corpus.document(j)) for j in range(corpus.num_documents)]
    return texts


def test_out_holds_only_the_declared_publishable_layout_and_no_planted_review(cp1252_case, tokenizer_path):
    """The planted review is cut, and nothing in OUT (a file's bytes, a token corpus decoded)
    holds 20 consecutive words of it: every word is at least one token, so such a run would be a
    shared sequence of >= 20 > K tokens, which the cut removes. The uncleaned public corpus,
    which holds it, is private state, as `PRIVATE` declares."""
    from dpsynth.beam import dedup as bdedup

    out = cp1252_case / "out"
    assert dedup_job.main(_unread_argv(cp1252_case, tokenizer_path, out, "--encoding", "cp1252")) == 0
    assert set(outdir.without_run_files(os.listdir(out))) == bdedup.publishable_names() \
        == {"clean", "clean_tokens", "contamination.json"}
    words = _planted(cp1252_case).split()
    windows = [" ".join(words[i:i + 20]) for i in range(len(words) - 19)]
    assert len(words) >= 40 and windows
    texts = _everything_in(out, tokenizer_path)
    assert not [w for w in windows if any(w in t for t in texts)]
    private = _everything_in(_private(out) / "tokens" / "public", tokenizer_path)
    assert all(any(w in t for t in private) for w in windows)  # (the check can see it where it is)
    assert "tokens/public/" in dict(bdedup.PRIVATE)


def test_an_older_layouts_public_tokens_in_out_are_removed_and_a_public_token_corpus_in_out_is_refused(
        cp1252_case, tokenizer_path, caplog):
    """A rerun into an OUT where an older dpsynth left `tokens/public/` removes it (the tokens are
    made again in the private state) and writes the same OUT otherwise; `--public OUT/...` (a token
    corpus inside OUT) is one line, before anything is written."""
    import shutil

    from dpsynth.data.readers import InputError

    out = cp1252_case / "out"
    argv = _unread_argv(cp1252_case, tokenizer_path, out, "--encoding", "cp1252")
    dedup_job.run(argv)
    first = _tree_digest(out)
    shutil.copytree(_private(out) / "tokens" / "public", out / "tokens" / "public")  # the old layout
    with caplog.at_level("WARNING", logger="dpsynth"):
        dedup_job.run(argv)
    assert _tree_digest(out) == first and not (out / "tokens").exists()
    assert any("older dpsynth" in r.getMessage() for r in caplog.records)
    shutil.copytree(_private(out) / "tokens" / "public", out / "tokens" / "public")
    given = ["--public", str(out / "tokens" / "public")] + argv[2:]
    with pytest.raises(InputError, match=r"the public token corpus lies inside --out .* may be published"):
        dedup_job.run(given)
    assert (out / "tokens" / "public" / "manifest.json").is_file()  # refused: nothing of the user's is touched


def test_the_help_and_formats_md_quote_the_declared_layout():
    """`dpsynth dedup --help` prints `layout_text()` as it is, and docs/formats.md quotes it (in
    its "Dedup output" item, indented two spaces)."""
    import textwrap

    from dpsynth.beam import dedup as bdedup

    layout = bdedup.layout_text()
    assert layout in dedup_job.build_parser().format_help()
    formats = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text(encoding="utf-8")
    assert textwrap.indent(layout, "  ") in formats
    for path, _ in bdedup.PUBLISHABLE:
        assert f"OUT/{path}" in layout
    for path, _ in bdedup.PRIVATE:
        assert f"STATE/{path}" in layout and f"OUT/{path}" not in layout
