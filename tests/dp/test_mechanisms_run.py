"""The run mechanism (`dpsynth.dp.mechanisms.run`): what it releases does not depend on exact data counts."""

import math

from dpsynth.dp.mechanisms import run as mechanism
from dpsynth.dp.plan import plan_privacy


def _user_mechanism(user_ids, k=3):
    plan = plan_privacy(dataset_size=len(set(user_ids)), expected_batch_size=2, steps=3, noise_multiplier=1.0,
                        privacy_unit="user")
    return mechanism.build_run_mechanism(plan, clip_norm=1.0, microbatch_size=8, seed=5, num_rows=len(user_ids),
                                         user_ids=user_ids, max_examples_per_user=k)


def test_released_side_channels_do_not_move_with_one_users_rows():
    """Issue 23, finding 3: the report carried the exact number of rows the per-user cap K dropped, so
    one user with m > K rows changed it by m - K. Neighbouring datasets (that user with K rows, or with
    K + 5) must give the same released text; the exact count stays in `private_counts`."""
    base = [f"u{i % 6}" for i in range(18)]  # six users with 3 rows each: nothing dropped at K = 3
    heavy = base + ["u0"] * 5  # u0 now has 8 rows: 5 dropped
    a, b = _user_mechanism(base), _user_mechanism(heavy)
    assert a.private_counts() == {"rows_kept": 18, "rows_dropped": 0}
    assert b.private_counts() == {"rows_kept": 18, "rows_dropped": 5}
    assert a.side_channels() == b.side_channels()
    assert a.training_fields() == b.training_fields() and a.report_kwargs() == b.report_kwargs()


def test_example_level_mechanism_has_no_private_counts():
    plan = plan_privacy(dataset_size=20, expected_batch_size=4, steps=2, noise_multiplier=1.0)
    m = mechanism.build_run_mechanism(plan, clip_norm=1.0, microbatch_size=4, seed=1, num_rows=20)
    assert m.private_counts() == {} and m.side_channels() == [] and not math.isnan(m.plan.noise_multiplier)
