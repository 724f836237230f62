import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpsynth.train import lm


def test_cross_entropy_and_z_loss_against_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 7)).astype(np.float32) * 3
    targets = rng.integers(0, 7, (2, 3))
    ce, z = lm.cross_entropy_with_z_loss(jnp.asarray(logits), jnp.asarray(targets), z_loss=1e-4)
    log_z = np.log(np.exp(logits.astype(np.float64)).sum(-1))
    ref_ce = log_z - np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(ce, ref_ce, rtol=1e-5)
    np.testing.assert_allclose(z, 1e-4 * log_z**2, rtol=1e-5)


def test_lm_loss_is_weighted_mean_per_example():
    vocab = 5

    class Fake:  # a "model" whose logits are fixed per token id
        table = jnp.asarray(np.random.default_rng(1).normal(size=(vocab, vocab)), jnp.float32)

        def apply(self, variables, inputs, segment_ids=None, positions=None):
            return self.table[inputs] * variables["params"]["s"]

    loss_fn = lm.make_lm_loss(Fake(), z_loss=0.0)
    inputs = jnp.asarray([[1, 2, 3, 4], [0, 1, 2, 3]])
    targets = jnp.asarray([[2, 3, 4, 0], [1, 2, 3, 4]])
    weights = jnp.asarray([[1, 1, 0, 0], [0, 0, 0, 1.0]])
    per_example, aux = loss_fn({"params": {"s": 1.0}}, {}, {"inputs": inputs, "targets": targets,
                                                             "weights": weights, "mask": jnp.ones(2)}, None)
    ce, _ = lm.cross_entropy_with_z_loss(Fake.table[inputs], targets, 0.0)
    np.testing.assert_allclose(per_example[0], (ce[0, 0] + ce[0, 1]) / 2, rtol=1e-6)
    np.testing.assert_allclose(per_example[1], ce[1, 3], rtol=1e-6)
    np.testing.assert_allclose(aux["tokens"], [2, 1])
    np.testing.assert_allclose(aux["ce_sum"], [ce[0, 0] + ce[0, 1], ce[1, 3]], rtol=1e-6)


def test_head_capacities_are_ascending_distinct_and_end_at_the_row_length():
    assert lm.head_capacities(64) == (16, 32, 48, 64)
    assert lm.head_capacities(40) == (16, 32, 40)
    assert lm.head_capacities(16) == (16,)
    assert lm.head_capacities(8) == (8,)


@pytest.mark.parametrize("most", [0, 5, 16, 17, 33, 64])
def test_target_only_row_sums_equal_the_full_heads_and_their_gradients(most):
    """`row_sums(target_only=True)` (the output layer on the weighted positions only, in the branch whose
    width holds the largest count) gives the full head's sums, and the same gradient for every parameter
    but the (frozen, stop-gradient) output table."""
    from dpsynth.models import Transformer, get_config

    cfg = get_config("tiny", vocab_size=53, max_len=64, num_layers=1, d_model=16, num_heads=2, head_dim=8, d_ff=24)
    model = Transformer(cfg)
    rng = np.random.default_rng(most)
    b, t = 4, 64
    inputs = jnp.asarray(rng.integers(0, 53, (b, t)), jnp.int32)
    targets = jnp.asarray(rng.integers(0, 53, (b, t)), jnp.int32)
    w = np.zeros((b, t), np.float32)
    for i in range(b):  # a prompt of 0-5 tokens, then `most` or fewer weighted tokens, then padding
        start = int(rng.integers(0, 6))
        n = most if i == 0 else int(rng.integers(0, most + 1))
        w[i, start:start + n] = rng.uniform(0.5, 1.5, min(n, t - start))
    w[0] = 0.0
    w[0, t - most:] = 1.0  # the first row holds exactly `most`
    variables = model.init(jax.random.PRNGKey(0), inputs)

    def sums(v, target_only):
        ce, z = lm.row_sums(model, v, inputs, targets, jnp.asarray(w), 1e-4, target_only=target_only)
        return jnp.sum(ce + z), (ce, z)

    (_, (ce, z)), g = jax.value_and_grad(sums, has_aux=True)(variables, False)
    (_, (ce2, z2)), g2 = jax.value_and_grad(sums, has_aux=True)(variables, True)
    np.testing.assert_allclose(ce2, ce, rtol=1e-5, atol=1e-5)  # the same terms summed in another order
    np.testing.assert_allclose(z2, z, rtol=1e-5, atol=1e-9)
    assert float(ce[0]) == 0.0 if most == 0 else float(ce[0]) > 0
    flat, flat2 = jax.tree_util.tree_flatten_with_path(g)[0], jax.tree.leaves(g2)
    for (path, a), b_ in zip(flat, flat2):
        if "embedding" in jax.tree_util.keystr(path):
            continue  # the full head also differentiates the tied table; target-only stops its gradient
        np.testing.assert_allclose(b_, a, rtol=1e-4, atol=1e-6 * float(jnp.max(jnp.abs(a)) + 1e-30),
                                   err_msg=jax.tree_util.keystr(path))


