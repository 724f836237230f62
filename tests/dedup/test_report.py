"""contamination.json: schema, counts from shard stats, stable hash, no private text."""

import json

import numpy as np

from dpsynth.data.token_shards import TokenShard
from dpsynth.dedup.index import SensitiveIndex
from dpsynth.dedup.match import dedup_shard
from dpsynth.dedup.report import build_report, merge_stats, report_sha256, summary_text, write_report


def shard(name, docs):
    offsets = np.zeros(len(docs) + 1, np.int64)
    np.cumsum([len(d) for d in docs], out=offsets[1:])
    tokens = np.concatenate([np.asarray(d, np.uint16) for d in docs])
    return TokenShard(name, tokens, offsets, [{"id": f"{name}-{i}"} for i in range(len(docs))])


def corpus():
    rng = np.random.default_rng(0)
    train = [list(rng.integers(10, 1000, 80)) for _ in range(5)]
    test = [list(rng.integers(10, 1000, 80)) for _ in range(3)]
    index = SensitiveIndex.build([("train", shard("train", train)), ("test", shard("test", test))])
    pub0 = [list(rng.integers(10, 1000, 200)) for _ in range(3)]
    pub1 = [list(rng.integers(10, 1000, 200)) for _ in range(2)]
    pub0[1][20:20] = train[3][5:65]  # 60 shared tokens
    pub1[0][0:0] = test[2][:12]  # 12 shared: below k
    pub1[1].extend(train[3][:55])  # overlaps the first plant inside train-3
    return index, [shard("p0", pub0), shard("p1", pub1)]


def test_report_counts_and_schema(tmp_path):
    index, shards = corpus()
    stats = [dedup_shard(index, s, min_tokens=50).stats for s in shards]
    report = build_report(index, stats, min_tokens=50)
    assert report["min_tokens"] == 50
    assert report["sensitive"][0] == {
        "name": "train",
        "num_examples": 5,
        "num_examples_shared": 1,
        "shared_example_ids": ["train-3"],
        "longest_shared_tokens": 60,
        "num_unread": 0,
    }
    assert report["sensitive"][1]["num_examples_shared"] == 0
    assert report["sensitive"][1]["longest_shared_tokens"] >= 12
    assert report["public"] == {
        "shards": 2,
        "documents": 5,
        "documents_touched": 2,
        "documents_emptied": 0,
        "tokens": 1000 + 60 + 12 + 55,
        "tokens_removed": 115,
    }
    assert report["sensitive_index_sha256"] == index.sha256
    assert report["report_sha256"] == report_sha256(report)
    path = write_report(str(tmp_path), report)
    assert json.loads(open(path).read()) == report


def test_hash_is_stable_and_order_independent():
    index, shards = corpus()
    stats = [dedup_shard(index, s, min_tokens=50).stats for s in shards]
    a = build_report(index, stats, 50)
    b = build_report(index, list(reversed(stats)), 50)
    c = build_report(index, merge_stats(stats), 50)
    assert a == b == c
    assert build_report(index, stats, 49)["report_sha256"] != a["report_sha256"]


def test_summary_has_counts_not_ids_or_tokens():
    index, shards = corpus()
    report = build_report(index, [dedup_shard(index, s, 50).stats for s in shards], 50)
    text = summary_text(report)
    assert "1 of 5 examples" in text and "115 tokens" in text
    assert "train-3" not in text
