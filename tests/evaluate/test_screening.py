"""`dpsynth select --model` with screening (dpsynth.evaluate.screening): the plan's counts against
the grid arithmetic, --time-budget shrinking or refusing, and end to end on the fake model: the
released corpus has the size asked for and the winner's setting, its privacy report is the one
the full-size path writes."""

import dataclasses
import json
import math
import os

import pytest

from dpsynth.dp import report as report_lib
from dpsynth.dp.ledger import PrivacyLedger
from dpsynth.evaluate import dp_select, screening
from tests.evaluate.conftest import make_records

# A hand-made speed (no timing in tests): guided sampling half as fast as unguided.
SPEED = screening.Speed(examples_per_second={False: 100.0, True: 50.0}, job_overhead_seconds=10.0, mean_tokens=40.0,
                        classifier_seconds_per_example=0.01)


def default_plan(screen_size=2000, dataset_size=20_000):
    return screening.make_plan(dp_select.candidate_grid(), dataset_size=dataset_size, valid_fraction=0.1,
                               screen_size=screen_size, trainings_per_candidate=2, max_len=128)


def test_plan_counts_follow_the_grid_arithmetic():
    # Screening: 8 settings x (2000 + 200) examples, then the winner at 3 x 20,000 (+ 10% valid).
    plan = default_plan()
    assert plan.screening_examples == 8 * 2200 and plan.final_examples == 60_000 + 6_000
    assert plan.examples == 8 * 2200 + 66_000 and plan.max_tokens() == plan.examples * 128
    assert plan.candidates == 8 and plan.trainings == 16
    guided = sum(1 for j in plan.screening if j.guidance > 0)  # 6 of the 8 settings
    assert guided == 6
    eta = plan.seconds(SPEED)
    assert eta["screening"] == pytest.approx(8 * 10 + 2 * 2200 / 100 + 6 * 2200 / 50)
    assert eta["final"] == pytest.approx(10 + 66_000 / 50)  # the winner is unknown: the slowest setting
    assert eta["classifiers"] == pytest.approx(2 * 0.01 * 8 * 2000)
    assert eta["total"] == pytest.approx(eta["screening"] + eta["final"] + eta["classifiers"])
    # Without screening: each setting at its largest multiple (528,000 examples), all 16 candidates scored.
    full = default_plan(screen_size=0)
    assert full.screening_examples == 8 * 66_000 and full.final is None and full.trainings == 16 * 2
    assert full.seconds(SPEED)["classifiers"] == pytest.approx(2 * 0.01 * 8 * (20_000 + 60_000))
    text = "\n".join(plan.lines(SPEED))
    assert "83,600 examples" in text and "16 trainings" in text and "ETA" in text
    with pytest.raises(ValueError):
        default_plan(screen_size=-1)


def plan_of(multiples=(1, 2, 3), screen_size=2000, dataset_size=20_000):
    """The plan of the default settings at `multiples` (the final at the largest of them)."""
    return screening.make_plan(dp_select.candidate_grid(multiples=multiples), dataset_size=dataset_size,
                               valid_fraction=0.1, screen_size=screen_size, trainings_per_candidate=2, max_len=128)


def need(plan):
    return plan.seconds(SPEED)["total"]


def fit(plan, seconds):
    return screening.fit_time_budget(plan, SPEED, seconds, valid_fraction=0.1)


def test_a_plan_under_the_budget_or_without_one_is_unchanged():
    plan = plan_of()
    assert fit(plan, None) is plan and fit(plan, 0) is plan  # 0: no limit (even where nothing would fit)
    assert plan.time_budget is None and plan.lines(SPEED)[0] == "plan: no time budget (--time-budget 0)"
    for seconds in (need(plan), need(plan) * 10):
        fitted = fit(plan, seconds)
        assert fitted == dataclasses.replace(plan, time_budget=seconds)  # only the budget recorded
        assert not fitted.final_shrunk and not fitted.screen_shrunk
        assert "shrunk" not in "\n".join(fitted.lines(SPEED))
        assert screening.budget_record(fitted) == {"seconds": seconds, "default": False, "shrunk": []}


def test_time_budget_shrinks_the_released_size_first_then_the_screening_size():
    plan = plan_of(multiples=(1, 2, 3))  # the release asked: 3 x 20,000
    assert plan.final.train == plan.final_asked.train == 60_000 and plan.final_multiple == 3
    # A budget that 2x fits at the asked screening size: 2x, though 3x would fit with screening shrunk.
    two = need(plan_of(multiples=(2,)))
    assert need(plan_of(multiples=(3,), screen_size=screening.MIN_SCREEN_SIZE)) <= two  # (the other order's pick)
    fitted = fit(plan, two)
    assert (fitted.final_multiple, fitted.final.train, fitted.final.valid, fitted.screen_size) == (2, 40_000, 4_000, 2000)
    assert fitted.final_asked == plan.final and fitted.final_shrunk and not fitted.screen_shrunk
    assert need(fitted) <= two and fitted.screening == plan.screening and fitted.candidates == plan.candidates
    text = "\n".join(fitted.lines(SPEED))
    assert "44,000 examples (40,000 train + 4,000 valid; shrunk from 60,000 train examples to fit the time budget)" in text
    assert screening.budget_record(fitted)["shrunk"] == [{"what": "multiples", "asked": 3.0, "kept": 2.0,
                                                         "train_size_asked": 60_000, "train_size_kept": 40_000,
                                                         "below_smallest_asked": False}]
    # Just under 2x: the smallest multiple, still at the asked screening size.
    one = fit(plan, two - 1)
    assert (one.final_multiple, one.final.train, one.screen_size) == (1, 20_000, 2000)
    # Under 1x at 2,000: 1x, and the screening size shrinks: the largest that fits, at least MIN_SCREEN_SIZE.
    low, high = need(plan_of(multiples=(1,), screen_size=screening.MIN_SCREEN_SIZE)), need(plan_of(multiples=(1,)))
    budget = (low + high) / 2
    both = fit(plan, budget)
    assert both.final_multiple == 1 and screening.MIN_SCREEN_SIZE <= both.screen_size < 2000
    assert need(both) <= budget < need(plan_of(multiples=(1,), screen_size=both.screen_size + 1))
    assert all(j.train == both.screen_size and j.valid == round(0.1 * both.screen_size) for j in both.screening)
    assert both.lines(SPEED)[1] == both.shrink_line()  # (what shrank, from what: after the budget's line)
    assert f"at {both.screen_size:,} train examples each (shrunk from 2,000 to fit the time budget)" in both.lines(SPEED)[2]
    assert [s["what"] for s in screening.budget_record(both)["shrunk"]] == ["multiples", "screen_size"]
    # Not below the smallest multiple asked while the screening can shrink: --multiples 2,3 stops at 2x.
    two_three = fit(plan_of(multiples=(2, 3)), two - 1)
    assert two_three.final_multiple == 2 and two_three.screen_size < 2000


