"""`dpsynth privacy` calculator: JSON output, calibration, clear errors."""

import json

import pytest

from dpsynth.dp import accounting, calculator


def run(capsys, *argv):
    rc = calculator.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_epsilon_from_noise_multiplier_json(capsys):
    rc, out, _ = run(capsys, "--dataset-size", "3600", "--batch-size", "1024", "--steps", "30",
                     "--noise-multiplier", "2.0", "--delta", "1e-4", "--json")
    assert rc == 0
    result = json.loads(out)
    q = 1024 / 3600
    assert result["epsilon_rdp"] == accounting.epsilon(q, 30, 2.0, 1e-4, "rdp")
    assert result["epsilon_pld"] == accounting.epsilon(q, 30, 2.0, 1e-4, "pld")
    for key in ("dataset_size", "batch_size", "steps", "epochs", "delta", "noise_multiplier", "sampling_probability"):
        assert key in result


def test_calibrated_noise_multiplier_from_epsilon_and_epochs(capsys):
    rc, out, _ = run(capsys, "--dataset-size", "1000", "--batch-size", "100", "--epochs", "2",
                     "--epsilon", "3", "--json")
    assert rc == 0
    result = json.loads(out)
    assert result["steps"] == 20 and result["delta"] == pytest.approx(1e-3)
    assert result["epsilon_rdp"] <= 3.0 and result["epsilon_rdp"] > 2.95
    assert result["noise_multiplier"] == pytest.approx(
        accounting.calibrate_noise_multiplier(3.0, 1e-3, 0.1, 20), rel=1e-6)


def test_text_output(capsys):
    rc, out, _ = run(capsys, "--dataset-size", "1000", "--batch-size", "100", "--steps", "10",
                     "--noise-multiplier", "1.0")
    assert rc == 0 and "epsilon (RDP)" in out and "epsilon (PLD)" in out


def test_output_says_which_delta_was_used(capsys):
    rc, out, _ = run(capsys, "--dataset-size", "1000", "--batch-size", "100", "--steps", "10", "--noise-multiplier", "1")
    assert rc == 0 and "delta               0.001  (default 1/N" in out and "weak" in out
    rc, out, _ = run(capsys, "--dataset-size", "1000", "--batch-size", "100", "--steps", "10", "--noise-multiplier", "1",
                     "--delta", "1e-6", "--json")
    assert rc == 0 and json.loads(out)["delta"] == 1e-6 and json.loads(out)["delta_source"] == "given"


def test_same_numbers_as_the_privacy_plan(capsys):
    from dpsynth.dp.plan import plan_privacy

    rc, out, _ = run(capsys, "--dataset-size", "3600", "--batch-size", "1024", "--epochs", "10", "--epsilon", "3",
                     "--json")
    plan = plan_privacy(dataset_size=3600, expected_batch_size=1024, epochs=10, epsilon=3.0)
    result = json.loads(out)
    assert rc == 0 and result["noise_multiplier"] == plan.noise_multiplier and result["steps"] == plan.steps


@pytest.mark.parametrize("argv,msg", [
    (["--epsilon", "0"], "epsilon must be > 0"),
    (["--epsilon", "-1"], "epsilon must be > 0"),
    (["--epsilon", "1", "--delta", "1.5"], "delta"),
    (["--epsilon", "1", "--delta", "0"], "delta"),
    (["--epsilon", "1e-5"], "unreachable"),
])
def test_clear_errors(capsys, argv, msg):
    rc, _, err = run(capsys, "--dataset-size", "1000", "--batch-size", "1000", "--steps", "100000", *argv)
    assert rc == 2 and msg in err


