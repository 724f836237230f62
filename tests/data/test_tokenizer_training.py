"""Tests for dpsynth.data.tokenizer_training (the line sampler, SentencePiece training) and the
`dpsynth tokenizer train` entry point."""

import json
import random

import pytest

from dpsynth import cli
from dpsynth.data import readers, tokenizer_training
from dpsynth.data.tokenizer_training import sample_lines, train_tokenizer
from dpsynth.data.tokenizers import Tokenizer


def test_cli_trains_on_public_files(tmp_path, capsys):
    words = "river stone cloud field bird morning light window garden".split()
    (tmp_path / "pub").mkdir()
    for i in range(3):
        (tmp_path / "pub" / f"{i}.txt").write_text("\n".join(" ".join(words[(i + j) % 9:] + words[:(i + j) % 9]) for j in range(50)))
    (tmp_path / "pub" / "more.jsonl").write_text(json.dumps({"text": "river bird Morning"}) + "\n")
    out = tmp_path / "tok.model"
    assert cli.main(["tokenizer", "train", "--corpus", str(tmp_path / "pub"), "--vocab-size", "300", "--out", str(out)]) == 0
    t = Tokenizer.load(str(out))
    assert 260 < t.vocab_size <= 300 and t.decode(t.encode("garden window")) == "garden window"
    assert f"{t.vocab_size} pieces from 4 public files" in capsys.readouterr().out


