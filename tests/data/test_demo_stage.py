"""Tests for dpsynth.data.demo_stage: planting, and the whole demo on the embedded data (slow)."""

import json

import pytest

from dpsynth.data import demo_stage, embedded


def test_plant_inserts_every_review_once_at_paragraph_boundaries():
    docs = [{"id": f"d{i}", "text": "\n\n".join(f"p{i}.{j}" for j in range(5))} for i in range(3)]
    reviews = [{"id": f"r{i}", "text": f"REVIEW {i}"} for i in range(4)]
    out = demo_stage.plant(docs, reviews, seed=1)
    assert [d["text"] for d in docs][0].startswith("p0.0")  # inputs untouched
    paragraphs = [p for d in out for p in d["text"].split("\n\n")]
    assert sorted(p for p in paragraphs if p.startswith("REVIEW")) == [f"REVIEW {i}" for i in range(4)]
    assert sorted(p for p in paragraphs if not p.startswith("REVIEW")) == sorted(
        p for d in docs for p in d["text"].split("\n\n"))
    assert out == demo_stage.plant(docs, reviews, seed=1)


@pytest.mark.slow
def test_demo_finds_every_planted_review(tmp_path, capsys):
    try:
        embedded.fine_food_splits()
    except embedded.EmbeddedDataMissing:
        pytest.skip("embedded data not fetched (make data)")
    result = demo_stage.run_contamination_demo(None, str(tmp_path), vocab_size=4000, num_planted=3)
    assert len(result["planted_ids"]) == 3 and result["found_ids"] == result["planted_ids"]
    assert "PLANTING 3 sensitive training reviews" in capsys.readouterr().out
    report = json.loads(open(result["contamination"]).read())
    assert report == result["report"]
    # The released tokenizer comes after the dedup and re-tokenized the clean corpus; the
    # dedup's temporary tokenizer (it saw the planted reviews) is gone.
    from dpsynth.tokens import Tokenizer, read_manifest

    released = Tokenizer.load(result["tokenizer"])
    assert read_manifest(result["clean_tokens"])["tokenizer_sha256"] == released.sha256
    assert not (tmp_path / "dedup_tokenizer.model").exists() and not (tmp_path / "dedup" / "clean_tokens").exists()
