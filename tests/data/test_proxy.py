"""The public proxy task: balanced, deterministic, order-independent, disjoint splits, clear errors."""

import gzip
import json
import random

import pytest

from dpsynth.data.proxy import build_proxy_task
from dpsynth.data.readers import InputError

GROUPS = {"london": "hotels/london/", "paris": "hotels/paris/", "car": "cars/"}


def _corpus(tmp_path, order_seed=0, per_group=40):
    docs = [{"id": f"{p}doc{i}", "text": f"{name} review {i}"} for name, p in GROUPS.items() for i in range(per_group)]
    docs += [{"id": f"other/doc{i}", "text": "unlabelled"} for i in range(10)]
    random.Random(order_seed).shuffle(docs)
    a, b = tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl"
    with gzip.open(a, "wt") as f:
        f.writelines(json.dumps(d) + "\n" for d in docs[: len(docs) // 2])
    with open(b, "w") as f:
        f.writelines(json.dumps(d) + "\n" for d in docs[len(docs) // 2:])
        f.write('{"id": "bad", "text": ""}\n')  # dead-lettered (empty text), counted
    return [str(a), str(b)]


def test_balanced_disjoint_and_deterministic(tmp_path):
    task = build_proxy_task(_corpus(tmp_path), GROUPS,
                            num_train=31, num_valid=6, num_test=9, seed=3)
    assert task.labels == ("london", "paris", "car")
    assert [len(task.train), len(task.valid), len(task.test)] == [31, 6, 9]
    counts = {l: sum(r["label"] == l for r in task.train) for l in task.labels}
    assert counts == {"london": 11, "paris": 10, "car": 10}
    ids = [r["id"] for s in ("train", "valid", "test") for r in task.split(s)]
    assert len(set(ids)) == len(ids)  # disjoint splits
    for r in task.train + task.valid + task.test:
        assert r["id"].startswith(GROUPS[r["label"]]) and r["text"].startswith(r["label"])
    assert task.dead_letters == 1 and task.documents_read == 130
    (tmp_path / "y").mkdir()
    again = build_proxy_task(_corpus(tmp_path / "y", order_seed=7), GROUPS, num_train=31, num_valid=6, num_test=9, seed=3)
    assert again == task  # independent of file order
    other = build_proxy_task(_corpus(tmp_path / "y", order_seed=7), GROUPS, num_train=31, num_valid=6, num_test=9, seed=4)
    assert {r["id"] for r in other.train} != {r["id"] for r in task.train}


def test_errors(tmp_path):
    paths = _corpus(tmp_path)
    with pytest.raises(InputError, match="has 40 documents"):
        build_proxy_task(paths, GROUPS, num_train=100, num_valid=10, num_test=10)
    with pytest.raises(InputError, match="also matches"):
        build_proxy_task(paths, {"a": "hotels/", "b": "hotels/london/"}, num_train=4, num_valid=0, num_test=0)
    with pytest.raises(InputError, match="two or more"):
        build_proxy_task(paths, {}, num_train=4, num_valid=0, num_test=0)
