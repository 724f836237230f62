"""The mechanism registry (`dpsynth.dp.mechanisms`): every mechanism-dependent step dispatches
through it, so a mechanism defined outside the library (full-batch DP-GD, `mechanism_fakes.py`)
is planned, calibrated, accounted, reported and built like the built-in ones."""

import math

import dp_accounting
import numpy as np
import pytest

from dpsynth.dp import accounting, mechanisms
from dpsynth.dp import report as report_lib
from dpsynth.dp.ledger import BudgetExceeded, PrivacyLedger
from dpsynth.dp.mechanisms.run import build_run_mechanism
from dpsynth.dp.plan import plan_privacy
from tests.dp.mechanism_fakes import FullBatchDPGD

N, T = 200, 20


@pytest.fixture
def dpgd():
    with mechanisms.registered(FullBatchDPGD()) as m:
        yield m


def _gaussian_epsilon(sigma: float, steps: int, delta: float, accountant: str) -> float:
    """Reference: T Gaussian mechanisms of noise multiplier sigma are one of sigma / sqrt(T)."""
    acc = accounting.make_accountant(accountant)
    acc.compose(dp_accounting.GaussianDpEvent(sigma / math.sqrt(steps)))
    return acc.get_epsilon(delta)


def test_builtin_registry_and_unknown_names():
    assert mechanisms.names() == ("dpsgd", "bandmf") and mechanisms.DEFAULT == "dpsgd"
    with pytest.raises(accounting.PrivacyConfigError, match="unknown mechanism 'dpgd'; choose one of"):
        mechanisms.get("dpgd")
    with pytest.raises(ValueError, match="taken"):
        mechanisms.register(mechanisms.get("bandmf").__class__())
    with pytest.raises(accounting.PrivacyConfigError, match="unknown mechanism"):
        plan_privacy(dataset_size=N, expected_batch_size=N, steps=T, epsilon=3.0, mechanism="dpgd")


# PLD: ~200 s on 2 cores (a calibration of 2T full-batch steps by bisection); PLD calibration itself is
# in make test through tests/dp/test_accounting.py.
@pytest.mark.parametrize("accountant", ["rdp", pytest.param("pld", marks=pytest.mark.slow)])
def test_a_third_mechanism_is_calibrated_and_accounted_by_its_own_event(dpgd, accountant):
    plan = plan_privacy(dataset_size=N, expected_batch_size=N, steps=T, epsilon=3.0, accountant=accountant,
                        mechanism="dpgd")
    assert plan.sampling_probability == 1.0 and plan.bands == 1 and plan.mechanism == "dpgd"
    eps = _gaussian_epsilon(plan.noise_multiplier, T, plan.delta, accountant)
    assert eps <= 3.0 * (1 + 1e-6) and eps == pytest.approx(3.0, abs=2e-3)  # calibrated tight, by the reference
    assert plan.epsilons()[accountant] == pytest.approx(eps, rel=1e-9)
    # Two compositions: the same T-step runs twice, i.e. 2T Gaussian steps.
    two = plan_privacy(dataset_size=N, expected_batch_size=N, steps=T, epsilon=3.0, accountant=accountant,
                       mechanism="dpgd", compositions=2)
    assert _gaussian_epsilon(two.noise_multiplier, 2 * T, two.delta, accountant) == pytest.approx(3.0, abs=2e-3)
    with pytest.raises(accounting.PrivacyConfigError, match="every unit"):
        plan_privacy(dataset_size=N, expected_batch_size=N / 2, steps=T, epsilon=3.0, mechanism="dpgd")
    with pytest.raises(accounting.PrivacyConfigError, match="bands is a BandMF setting"):
        plan_privacy(dataset_size=N, expected_batch_size=N, steps=T, epsilon=3.0, mechanism="dpgd", bands=2)


