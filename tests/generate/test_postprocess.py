"""Post-processing filters (dpsynth.generate.postprocess) and their use in the generation job."""

import json

import pytest

from dpsynth.generate.job import generate
from dpsynth.generate.postprocess import PostprocessConfig, filter_samples
from tests.generate.fakes import load_fake_bundle, write_fake_model_dir
from tests.generate.test_job import MAX_LEN, TABLE_SEED, _config


def rec(text, label="a", finished=True):
    return {"text": text, "label": label, "finished": finished}


def test_filters_count_and_keep_the_first_survivors():
    records = [rec("good one"), rec("   "), rec("cut off", finished=False), rec("good  one"), rec("good one", "b"),
               rec("another"), rec("third"), rec("fourth")]
    cfg = PostprocessConfig(drop=("empty", "truncated", "duplicate"))
    kept, counts = filter_samples(records, cfg, want=3)
    assert [(r["text"], r["label"]) for r in kept] == [("good one", "a"), ("good one", "b"), ("another", "a")]
    assert counts == {"drawn": 8, "kept": 3, "unused": 2, "dropped_empty": 1, "dropped_truncated": 1,
                      "dropped_duplicate": 1}
    kept, counts = filter_samples(records, PostprocessConfig(drop=("duplicate",)), want=100, seen={("a", "another")})
    assert len(kept) == 6 and counts["dropped_duplicate"] == 2  # "good  one" and the seen "another"
    kept, _ = filter_samples([rec("one two"), rec("three")], PostprocessConfig(drop=("empty",), min_words=2), 5)
    assert [r["text"] for r in kept] == ["one two"]


@pytest.mark.parametrize("kwargs", [{"drop": ("short",)}, {"min_words": 0}, {"oversample": 0.5}])
def test_bad_config(kwargs):
    with pytest.raises(ValueError, match="postprocess"):
        PostprocessConfig(**kwargs)


def test_oversample_draws_more():
    assert PostprocessConfig(oversample=1.25).drawn(37) == 47 and PostprocessConfig().drawn(37) == 37


def test_job_filters_draws_extra_and_reports(tmp_path):
    model = write_fake_model_dir(str(tmp_path / "m"), max_len=MAX_LEN, seed=TABLE_SEED)
    post = PostprocessConfig(drop=("empty", "duplicate"), oversample=3.0)  # the fake model never ends (EOS)
    manifest = generate(_config(model, tmp_path / "o", temperature=0.0, valid_examples=0, postprocess=post),
                        loader=load_fake_bundle)
    train = [json.loads(l) for l in open(tmp_path / "o" / "train.jsonl")]
    # Greedy decoding gives one text per label: everything else is a duplicate.
    keys = [(r["label"], r["text"]) for r in train]
    assert len(keys) == len(set(keys)) and len(train) <= 2
    report = json.load(open(tmp_path / "o" / "generation_report.json"))
    counts = report["postprocess"]["train"]
    assert counts["drawn"] == 3 * 37 and counts["kept"] == len(train)
    assert counts["drawn"] == counts["kept"] + counts["unused"] + sum(counts[f"dropped_{f}"] for f in
                                                                      ("empty", "truncated", "duplicate"))
    assert manifest["splits"]["train"]["postprocess"] == counts
    config = json.load(open(tmp_path / "o" / "generation_config.json"))
    assert config["postprocess"]["oversample"] == 3.0
    # Without post-processing the job's identity (config hash) is what it was before the option existed.
    generate(_config(model, tmp_path / "p", num_examples=4, valid_examples=0), loader=load_fake_bundle)
    assert "postprocess" not in json.load(open(tmp_path / "p" / "generation_config.json"))
    assert "postprocess" not in json.load(open(tmp_path / "p" / "generation_report.json"))