def smallest_of(plan):
    """Stage (4)'s floor, built by hand: the first 2 settings of `dp_select.settings_by_priority`, screened
    at MIN_SCREEN_SIZE, the release at the screening size (MIN_SCREEN_SIZE train examples)."""
    keep = {f"w{w:g}-t{t:g}" for w, t in dp_select.settings_by_priority(
        [(j.guidance, j.temperature) for j in plan.screening])[:screening.MIN_SETTINGS]}
    n = screening.MIN_SCREEN_SIZE
    jobs = tuple(dataclasses.replace(j, train=n, valid=round(0.1 * n)) for j in plan.screening if j.name in keep)
    return dataclasses.replace(plan, screening=jobs, candidates=len(jobs), candidate_train_sizes=(n,) * len(jobs),
                               screen_size=n, final=dataclasses.replace(plan.final, train=n, valid=round(0.1 * n)))


def settings_plan(guidances, temperatures=(1.0,), multiples=(1,), screen_size=2000, dataset_size=20_000):
    """The plan of a grid, made directly (no budget): what a shrunk grid must equal."""
    return screening.make_plan(dp_select.candidate_grid(guidances, temperatures, multiples), dataset_size=dataset_size,
                               valid_fraction=0.1, screen_size=screen_size, trainings_per_candidate=2, max_len=128)


def stage(plan):
    """The last stage of `screening.SHRINK_ORDER` that `plan` reached (0: as asked)."""
    return max([0] + [i for i, hit in ((1, plan.final_shrunk), (2, plan.screen_shrunk),
                                       (3, bool(plan.settings_dropped)), (4, plan.final_below_asked)) if hit])


def test_the_priority_order_is_a_fixed_data_independent_order_of_the_grid():
    grid = screening.settings_of(dp_select.candidate_grid())
    order = dp_select.settings_by_priority(grid)
    assert order == list(dp_select.SETTING_PRIORITY) and sorted(order) == sorted(grid)  # the default grid: as declared
    assert order[: screening.MIN_SETTINGS] == [(0.0, 1.0), (1.5, 1.0)]  # one unguided, one guided kept last
    assert dp_select.settings_by_priority(list(reversed(grid))) == order  # the grid's order does not matter for these
    # Settings the study did not run: after the listed ones, in a spread order of the grid (middle, ends, gaps).
    other = [(w, 1.0) for w in (0.5, 1.0, 2.0, 4.0, 8.0)]
    assert dp_select.settings_by_priority([(6.0, 1.0)] + other) == [(6.0, 1.0)] + [other[i] for i in (2, 0, 4, 1, 3)]
    for n in range(1, 12):
        assert sorted(dp_select._spread(n)) == list(range(n))


def test_every_shrunk_plan_fits_and_the_stages_come_in_the_documented_order():
    plan = plan_of(multiples=(1, 2, 3))
    floor = need(smallest_of(plan))
    order = [f"w{w:g}-t{t:g}" for w, t in dp_select.settings_by_priority(screening.settings_of(dp_select.candidate_grid()))]
    budgets = sorted({floor * (1 + i / 40) for i in range(0, 400)} | {floor, need(plan) - 1}, reverse=True)
    last_stage, last_kept = 0, len(order)
    for seconds in budgets:
        got = fit(plan, seconds)
        assert need(got) <= seconds, seconds  # the shrunk plan's ETA fits the budget
        st = stage(got)
        # Stages in order: a smaller budget never goes back to an earlier stage.
        assert st >= last_stage, (seconds, st, last_stage)
        last_stage = st
        kept = len(got.screening)
        assert kept <= last_kept and got.candidates == kept == len(got.candidate_train_sizes)
        last_kept = kept
        # The grid shrinks in the documented order: the kept settings are a prefix of the priority order.
        assert set(got.settings) == set(order[:kept]) and got.settings_dropped == tuple(reversed(order[kept:]))
        assert list(got.settings) == [n for n in plan.settings if n in got.settings]  # (listed in grid order)
        if st == 3:  # a smaller grid still releases at least the smallest multiple asked
            assert kept < 8 and got.final_multiple >= 1
        if st == 4:  # below the smallest multiple: 2 settings at MIN_SCREEN_SIZE, the release maximal, >= the floor
            assert kept == screening.MIN_SETTINGS and got.screen_size == screening.MIN_SCREEN_SIZE
            assert screening.MIN_SCREEN_SIZE <= got.final.train < 20_000 and got.final.valid == round(0.1 * got.final.train)
            more = dataclasses.replace(got, final=dataclasses.replace(got.final, train=got.final.train + 1,
                                                                      valid=round(0.1 * (got.final.train + 1))))
            assert need(more) > seconds
            assert got.final_multiple == pytest.approx(got.final.train / 20_000)
        else:
            assert got.final.train in (20_000, 40_000, 60_000)
    assert last_stage == 4 and last_kept == screening.MIN_SETTINGS  # the sweep reached every stage


