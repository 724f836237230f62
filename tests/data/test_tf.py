"""[tf] paths of dpsynth.data: TFRecord output, TF-Text tokenization, TFDS sources.

Marked `tf` (needs the [tf] extra) but never skipped: CI installs the extra.
"""

import random

import numpy as np
import pytest

from dpsynth.data import tf_text, tfds_source, tfrecord, token_shards
from dpsynth.data.tokenizer_training import train_tokenizer

pytestmark = pytest.mark.tf


def test_tfrecord_roundtrip(tmp_path):
    records = [{"id": f"syn-{i}", "text": f"synthetic review {i} ✓", "label": ["great", "other"][i % 2], "score": i}
               for i in range(5)]
    path = str(tmp_path / "out.tfrecord")
    assert tfrecord.write_tfrecord(path, records) == 5
    assert tfrecord.read_tfrecord(path) == records
    with pytest.raises(TypeError, match="unsupported type"):
        tfrecord.to_example({"x": [1, 2]})


def test_tf_text_gives_the_same_ids_as_the_tokenizer():
    rng = random.Random(0)
    words = "quick brown fox jumps over lazy dog café naïve".split()
    tokenizer = train_tokenizer([" ".join(rng.choice(words) for _ in range(30)) for _ in range(50)], vocab_size=300)
    texts = ["the quick brown fox", "", "  spaces  and\nnewlines\t", "Ünïcode ✓ 🙂 日本語", "café naïve " * 20]
    got = tf_text.tf_encode(tokenizer, texts)
    for text, ids in zip(texts, got):
        np.testing.assert_array_equal(ids, tokenizer.encode(text))


@pytest.mark.parametrize("name,features", [("imdb_reviews", ("text",)), ("ag_news_subset", ("title", "description"))])
def test_load_tfds_split_on_mock_data(name, features, tmp_path):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=20):
        splits = tfds_source.load_tfds(name, data_dir=str(tmp_path))
        builder = tfds.builder(name, data_dir=str(tmp_path))
        raw_train = list(tfds.as_numpy(builder.as_dataset(split="train", shuffle_files=False)))
    assert (len(splits["train"]), len(splits["valid"]), len(splits["test"])) == (18, 2, 20)
    label = builder.info.features["label"]
    # Stored order is kept: train + valid is the original train split, first 90% then last 10%.
    for row, ex in zip(splits["train"] + splits["valid"], raw_train):
        assert row["label"] == label.int2str(int(ex["label"]))
        assert row["text"] == ". ".join(ex[f].decode().strip() for f in features if ex[f].decode().strip())
    assert splits["valid"][0]["id"] == f"{name}/train-000018"


def test_unsupported_tfds_name():
    with pytest.raises(ValueError, match="unsupported"):
        tfds_source.load_tfds("mnist")


def test_tokenize_job_reads_tfds(tmp_path):
    import tensorflow_datasets as tfds

    from beam_jobs import tokenize as tokenize_job

    tokenizer = train_tokenizer(["abc def ghi jkl " * 20] * 5, vocab_size=300)
    tokenizer.save(str(tmp_path / "t.model"))
    with tfds.testing.mock_data(num_examples=10):
        manifest = tokenize_job.run(["--kind", "sensitive", "--input", "tfds:imdb_reviews", "--tfds-data-dir",
                                     str(tmp_path / "tfds"), "--tokenizer", str(tmp_path / "t.model"),
                                     "--out", str(tmp_path / "out")])
    # 9 train + 1 valid + 10 test examples; mock texts may be empty and are then dead-lettered.
    assert manifest["records_in"] == 20 == manifest["num_documents"] + manifest["dead_lettered"]
    assert set(manifest["labels"]) <= {"neg", "pos"}
    ids = {d["id"] for s in token_shards.iter_shards(str(tmp_path / "out")) for d in s.docs}
    assert ids <= {f"imdb_reviews/{split}-{i:06d}" for split in ("train", "test") for i in range(10)}
