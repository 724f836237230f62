"""`dpsynth select --model` with screening (dpsynth.evaluate.screening): the plan's counts against
the grid arithmetic, --time-budget shrinking or refusing, and end to end on the fake model: the
released corpus has the size asked for and the winner's setting, its privacy report is the one
the full-size path writes."""

import dataclasses
import json
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
                                                         "train_size_asked": 60_000, "train_size_kept": 40_000}]
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
    assert f"at {both.screen_size:,} train examples each (shrunk from 2,000 to fit the time budget)" in both.lines(SPEED)[1]
    assert [s["what"] for s in screening.budget_record(both)["shrunk"]] == ["multiples", "screen_size"]
    # Never below the smallest multiple asked: --multiples 2,3 stops at 2x (and shrinks the screening).
    two_three = fit(plan_of(multiples=(2, 3)), two - 1)
    assert two_three.final_multiple == 2 and two_three.screen_size < 2000


def test_time_budget_refuses_in_one_line_saying_what_fits():
    plan = plan_of()
    smallest = need(plan_of(multiples=(1,), screen_size=screening.MIN_SCREEN_SIZE))
    with pytest.raises(screening.BudgetError, match="what fits is a final corpus of about") as e:
        fit(plan, smallest - 100)
    msg = str(e.value)
    assert "\n" not in msg and msg.endswith("(--time-budget 0: no limit)")
    assert "even the smallest plan asked for (the final corpus at 1x |D_train| = 20,000 train examples, screening " \
           "at 200 per setting)" in msg and "--multiples 0." in msg
    with pytest.raises(screening.BudgetError, match=r"nothing fits.*\(--time-budget 0: no limit\)$"):
        fit(plan, 5)
    with pytest.raises(screening.BudgetError, match="--screen-size 2000") as e:  # full size: nothing to shrink
        fit(plan_of(screen_size=0), need(plan))
    assert str(e.value).endswith("(--time-budget 0: no limit)")
    with pytest.raises(screening.BudgetError, match=r"must be >= 0 seconds \(0: no limit\), got -1"):
        fit(plan, -1)


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
    assert sel["screening"]["time_budget"] == {"seconds": 3600.0, "default": True, "shrunk": []}  # (nothing shrank)
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


def test_the_time_budget_default_is_in_the_help():
    from trainers import select as cli

    action = next(a for a in cli.parser()._actions if "--time-budget" in a.option_strings)
    assert f"default {screening.DEFAULT_TIME_BUDGET} = one hour; 0: no limit" in action.help