def test_a_smaller_grid_is_reached_only_when_the_bigger_one_cannot_fit_the_smallest_asked_multiple():
    plan = plan_of(multiples=(1, 3))
    order = dp_select.settings_by_priority(screening.settings_of(dp_select.candidate_grid()))

    def grid_of(k, screen_size):  # the first k settings of the priority order, at 1x, made directly
        p = screening.make_plan([c for c in dp_select.candidate_grid(multiples=(1, 3))
                                 if (c.guidance, c.temperature) in order[:k]], dataset_size=20_000, valid_fraction=0.1,
                                screen_size=screen_size, trainings_per_candidate=2, max_len=128)
        return dataclasses.replace(p, final=dataclasses.replace(p.final, train=20_000, valid=2_000))

    for k in range(7, 1, -1):
        # A budget where k + 1 settings cannot fit 1x even at MIN_SCREEN_SIZE, and k settings fit 1x at it.
        lo, hi = need(grid_of(k, screening.MIN_SCREEN_SIZE)), need(grid_of(k + 1, screening.MIN_SCREEN_SIZE))
        assert lo < hi
        got = fit(plan, (lo + hi) / 2)
        assert len(got.screening) == k and got.final.train >= 20_000 and not got.final_below_asked
        # ... and at each grid size, the release and the screening size are maximized again.
        assert got.screen_size >= screening.MIN_SCREEN_SIZE
        if got.screen_size < 2000:
            assert need(grid_of(k, got.screen_size + 1)) > (lo + hi) / 2
        assert "in the fixed order of dp_select.SETTING_PRIORITY" in got.shrink_line()
        rec = screening.budget_record(got, SPEED)
        settings = next(s for s in rec["shrunk"] if s["what"] == "settings")
        assert settings["asked"] == list(plan.settings) and len(settings["kept"]) == k
        assert settings["dropped"] == [f"w{w:g}-t{t:g}" for w, t in reversed(order[k:])]


def test_below_the_smallest_multiple_then_nothing_fits_only_below_the_last_floor():
    plan = plan_of()  # --multiples 1,2,3
    smallest = smallest_of(plan)
    floor = need(smallest)
    # Exactly the floor's ETA: the floor plan (2 settings at 200, the release at 200 train examples).
    got = fit(plan, floor)
    assert (len(got.screening), got.screen_size, got.final.train, got.final.valid) == (2, 200, 200, 20)
    assert need(got) == pytest.approx(floor) and got.final_below_asked and stage(got) == 4
    # A little more: a bigger release, nothing else.
    more = fit(plan, floor + 100)
    assert more.final.train > 200 and (len(more.screening), more.screen_size) == (2, 200)
    line = more.shrink_line()
    assert line.startswith(f"plan: shrunk to fit --time-budget {floor + 100:g}: released {more.final.train:,} train "
                           f"examples ({more.final.train / 20_000:.3g}x |D_train|, asked 3x = 60,000, below the "
                           "smallest asked, 1x); 2 of 8 sampling settings screened (w0-t1, w1.5-t1; dropped ")
    assert line.endswith(f"screening at 200 train examples per setting (asked 2,000); --time-budget 0 for the plan as "
                         f"asked (~{screening._fmt(need(plan))})")
    assert line in more.lines(SPEED) and "screening 2 of 8 sampling settings at 200" in "\n".join(more.lines(SPEED))
    rec = screening.budget_record(more, SPEED)
    assert rec["shrunk"][0] == {"what": "multiples", "asked": 3.0, "kept": more.final.train / 20_000,
                                "train_size_asked": 60_000, "train_size_kept": more.final.train,
                                "below_smallest_asked": True}
    assert [s["what"] for s in rec["shrunk"]] == ["multiples", "screen_size", "settings"]
    assert rec["eta_asked_seconds"] == need(plan) and rec["eta_seconds"] == need(more) <= floor + 100
    # Below the floor: the one-line refusal.
    for seconds in (floor - 0.5, floor / 2, 5):
        with pytest.raises(screening.BudgetError) as e:
            fit(plan, seconds)
        msg = str(e.value)
        assert "\n" not in msg and msg.endswith("(--time-budget 0: no limit)") and "nothing fits" in msg
        assert ("even the smallest plan it may shrink to (2 sampling settings screened at 200 train examples each, "
                "the release at 200 train examples)") in msg and f"at least {math.ceil(floor):,} s" in msg
    with pytest.raises(screening.BudgetError, match="--screen-size 2000") as e:  # full size: nothing to shrink
        fit(plan_of(screen_size=0), need(plan))
    assert str(e.value).endswith("(--time-budget 0: no limit)")
    with pytest.raises(screening.BudgetError, match=r"must be >= 0 seconds \(0: no limit\), got -1"):
        fit(plan, -1)


