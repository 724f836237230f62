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
