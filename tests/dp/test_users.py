"""User-level DP: contribution bound K, user batches, per-user sensitivity <= C, accounting vs jax-privacy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax_privacy import accounting as jp_accounting
from jax_privacy import batch_selection

from dpsynth.dp import accounting, clipping, sampling, users
from dpsynth.dp.plan import plan_privacy
from dpsynth.dp.strategy import UserDPSGDStrategy
from tests.dp.test_clipping import make, toy_loss


def repeated_users(seed=0, num_users=12, heavy_rows=40):
    """User ids of a small data set with repeated users: one heavy user ("u00", many rows), the
    rest with 1-5 rows each, shuffled."""
    rng = np.random.default_rng(seed)
    ids = ["u00"] * heavy_rows + [f"u{u:02d}" for u in range(1, num_users) for _ in range(rng.integers(1, 6))]
    return [ids[i] for i in rng.permutation(len(ids))]


def test_contribution_bound_keeps_at_most_k_rows_chosen_by_the_seed():
    ids = repeated_users()
    counts = {u: ids.count(u) for u in set(ids)}
    for k in (1, 3, 50):
        g = users.group_by_user(ids, k, seed=7)
        assert g.num_users == len(counts) and g.slots.shape[1] <= k
        for u_index, u in enumerate(sorted(counts)):
            kept = g.slots[u_index][g.slots[u_index] >= 0]
            assert len(kept) == min(k, counts[u])
            assert all(ids[r] == u for r in kept) and len(set(kept)) == len(kept)
        assert g.rows_dropped == sum(max(0, c - k) for c in counts.values())
        assert g.rows_kept + g.rows_dropped == len(ids)
        np.testing.assert_array_equal(g.slots, users.group_by_user(ids, k, seed=7).slots)
    heavy = {tuple(users.group_by_user(ids, 3, seed=s).slots[0]) for s in range(10)}
    assert len(heavy) > 1  # the kept rows depend on the (secret) seed


def test_bad_user_ids_and_bound():
    with pytest.raises(users.UserColumnError, match="row 1"):
        users.group_by_user(["a", "", "b"], 2, seed=0)
    with pytest.raises(users.UserColumnError):
        users.group_by_user(["a"], 0, seed=0)


def test_user_draw_is_jax_privacy_user_selection_on_the_same_generator():
    ids = repeated_users(seed=1, num_users=30)
    g = users.group_by_user(ids, 4, seed=3)
    row_users = g.row_users(len(ids))
    kept_rows = np.flatnonzero(row_users >= 0)
    q = 0.3
    poisson = sampling.PoissonSampler(g.num_users, q * g.num_users, 8, seed=11)
    batches = users.UserBatches(g, poisson, microbatch_users=8)
    for step in range(5):
        ref = batch_selection.UserSelectionStrategy(
            batch_selection.CyclicPoissonSampling(sampling_prob=q, iterations=1), examples_per_user_per_batch=4)
        (ref_batch,) = ref.batch_iterator(row_users[kept_rows], rng=sampling.step_generator(11, step))
        ref_users = sorted(int(row_users[kept_rows[r[0]]]) for r in ref_batch)
        assert ref_users == sorted(poisson.batch_indices(step).tolist())
        ours = np.concatenate(batches.microbatches(step))
        ours = ours[(ours >= 0).any(axis=1)]
        # Same users; each row holds exactly the user's kept rows (jax-privacy's repeats removed).
        assert sorted(int(row_users[r[0]]) for r in ours) == ref_users
        for r, rr in zip(sorted(ours.tolist()), sorted(kept_rows[ref_batch].tolist())):
            assert set(x for x in r if x >= 0) == set(rr)


def _user_data(n_users=6, heavy=25, seed=0):
    """Toy rows of `n_users` users (user 0 owns `heavy` rows) and their user batch."""
    counts = [heavy] + [1 + u % 3 for u in range(1, n_users)]
    params, frozen, rows = make(seed, n=sum(counts))
    ids = [u for u, c in enumerate(counts) for _ in range(c)]
    g = users.group_by_user(ids, max(counts), seed=0)
    examples = {k: np.asarray(v) for k, v in rows.items()}
    return params, frozen, examples, g


@pytest.mark.parametrize("clip_norm", [0.05, 1.0, 100.0])
def test_sensitivity_of_one_whole_user_is_at_most_c(clip_norm):
    params, frozen, examples, g = _user_data()
    strat = UserDPSGDStrategy(clip_norm=clip_norm, noise_multiplier=0.0, expected_batch_size=3.0)
    key = jax.random.PRNGKey(0)

    def clipped_sum(slot_rows):
        batch = {k: jnp.asarray(v) for k, v in users.gather_users(examples, slot_rows).items()}
        acc, m = strat.accumulate(toy_loss, params, frozen, batch, key, strat.init_accumulator(params))
        return acc["grad_sum"], m

    all_users = g.slots
    without_heavy = np.concatenate([np.full((1, g.slots.shape[1]), -1), g.slots[1:]])  # user 0 removed (padding)
    with_all, m_all = clipped_sum(all_users)
    without, m_wo = clipped_sum(without_heavy)
    assert float(m_all["count"]) == g.num_users and float(m_wo["count"]) == g.num_users - 1
    diff = jax.tree.map(jnp.subtract, with_all, without)
    norm = float(jnp.sqrt(sum(jnp.sum(d ** 2) for d in jax.tree.leaves(diff))))
    assert norm <= clip_norm * (1 + 1e-5)
    # The heavy user's term is exactly clip_C(mean of its 25 rows' gradients), computed by brute force.
    heavy_rows = g.slots[0][g.slots[0] >= 0]
    per_ex = clipping.per_example_grads(toy_loss, params, frozen,
                                        {k: jnp.asarray(v[heavy_rows]) for k, v in examples.items()}, key)
    mean = jax.tree.map(lambda x: x.mean(0), per_ex)
    mean_norm = float(jnp.sqrt(sum(jnp.sum(x ** 2) for x in jax.tree.leaves(mean))))
    ref = jax.tree.map(lambda x: x * min(1.0, clip_norm / mean_norm), mean)
    for a, b in zip(jax.tree.leaves(diff), jax.tree.leaves(ref)):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6 * clip_norm)


def test_user_strategy_needs_a_user_batch():
    params, frozen, batch = make(0)
    strat = UserDPSGDStrategy(clip_norm=1.0, noise_multiplier=1.0, expected_batch_size=3.0)
    with pytest.raises(ValueError, match="example_mask"):
        strat.accumulate(toy_loss, params, frozen, batch, jax.random.PRNGKey(0), strat.init_accumulator(params))


@pytest.mark.parametrize("num_users,batch,steps,sigma", [(500, 50, 40, 1.1), (2000, 64, 200, 0.9)])
def test_user_level_accounting_equals_jax_privacy(num_users, batch, steps, sigma):
    plan = plan_privacy(dataset_size=num_users, expected_batch_size=batch, steps=steps, noise_multiplier=sigma,
                        privacy_unit="user", accountant="pld")
    assert plan.delta == 1.0 / num_users and plan.privacy_unit == "user"
    eps = plan.epsilons()["pld"]
    config = jp_accounting.PldAccountantConfig(value_discretization_interval=accounting.PLD_DISCRETIZATION)
    params = jp_accounting.DpParams(noise_multipliers=sigma, num_samples=num_users, delta=plan.delta,
                                    batch_size=batch)
    ref = jp_accounting.DpsgdTrainingAccountant(config).compute_epsilon(steps, params)
    # One user = one unit of sensitivity C after mean-then-clip: jax-privacy's user-level
    # accountant with examples_per_user=1 is the same mechanism.
    params_user = jp_accounting.DpParams(noise_multipliers=sigma, num_samples=num_users, delta=plan.delta,
                                         batch_size=batch, examples_per_user=1)
    ref_user = jp_accounting.DpsgdTrainingUserLevelAccountant(config).compute_epsilon(steps, params_user)
    assert eps == pytest.approx(ref, rel=1e-9)
    assert eps == pytest.approx(ref_user, rel=1e-3)
    # The ledger entry of the plan carries the unit and is accounted the same way.
    entry = plan.ledger_entry(steps=steps, clip_norm=1.0)
    assert entry["unit"] == "user" and entry["dataset_size"] == num_users


@pytest.mark.parametrize("pad_multiple", [1, 3, 8])
def test_user_microbatches_padded_to_a_multiple_hold_the_same_users(pad_multiple):
    g = users.group_by_user(repeated_users(seed=2, num_users=30), 4, seed=3)
    poisson = sampling.PoissonSampler(g.num_users, 12, 5, seed=11)
    plain = users.UserBatches(g, poisson, microbatch_users=5)
    padded = users.UserBatches(g, poisson, microbatch_users=5, pad_multiple=pad_multiple)
    assert padded.rows_per_microbatch % pad_multiple == 0 and 5 <= padded.rows_per_microbatch < 5 + pad_multiple
    for step in range(4):
        a, b = plain.microbatches(step), padded.microbatches(step)
        assert len(a) == len(b)
        for x, y in zip(a, b):  # the same users in the same microbatch; the rest is empty users
            assert y.shape == (padded.rows_per_microbatch, g.slots.shape[1])
            np.testing.assert_array_equal(x, y[:5])
            assert np.all(y[5:] == -1)


def test_user_level_step_on_a_mesh_equals_one_device():
    """User batches padded to the data axis on a mesh of 8 devices: the same noisy step as on one
    device (each user clipped once, noise added once to the global sum)."""
    import optax

    from dpsynth.train import core, sharding

    params, frozen, examples, g = _user_data()
    strat = UserDPSGDStrategy(clip_norm=0.5, noise_multiplier=1.5, expected_batch_size=3.0)
    poisson = sampling.PoissonSampler(g.num_users, 3.0, 3, seed=5)
    results = {}
    for name, mesh, multiple in (("one", None, 1), ("mesh", sharding.make_mesh(8, 1), 8)):
        batches = users.UserBatches(g, poisson, microbatch_users=3, pad_multiple=multiple)
        fns = core.make_train_functions(toy_loss, optax.sgd(0.1), strat, mesh=mesh)
        state = fns.init_state(params, frozen, rng=4)
        losses = []
        for step in range(3):
            mbs = [users.gather_users(examples, m) for m in batches.microbatches(step)]
            state, m = fns.accumulated_step(state, mbs, global_rows=batches.rows_per_microbatch)
            losses.append(float(m["loss"]))
        results[name] = losses, jax.device_get(state.params)
    np.testing.assert_allclose(results["one"][0], results["mesh"][0], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(results["one"][1]), jax.tree.leaves(results["mesh"][1])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
