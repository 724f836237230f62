"""A bad-input suite over the CLI entries that read data (issue 23, finding 9).

Each malformed input (`tests.data.bad_inputs.CASES`: CSV with a BOM, CRLF, quoted newlines, an
unterminated quote, a duplicate or missing header, extra columns, NUL bytes; JSONL with broken
and non-object lines, numeric vs string labels; Parquet with wrong column types; truncated gzip;
empty files; a directory with mixed file types) is given to every entry point. Each gets either
a one-line error naming the file and the reason, or counted dead letters; never a traceback,
never a silent drop (the readers' counts are checked exactly). Labels unseen at training time
are checked for generate and evaluate (and dp-tune's validation set).
"""

import json
import os
import traceback

import pytest

from tests.data.bad_inputs import CASES, write_case
from tests.train.conftest import tiny_base  # noqa: F401 (fixture)

ENTRIES = ("dp-tune", "classify", "evaluate", "generate", "tokenize", "dedup", "audit", "experiment")


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory):
    """A generator model directory (manifest, config, privacy report) tuned on labels no case file uses."""
    from tests.generate.fakes import write_fake_model_dir

    return write_fake_model_dir(str(tmp_path_factory.mktemp("model")), labels=("alpha", "beta"))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from dpsynth.data.tokenizer_training import train_tokenizer

    path = str(tmp_path_factory.mktemp("tok") / "tok.model")
    texts = [f"review {i} text great other line one two alpha beta" for i in range(300)]
    train_tokenizer(texts, vocab_size=300).save(path)
    return path


def _run(entry, data, tmp, fake_model, tokenizer, capsys, encoding=None, out_name="out"):
    """Runs `dpsynth ENTRY` in-process on `data`, set up to stop right after reading it; returns (rc, stderr+stdout).

    `encoding`: the entry's `--encoding` (the experiment's `sensitive.encoding`); `out_name`: the --out
    under `tmp` (a run with other flags needs its own: an --out belongs to one run, `dpsynth.outdir`).

    An exception escaping `main` is a traceback the user would see: the test fails with it.
    """
    out = str(tmp / out_name)
    clean = tmp / "clean.csv"
    clean.write_text("text,label\na b,great\nc d,other\n")
    if entry == "dp-tune":
        from trainers.dp_tune import main
        args = ["--base", str(tmp / "no_base"), "--train", data, "--out", out, "--batch-size", "1", "--steps", "1",
                "--max-dead-letters", "0"]
    elif entry == "classify":
        from trainers.classify import main
        args = ["--train", data, "--valid", data, "--test", data, "--out", out, "--classifier", "backbone",
                "--max-dead-letters", "0"]
    elif entry == "evaluate":
        from beam_jobs.metrics import main
        (tmp / "no_corpora").mkdir(exist_ok=True)
        args = ["--synthetic-root", str(tmp / "no_corpora"), "--real-train", data, "--real-test", data, "--out", out,
                "--classifiers", "none", "--max-dead-letters", "0"]
    elif entry == "generate":
        from beam_jobs.generate import main
        args = ["--model", fake_model, "--num-examples", "2", "--out", out, "--label-distribution", "dp-histogram",
                "--label-source", data, "--label-noise-multiplier", "1", "--max-dead-letters", "0"]
    elif entry == "tokenize":
        from beam_jobs.tokenize import main
        args = ["--input", data, "--kind", "sensitive", "--tokenizer", tokenizer, "--out", out,
                "--max-dead-letters", "0"]
    elif entry == "dedup":
        from beam_jobs.dedup import main
        args = ["--public", str(clean), "--sensitive", f"d={data}", "--tokenizer", tokenizer, "--out", out,
                "--min-tokens", "3", "--max-dead-letters", "0"]
    elif entry == "audit":  # stops at the missing corpus, after reading D_train and D_test
        from trainers.audit import main
        args = ["--corpus", str(tmp / "no_corpus"), "--train", data, "--test", str(clean), "--out", out,
                "--max-dead-letters", "0"]
    elif entry == "experiment":
        from dpsynth.experiment.runner import main
        config = tmp / "exp.yaml"
        sensitive = {"embedded": False, "train": data, "valid": str(clean), "test": str(clean), "max_dead_letters": "0"}
        config.write_text(json.dumps({"out": out, "sensitive": {**sensitive, **({"encoding": encoding} if encoding else {})},
                                      "public": {"embedded": False, "paths": [str(clean)]}}))
        args = [str(config), "--until", "sensitive"]
    if encoding and entry != "experiment":
        args += ["--encoding", encoding]
    capsys.readouterr()
    try:
        rc = main(args)
    except SystemExit as e:  # argparse
        rc = e.code
    except BaseException:
        pytest.fail(f"dpsynth {entry}: traceback on {data}:\n{traceback.format_exc()}")
    captured = capsys.readouterr()
    return rc, captured.err + captured.out


