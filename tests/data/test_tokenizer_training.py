"""Tests for dpsynth.data.tokenizer_training and the `dpsynth tokenizer train` entry point."""

import json

import pytest

from dpsynth import cli
from dpsynth import tokens as tok
from dpsynth.data import readers


def test_cli_trains_on_public_files(tmp_path, capsys):
    words = "river stone cloud field bird morning light window garden".split()
    (tmp_path / "pub").mkdir()
    for i in range(3):
        (tmp_path / "pub" / f"{i}.txt").write_text("\n".join(" ".join(words[(i + j) % 9:] + words[:(i + j) % 9]) for j in range(50)))
    (tmp_path / "pub" / "more.jsonl").write_text(json.dumps({"text": "river bird Morning"}) + "\n")
    out = tmp_path / "tok.model"
    assert cli.main(["tokenizer", "train", "--corpus", str(tmp_path / "pub"), "--vocab-size", "300", "--out", str(out)]) == 0
    t = tok.Tokenizer.load(str(out))
    assert 260 < t.vocab_size <= 300 and t.decode(t.encode("garden window")) == "garden window"
    assert f"{t.vocab_size} pieces from 4 public files" in capsys.readouterr().out


def test_empty_corpus_is_a_clear_error(tmp_path, capsys):
    from dpsynth.data.tokenizer_training import train_public_tokenizer

    (tmp_path / "e.jsonl").write_text(json.dumps({"text": "   "}) + "\n")
    with pytest.raises(readers.InputError, match="e.jsonl"):
        train_public_tokenizer([str(tmp_path / "e.jsonl")], vocab_size=300, out=str(tmp_path / "t.model"))
    # The command: that error as one line, exit status 2 (dpsynth.errors).
    assert cli.main(["tokenizer", "train", "--corpus", str(tmp_path / "e.jsonl"), "--vocab-size", "300",
                     "--out", str(tmp_path / "t.model")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpsynth tokenizer: error: ") and err.count("\n") == 1 and "e.jsonl" in err, err


def test_cli_sample_is_bounded_by_bytes(tmp_path, monkeypatch):
    words = "river stone cloud field bird morning light window garden".split()
    (tmp_path / "big.txt").write_text("\n".join(" ".join(words[j % 9:] + words[: j % 9]) + f" {j}" for j in range(4000)))
    seen = {}
    real = tok.sample_lines

    def spy(texts, **kwargs):
        seen.update(kwargs)
        sample = real(texts, **kwargs)
        seen["bytes"] = sum(len(s.encode()) for s in sample)
        return sample

    monkeypatch.setattr(tok, "sample_lines", spy)
    assert cli.main(["tokenizer", "train", "--corpus", str(tmp_path / "big.txt"), "--vocab-size", "300",
                     "--max-sample-mb", "0.05", "--out", str(tmp_path / "t.model")]) == 0
    assert seen["max_bytes"] == int(0.05 * 2**20) and 0 < seen["bytes"] <= seen["max_bytes"]
    assert (tmp_path / "big.txt").stat().st_size > 3 * seen["max_bytes"]  # the bound did cut
