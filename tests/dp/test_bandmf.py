"""BandMF: B = 1 is DP-SGD, noise covariance = the strategy's, calibration, cache, cyclic sampling, exact resume."""

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax_privacy import accounting as jp_accounting

from dpsynth.dp import accounting, bandmf
from dpsynth.dp.ledger import PrivacyLedger
from dpsynth.dp.plan import plan_privacy
from dpsynth.dp.strategy import DPSGDStrategy
from dpsynth.train import core
from tests.dp.test_clipping import make, toy_loss


def noise_sequence(strategy, params, steps, key=0):
    """The noise the strategy adds at steps 0..steps-1 (zero gradients), before division."""
    state = strategy.init_noise_state(params, jax.random.PRNGKey(key))
    acc = strategy.init_accumulator(params)
    out = []
    for _ in range(steps):
        noisy, state = jax.jit(strategy.noisy_sum)(acc, state)
        out.append(noisy)
    return out


def test_one_band_is_dpsgd_noise_and_epsilon():
    assert bandmf.optimized_coefs(50, 1).tolist() == [1.0]
    strat = bandmf.BandMFStrategy(clip_norm=0.7, noise_multiplier=1.3, expected_batch_size=10.0, coefs=(1.0,), steps=4)
    params = {"w": jnp.zeros((100, 100))}
    seq = np.stack([np.asarray(n["w"]).ravel() for n in noise_sequence(strat, params, 4)])
    # iid N(0, (sigma C)^2) per step, uncorrelated across steps: the DP-SGD distribution.
    np.testing.assert_allclose(seq.std(axis=1), 1.3 * 0.7, rtol=0.03)
    corr = np.corrcoef(seq)
    assert np.all(np.abs(corr - np.eye(4)) < 0.05)
    dpsgd = DPSGDStrategy(clip_norm=0.7, noise_multiplier=1.3, expected_batch_size=10.0)
    ref = np.asarray(dpsgd.noisy_sum(dpsgd.init_accumulator(params), jax.random.PRNGKey(3))["w"]).ravel()
    assert abs(ref.std() - seq[0].std()) < 0.03 * 1.3 * 0.7
    # Same epsilon and same calibrated sigma as DP-SGD.
    for kw in ({"noise_multiplier": 1.1}, {"epsilon": 2.0}):
        a = plan_privacy(dataset_size=1000, expected_batch_size=50, steps=60, mechanism="bandmf", bands=1, **kw)
        b = plan_privacy(dataset_size=1000, expected_batch_size=50, steps=60, **kw)
        assert a.noise_multiplier == b.noise_multiplier and a.sampling_probability == b.sampling_probability
        assert a.epsilons() == b.epsilons()


def test_noise_covariance_across_steps_matches_the_strategy(tmp_path):
    n, bands, sigma, c = 6, 3, 0.8, 1.5
    coefs = bandmf.optimized_coefs(n, bands, directory=str(tmp_path))
    strat = bandmf.BandMFStrategy(clip_norm=c, noise_multiplier=sigma, expected_batch_size=1.0,
                                  coefs=tuple(coefs), steps=n)
    params = {"a": jnp.zeros((200, 150)), "b": jnp.zeros((30000,))}
    seq = noise_sequence(strat, params, n, key=5)
    x = np.stack([np.concatenate([np.asarray(s["a"]).ravel(), np.asarray(s["b"])]) for s in seq])  # [n, 60000]
    emp = x @ x.T / x.shape[1]
    cinv = np.linalg.inv(bandmf.strategy_matrix(n, coefs))
    expected = (sigma * c) ** 2 * cinv @ cinv.T
    assert not np.allclose(expected, np.diag(np.diag(expected)), atol=0.05)  # really correlated
    np.testing.assert_allclose(emp, expected, atol=0.03 * (sigma * c) ** 2 * np.max(np.diag(cinv @ cinv.T)))
    # The strategy is b-banded with unit columns (what the accounting assumes).
    cm = bandmf.strategy_matrix(n, coefs)
    np.testing.assert_allclose(np.linalg.norm(cm, axis=0), 1.0)
    assert np.all(np.tril(cm, -bands) == 0) and np.all(np.triu(cm, 1) == 0)