@pytest.mark.parametrize("case", sorted(CASES))
def test_readers_count_exactly(case, tmp_path):
    """Below every entry point: each case is read into exactly the expected records and dead letters."""
    from dpsynth.data.readers import InputError, read_sensitive

    path, expected = write_case(tmp_path, case)
    if expected[0] == "error":
        with pytest.raises(InputError) as e:
            read_sensitive(path)
        msg = str(e.value)
        assert expected[1] in msg and os.path.basename(path) in msg and "\n" not in msg
        return
    ds = read_sensitive(path)
    assert (len(ds.records), len(ds.dead_letters)) == expected[1:]
    assert ds.records_in == len(ds.records) + len(ds.dead_letters)
    assert all(d.file.endswith(os.path.basename(path)) and d.record >= 1 and d.reason for d in ds.dead_letters)


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_entry_gives_one_line_or_counted_dead_letters(entry, case, tmp_path, fake_model, tokenizer, capsys):
    path, expected = write_case(tmp_path, case)
    rc, out = _run(entry, path, tmp_path, fake_model, tokenizer, capsys)
    assert "Traceback" not in out, out
    name = os.path.basename(path)
    if expected[0] == "error":
        assert rc not in (0, None), out
        errors = [line for line in out.splitlines() if "error" in line.lower() or "failed" in line.lower()]
        assert errors and any(expected[1] in line and name in line for line in errors), out
        return
    used, dead = expected[1:]
    if dead:  # --max-dead-letters 0: refused, with the count and the reasons
        assert rc not in (0, None) and f"{dead} of {used + dead} records dead-lettered, {used} used" in out, out
        assert "more than --max-dead-letters 0" in out
    if dead and entry in ("tokenize", "dedup"):  # the Beam jobs list them and count them in the token manifest
        tokens = (tmp_path / "out") if entry == "tokenize" else (tmp_path / "out.private" / "tokens" / "sensitive" / "d")
        manifest = json.loads((tokens / "manifest.json").read_text())
        assert (manifest["dead_lettered"], manifest["records_in"]) == (dead, used + dead)
        assert len((tokens / "dead_letters.jsonl").read_text().splitlines()) == dead
    if dead and entry == "dedup":  # nothing cut, nothing publishable written
        assert not (tmp_path / "out" / "clean").exists() and not (tmp_path / "out" / "contamination.json").exists()
    if not dead:
        assert "records dead-lettered" not in out  # read whole: the entry went on (and stopped later, on purpose)


# ----------------------------------------------------------------------------- labels unseen at training time


def _labeled(path, labels):
    path.write_text("".join(json.dumps({"text": f"text number {i}", "label": l}) + "\n" for i, l in enumerate(labels)))
    return str(path)