def test_a_third_mechanism_in_the_ledger_and_reports(dpgd):
    plan = plan_privacy(dataset_size=N, expected_batch_size=N, steps=T, epsilon=2.0, mechanism="dpgd")
    ledger = PrivacyLedger(delta=plan.delta, target_epsilon=2.0)
    ledger.check_budget([plan.ledger_entry(steps=T, clip_norm=1.0)])
    for _ in range(T):
        ledger.record_steps(plan.ledger_entry(steps=1, clip_norm=1.0))
    assert len(ledger.entries) == 1 and ledger.steps_recorded == T and ledger.entries[0]["mechanism"] == "dpgd"
    assert ledger.epsilon() == pytest.approx(_gaussian_epsilon(plan.noise_multiplier, T, plan.delta, "rdp"), rel=1e-9)
    with pytest.raises(BudgetExceeded):
        ledger.check_budget([plan.ledger_entry(steps=T, clip_norm=1.0)])  # twice the steps: over budget
    rep = report_lib.build_report(ledger, training={"mode": "lora"}, contamination_sha256=None,
                                  mechanism={"name": "dpgd"})
    md = report_lib.render_markdown(rep)
    assert rep["mechanism"] == "dpgd" and f"{T} full-batch DP-GD steps" in md and "| mechanism | full-batch DP-GD |" in md
    again = PrivacyLedger.from_json(ledger.to_json())  # a saved ledger reloads through the registry
    assert again.epsilons() == ledger.epsilons()


def test_a_third_mechanism_builds_its_run(dpgd):
    plan = plan_privacy(dataset_size=N, expected_batch_size=N, steps=T, epsilon=2.0, mechanism="dpgd")
    run = build_run_mechanism(plan, clip_norm=0.5, microbatch_size=64, seed=1, num_rows=N)
    mbs = run.batches.microbatches(3)
    assert [len(m) for m in mbs] == [64] * 4 and sorted(np.concatenate(mbs)[np.concatenate(mbs) >= 0]) == list(range(N))
    assert run.strategy.noise_multiplier == plan.noise_multiplier and run.strategy.clip_norm == 0.5
    assert run.ledger_entry(1)["mechanism"] == "dpgd" and run.strategy_sha256 is None
    assert run.report_kwargs()["mechanism"] == {"name": "dpgd"}
    assert run.training_fields() == {"mechanism": "dpgd", "privacy_unit": "example"}


def test_configs_accept_exactly_the_registered_mechanisms(dpgd):
    from dpsynth.experiment.config import ConfigError, from_dict
    from dpsynth.train.tune_config import TuneConfig, TuneError

    TuneConfig(mechanism="dpgd", batch_size=N)
    with pytest.raises(TuneError, match="--bands: is a BandMF setting"):
        TuneConfig(mechanism="dpgd", bands=2)
    cfg = {"sensitive": {"embedded": True}, "public": {"embedded": True}, "dp_tune": {"mechanism": "dpgd"}}
    assert from_dict(cfg).dp_tune.mechanism == "dpgd"
    mechanisms.REGISTRY.pop("dpgd")
    try:
        with pytest.raises(TuneError, match="mechanism must be one of"):
            TuneConfig(mechanism="dpgd")
        with pytest.raises(ConfigError, match="dp_tune.mechanism"):
            from_dict(cfg)
    finally:
        mechanisms.register(dpgd)


def test_the_sparse_embedding_strategy_comes_from_the_mechanism_and_the_tuner_builds_none_itself(dpgd):
    """The tuner dispatches through the registry (issue 36): no mechanism's strategy class is named in it."""
    import ast
    import pathlib

    from dpsynth.dp.strategy import DPSGDStrategy

    plan = plan_privacy(dataset_size=N, expected_batch_size=64, steps=T, epsilon=2.0)
    got = mechanisms.get("dpsgd").sparse_embedding_strategy(plan, clip_norm=0.5, embedding="spec")
    assert isinstance(got, DPSGDStrategy) and got.embedding == "spec" and got.clip_norm == 0.5
    assert got.noise_multiplier == plan.noise_multiplier and got.expected_batch_size == plan.expected_batch_size
    for name in mechanisms.names():
        if not mechanisms.get(name).supports_sparse_embedding:
            with pytest.raises(NotImplementedError):
                mechanisms.get(name).sparse_embedding_strategy(plan, clip_norm=0.5, embedding="spec")
    train = pathlib.Path(__file__).resolve().parents[2] / "dpsynth" / "train"
    for tuner in [train / "finetune.py", *sorted(train.glob("tune_*.py"))]:  # the tuner and its modules
        names = {n.id for n in ast.walk(ast.parse(tuner.read_text())) if isinstance(n, ast.Name)}
        names |= {a.name for n in ast.walk(ast.parse(tuner.read_text())) if isinstance(n, ast.ImportFrom)
                  for a in n.names}
        assert not names & {"DPSGDStrategy", "UserDPSGDStrategy", "BandMFStrategy"}, tuner.name
