"""Choosing one trial of a hyperparameter sweep on a validation score, and accounting the sweep.

Both sweeps use this module: the DP tuner's (`dpsynth.train.sweep`, selected by the lowest
loss on D_valid) and the DP-on-real classifier baseline's
(`dpsynth.evaluate.train_classifier.run_sweep`, selected by the highest mean accuracy on the
real D_valid). A sweep trains k trials on the same D_train and is accounted in one of two ways:

* `COMPOSED` ("composed", the default): each trial is calibrated with `compositions=k`
  (`compositions`), and every trial's ledger entries count (`accounted_trials`).
* `SELECTED_ONLY` ("selected-only", the paper's accounting): each trial alone is calibrated to
  the target and only the selected trial's entries count; its side channel says that the other
  trials and the selection are not accounted.

Formal guarantee. With `COMPOSED`, all k trained models (every intermediate parameter) are
together (epsilon, delta)-DP for D_train under add-or-remove adjacency (composition of k
mechanisms each calibrated for k-fold composition); picking one of them is post-processing with
respect to D_train. The selection reads D_valid without DP: a declared side channel
(`selection_channel`). With `SELECTED_ONLY` only the selected trial is covered; the whole
procedure costs the composition of k such runs, which the report does not claim.

The DP alternative to the non-DP choice is `dpsynth.dp.private_selection` (the exponential
mechanism on a count of correct predictions on D_valid, accounted in the ledger): the DP-on-real
sweep uses it with `DPConfig.select_epsilon`, and then declares no validation-based channel under
`COMPOSED`. The tuner's sweep still chooses by the D_valid loss without DP (a loss needs a
per-example clip before it has a bounded sensitivity).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

COMPOSED = "composed"
SELECTED_ONLY = "selected-only"
SWEEP_ACCOUNTINGS = (COMPOSED, SELECTED_ONLY)

# The sweeps whose side-channel wording `selection_channel` knows (their report's training mode).
DP_TUNE, DP_ON_REAL = "dp_tune", "dp_on_real"

# The side channel of a validation-based selection, by (sweep, accounting): name and detail. The
# detail is formatted with k (trials), grid (the grid in words) and, for DP_ON_REAL, others
# (k - 1) and other_repeats (repeats - 1).
_CHANNELS = {
    (DP_TUNE, COMPOSED): (
        "validation-based selection",
        "{k} hyperparameter trials ({grid}) were trained on the same D_train, each calibrated so that all {k} "
        "together meet the target (epsilon, delta): the ledger and the epsilon of this report cover all "
        "{k} trials. Choosing the trial with the lowest loss on D_valid is NOT differentially private with "
        "respect to D_valid (a declared side channel); the validation losses are not released (private "
        "state only), and only the selected model is written here"),
    (DP_TUNE, SELECTED_ONLY): (
        "validation-based selection (selected-only accounting)",
        "{k} hyperparameter trials ({grid}) were each trained at the target (epsilon, delta) on their own and "
        "ONLY THE SELECTED TRIAL IS ACCOUNTED (the paper's way): the ledger and the epsilon of this report cover "
        "one trial, not the {k} trained on the same D_train, whose composition is the true cost of the whole "
        "procedure. Choosing the trial by its loss on D_valid is NOT differentially private; the other trials "
        "were never written to this directory and the validation losses stay in the private state"),
    (DP_ON_REAL, COMPOSED): (
        "validation-based selection",
        "{k} trials ({grid}) were trained on D_train, each with noise calibrated so that all "
        "{k} together meet the target (epsilon, delta) (the ledger holds all {k}); early "
        "stopping and the choice of the setting read the real D_valid, and the D_valid accuracies "
        "are recorded, without DP with respect to D_valid"),
    (DP_ON_REAL, SELECTED_ONLY): (
        "selected-only accounting",
        "the paper's accounting: each of the {k} trials ({grid}) was trained on D_train at the "
        "full target (epsilon, delta) on its own and only the selected trial is in the ledger. The "
        "other {others} trials (including the {other_repeats} other repeats whose accuracies enter "
        "the reported mean) and the selection on the real D_valid are NOT covered: all that was "
        "computed together is only the composition of {k} such runs"),
}


def check_accounting(accounting: str, error: type[Exception] = ValueError) -> str:
    """`accounting` if it is one of `SWEEP_ACCOUNTINGS`; else raises `error`."""
    if accounting not in SWEEP_ACCOUNTINGS:
        raise error(f"sweep_accounting must be one of {SWEEP_ACCOUNTINGS}, got {accounting!r}")
    return accounting


def compositions(accounting: str, trials: int) -> int:
    """How many trials the ledger accounts, and so the `compositions` each trial is calibrated for."""
    return int(trials) if check_accounting(accounting) == COMPOSED else 1


def accounted_trials(accounting: str, trials: int, selected: int) -> list[int]:
    """The indices of the trials whose ledger entries count: all of them, or the selected one."""
    if not 0 <= selected < trials:
        raise ValueError(f"selected trial {selected} is not one of {trials}")
    return list(range(trials)) if check_accounting(accounting) == COMPOSED else [selected]


def best(scores: Sequence[float], *, higher_is_better: bool) -> int:
    """The index of the best validation score: the first of equal ones; NaN ranks last."""
    if not scores:
        raise ValueError("nothing to select from: no trials")
    chosen = 0
    for i, s in enumerate(scores):
        b = scores[chosen]
        if not math.isnan(s) and (math.isnan(b) or (s > b if higher_is_better else s < b)):
            chosen = i
    return chosen


def selection_channel(accounting: str, *, sweep: str, trials: int, grid: str, repeats: int = 1) -> dict:
    """The side channel of a sweep's validation-based selection, for its privacy report.

    Args:
      accounting: `COMPOSED` or `SELECTED_ONLY`.
      sweep: `DP_TUNE` or `DP_ON_REAL` (which sweep: what it selects by and what it releases).
      trials: k, the trials trained on D_train; grid: the grid in words; repeats: the repeats
        of each setting (DP_ON_REAL).
    """
    name, detail = _CHANNELS[(sweep, check_accounting(accounting))]
    return {"name": name, "detail": detail.format(k=trials, grid=grid, others=trials - 1, other_repeats=repeats - 1)}
