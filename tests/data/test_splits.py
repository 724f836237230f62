"""Fixed splits and subsamples (dpsynth.data.splits) on small record lists."""

import pytest

from dpsynth.data import splits


def recs(n, prefix="f.csv", **extra):
    return [{"id": f"{prefix}:{i}", "text": f"text {i}", "label": str(i % 2), **extra} for i in range(n)]


def test_tail_holdout_is_the_last_fraction_in_order():
    out = splits.make_splits({"train": recs(20), "test": recs(5, "t.csv")})
    assert [len(out[s]) for s in splits.SPLITS] == [18, 2, 5]
    assert [r["id"] for r in out["valid"]] == ["f.csv:18", "f.csv:19"]


def test_hash_holdout_is_fixed_disjoint_and_near_its_fractions():
    spec = splits.SplitSpec(holdout="hash", valid_fraction=0.1, test_fraction=0.2, seed=3)
    a = splits.make_splits({"train": recs(5000)}, spec)
    b = splits.make_splits({"train": list(reversed(recs(5000)))}, spec)
    ids = {s: {r["id"] for r in a[s]} for s in splits.SPLITS}
    assert ids == {s: {r["id"] for r in b[s]} for s in splits.SPLITS}  # independent of file order
    assert sum(len(v) for v in ids.values()) == 5000
    assert not (ids["train"] & ids["valid"]) and not (ids["train"] & ids["test"]) and not (ids["valid"] & ids["test"])
    assert abs(len(ids["test"]) - 1000) < 100 and abs(len(ids["valid"]) - 500) < 75
    other = splits.make_splits({"train": recs(5000)}, splits.SplitSpec(holdout="hash", test_fraction=0.2, seed=4))
    assert {r["id"] for r in other["test"]} != ids["test"]  # the seed matters


def test_split_column_selects_rows_and_is_dropped():
    rows = [{**r, "split": "test" if i % 3 else "dev"} for i, r in enumerate(recs(300))]
    spec = splits.SplitSpec(split_column="split", split_values={"train": "test", "test": "dev"}, holdout="hash")
    out = splits.make_splits({"train": rows, "test": rows}, spec)
    assert len(out["test"]) == 100 and len(out["train"]) + len(out["valid"]) == 200
    assert all("split" not in r for s in splits.SPLITS for r in out[s])
    assert {r["id"] for r in out["test"]} == {f"f.csv:{i}" for i in range(0, 300, 3)}
    with pytest.raises(splits.SplitError, match="has no 'split' field"):
        splits.make_splits({"train": recs(4), "test": recs(4)}, spec)


def test_hash_subsample_is_fixed_in_file_order_and_not_the_first_rows():
    rows = recs(1000)
    a = splits.subsample(rows, 100, "hash", seed=0)
    assert a == splits.subsample(rows, 100, "hash", seed=0) and len(a) == 100
    positions = [int(r["id"].split(":")[1]) for r in a]
    assert positions == sorted(positions) and max(positions) > 500  # spread, in order
    assert splits.subsample(rows, 100, "first") == rows[:100]
    out = splits.make_splits({"train": rows, "test": recs(50, "t")}, splits.SplitSpec(subsample="hash"),
                             {"train": 200, "valid": None, "test": 10})
    assert [len(out[s]) for s in splits.SPLITS] == [200, 100, 10]


@pytest.mark.parametrize("kwargs, match", [
    ({"holdout": "random"}, "holdout must be one of"),
    ({"test_fraction": 0.1}, "needs holdout: hash"),
    ({"valid_fraction": 0.0}, "valid_fraction must be in"),
    ({"split_values": {"train": "a"}}, "needs split_column"),
    ({"split_column": "s", "split_values": {"dev": "a"}}, "unknown split"),
])
def test_bad_specs(kwargs, match):
    with pytest.raises(splits.SplitError, match=match):
        splits.SplitSpec(**kwargs)


def test_missing_or_doubled_test_split():
    with pytest.raises(splits.SplitError, match="give a test file or test_fraction"):
        splits.make_splits({"train": recs(10)})
    with pytest.raises(splits.SplitError, match="also given"):
        splits.make_splits({"train": recs(10), "test": recs(3)}, splits.SplitSpec(holdout="hash", test_fraction=0.2))
    with pytest.raises(splits.SplitError, match="valid: no records"):
        splits.make_splits({"train": recs(3), "test": recs(3)})