def test_clipped_sum_is_dpsgds():
    params, frozen, batch = make(3)
    coefs = (0.8, 0.6)
    strat = bandmf.BandMFStrategy(clip_norm=0.4, noise_multiplier=1.0, expected_batch_size=3.0, coefs=coefs, steps=8)
    ref = DPSGDStrategy(clip_norm=0.4, noise_multiplier=1.0, expected_batch_size=3.0)
    key = jax.random.PRNGKey(1)
    a, _ = strat.accumulate(toy_loss, params, frozen, batch, key, strat.init_accumulator(params))
    b, _ = ref.accumulate(toy_loss, params, frozen, batch, key, ref.init_accumulator(params))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(TypeError):
        strat.finalize(a, params, key)
    with pytest.raises(ValueError):
        bandmf.BandMFStrategy(clip_norm=1.0, noise_multiplier=1.0, expected_batch_size=1.0, coefs=(0.5, 0.9), steps=8)


@pytest.mark.parametrize("bands,target", [(4, 2.0), pytest.param(8, 6.0, marks=pytest.mark.slow)])
def test_calibration_meets_target_and_equals_jax_privacy(bands, target):
    n_units, batch, steps = 4000, 25, 160
    plan = plan_privacy(dataset_size=n_units, expected_batch_size=batch, steps=steps, epsilon=target,
                        mechanism="bandmf", bands=bands, accountant="pld")
    eps = plan.epsilons()["pld"]
    assert eps <= target * (1 + 1e-6) and eps >= target * 0.99
    assert plan.sampling_probability == batch / (n_units // bands)
    config = jp_accounting.PldAccountantConfig(value_discretization_interval=accounting.PLD_DISCRETIZATION)
    jp = jp_accounting.DpsgdTrainingAccountant(config)
    params = jp_accounting.DpParams(noise_multipliers=plan.noise_multiplier, num_samples=n_units, delta=plan.delta,
                                    batch_size=batch, cycle_length=bands)
    assert eps == pytest.approx(jp.compute_epsilon(steps, params), rel=1e-9)
    jp_sigma = jp_accounting.calibrate_noise_multiplier(
        target_epsilon=target, accountant=jp, batch_sizes=batch, num_updates=steps, num_samples=n_units,
        target_delta=plan.delta, cycle_length=bands, tol=1e-4)
    assert plan.noise_multiplier == pytest.approx(jp_sigma, rel=2e-3)
    # Ledger entries of the plan are accounted identically (steps recorded one at a time, merged).
    ledger = PrivacyLedger(delta=plan.delta, target_epsilon=target, accountant="pld")
    for _ in range(steps):
        ledger.record_steps(plan.ledger_entry(steps=1, clip_norm=1.0, strategy_sha256="ab" * 32))
    assert ledger.steps_recorded == steps and len(ledger.entries) == 1
    assert ledger.epsilon() == pytest.approx(eps, rel=1e-12)
    ledger.check_budget()


def test_plan_refuses_bad_bandmf():
    from dpsynth.dp.accounting import PrivacyConfigError

    with pytest.raises(PrivacyConfigError, match="floor"):
        plan_privacy(dataset_size=100, expected_batch_size=30, steps=50, epsilon=1.0, mechanism="bandmf", bands=4)
    with pytest.raises(PrivacyConfigError, match="exceed"):
        plan_privacy(dataset_size=100, expected_batch_size=3, steps=2, epsilon=1.0, mechanism="bandmf", bands=4)
    with pytest.raises(PrivacyConfigError, match="bandmf"):
        plan_privacy(dataset_size=100, expected_batch_size=3, steps=2, epsilon=1.0, bands=4)
    with pytest.raises(ValueError, match="sha256"):
        plan_privacy(dataset_size=100, expected_batch_size=3, steps=8, epsilon=1.0, mechanism="bandmf",
                     bands=2).ledger_entry(steps=1, clip_norm=1.0)


def test_strategy_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(bandmf.CACHE_ENV, str(tmp_path))
    assert bandmf.cache_dir() == os.path.join(str(tmp_path), "bandmf")
    coefs = bandmf.optimized_coefs(16, 4)
    path = os.path.join(bandmf.cache_dir(), "toeplitz_n16_b4.json")
    data = json.load(open(path))
    assert data["sha256"] == bandmf.strategy_sha256(16, 4, coefs) and len(coefs) == 4
    assert math.isclose(float(np.linalg.norm(coefs)), 1.0, rel_tol=1e-9) and np.all(np.diff(coefs) <= 0)
    mtime = os.path.getmtime(path)
    np.testing.assert_array_equal(bandmf.optimized_coefs(16, 4), coefs)  # read back, not re-optimised
    assert os.path.getmtime(path) == mtime
    data["coefs"][1] += 0.01
    json.dump(data, open(path, "w"))
    with pytest.raises(ValueError, match="corrupt"):
        bandmf.optimized_coefs(16, 4)
    with pytest.raises(ValueError):
        bandmf.optimized_coefs(3, 4)


def test_cyclic_poisson_sampler_separates_participations_by_b():
    n, b, batch = 300, 5, 12
    s = bandmf.CyclicPoissonSampler(n, batch, b, microbatch_size=8, seed=42)
    groups = s.groups
    assert sorted(np.concatenate(groups).tolist()) == list(range(n))
    group_of = np.empty(n, int)
    for j, g in enumerate(groups):
        group_of[g] = j
    hits = np.zeros(n)
    steps = 400
    for t in range(steps):
        idx = s.batch_indices(t)
        assert np.all(group_of[idx] == t % b)  # only the eligible group: participations >= b apart
        hits[idx] += 1
    assert hits.sum() / (steps / b * n) == pytest.approx(s.q, rel=0.05)
    np.testing.assert_array_equal(s.batch_indices(17), bandmf.CyclicPoissonSampler(n, batch, b, 8, seed=42).batch_indices(17))
    assert not np.array_equal(s.batch_indices(17), bandmf.CyclicPoissonSampler(n, batch, b, 8, seed=43).batch_indices(17))


def test_resume_through_a_checkpoint_is_exact(tmp_path):
    from dpsynth.train.checkpoint import TrainCheckpointer

    params, frozen, batch = make(4)
    strat = bandmf.BandMFStrategy(clip_norm=0.5, noise_multiplier=2.0, expected_batch_size=6.0,
                                  coefs=(0.8, 0.5, 0.33), steps=6)
    fns = core.make_train_functions(toy_loss, optax.adam(0.05), strat, donate=False)

    def run(state, steps):
        for _ in range(steps):
            state, _ = fns.train_step(state, batch)
        return state

    straight = run(fns.init_state(params, frozen, rng=9), 6)
    half = run(fns.init_state(params, frozen, rng=9), 3)
    ckpt = TrainCheckpointer(str(tmp_path / "ckpt"))
    ckpt.save(half, {"k": 1})
    restored, _ = ckpt.restore(fns.init_state(params, frozen, rng=9))
    ckpt.close()
    assert int(restored.step) == 3
    resumed = run(fns.place_state(restored), 3)
    for a, b in zip(jax.tree.leaves(straight.params), jax.tree.leaves(resumed.params)):
        np.testing.assert_array_equal(a, b)
    # Without the noise state the continuation differs (the state carries the correlation).
    fresh = fns.init_state(params, frozen, rng=9).replace(step=restored.step, params=restored.params,
                                                          opt_state=restored.opt_state)
    other = run(fresh, 3)
    assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(straight.params), jax.tree.leaves(other.params)))