def test_dp_tune_runs_the_target_only_head_for_lora_with_ghost_clipping_only():
    """The target-only head needs a frozen table (LoRA) and a per-batch switch (ghost clipping): every other
    mode and the vmapped clipping keep the full head."""
    from dpsynth.models import Transformer, get_config
    from dpsynth.train import tune_config, tune_model

    base = get_config("tiny", vocab_size=53, max_len=64, num_layers=1, d_model=16, num_heads=2, head_dim=8, d_ff=24)
    base_params = Transformer(base).init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"]
    batch = {"inputs": jnp.zeros((2, 32), jnp.int32), "targets": jnp.zeros((2, 32), jnp.int32),
             "weights": jnp.ones((2, 32)), "mask": jnp.ones((2,))}
    for mode, clipping, want in (("lora", "ghost", True), ("lora", "vmap", False), ("full", "ghost", False),
                                 ("prompt", "vmap", False), ("lora", "auto", True), ("prompt", "auto", False)):
        config = tune_config.TuneConfig(mode=mode, clipping=clipping, lora_rank=2, prompt_length=3, label_contrast=0.0)
        model_cfg = tune_model.tuned_model_config(base, config)
        variables = tune_model.init_variables(model_cfg, base_params, config)
        params, frozen = lm.split_variables(variables, tune_config.TRAINABLE[mode])
        loss = tune_model.make_loss_fn(model_cfg, config)
        jaxpr = str(jax.make_jaxpr(lambda p: loss(p, frozen, batch, jax.random.PRNGKey(0)))(params))
        assert ("cond[" in jaxpr) == want, (mode, clipping)


@pytest.mark.parametrize("tie", [True, False])
def test_auto_clipping_is_ghost_where_it_applies_and_the_loss_and_strategy_agree(tie):
    """`--clipping auto` (the default): ghost for full and LoRA tuning at example level, vmap for prompt
    tuning, user-level DP and full tuning of an untied input table (its sparse path); the strategy dp-tune
    builds clips with the method `clipping_method` names (the loss's target-only head goes with it: above)."""
    from dpsynth.dp.plan import plan_privacy
    from dpsynth.models import get_config
    from dpsynth.train import tune_config, tune_model

    base = get_config("tiny", vocab_size=53, max_len=64, num_layers=1, d_model=16, num_heads=2, head_dim=8, d_ff=24,
                      tie_embeddings=tie)
    assert tune_config.TuneConfig().clipping == tune_config.AUTO_CLIPPING
    plan = plan_privacy(dataset_size=100, expected_batch_size=10.0, steps=2, noise_multiplier=1.0, delta=1e-3)
    cases = [(dict(mode="lora"), "ghost"), (dict(mode="full"), "ghost" if tie else "vmap"), (dict(mode="prompt"), "vmap"),
             (dict(mode="lora", privacy_unit="user", max_examples_per_user=2), "vmap"),
             (dict(mode="lora", clipping="vmap"), "vmap"), (dict(mode="full", clipping="vmap"), "vmap")]
    for fields, want in cases:
        config = tune_config.TuneConfig(lora_rank=2, prompt_length=3, label_contrast=0.0, microbatch_size=2, **fields)
        model_cfg = tune_model.tuned_model_config(base, config)
        assert tune_model.clipping_method(model_cfg, config) == want, fields
        if fields.get("privacy_unit") == "user":
            continue  # (the user-level strategy needs the users' rows: `build_mechanism`'s own tests)
        _, fns = tune_model.planned_step(base, config, plan)
        assert getattr(fns.strategy, "clipping", "vmap") == want, fields