def test_the_floors_of_small_grids_and_small_screening_sizes():
    # One setting asked: nothing to drop; a screening size asked below MIN_SCREEN_SIZE: not shrunk, the floor.
    one = settings_plan([0.0], screen_size=50, dataset_size=1_000)
    tiny = screening.fit_time_budget(one, SPEED, need(one) - 1, valid_fraction=0.1)
    assert len(tiny.screening) == 1 and tiny.screen_size == 50 and 50 <= tiny.final.train < 1_000
    floor = dataclasses.replace(one, final=dataclasses.replace(one.final, train=50, valid=5))
    assert screening.fit_time_budget(one, SPEED, need(floor), valid_fraction=0.1).final.train == 50
    with pytest.raises(screening.BudgetError, match="nothing fits"):
        screening.fit_time_budget(one, SPEED, need(floor) - 0.5, valid_fraction=0.1)
    # |D_train| no bigger than the screening size: no release below the smallest multiple to shrink to.
    small = settings_plan([0.0, 1.5], screen_size=300, dataset_size=150)
    at_min = settings_plan([0.0, 1.5], screen_size=screening.MIN_SCREEN_SIZE, dataset_size=150)
    assert screening.fit_time_budget(small, SPEED, need(at_min), valid_fraction=0.1).screen_size == 200
    with pytest.raises(screening.BudgetError, match="the release at 150 train examples"):
        screening.fit_time_budget(small, SPEED, need(at_min) - 0.5, valid_fraction=0.1)


def test_the_probe_time_counts_against_the_budget():
    plan = plan_of()
    slow = dataclasses.replace(SPEED, probe_seconds=300.0)
    assert plan.seconds(slow)["probe"] == 300 and plan.seconds(slow)["total"] == pytest.approx(need(plan) + 300)
    for seconds in (need(plan) / 3, need(plan) / 10, need(smallest_of(plan)) + 50):
        # The probe's seconds are spent: the same plan as a budget 300 s smaller without them.
        a, b = screening.fit_time_budget(plan, slow, seconds + 300, valid_fraction=0.1), fit(plan, seconds)
        assert dataclasses.replace(a, time_budget=0, eta_asked=0) == dataclasses.replace(b, time_budget=0, eta_asked=0)
        assert a.shrunk and a.eta_asked == pytest.approx(b.eta_asked + 300)
    eta = [line for line in fit(plan, need(plan) / 3).lines(slow) if line.startswith("plan: ETA")][0]
    assert "the probe's 5m00s (already spent) included" in eta
    with pytest.raises(screening.BudgetError, match=r"the probe's 5m00s included"):
        screening.fit_time_budget(plan, slow, 299, valid_fraction=0.1)
    assert screening.budget_record(fit(plan, need(plan)), slow)["probe_seconds_included"] == 300
    # --time-budget 0: the plan as asked, untouched, whatever the probe took.
    assert screening.fit_time_budget(plan, slow, 0, valid_fraction=0.1) is plan
    assert screening.fit_time_budget(plan_of(screen_size=0), slow, 0, valid_fraction=0.1) == plan_of(screen_size=0)


def replan(plan, winner, speed=SPEED):
    return screening.replan_final(plan, speed, winner, valid_fraction=0.1)


def test_the_replan_grows_an_unguided_winners_release_to_the_largest_size_that_fits():
    plan = plan_of(multiples=(1, 2, 3))
    # A budget where 1x fits at the guided (slowest) rate and 3x does not even at the unguided rate.
    one = fit(plan, need(plan_of(multiples=(1,))) + 5)
    assert one.final.train == 20_000 and one.final_shrunk
    got = replan(one, "w0-t1")  # unguided: twice the guided rate (SPEED)
    assert got.winner == "w0-t1" and got.final_planned == one.final and got.final_grown
    n = got.final.train
    left = one.time_budget - screening.spent_seconds(got, SPEED) - SPEED.job_overhead_seconds
    assert 20_000 < n < 60_000 and got.final.valid == round(0.1 * n)
    # the largest that fits at the winner's rate: n fits, n + 1 does not (valid rounds with it)
    assert n + round(0.1 * n) <= left * 100 < n + 1 + round(0.1 * (n + 1))
    assert need(got) <= one.time_budget and got.final_multiple == pytest.approx(n / 20_000)
    # the stages already run count as the plan's ETA: probe, screening, classifiers (no wall clock)
    eta = one.seconds(SPEED)
    assert screening.spent_seconds(got, SPEED) == eta["probe"] + eta["screening"] + eta["classifiers"]
    line = screening.replan_line(got, SPEED)
    assert line.startswith("plan: the winner (w0-t1, unguided, 100 example/s) leaves ")
    assert line.endswith(f": its final corpus grows from 20,000 to {n:,} train examples ({n / 20_000:.3g}x |D_train|)")
    rec = screening.budget_record(got, SPEED)["replan"]
    assert {k: rec[k] for k in ("setting", "guided", "train_size_asked", "train_size_planned", "train_size_replanned",
                                "grown", "examples_per_second")} == {
        "setting": "w0-t1", "guided": False, "train_size_asked": 60_000, "train_size_planned": 20_000,
        "train_size_replanned": n, "grown": True, "examples_per_second": 100.0}
    record = screening.screening_record(got, "w0-t1", "/tmp/x", SPEED)
    assert record["released_train_size"] == n and record["released_valid_size"] == got.final.valid


