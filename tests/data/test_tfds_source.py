"""Tests for dpsynth.data.tfds_source's split logic (no TensorFlow needed)."""

import pytest

from dpsynth.data.tfds_source import split_train_valid


@pytest.mark.parametrize("n", [0, 1, 9, 10, 11, 25, 4000])
def test_first_ninety_percent_is_train(n):
    rows = list(range(n))
    train, valid = split_train_valid(rows)
    assert train + valid == rows
    assert len(valid) == round(n * 0.1)


def test_bad_fraction():
    with pytest.raises(ValueError):
        split_train_valid([1], 1.0)
