"""The sweep selection and accounting shared by the DP tuner's and the DP-on-real sweeps."""

import itertools
import math

import numpy as np
import pytest

from dpsynth.dp import selection


def _reference(scores, higher_is_better):
    """Brute force: the first index whose score no other non-NaN score beats; NaN only if all are."""
    finite = [i for i, s in enumerate(scores) if not math.isnan(s)]
    if not finite:
        return 0
    target = (max if higher_is_better else min)(scores[i] for i in finite)
    return next(i for i in finite if scores[i] == target)


@pytest.mark.parametrize("higher_is_better", [True, False])
def test_best_is_the_first_best_score_and_nan_ranks_last(higher_is_better):
    values = [0.1, 0.5, 0.5, float("nan"), 0.9]
    for n in range(1, 5):
        for scores in itertools.product(values, repeat=n):
            assert selection.best(list(scores), higher_is_better=higher_is_better) == _reference(scores, higher_is_better)
    rng = np.random.default_rng(0)
    for _ in range(200):
        scores = list(rng.integers(0, 4, rng.integers(1, 12)).astype(float))
        assert selection.best(scores, higher_is_better=higher_is_better) == _reference(scores, higher_is_better)
    with pytest.raises(ValueError, match="no trials"):
        selection.best([], higher_is_better=higher_is_better)


@pytest.mark.parametrize("trials", [1, 2, 7])
def test_composed_accounts_every_trial_and_selected_only_one(trials):
    for selected in range(trials):
        assert selection.compositions(selection.COMPOSED, trials) == trials
        assert selection.accounted_trials(selection.COMPOSED, trials, selected) == list(range(trials))
        assert selection.compositions(selection.SELECTED_ONLY, trials) == 1
        assert selection.accounted_trials(selection.SELECTED_ONLY, trials, selected) == [selected]
    with pytest.raises(ValueError, match="not one of"):
        selection.accounted_trials(selection.COMPOSED, trials, trials)
    with pytest.raises(ValueError, match="sweep_accounting must be one of"):
        selection.compositions("all", trials)
    with pytest.raises(KeyError):
        selection.check_accounting("all", KeyError)


@pytest.mark.parametrize("sweep", [selection.DP_TUNE, selection.DP_ON_REAL])
def test_the_side_channel_says_what_each_accounting_covers(sweep):
    composed = selection.selection_channel(selection.COMPOSED, sweep=sweep, trials=6, grid="G", repeats=3)
    assert composed["name"] == "validation-based selection"
    assert "all 6" in composed["detail"] and "(G)" in composed["detail"] and "D_valid" in composed["detail"]
    only = selection.selection_channel(selection.SELECTED_ONLY, sweep=sweep, trials=6, grid="G", repeats=3)
    assert "selected-only accounting" in only["name"] and "paper" in only["detail"]
    assert "NOT" in only["detail"] and "(G)" in only["detail"]