def test_user_level(capsys):
    rc, out, _ = run(capsys, "--privacy-unit", "user", "--num-users", "600", "--batch-size", "60", "--steps", "40",
                     "--noise-multiplier", "1.2", "--json")
    assert rc == 0
    result = json.loads(out)
    assert result["privacy_unit"] == "user" and result["dataset_size"] == 600 and result["num_users"] == 600
    assert result["delta"] == pytest.approx(1 / 600) and "one user" in result["adjacency"]
    assert result["epsilon_pld"] == accounting.epsilon(0.1, 40, 1.2, 1 / 600, "pld")
    rc, out, _ = run(capsys, "--privacy-unit", "user", "--num-users", "600", "--batch-size", "60", "--steps", "40",
                     "--noise-multiplier", "1.2")
    assert rc == 0 and "600 users" in out and "add-or-remove one user" in out
    rc, _, err = run(capsys, "--privacy-unit", "user", "--batch-size", "60", "--steps", "40", "--epsilon", "1")
    assert rc == 2 and "--num-users" in err


def test_bandmf(capsys):
    rc, out, _ = run(capsys, "--dataset-size", "1000", "--batch-size", "20", "--steps", "100", "--mechanism", "bandmf",
                     "--bands", "5", "--noise-multiplier", "1.0", "--json")
    assert rc == 0
    result = json.loads(out)
    assert result["mechanism"] == "bandmf" and result["bands"] == 5 and result["sampling_probability"] == 0.1
    assert result["epsilon_rdp"] == accounting.epsilon(0.1, 20, 1.0, 1e-3, "rdp")  # ceil(100 / 5) participations
    rc, _, err = run(capsys, "--dataset-size", "1000", "--batch-size", "300", "--steps", "100", "--mechanism",
                     "bandmf", "--bands", "5", "--noise-multiplier", "1.0")
    assert rc == 2 and "floor(N / b)" in err


def test_example_level_run_seen_per_user(capsys):
    args = ["--dataset-size", "2000", "--batch-size", "40", "--steps", "30", "--noise-multiplier", "1.0", "--json"]
    _, out1, _ = run(capsys, *args, "--max-examples-per-user", "1")
    _, out4, _ = run(capsys, *args, "--max-examples-per-user", "4")
    one, four = json.loads(out1), json.loads(out4)
    # One row per person: the same mechanism as example level; four rows: a larger epsilon.
    assert one["epsilon_per_user_pld"] == pytest.approx(one["epsilon_pld"], rel=2e-3)
    assert four["epsilon_per_user_pld"] > 2 * four["epsilon_pld"]


def test_a_large_delta_is_refused_one_line_and_allowed_with_a_weak_headline(capsys):
    argv = ("--dataset-size", "300", "--batch-size", "30", "--steps", "100", "--epsilon", "3", "--delta", "0.5")
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("dpsynth privacy: error: delta 0.5 is above 1/N = 1/300 examples")
    rc, out, _ = run(capsys, *argv, "--allow-large-delta")
    assert rc == 0 and out.splitlines()[0].startswith("WEAK DELTA: delta 0.5 is above 1/N = 1/300 examples")
    rc, out, _ = run(capsys, *argv, "--allow-large-delta", "--json")
    assert rc == 0 and "WEAK DELTA" in json.loads(out)["delta_warning"]
    rc, out, _ = run(capsys, *argv[:-2])  # the default delta: no warning
    assert rc == 0 and "WEAK" not in out


def test_reserved_selection_matches_the_tuners_plan(capsys):
    """`--reserve-selection-epsilon`: the same sigma as `dp-tune` with the same reservation, the run alone
    below the target, the run and the reserved selection together at it; PLD refused in one line."""
    from dpsynth.train.tune_config import TuneConfig, plan_run

    argv = ["--dataset-size", "4036", "--batch-size", "234.5", "--steps", "100", "--epsilon", "3", "--json"]
    assert calculator.main(argv + ["--reserve-selection-epsilon", "0.3"]) == 0
    out = json.loads(capsys.readouterr().out)
    plan = plan_run(TuneConfig(batch_size=234.5, steps=100, reserve_selection_epsilon=0.3), 4036)
    assert out["noise_multiplier"] == plan.noise_multiplier
    assert out["epsilon_rdp"] < 2.9 and 2.99 <= out["epsilon_with_reserved_rdp"] <= 3.0
    assert calculator.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["noise_multiplier"] < plan.noise_multiplier
    assert calculator.main(argv + ["--reserve-selection-epsilon", "0.3", "--accountant", "pld"]) == 2
    assert "RDP accountant only" in capsys.readouterr().err