def test_generate_label_source_with_a_label_the_model_was_not_tuned_on(tmp_path, fake_model, capsys):
    from beam_jobs.generate import main

    data = _labeled(tmp_path / "train.jsonl", ["alpha", "beta", "alpha", "gamma", "gamma"])
    rc = main(["--model", fake_model, "--num-examples", "2", "--out", str(tmp_path / "out"), "--label-distribution",
               "dp-histogram", "--label-source", data, "--label-noise-multiplier", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "train.jsonl:4" in err and "'gamma'" in err and "2 records" in err and not (tmp_path / "out").exists()
    # --labels naming a label the model does not know: the same, before anything is read.
    rc = main(["--model", fake_model, "--num-examples", "2", "--out", str(tmp_path / "out"), "--labels", "alpha,gamma"])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown label(s) ['gamma']" in err and len(err.strip().splitlines()) == 1


def test_evaluate_with_labels_unseen_in_training(tmp_path, capsys):
    from beam_jobs import metrics

    train = _labeled(tmp_path / "train.jsonl", ["a", "b"] * 10)
    test = _labeled(tmp_path / "test.jsonl", ["a", "b", "c"])
    syn = tmp_path / "syn"
    syn.mkdir()
    _labeled(syn / "train.jsonl", ["a", "b"] * 5)
    _labeled(syn / "valid.jsonl", ["a", "b"])
    rc = metrics.main(["--synthetic", str(syn), "--real-train", train, "--real-test", test, "--out", str(tmp_path / "o"),
                       "--classifiers", "none"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("dpsynth evaluate: error:") and "'c'" in line and "real test" in line, err


def test_classify_with_labels_unseen_in_training(tmp_path, capsys):
    from trainers import classify

    train = _labeled(tmp_path / "train.jsonl", ["a", "b"] * 10)
    test = _labeled(tmp_path / "test.jsonl", ["a", "b", "c"])
    rc = classify.main(["--train", train, "--valid", train, "--test", test, "--out", str(tmp_path / "m.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and "'c'" in err.strip().splitlines()[-1], err


def test_dp_tune_validation_label_unseen_in_training(tmp_path, capsys, tiny_base):  # noqa: F811
    from trainers import dp_tune

    train = _labeled(tmp_path / "train.jsonl", ["great", "other"] * 10)
    valid = _labeled(tmp_path / "valid.jsonl", ["great", "awful"])
    rc = dp_tune.main(["--base", tiny_base[0], "--train", train, "--valid", valid, "--out", str(tmp_path / "o"),
                       "--batch-size", "2", "--steps", "1", "--max-tokens", "32"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "valid.jsonl:2" in err and "awful" in err  # the file and the record
    assert "record 2 (id" in err  # counted from 1, as the dead-letter files count


# ----------------------------------------------------------------------------- lines of hundreds of MB


@pytest.mark.slow  # writes and reads a 300 MB line per format (about 1.5 GB of memory at the peak)
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_line_of_hundreds_of_megabytes_is_a_counted_dead_letter(fmt, tmp_path, capsys, tiny_base):  # noqa: F811
    from dpsynth.data.readers import DEFAULT_MAX_DOCUMENT_BYTES, read_sensitive
    from trainers import dp_tune

    size = 300 << 20
    assert size > DEFAULT_MAX_DOCUMENT_BYTES
    path = tmp_path / f"big.{fmt}"
    with open(path, "wb") as f:
        f.write(b"text,label\n" if fmt == "csv" else b"")
        for i in range(5):
            f.write(b"small %d,great\n" % i if fmt == "csv" else b'{"text": "small %d", "label": "great"}\n' % i)
        chunk = b"word " * (1 << 20)
        f.write(b'{"text": "' if fmt == "jsonl" else b"")
        for _ in range(size // len(chunk)):
            f.write(chunk)
        f.write(b'", "label": "other"}\n' if fmt == "jsonl" else b",other\n")
    ds = read_sensitive(str(path))
    assert len(ds.records) == 5 and len(ds.dead_letters) == 1 and ds.records_in == 6
    assert "exceeds max_document_bytes" in ds.dead_letters[0].reason and ds.dead_letters[0].record == 6
    del ds
    rc = dp_tune.main(["--base", tiny_base[0], "--train", str(path), "--out", str(tmp_path / "o"), "--batch-size", "2",
                       "--steps", "1", "--max-dead-letters", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and "1 of 6 records dead-lettered, 5 used" in err and "Traceback" not in err
    assert "word word" not in err


# ----------------------------------------------------------------------------- issue 35: encodings, delta, small cases


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_entry_reads_a_cp1252_export_whole_with_its_encoding(entry, tmp_path, fake_model, tokenizer, capsys):
    """The same `--encoding cp1252` (the experiment's `sensitive.encoding`) fixes the export for every stage."""
    path, _ = write_case(tmp_path, "csv_cp1252")
    rc, out = _run(entry, path, tmp_path, fake_model, tokenizer, capsys, encoding="cp1252")
    assert "Traceback" not in out and "records dead-lettered" not in out and "invalid" not in out, out
    rc, out = _run(entry, path, tmp_path, fake_model, tokenizer, capsys, encoding="utf-16", out_name="out16")
    assert rc == 2 and "'utf-16' is not ASCII-compatible" in out, out
    rc, out = _run(entry, path, tmp_path, fake_model, tokenizer, capsys, encoding="no-such-codec",
                   out_name="out_bad")
    assert rc == 2 and "unknown text encoding 'no-such-codec'" in out, out


def _dp_tune(tmp_path, capsys, *argv, labels=("great", "other") * 10):
    from trainers import dp_tune

    train = _labeled(tmp_path / "train.jsonl", list(labels))
    capsys.readouterr()
    rc = dp_tune.main(["--base", str(tmp_path / "no_base"), "--train", train, "--out", str(tmp_path / "o"),
                       "--batch-size", "2", "--steps", "1", "--max-tokens", "32", *argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


def test_dp_tune_refuses_a_delta_above_one_over_n_before_any_compute(tmp_path, capsys):
    rc, err = _dp_tune(tmp_path, capsys, "--delta", "0.5")
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "delta 0.5 is above 1/N = 1/20 examples" in err and "--allow-large-delta" in err
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.private" / "checkpoints").exists()
    # Allowed, the run goes on (to the missing base model here: past the plan, nothing spent yet).
    rc, err = _dp_tune(tmp_path, capsys, "--delta", "0.5", "--allow-large-delta")
    assert rc == 2 and "above 1/N" not in err and "no_base/manifest.json: missing" in err, err


@pytest.mark.slow  # one DP step of the tiny model (~30 CPU-s); the headline itself: tests/dp/test_report.py
def test_dp_tune_with_allow_large_delta_says_weak_delta_in_the_report_headline(tmp_path, capsys, tiny_base):  # noqa: F811
    from dpsynth.dp import report

    train = _labeled(tmp_path / "train.jsonl", ["great", "other"] * 10)
    from trainers import dp_tune

    rc = dp_tune.main(["--base", tiny_base[0], "--train", train, "--out", str(tmp_path / "o"), "--batch-size", "2",
                       "--steps", "1", "--max-tokens", "32", "--delta", "0.5", "--allow-large-delta", "--seed", "1"])
    err = capsys.readouterr().err
    assert rc == 0 and "WEAK DELTA: delta 0.5 is above 1/N = 1/20 examples" in err, err
    headline = (tmp_path / "o" / report.REPORT_MD).read_text().splitlines()[2]
    assert headline.startswith("**DIFFERENTIALLY PRIVATE**") and "WEAK DELTA: delta 0.5 is above 1/N = 1/20" in headline


def test_dp_tune_refuses_a_single_label_training_set_before_any_budget(tmp_path, capsys):
    rc, err = _dp_tune(tmp_path, capsys, labels=["great"] * 20)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "single label ('great' in all 20 records)" in err and not (tmp_path / "o").exists()


def test_dp_tune_epsilon_that_is_not_a_number(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        _dp_tune(tmp_path, capsys, "--epsilon", "abc")
    err = capsys.readouterr().err
    assert e.value.code == 2 and "argument --epsilon: expected a number or 'inf', got 'abc'" in err
    assert "_float_or_inf" not in err


def test_generate_max_len_zero_is_refused(tmp_path, fake_model, capsys):
    from beam_jobs.generate import main

    rc = main(["--model", fake_model, "--num-examples", "2", "--out", str(tmp_path / "out"), "--max-len", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and "--max-len must be >= 2 tokens" in err and len(err.strip().splitlines()) == 1, err


def test_generate_label_histogram_refuses_a_delta_above_one_over_n(tmp_path, fake_model, capsys):
    from beam_jobs.generate import main

    data = _labeled(tmp_path / "train.jsonl", ["alpha", "beta"] * 5)
    argv = ["--model", fake_model, "--num-examples", "2", "--out", str(tmp_path / "out"), "--label-distribution",
            "dp-histogram", "--label-source", data, "--label-epsilon", "1", "--label-delta", "0.5"]
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists(), err
    assert "--label-delta: delta 0.5 is above 1/N = 1/10 examples" in err