def test_the_replan_is_capped_at_the_size_asked_and_never_shrinks():
    plan = plan_of(multiples=(1, 2, 3))
    unguided_asked = need(replan(plan, "w0-t1"))  # the plan as asked, the final at the unguided rate
    assert unguided_asked < need(plan)
    fitted = fit(plan, unguided_asked + 1)  # 3x fits only at the unguided rate
    assert fitted.final_multiple < 3 and fitted.final_shrunk
    got = replan(fitted, "w0-t1")
    assert got.final == plan.final_asked and got.final_multiple == 3  # capped: the asked multiple exactly
    assert not replan(fit(plan, need(plan) * 10), "w0-t1").final_grown  # (nothing to grow: the size asked)
    # Every budget: planned <= re-planned <= asked, the largest that fits at the winner's rate; below the
    # smallest multiple the plan's size is already the largest at the slowest rate: a guided winner (that
    # rate) keeps it, nothing is left.
    def at(p, n):
        return dataclasses.replace(p, final=screening.Job(guidance=-1.0, temperature=-1.0, train=n,
                                                          valid=max(1, round(0.1 * n))))

    floor = need(smallest_of(plan))
    below = 0
    for seconds in sorted({floor * (1 + i / 20) for i in range(40)} | {need(plan) - 1}):
        fitted = fit(plan, seconds)
        for winner in fitted.settings:
            got = replan(fitted, winner)
            assert fitted.final.train <= got.final.train <= plan.final_asked.train
            assert need(got) <= seconds
            assert got.final == plan.final_asked or need(at(got, got.final.train + 1)) > seconds
            assert got.screening == fitted.screening and got.screen_size == fitted.screen_size
            if got.winner_job.guidance > 0 and fitted.final_below_asked:
                below += 1
                assert got.final == fitted.final and not got.final_grown
                assert screening.budget_record(got, SPEED)["replan"]["grown"] is False
    assert below  # (the budgets reach stage 4)


def test_the_replan_without_a_budget_keeps_the_size_asked():
    plan = plan_of(multiples=(1, 3))
    for fitted in (fit(plan, 0), fit(plan, None)):
        got = replan(fitted, "w0-t1")
        assert got.final == plan.final_asked and not got.final_grown
        assert "replan" not in screening.budget_record(got, SPEED)
    full = plan_of(screen_size=0)  # no screening: no final to re-plan
    assert replan(fit(full, 0), "w0-t1") == full


def test_the_replan_reads_no_clock(monkeypatch):
    """The re-planned size must not time the work that read D_valid: it reads the plan's ETA, never a clock."""
    import time

    plan = fit(plan_of(multiples=(1, 2, 3)), need(plan_of(multiples=(1,))) + 5)
    expected = replan(plan, "w0-t1")

    def clock(*a):
        raise AssertionError("a clock was read")

    for name in ("time", "perf_counter", "monotonic", "process_time", "time_ns", "perf_counter_ns", "monotonic_ns"):
        monkeypatch.setattr(time, name, clock)
    assert replan(plan, "w0-t1") == expected and expected.final_grown


def test_the_help_and_the_docs_say_the_shrink_order():
    from trainers import select as cli

    action = next(a for a in cli.parser()._actions if "--time-budget" in a.option_strings)
    assert screening.shrink_order_text() in " ".join(action.help.split())
    assert len(screening.SHRINK_ORDER) == 4 and "SETTING_PRIORITY" in screening.SHRINK_ORDER[2]


def test_the_plan_says_the_budget_and_whether_it_is_the_default():
    plan = plan_of(multiples=(1,))
    default = fit(plan, screening.DEFAULT_TIME_BUDGET)
    assert screening.DEFAULT_TIME_BUDGET == 3600 and need(plan) <= 3600  # (this plan fits the default as it is)
    assert default.lines(SPEED)[0] == "plan: time budget 1h00m00s (the default; --time-budget 0: no limit)"
    assert screening.budget_record(default)["default"] is True
    assert fit(plan, 7200).lines(SPEED)[0] == "plan: time budget 2h00m00s (--time-budget 7200; --time-budget 0: no limit)"


# ---------------------------------------------------------------------- end to end on the fake model


@pytest.fixture
def fake_setup(tmp_path, monkeypatch):
    from dpsynth.generate import model_info
    from tests.generate.fakes import load_fake_bundle, write_fake_model_dir

    model = write_fake_model_dir(str(tmp_path / "model"), max_len=12)
    ledger = PrivacyLedger(delta=1e-5, target_epsilon=3.0)  # a report with |D_train| = 20
    ledger.record_dpsgd(sampling_probability=0.05, noise_multiplier=1.0, steps=100, clip_norm=1.0, dataset_size=20)
    report_lib.write_report(model, report_lib.build_report(ledger, training={"mode": "lora", "dataset_size": 20},
                                                           contamination_sha256=None, max_tokens_per_example=12))
    monkeypatch.setattr(model_info, "load_bundle", load_fake_bundle)  # (the CLI's loader, looked up at call time)
    valid = tmp_path / "valid.jsonl"
    valid.write_text("".join(json.dumps(r) + "\n" for r in make_records(30, 7)))
    common = ["--model", model, "--valid", str(valid), "--temperatures", "1", "--guidance", "0,1.5",
              "--max-epochs", "1", "--seed", "0", "--max-len", "12", "--gen-batch-size", "4"]
    return tmp_path, common


def lines(path):
    return open(path).read().splitlines()


