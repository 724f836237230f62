"""dpsynth.data.dead_letters: limits, summaries (records in = used + dead), owner-only lists, refusal."""

import io
import json
import os
import stat

import pytest

from dpsynth.data import dead_letters
from dpsynth.data.readers import InputError, read_sensitive
from tests.data.bad_inputs import SECRET, bad_csv


def test_parse_limit():
    assert dead_letters.parse_limit("1%").allowed(400) == 4 and dead_letters.parse_limit("1%").allowed(99) == 0
    assert dead_letters.parse_limit("0.5%").allowed(1000) == 5 and dead_letters.parse_limit("7").allowed(3) == 7
    assert dead_letters.parse_limit(2).allowed(10**6) == 2 and str(dead_letters.parse_limit(None)) == "1%"
    for bad in ("-1", "x", "150%", "1.5", -3):
        with pytest.raises(InputError, match="--max-dead-letters"):
            dead_letters.parse_limit(bad)


def test_summary_counts_reasons_and_refuses_past_the_limit(tmp_path):
    ds = read_sensitive(str(bad_csv(tmp_path / "train.csv")))
    s = dead_letters.check(ds, name="D_train", limit="1%")
    assert (s.records_in, s.used, len(s.dead)) == (400, 397, 3) and s.records_in == s.used + len(s.dead)
    kinds = dict(s.reasons)
    assert sum(kinds.values()) == 3 and "empty document" in kinds and any("invalid UTF-8" in k for k in kinds)
    assert any("label" in k and "empty" in k for k in kinds)
    line = s.describe("/x/dead_letters.jsonl")
    assert line.startswith("D_train: 3 of 400 records dead-lettered, 397 used (") and SECRET not in line
    with pytest.raises(dead_letters.TooManyDeadLetters) as e:
        dead_letters.check(ds, name="D_train", limit="2")
    assert "3 of 400" in str(e.value) and "more than --max-dead-letters 2" in str(e.value) and SECRET not in str(e.value)


def test_read_checked_prints_writes_owner_only_then_refuses(tmp_path):
    data = bad_csv(tmp_path / "train.csv")
    out = str(tmp_path / "run.private" / "dead_letters.jsonl")
    err = io.StringIO()
    [ds] = dead_letters.read_checked([("D_train", str(data))], dead_letters.Policy.of("1%", out), stream=err)
    assert len(ds.records) == 397 and SECRET not in err.getvalue() and "3 of 400" in err.getvalue()
    with open(out) as f:
        letters = [json.loads(line) for line in f]
    assert [(d["record"], d["input"]) for d in letters] == [(11, "D_train"), (21, "D_train"), (31, "D_train")]
    assert all(d["file"] == str(data) and d["reason"] for d in letters)
    raw = open(out, "rb").read()
    assert SECRET.encode() not in raw  # never the text
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600 and stat.S_IMODE(os.stat(os.path.dirname(out)).st_mode) == 0o700
    os.remove(out)
    with pytest.raises(dead_letters.TooManyDeadLetters, match="dead_letters.jsonl"):
        dead_letters.read_checked([("D_train", str(data))], dead_letters.Policy.of("0", out), stream=io.StringIO())
    assert os.path.exists(out)  # a refused run still lists what was wrong


def test_clean_input_prints_and_writes_nothing(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"text": "a", "label": "x"}\n')
    err = io.StringIO()
    out = str(tmp_path / "o.private" / "dead_letters.jsonl")
    dead_letters.read_checked([("D", str(tmp_path / "t.jsonl"))], dead_letters.Policy.of("0", out), stream=err)
    assert err.getvalue() == "" and not os.path.exists(out)


def test_default_path_is_a_private_sibling():
    assert dead_letters.default_path("/a/b/out/") == "/a/b/out.private/dead_letters.jsonl"
