"""Tests for dpsynth.data.demo_stage: planting (the demo's dedup check is in tests/test_demo.py)."""

from dpsynth.data import demo_stage


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

