"""Tests for dpsynth.data.readers: formats, stable ids, fatal errors and dead letters."""

import csv
import gzip
import io
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpsynth.data import readers
from dpsynth.data.readers import Columns, DeadLetter, EmptyDatasetError, InputError


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_formats_give_the_same_records(tmp_path):
    rows = [{"text": f"review number {i}, with \"quotes\",\nand a newline", "label": ["pos", "neg"][i % 2]} for i in range(7)]
    _jsonl(tmp_path / "d.jsonl", rows)
    with open(tmp_path / "d.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, ["label", "text"])
        w.writeheader()
        w.writerows(rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet", row_group_size=3)
    with gzip.open(tmp_path / "z.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with gzip.open(tmp_path / "c.csv.gz", "wt", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, ["text", "label"])
        w.writeheader()
        w.writerows(rows)
    (tmp_path / "b.jsonl").write_bytes(b"\xef\xbb\xbf" + (tmp_path / "d.jsonl").read_bytes())  # with a BOM
    got = {}
    for name in ("d.jsonl", "d.csv", "d.parquet", "z.jsonl.gz", "c.csv.gz", "b.jsonl"):
        ds = readers.read_sensitive(str(tmp_path / name))
        assert not ds.dead_letters
        got[name] = [(r["text"], r["label"]) for r in ds.records]
        stem = name.split(".")[0]
        assert [r["id"] for r in ds.records] == [f"{name}:{i + 1}" for i in range(7)], stem
    expected = [(r["text"], r["label"]) for r in rows]
    assert all(v == expected for v in got.values())


def test_custom_columns_and_given_ids(tmp_path):
    _jsonl(tmp_path / "d.jsonl", [{"review": "good food", "score": 5, "id": "r7"}, {"review": "bad", "score": 1.0}])
    ds = readers.read_sensitive(str(tmp_path / "d.jsonl"), text_column="review", label_column="score")
    assert [(r["id"], r["label"]) for r in ds.records] == [("r7", "5"), ("d.jsonl:2", "1")]


def test_directory_and_glob_resolve_stably(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "b" / "c.txt").write_text("gamma")
    (tmp_path / ".hidden.txt").write_text("skip me")
    ds = readers.read_public(str(tmp_path))
    assert [(r["id"], r["text"]) for r in ds.records] == [("a.txt", "alpha"), ("b/c.txt", "gamma")]
    files = readers.resolve_inputs(str(tmp_path / "**" / "*.txt"))
    assert [f.relpath for f in files] == ["b/c.txt"]  # `**/` needs at least one folder
    assert [f.relpath for f in readers.resolve_inputs(str(tmp_path / "*.txt"))] == ["a.txt"]


def test_fatal_errors_name_the_file(tmp_path):
    with pytest.raises(InputError, match="nothing matches"):
        readers.resolve_inputs(str(tmp_path / "missing.jsonl"))
    (tmp_path / "x.docx").write_text("?")
    with pytest.raises(InputError, match=r"x\.docx: unknown file type '\.docx'"):
        readers.resolve_inputs(str(tmp_path / "x.docx"))
    with open(tmp_path / "d.csv", "w") as f:
        f.write("text,stars\nhello,5\n")
    with pytest.raises(InputError, match=r"d\.csv: missing column\(s\) \['label'\].*--label-column"):
        readers.read_sensitive(str(tmp_path / "d.csv"))
    pq.write_table(pa.Table.from_pylist([{"body": "x", "label": "a"}]), tmp_path / "d.parquet")
    with pytest.raises(InputError, match=r"d\.parquet: missing column\(s\) \['text'\]"):
        readers.read_sensitive(str(tmp_path / "d.parquet"))
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(EmptyDatasetError, match="e.jsonl: no valid record"):
        readers.read_public(str(tmp_path / "e.jsonl"))
    (tmp_path / "t.txt").write_text("text")
    with pytest.raises(InputError, match="has no label"):
        readers.read_sensitive(str(tmp_path / "t.txt"))


def test_bad_records_are_dead_lettered_and_counted(tmp_path):
    lines = [
        json.dumps({"text": "fine one", "label": "a"}).encode(),
        b'{"text": "bad \xff utf8", "label": "a"}',
        json.dumps({"text": "   ", "label": "a"}).encode(),
        json.dumps({"text": "nul\u0000inside", "label": "a"}).encode(),
        b"{not json",
        b"[1, 2]",
        json.dumps({"label": "a"}).encode(),
        json.dumps({"text": "no label"}).encode(),
        json.dumps({"text": 5, "label": "a"}).encode(),
        b"",
        json.dumps({"text": "x" * 200, "label": "a"}).encode(),
        json.dumps({"text": "fine two", "label": "b"}).encode(),
    ]
    (tmp_path / "d.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    ds = readers.read_sensitive(str(tmp_path / "d.jsonl"), max_document_bytes=100)
    assert ds.records_in == len(lines) == len(ds.records) + len(ds.dead_letters)
    assert [r["text"] for r in ds.records] == ["fine one", "fine two"]
    reasons = {d.record: d.reason for d in ds.dead_letters}
    assert reasons[2].startswith("invalid UTF-8")
    assert reasons[3] == "empty document"
    assert reasons[4].startswith("NUL byte")
    assert reasons[5].startswith("invalid JSON")
    assert reasons[6].startswith("not a JSON object")
    assert reasons[7] == "no 'text' field"
    assert "label" in reasons[8]
    assert "not a string" in reasons[9]
    assert reasons[10] == "empty line"
    assert "exceeds max_document_bytes=100" in reasons[11]
    assert all(d.file.endswith("d.jsonl") for d in ds.dead_letters)
    # Dead letters never carry text.
    assert "fine" not in json.dumps([d.to_json() for d in ds.dead_letters])


def test_csv_bad_rows(tmp_path):
    (tmp_path / "d.csv").write_bytes(b"text,label\nok text,a\nbad \xfe bytes,a\nonly-one-field\n,a\nlast,b\n")
    ds = readers.read_sensitive(str(tmp_path / "d.csv"))
    assert [r["id"] for r in ds.records] == ["d.csv:1", "d.csv:5"]
    assert [(d.record, d.reason.split(" ")[0]) for d in ds.dead_letters] == [(2, "invalid"), (3, "row"), (4, "empty")]


def test_tsv_reads_the_same_records_and_dead_letters_as_the_same_table_in_csv(tmp_path):
    rows = [["text", "label", "id"], ["a text, with a comma", "pos", "r1"], ["tab\tinside quotes", "neg", "r2"],
            ["x", "pos"], ["", "neg", "r4"], ["last", "neg", "r5"]]
    for name, delimiter in (("d.csv", ","), ("d.tsv", "\t"), ("e.tab", "\t")):
        with open(tmp_path / name, "w", newline="", encoding="utf-8") as f:
            csv.writer(f, delimiter=delimiter).writerows(rows)
    got = {name: readers.read_sensitive(str(tmp_path / name)) for name in ("d.csv", "d.tsv", "e.tab")}
    assert [r["text"] for r in got["d.csv"].records] == ["a text, with a comma", "tab\tinside quotes", "last"]
    for name in ("d.tsv", "e.tab"):
        assert [f.format for f in readers.resolve_inputs(str(tmp_path / name))] == ["tsv"]
        assert got[name].records == got["d.csv"].records
        assert [(d.record, d.reason) for d in got[name].dead_letters] == \
            [(d.record, d.reason) for d in got["d.csv"].dead_letters]
    (tmp_path / "empty.tsv").write_bytes(b"")
    with pytest.raises(InputError, match="empty TSV file"):
        readers.read_sensitive(str(tmp_path / "empty.tsv"))
    (tmp_path / "cols.tsv").write_text("body\tlabel\nx\ty\n", encoding="utf-8")
    with pytest.raises(InputError, match="missing column"):
        readers.read_sensitive(str(tmp_path / "cols.tsv"))


def test_every_format_is_one_registry_entry_that_the_other_layers_read():
    from dpsynth.experiment import config as experiment_config

    assert readers.FORMATS == tuple(readers.REGISTRY)
    assert experiment_config.FORMATS == ("auto",) + readers.LABELED_FORMATS  # the experiment's choices
    assert "tsv" in readers.LABELED_FORMATS and "txt" not in readers.LABELED_FORMATS
    for name, fmt in readers.REGISTRY.items():
        for suffix in fmt.suffixes:
            assert readers.file_format("x" + suffix + ".gz") == name


def test_txt_invalid_utf8_and_100mb_document(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"abc\xc3(")
    (tmp_path / "big.txt").write_bytes(b"word " * (20 << 20))  # one 100 MiB document
    files = {f.relpath: f for f in readers.resolve_inputs(str(tmp_path))}
    (bad,) = readers.iter_file(files["bad.txt"], Columns.public())
    assert isinstance(bad, DeadLetter) and bad.reason == "invalid UTF-8 at byte 3"
    (big,) = readers.iter_file(files["big.txt"], Columns.public())
    assert big["id"] == "big.txt" and len(big["text"]) == 100 << 20
    (rejected,) = readers.iter_file(files["big.txt"], Columns.public(), max_document_bytes=10 << 20)
    assert isinstance(rejected, DeadLetter)
    assert rejected.reason == f"document of {100 << 20} bytes exceeds max_document_bytes={10 << 20}"


def test_duplicate_relative_names_are_refused(tmp_path):
    for d in ("x", "y"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "train.jsonl").write_text('{"text": "t"}\n')
    with pytest.raises(InputError, match="ids would collide"):
        readers.resolve_inputs([str(tmp_path / "x"), str(tmp_path / "y")])


def test_label_text_lines_like_sst2(tmp_path):
    path = tmp_path / "stsa.binary.train"
    path.write_bytes(b"1 a stirring , funny film\n0 apparently reassembled .\nnospace\n\n1 \xff bad\n0 ok  two  spaces\n")
    with pytest.raises(InputError, match="unknown file type '.train'"):
        readers.read_sensitive(str(path))
    ds = readers.read_sensitive(str(path), format="label_text")
    assert [(r["id"], r["label"], r["text"]) for r in ds.records] == [
        ("stsa.binary.train:1", "1", "a stirring , funny film"), ("stsa.binary.train:2", "0", "apparently reassembled ."),
        ("stsa.binary.train:6", "0", "ok  two  spaces")]
    assert [(d.record, d.reason.split(" (")[0]) for d in ds.dead_letters] == [
        (3, "no space between label and text"), (4, "empty line"), (5, "invalid UTF-8 at byte 2 of the line")]
    with pytest.raises(InputError, match="unknown format 'sst'"):
        readers.read_sensitive(str(path), format="sst")
    with pytest.raises(InputError, match="label_text is for labeled datasets"):
        list(readers.iter_file(
            readers.resolve_inputs(str(path), "label_text")[0], Columns.public()))


def test_extra_columns_are_carried_as_strings(tmp_path):
    with open(tmp_path / "s.csv", "w", newline="") as f:
        csv.writer(f).writerows([["split", "label", "text"], ["dev", "0", "bad food ."], ["test", "1", "great !"]])
    ds = readers.read_sensitive(str(tmp_path / "s.csv"), extra_columns=["split"])
    assert [(r["split"], r["label"]) for r in ds.records] == [("dev", "0"), ("test", "1")]
    assert "split" not in readers.read_sensitive(str(tmp_path / "s.csv")).records[0]


def test_public_gz_jsonl_glob_dead_letters_nul_and_counts(tmp_path):
    # The layout of ../shared/data/public/{opinrank,enwiki}: gzip JSON lines {"id", "text"}.
    for name, rows in (("opinrank-00", [{"id": "hotels/a:0", "text": "Nice hotel.\nGood stay."},
                                        {"id": "hotels/a:1", "text": "bad\x00byte"}]),
                       ("opinrank-01", [{"id": "cars/b:0", "text": "A fine car."}]),
                       ("enwiki-00", [{"id": "enwiki:12", "text": "Anarchism\nA philosophy."}])):
        with gzip.open(tmp_path / f"{name}.jsonl.gz", "wt", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    ds = readers.read_public([str(tmp_path / "opinrank-*.jsonl.gz"), str(tmp_path / "enwiki-*.jsonl.gz")])
    assert [r["id"] for r in ds.records] == ["hotels/a:0", "cars/b:0", "enwiki:12"]
    assert ds.records_in == 4 and len(ds.dead_letters) == 1
    dead = ds.dead_letters[0]
    assert dead.file.endswith("opinrank-00.jsonl.gz") and dead.record == 2 and dead.reason.startswith("NUL byte")
    assert "bad" not in json.dumps(dead.to_json())  # never the text


def repeated_user_rows(n_users=5, seed=0):
    """A small labeled data set with repeated users: user i wrote i + 1 reviews (ids as ints in Parquet/JSONL)."""
    import random

    rng = random.Random(seed)
    rows = [{"text": f"review {j} by person {u}", "label": rng.choice(["pos", "neg"]), "author": u}
            for u in range(n_users) for j in range(u + 1)]
    rng.shuffle(rows)
    return rows


def test_user_column_in_every_format(tmp_path):
    rows = repeated_user_rows()
    _jsonl(tmp_path / "u.jsonl", rows)
    with open(tmp_path / "u.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, ["author", "text", "label"])
        w.writeheader()
        w.writerows(rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "u.parquet")
    for name in ("u.jsonl", "u.csv", "u.parquet"):
        ds = readers.read_sensitive(str(tmp_path / name), user_column="author")
        assert not ds.dead_letters
        assert [(r["text"], r["user"]) for r in ds.records] == [(r["text"], str(r["author"])) for r in rows], name
        counts = {}
        for r in ds.records:
            counts[r["user"]] = counts.get(r["user"], 0) + 1
        assert counts == {str(u): u + 1 for u in range(5)}
    assert "user" not in readers.read_sensitive(str(tmp_path / "u.csv")).records[0]  # only when asked


def test_missing_user_column_is_fatal_and_names_the_file(tmp_path):
    rows = [{"text": "a review", "label": "pos"}, {"text": "another", "label": "neg"}]
    _jsonl(tmp_path / "n.jsonl", rows)
    with open(tmp_path / "n.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, ["text", "label"])
        w.writeheader()
        w.writerows(rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "n.parquet")
    for name in ("n.jsonl", "n.csv", "n.parquet"):
        with pytest.raises(InputError, match=rf"{name}.*author.*--user-column"):
            readers.read_sensitive(str(tmp_path / name), user_column="author")
    # A single record without a user is dead-lettered (the file has the column elsewhere).
    _jsonl(tmp_path / "m.jsonl", [{"text": "x", "label": "pos", "author": "a"}, {"text": "y", "label": "pos"},
                                  {"text": "z", "label": "pos", "author": ""}])
    ds = readers.read_sensitive(str(tmp_path / "m.jsonl"), user_column="author")
    assert [r["user"] for r in ds.records] == ["a"]
    assert [(d.record, "user column" in d.reason) for d in ds.dead_letters] == [(2, True), (3, True)]


def test_iter_file_parts_partition_the_lines(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"text": "x"}\n\n{"text": "z", "id": "q"}\n[1]\n{"text": "w"}\n{"text": 3}\n')
    (f,) = readers.resolve_inputs(str(path))
    cols = Columns.public()
    whole = [_norm(x) for x in readers.iter_file(f, cols)]
    for k in (1, 2, 4, 9):
        got = {}
        for i in range(k):
            for j, item in enumerate(readers.iter_file(f, cols, part=(i, k))):
                got[i + 1 + j * k] = _norm(item)
        assert [got[n] for n in sorted(got)] == whole and sorted(got) == list(range(1, len(whole) + 1))
    with pytest.raises(ValueError, match="cannot read part"):
        readers.iter_file(f, Columns(text="text", label="label", user="user"), part=(0, 2))
    (tmp_path / "b.csv").write_text("text\nx\n")
    with pytest.raises(ValueError, match="cannot read part"):
        readers.iter_file(readers.resolve_inputs(str(tmp_path / "b.csv"))[0], cols, part=(1, 2))


def _norm(item):
    return ("dead", item.record, item.reason) if isinstance(item, DeadLetter) else ("doc", item)


@pytest.mark.parametrize("case", ["multi_member", "zero_padding", "bad_crc", "truncated", "trailing_garbage"])
def test_gzip_streams_read_as_pythons_gzip_reads_them(tmp_path, case):
    # .gz goes through ISA-L; every record Python's gzip yields is yielded, and every stream
    # Python's gzip rejects is an InputError naming the file.
    rows = [{"text": f"line {i} " + "words " * (i % 7)} for i in range(3000)]
    data = gzip.compress("".join(json.dumps(r) + "\n" for r in rows[:2000]).encode("utf-8"))
    data = {
        "multi_member": data + gzip.compress("".join(json.dumps(r) + "\n" for r in rows[2000:]).encode("utf-8")),
        "zero_padding": data + bytes(64),
        "bad_crc": data[:-8] + bytes(4) + data[-4:],
        "truncated": data[: len(data) // 2],
        "trailing_garbage": data + b"not gzip",
    }[case]
    path = tmp_path / "p.jsonl.gz"
    path.write_bytes(data)
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
            want = [json.loads(line)["text"] for line in f]
    except (OSError, EOFError):
        want = None
    if want is None:
        with pytest.raises(readers.InputError, match=f"{path}: truncated or corrupt compressed file"):
            readers.read_public(str(path))
    else:
        assert [r["text"] for r in readers.read_public(str(path)).records] == want


def test_text_checks_match_their_plain_definitions():
    # utf8_size skips encoding ASCII texts; the empty check avoids copying: both must agree
    # with the plain expressions on every kind of text, whitespace of every kind included.
    spaces = [chr(c) for c in range(0x3100) if chr(c).isspace()]
    rng = random.Random(0)
    alphabet = spaces + ["a", "é", "\U0001F600", "\x00", "\u200b", "\ufeff"]
    texts = ["", " ", "\u3000", "abc", "\ud800"] + ["".join(rng.choices(alphabet, k=rng.randint(1, 6))) for _ in range(3000)]
    texts += ["".join(rng.choices(spaces, k=rng.randint(1, 4))) for _ in range(500)]
    for t in texts:
        try:
            want = len(t.encode("utf-8"))
        except UnicodeEncodeError:
            with pytest.raises(UnicodeEncodeError):
                readers.utf8_size(t)
            continue
        assert readers.utf8_size(t) == want
        assert (readers.check_text(t, "text", 10**6) == "empty document") == (not t.strip()), repr(t)