def test_on_a_mesh_noise_state_and_resume_equal_one_device(tmp_path):
    """Under a (data, model) mesh the correlated noise is the one-device noise (added once to the
    global sum), its state is placed on the mesh, and an Orbax checkpoint of the sharded state
    resumes exactly."""
    from dpsynth.train import sharding
    from dpsynth.train.checkpoint import TrainCheckpointer

    params, frozen, batch = make(4, n=8)
    params = {**params, "w2": jnp.concatenate([params["w2"]] * 2, axis=1)}  # [7, 4]: splittable over model
    batch = {**batch, "y": jnp.concatenate([batch["y"]] * 2, axis=1)}
    strat = bandmf.BandMFStrategy(clip_norm=0.5, noise_multiplier=2.0, expected_batch_size=6.0,
                                  coefs=(0.8, 0.5, 0.33), steps=6)

    def run(fns, state, steps):
        for _ in range(steps):
            state, _ = fns.train_step(state, fns.shard_batch(batch))
        return state

    one = core.make_train_functions(toy_loss, optax.adam(0.05), strat, donate=False)
    straight = run(one, one.init_state(params, frozen, rng=9), 6)
    mesh = sharding.make_mesh(4, 2)
    fns = core.make_train_functions(toy_loss, optax.adam(0.05), strat, mesh=mesh, donate=False)
    half = run(fns, fns.init_state(params, frozen, rng=9), 3)
    assert all(len(x.sharding.device_set) == 8 for x in jax.tree.leaves(half.noise_state))
    ckpt = TrainCheckpointer(str(tmp_path / "ckpt"))
    ckpt.save(half, {"k": 1})
    restored, _ = ckpt.restore(fns.init_state(params, frozen, rng=9))
    ckpt.close()
    resumed = run(fns, fns.place_state(restored), 3)
    assert int(resumed.step) == 6
    for a, b in zip(jax.tree.leaves((straight.params, straight.noise_state)),
                    jax.tree.leaves(jax.device_get((resumed.params, resumed.noise_state)))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