def test_screening_end_to_end_releases_the_winner_at_the_size_asked_for(fake_setup, capsys):
    from trainers import select as cli

    tmp_path, common = fake_setup
    out = str(tmp_path / "synth")
    assert cli.main(common + ["--out", out, "--multiples", "1,2", "--screen-size", "16"]) == 0
    got = capsys.readouterr()
    summary = json.loads(got.out.strip().splitlines()[-1])
    # The plan came first: 2 settings x (16 + 2) screened, the winner at 2 x 20 (+ 4 valid), 2 candidates.
    assert "plan: screening 2 sampling settings at 16 train examples each: 36 examples" in got.err
    assert "the winner at full size: 44 examples (40 train + 4 valid)" in got.err and "plan: ETA" in got.err
    assert got.err.index("plan: ETA") < got.err.index("select: screening generation")
    progress = [line for line in got.err.splitlines() if line.startswith(("select: screening generation",
                                                                          "select: the winner at full size"))]
    assert progress and all("example/s" in line and "ETA" in line for line in progress)
    assert progress[-1].startswith("select: the winner at full size: 44/44 example")
    assert summary["candidates"] == 2 and summary["selected"] in ("w0-t1", "w1.5-t1")
    screened = os.path.join(out + ".candidates", screening.SCREEN_DIR)
    assert sorted(os.listdir(screened)) == ["w0-t1", "w1.5-t1"]
    assert all(len(lines(os.path.join(screened, d, "train.jsonl"))) == 16 for d in os.listdir(screened))
    # The release: the size asked for (the largest multiple), generated with the winner's setting.
    assert len(lines(os.path.join(out, "train.jsonl"))) == 40 and len(lines(os.path.join(out, "valid.jsonl"))) == 4
    sel = json.load(open(os.path.join(out, dp_select.SELECTION_FILE)))
    w = 1.5 if summary["selected"] == "w1.5-t1" else 0.0
    assert sel["selected"] == summary["selected"] and sel["candidates"] == ["w0-t1", "w1.5-t1"]
    assert sel["screening"]["released_setting"] == {"guidance": w, "temperature": 1.0}
    assert sel["screening"]["released_train_size"] == 40 and "no further privacy cost" in sel["screening"]["privacy"]
    assert sel["screening"]["released_multiple"] == 2.0 and sel["screening"]["multiples_asked"] == [1.0, 2.0]
    budget = sel["screening"]["time_budget"]
    assert {k: budget[k] for k in ("seconds", "default", "shrunk")} == {"seconds": 3600.0, "default": True,
                                                                       "shrunk": []}  # (nothing shrank)
    probe = sel["screening"]["probe"]
    assert 0 < probe["probe_seconds"] == budget["probe_seconds_included"] <= budget["eta_seconds"] <= 3600
    assert sel["screening"]["plan"] == {"screen_size": 16, "screening_examples": 36, "final_examples": 44,
                                        "examples": 80, "trainings": 4, "max_tokens": 80 * 12}
    assert set(sel["screening"]["probe"]["examples_per_second"]) == {"unguided", "guided"}
    gen = json.load(open(os.path.join(out, "generation_config.json")))
    assert gen["num_examples"] == {"train": 40, "valid": 4}
    assert gen["sampler"]["guidance"] == w and gen["sampler"]["temperature"] == 1.0
    assert sel["screening"]["released_dir"] == os.path.abspath(os.path.join(out + ".candidates", screening.FINAL_DIR,
                                                                            summary["selected"]))


def test_the_release_privacy_report_is_the_full_size_paths(fake_setup, capsys):
    """Same grid (one multiple: the same candidates), same epsilon: screened or not, the release's
    ledger, epsilon, delta and composition are the same (the full-size generation spends nothing)."""
    from trainers import select as cli

    tmp_path, common = fake_setup
    a, b = str(tmp_path / "screened"), str(tmp_path / "full")
    assert cli.main(common + ["--out", a, "--multiples", "1", "--screen-size", "20", "--epsilon", "2"]) == 0
    assert cli.main(common + ["--out", b, "--multiples", "1", "--screen-size", "0", "--epsilon", "2"]) == 0
    capsys.readouterr()
    ra, rb = report_lib.load_report(a), report_lib.load_report(b)

    def ledger(r):
        return [{k: v for k, v in e.items() if k != "run"} for e in r["ledger"]["entries"]]

    assert ledger(ra) == ledger(rb) and ledger(ra)[-1]["epsilon"] == 2.0
    assert ra["epsilon"] == rb["epsilon"] and ra["delta"] == rb["delta"]
    for key in ("composition", "epsilon_by_dataset", "epsilon_tuning", "mechanism", "epsilon"):
        assert ra["selection"][key] == rb["selection"][key]
    assert "screening" not in json.load(open(os.path.join(b, dp_select.SELECTION_FILE)))
    # The full-size path released a candidate as it was (20 = 1 x |D_train|); the screened path, a new one of that size.
    assert len(lines(os.path.join(a, "train.jsonl"))) == len(lines(os.path.join(b, "train.jsonl"))) == 20