def test_empty_corpus_is_a_clear_error(tmp_path, capsys):
    from dpsynth.data.tokenizer_training import TokenizerConfig, train_public_tokenizer

    (tmp_path / "e.jsonl").write_text(json.dumps({"text": "   "}) + "\n")
    with pytest.raises(readers.InputError, match="e.jsonl"):
        train_public_tokenizer([str(tmp_path / "e.jsonl")], out=str(tmp_path / "t.model"),
                               config=TokenizerConfig(vocab_size=300))
    # The command: that error as one line, exit status 2 (dpsynth.errors).
    assert cli.main(["tokenizer", "train", "--corpus", str(tmp_path / "e.jsonl"), "--vocab-size", "300",
                     "--out", str(tmp_path / "t.model")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpsynth tokenizer: error: ") and err.count("\n") == 1 and "e.jsonl" in err, err


def test_cli_sample_is_bounded_by_bytes(tmp_path, monkeypatch):
    words = "river stone cloud field bird morning light window garden".split()
    (tmp_path / "big.txt").write_text("\n".join(" ".join(words[j % 9:] + words[: j % 9]) + f" {j}" for j in range(4000)))
    seen = {}
    real = tokenizer_training.sample_lines

    def spy(texts, **kwargs):
        seen.update(kwargs)
        sample = real(texts, **kwargs)
        seen["bytes"] = sum(len(s.encode()) for s in sample)
        return sample

    monkeypatch.setattr(tokenizer_training, "sample_lines", spy)
    assert cli.main(["tokenizer", "train", "--corpus", str(tmp_path / "big.txt"), "--vocab-size", "300",
                     "--max-sample-mb", "0.05", "--out", str(tmp_path / "t.model")]) == 0
    assert seen["max_bytes"] == int(0.05 * 2**20) and 0 < seen["bytes"] <= seen["max_bytes"]
    assert (tmp_path / "big.txt").stat().st_size > 3 * seen["max_bytes"]  # the bound did cut


def test_train_tokenizer_rejects_empty_text():
    with pytest.raises(ValueError, match="no non-empty lines"):
        train_tokenizer(["", "  \n "], vocab_size=300)


def test_sample_lines_is_bounded_in_bytes_and_lines_and_keeps_corpus_order():
    rng = random.Random(1)
    texts = ["\n".join("x" * rng.randint(1, 300) + f" {i}-{j}" for j in range(50)) for i in range(40)]
    lines = [ln for t in texts for ln in t.splitlines()]
    sample = sample_lines(texts, max_bytes=20_000, seed=3)
    assert 0 < sum(len(s.encode()) for s in sample) <= 20_000
    positions = [lines.index(s) for s in sample]
    assert positions == sorted(positions)  # corpus order
    assert sample == sample_lines(texts, max_bytes=20_000, seed=3)  # deterministic
    assert len(sample_lines(texts, max_bytes=10**9, max_lines=7, seed=3)) == 7
    assert sample_lines(texts, max_bytes=10**9, seed=3) == lines  # everything fits: all lines
    assert sample_lines(["a\n" + "b" * 50, "c"], max_bytes=100, max_line_bytes=10) == ["a", "c"]
    with pytest.raises(ValueError):
        sample_lines(texts, max_bytes=0)


def test_sample_lines_does_not_favour_short_lines():
    # Half the lines are 10x longer; a sample of a quarter of the bytes keeps both kinds at the
    # same rate (a fill-until-full sampler would keep mostly short lines).
    texts = [f"s{i} " + "a" * 20 + f"\nl{i} " + "b" * 200 for i in range(4000)]
    sample = sample_lines(texts, max_bytes=(4000 * 230) // 4, seed=0)
    short = sum(s.startswith("s") for s in sample)
    long = len(sample) - short
    assert long > 100 and 0.85 < short / long < 1.18


def test_sample_lines_memory_follows_the_sample_not_the_corpus():
    import tracemalloc

    def corpus():  # 8 MB of text, streamed
        for i in range(8_000):
            yield "\n".join(f"{i} {j} " + "w" * 95 for j in range(10))

    tracemalloc.start()
    sample = sample_lines(corpus(), max_bytes=1 << 18, seed=0)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert sum(len(s) for s in sample) <= 1 << 18
    assert peak < 1 << 20  # the 256 KiB sample with per-line overhead, not 8 MB


def test_train_tokenizer_uses_lines_longer_than_sentencepiece_accepts():
    from dpsynth.data.tokenizer_training import _sentences, train_tokenizer

    words = [f"w{i % 50}" for i in range(3000)]
    line = " ".join(words)  # ~11 KB on one line: SentencePiece alone would drop it (max 8192 bytes)
    chunks = list(_sentences(line + "\n\n short line \n", 8192))
    assert chunks[-1] == "short line" and " ".join(chunks[:-1]) == line
    assert all(len(c.encode()) <= 8192 for c in chunks)
    tok = train_tokenizer([line], vocab_size=400)  # used to fail: no sentence left
    assert tok.decode(tok.encode("w1 w2 w3")) == "w1 w2 w3"


def test_one_config_for_the_command_the_experiment_and_the_library(tmp_path, capsys):
    """`TokenizerConfig` is the one declaration: `dpsynth tokenizer train`'s flags and defaults, the
    experiment's `tokenizer:` section (a preset over it) and its validation, with the field named."""
    import dataclasses

    from dpsynth import binding
    from dpsynth.data.tokenizer_training import TokenizerConfig
    from dpsynth.experiment import config as exp_config
    from trainers import tokenizer as tok_cli

    train = tok_cli.build_parser()._subparsers._group_actions[0].choices["train"]
    args = train.parse_args(["--corpus", "c", "--out", "o", "--vocab-size", "500", "--model-type", "bpe"])
    assert binding.from_args(TokenizerConfig, args) == TokenizerConfig(vocab_size=500, model_type="bpe")
    section = exp_config.TokenizerConfig()
    assert {f.name for f in dataclasses.fields(section)} == {"vocab_size", "max_sentences"}
    assert section.vocab_size == TokenizerConfig().vocab_size and section.max_sentences == 200_000  # the preset
    for bad, key in (({"vocab_size": 8}, "tokenizer.vocab_size"), ({"max_sentences": 0}, "tokenizer.max_sentences")):
        with pytest.raises(exp_config.ConfigError, match=key):
            exp_config.TokenizerConfig(**bad).validate("tokenizer")
    for bad in ({"max_sample_mb": 0}, {"model_type": "word"}, {"seed": 1.5}):
        with pytest.raises(binding.SettingError, match=next(iter(bad))):
            TokenizerConfig(**bad)
    assert cli.main(["tokenizer", "train", "--corpus", "c", "--out", str(tmp_path / "t.model"), "--vocab-size", "3"]) == 2
    assert capsys.readouterr().err.strip() == "dpsynth tokenizer: error: --vocab-size: must be >= 16, got 3"