def test_dry_run_prints_the_plan_writes_nothing_and_reads_no_valid(fake_setup, capsys):
    from trainers import select as cli

    tmp_path, common = fake_setup
    out = str(tmp_path / "synth")
    argv = [a if a != str(tmp_path / "valid.jsonl") else str(tmp_path / "absent.jsonl") for a in common]
    assert cli.main(argv + ["--out", out, "--multiples", "1,3", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert f"at {screening.DEFAULT_SCREEN_SIZE:,} train examples each" in err and "60 train + 6 valid" in err
    assert not os.path.exists(out) and not os.path.exists(out + ".candidates") and not os.path.exists(out + ".private")


def test_time_budget_on_the_command_line(fake_setup, monkeypatch, capsys):
    from trainers import select as cli

    tmp_path, common = fake_setup
    monkeypatch.setattr(screening, "probe", lambda *a, **k: (SPEED, 12))  # (a slow machine, by hand)
    out = str(tmp_path / "synth")
    assert cli.main(common + ["--out", out, "--multiples", "1", "--time-budget", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("dpsynth select: error: --time-budget 1 s") and "nothing fits" in err[-1]
    assert err[-1].endswith("(--time-budget 0: no limit)") and not os.path.exists(out)  # refused: nothing left
    err = err[-1:]
    # The plan is fixed before D_valid is read (absent here): the budget's choice is data-independent.
    common = [a if a != str(tmp_path / "valid.jsonl") else str(tmp_path / "absent.jsonl") for a in common]
    # --dry-run: the plan asked for, with its ETA, then the same one-line refusal
    assert cli.main(common + ["--out", out, "--multiples", "1", "--time-budget", "1", "--dry-run"]) == 2
    dry = capsys.readouterr().err.strip().splitlines()
    assert dry[-1] == err[0] and len(dry) > 1 and all(d.startswith("dpsynth select: ") for d in dry)
    assert any("ETA" in d or "eta" in d.lower() for d in dry[:-1])
    # 2 settings (1 guided) screened at n: 2 x 10 + 1.1 n / 100 + 1.1 n / 50 + 2 x 2 x 0.01 n, + 10 + 22 / 50 final.
    assert cli.main(common + ["--out", out, "--multiples", "1", "--time-budget", "100", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "plan: time budget 1m40s (--time-budget 100; --time-budget 0: no limit)" in err
    n = int(err.split("sampling settings at ")[1].split(" train")[0].replace(",", ""))
    assert screening.MIN_SCREEN_SIZE <= n < screening.DEFAULT_SCREEN_SIZE
    def total(k):
        return 2 * 10 + (k + round(0.1 * k)) * (1 / 100 + 1 / 50) + 2 * 2 * 0.01 * k + 10 + 22 / 50

    assert total(n) <= 100 < total(n + 1)  # the largest size that fits
    # The default budget applies without the flag; 0 lifts it (the same plan as asked, whatever its ETA).
    assert cli.main(common + ["--out", out, "--multiples", "1", "--dry-run"]) == 0
    assert "plan: time budget 1h00m00s (the default; --time-budget 0: no limit)" in capsys.readouterr().err
    assert cli.main(common + ["--out", out, "--multiples", "1", "--time-budget", "0", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "plan: no time budget (--time-budget 0)" in err and "at 2,000 train examples each:" in err
    assert cli.main(["--candidates", out, "--valid", "v", "--out", out, "--time-budget", "5"]) == 2
    assert "apply with --model" in capsys.readouterr().err


    def no_probe(*a, **k):
        raise AssertionError("probed")

    monkeypatch.setattr(screening, "probe", no_probe)  # a bad budget is refused before the probe, in one line
    assert cli.main(common + ["--out", out, "--time-budget", "-5", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["dpsynth select: error: --time-budget must be >= 0 seconds (0: no limit), got -5"]
    # A --valid that is not there is said before the probe, in one line, and nothing is left behind.
    assert cli.main(common + ["--out", out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("dpsynth select: error: ") and "absent.jsonl: no such file" in err[-1]
    assert not os.path.exists(out) and not os.path.exists(out + ".candidates")


def test_a_shrunk_grid_is_one_gaussian_selection_calibrated_on_the_kept_candidates(fake_setup, monkeypatch, capsys):
    """--time-budget drops settings: the kept ones alone are screened and scored, the Gaussian selection's
    sigma is calibrated on their number, and the plan that fixes it is made before D_valid is read."""
    from dpsynth.data import dead_letters
    from dpsynth.dp import private_selection as ps
    from dpsynth.evaluate import corpora
    from trainers import select as cli

    tmp_path, common = fake_setup
    events = []

    def probe(*a, **k):
        events.append("probe")
        return SPEED, 12

    def reading(fn):
        def read(*a, **k):
            events.append("D_valid")
            return fn(*a, **k)
        return read

    monkeypatch.setattr(screening, "probe", probe)
    monkeypatch.setattr(corpora, "read_real", reading(corpora.read_real))
    monkeypatch.setattr(dead_letters, "read_checked", reading(dead_letters.read_checked))
    tpc = screening.trainings_per_candidate(dp_select.SelectConfig(max_epochs=1))
    # The budget of the 2 settings kept last (w 0 and w 1.5 at t 1), made directly: 4 asked cannot fit it.
    two = screening.make_plan(dp_select.candidate_grid((0.0, 1.5), (1.0,), (1.0,)), dataset_size=20, valid_fraction=0.1,
                              screen_size=16, trainings_per_candidate=tpc, max_len=12).seconds(SPEED)["total"]
    out = str(tmp_path / "synth")
    assert cli.main(common + ["--out", out, "--guidance", "0,1.5,3,6", "--multiples", "1", "--screen-size", "16",
                              "--time-budget", repr(two), "--mechanism", "gaussian"]) == 0
    got = capsys.readouterr()
    assert events[0] == "probe" and "D_valid" in events  # the plan (and its candidate count) before D_valid
    assert "plan: shrunk to fit --time-budget" in got.err and "screening 2 of 4 sampling settings" in got.err
    summary = json.loads(got.out.strip().splitlines()[-1])
    assert summary["candidates"] == 2
    assert sorted(os.listdir(os.path.join(out + ".candidates", screening.SCREEN_DIR))) == ["w0-t1", "w1.5-t1"]
    sel = json.load(open(os.path.join(out, dp_select.SELECTION_FILE)))
    assert sel["candidates"] == ["w0-t1", "w1.5-t1"]
    settings = [s for s in sel["screening"]["time_budget"]["shrunk"] if s["what"] == "settings"]
    assert settings == [{"what": "settings", "asked": ["w0-t1", "w1.5-t1", "w3-t1", "w6-t1"],
                         "kept": ["w0-t1", "w1.5-t1"], "dropped": ["w3-t1", "w6-t1"],
                         "order": "dp_select.SETTING_PRIORITY"}]
    entry = report_lib.load_report(out)["ledger"]["entries"][-1]
    mech = ps.DpSelection(epsilon=1.0, mechanism=ps.GAUSSIAN, delta=1e-5)
    assert entry["mechanism"] == "gaussian" and entry["count"] == 2 and entry["dataset"] == ps.VALID
    assert entry["noise_multiplier"] == pytest.approx(mech.noise_multiplier(2), rel=1e-12)
    assert mech.noise_multiplier(2) < mech.noise_multiplier(4)  # (calibrated on the grid asked, it would differ)


def test_the_time_budget_default_is_in_the_help():
    from trainers import select as cli

    action = next(a for a in cli.parser()._actions if "--time-budget" in a.option_strings)
    assert f"default {screening.DEFAULT_TIME_BUDGET} = one hour; 0: no limit" in action.help


def test_select_budget_replan_grows_an_unguided_winners_release(fake_setup, monkeypatch, capsys):
    """The plan counts the final at the guided (slowest) rate; the DP choice is the unguided setting, whose
    rate leaves time: the released corpus grows to the largest size that fits, within the size asked."""
    from dpsynth.dp import private_selection as ps
    from dpsynth.progress import format_duration
    from trainers import select as cli

    tmp_path, common = fake_setup
    speed = screening.Speed(examples_per_second={False: 2.0, True: 1.0}, job_overhead_seconds=1.0, mean_tokens=8.0,
                            classifier_seconds_per_example=0.001)
    monkeypatch.setattr(screening, "probe", lambda *a, **k: (speed, 12))  # (the rates, by hand)
    monkeypatch.setattr(ps.DpSelection, "choose", lambda self, scores, rng: 0)  # (the first candidate: w0-t1)
    tpc = screening.trainings_per_candidate(dp_select.SelectConfig(max_epochs=1))
    plan = screening.make_plan(dp_select.candidate_grid((0.0, 1.5), (1.0,), (1.0, 3.0)), dataset_size=20,
                               valid_fraction=0.1, screen_size=16, trainings_per_candidate=tpc, max_len=12)
    eta = plan.seconds(speed)
    spent = eta["probe"] + eta["screening"] + eta["classifiers"]
    budget = spent + 1.0 + 22 / 1.0 + 0.5  # 1x (20 + 2) fits at the guided rate, 3x (60 + 6) does not
    out = str(tmp_path / "synth")
    assert cli.main(common + ["--out", out, "--multiples", "1,3", "--screen-size", "16",
                              "--time-budget", repr(budget)]) == 0
    got = capsys.readouterr()
    assert json.loads(got.out.strip().splitlines()[-1])["selected"] == "w0-t1"
    assert "22 examples (20 train + 2 valid; shrunk from 60 train examples" in got.err  # the plan, at the guided rate
    # The winner's rate, 2 example/s, in the 22.5 s left after the job's load: n + round(n / 10) <= 45.
    n = max(k for k in range(20, 61) if k + round(0.1 * k) <= 2.0 * (budget - spent - 1.0))
    assert n == 41
    left = format_duration(budget - spent)  # (23.5 s: the final's load and its 45 examples)
    assert (f"dpsynth select: plan: the winner (w0-t1, unguided, 2 example/s) leaves {left}: its final corpus grows "
            f"from 20 to 41 train examples (2.05x |D_train|)") in got.err.splitlines()
    assert len(lines(os.path.join(out, "train.jsonl"))) == 41 and len(lines(os.path.join(out, "valid.jsonl"))) == 4
    sel = json.load(open(os.path.join(out, dp_select.SELECTION_FILE)))["screening"]
    assert sel["released_train_size"] == 41 and sel["released_valid_size"] == 4
    assert sel["released_multiple"] == pytest.approx(41 / 20)
    rec = sel["time_budget"]["replan"]
    assert {k: rec[k] for k in ("setting", "guided", "train_size_asked", "train_size_planned", "train_size_replanned",
                                "grown", "examples_per_second")} == {
        "setting": "w0-t1", "guided": False, "train_size_asked": 60, "train_size_planned": 20,
        "train_size_replanned": 41, "grown": True, "examples_per_second": 2.0}
    assert rec["spent_seconds_eta"] == pytest.approx(spent)
    assert sel["time_budget"]["eta_seconds"] <= budget
    # The re-planned size reads no timing of the work on D_valid: a D_valid 4x larger, the same release.
    bigger = tmp_path / "valid_big.jsonl"
    bigger.write_text("".join(json.dumps(r) + "\n" for r in make_records(120, 8)))
    argv = [a if a != str(tmp_path / "valid.jsonl") else str(bigger) for a in common]
    out2 = str(tmp_path / "synth2")
    assert cli.main(argv + ["--out", out2, "--multiples", "1,3", "--screen-size", "16",
                            "--time-budget", repr(budget)]) == 0
    capsys.readouterr()
    assert len(lines(os.path.join(out2, "train.jsonl"))) == 41
