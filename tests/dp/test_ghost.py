"""Ghost clipping equals the vmapped clipping: norms and clipped sums on every layer type (full tuning and LoRA,
the label contrast's K rows per example), sensitivity, padding, refusals, memory."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpsynth.dp import clipping, ghost
from dpsynth.dp.strategy import DPSGDStrategy, UserDPSGDStrategy
from dpsynth.models import Transformer, get_config
from dpsynth.train import core, lm

# Every trainable layer type of the Transformer: tied embedding (lookup + transposed dense),
# untied lm_head, learned positions, RMSNorm / LayerNorm scales and biases, (1 + w) norms,
# q/k norms, post norms, projection biases, grouped-query attention, remat, gelu / swiglu MLPs.
VARIANTS = {
    "native": {},
    "gpt2": dict(tie_embeddings=False, norm="layernorm", qkv_bias=True, o_bias=True, mlp_bias=True,
                 positions="learned", mlp="gelu", scale_embedding=False),
    "gemma": dict(qk_norm=True, post_norms=True, norm_scale_offset=1.0, num_kv_heads=1, remat=True, mlp="swiglu"),
}


def _setup(variant, b, t, seed, d_model=32, vocab=61):
    cfg = get_config("tiny", vocab_size=vocab, max_len=64, num_layers=1, d_model=d_model, num_heads=2, head_dim=16,
                     d_ff=48, **VARIANTS[variant])
    model = Transformer(cfg)
    rng = np.random.default_rng(seed)
    toks = rng.integers(0, vocab, (b, t)).astype(np.int32)
    toks[:, : t // 2] = toks[:, :1]  # repeated ids: the lookup's [id == id] terms
    params, frozen = lm.split_variables(model.init(jax.random.PRNGKey(seed), toks), ("params",))
    keys = iter(jax.random.split(jax.random.PRNGKey(seed + 100), 64))
    params = jax.tree.map(lambda p: p + 0.2 * jax.random.normal(next(keys), p.shape), params)
    weights = np.ones((b, t), np.float32)
    weights[:, : rng.integers(1, t)] = 0.0  # a Prefix-LM prefix: no loss on it
    mask = (rng.random(b) < 0.7).astype(np.float32)
    mask[0] = 1.0
    batch = {"inputs": toks, "targets": rng.integers(0, vocab, (b, t)).astype(np.int32), "weights": weights,
             "mask": mask}
    return lm.make_lm_loss(model, z_loss=1e-4), params, frozen, batch


def _run(fn, loss, params, frozen, batch, c):
    return jax.jit(fn, static_argnums=(0, 5))(loss, params, frozen, batch, jax.random.PRNGKey(0), c)


def _clipped_reference(per_example, c):
    """Brute force: the sum of per-example gradients scaled to norm <= c."""
    factor = jnp.minimum(1.0, c / clipping.global_norms(per_example))
    return jax.tree.map(lambda g: jnp.einsum("b...,b->...", g, factor), per_example)


def _ghost_fn(loss):
    """The ghost clipped sum compiled once with a traced clip norm."""
    return jax.jit(lambda p, f, b, c: ghost.clipped_grad_sum(loss, p, f, b, jax.random.PRNGKey(0), c))


def _assert_trees_close(a, b, rtol=2e-5):
    scale = max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(a))
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * scale, err_msg=jax.tree_util.keystr(path))


# t = 4: the projections keep factors (ghost norms); t = 40: they form per-example gradients
SLOW_CASES = (("gpt2", 40, 2), ("gemma", 4, 3))  # 20-30 s each: make test runs both native cases


@pytest.mark.parametrize("variant,t,seed", [("native", 4, 0), ("native", 40, 1)]
                         + [pytest.param(*c, marks=pytest.mark.slow) for c in SLOW_CASES])
def test_transformer_norms_and_clipped_sums_equal_vmap(variant, t, seed):
    rng = np.random.default_rng(seed)
    b = int(rng.integers(2, 6))
    loss, params, frozen, batch = _setup(variant, b, t, seed)
    c = float(rng.uniform(0.1, 10))
    want, want_losses, want_norms = _run(clipping.clipped_grad_sum, loss, params, frozen, batch, c)
    fn = _ghost_fn(loss)
    got, losses, norms = fn(params, frozen, batch, c)
    np.testing.assert_allclose(norms, want_norms, rtol=2e-5)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-6)
    _assert_trees_close(want, got)
    # more clip norms against the brute-force reference (padding rows masked out)
    per_example = jax.tree.map(lambda g: g * batch["mask"].reshape((-1,) + (1,) * (g.ndim - 1)),
                               jax.jit(clipping.per_example_grads, static_argnums=0)(
                                   loss, params, frozen, batch, jax.random.PRNGKey(0)))
    for c in (1e-3, 1e4):
        _assert_trees_close(_clipped_reference(per_example, c), fn(params, frozen, batch, c)[0])


def test_plan_uses_both_ghost_norms_and_formed_gradients():
    """At t = 4 the dense layers keep factors (ghost norms); at t = 40 they form per-example grads."""
    for t, want in ((4, "factors"), (40, "grad")):
        loss, params, frozen, batch = _setup("native", 2, t, 0)
        with ghost._Session(discover=True, batch_size=2) as s:
            jax.eval_shape(loss, params, frozen, batch, jax.random.PRNGKey(0))
        plan = ghost._plan(dict(s.uses), params)
        assert plan[("params", "layer_0", "mlp", "up", "kernel")][0].mode == want
        assert [u.kind for u in plan[("params", "embedding")]] == ["lookup", "dense"]  # tied: always factors + cross term
        assert all(u.mode == "factors" for u in plan[("params", "embedding")])


@pytest.mark.parametrize("seed", range(2))
def test_per_example_terms_bounded_and_sensitivity_c(seed):
    loss, params, frozen, batch = _setup("gpt2", 4, 6, seed)
    batch["mask"][:] = 1.0
    c = 0.05
    fn = _ghost_fn(loss)
    full, _, norms = fn(params, frozen, batch, c)
    assert np.all(np.asarray(norms) > c)  # every example is clipped: the bound is tight
    for i in range(4):
        alone = dict(batch, mask=np.eye(4, dtype=np.float32)[i])
        term, _, _ = fn(params, frozen, alone, c)
        assert float(optax.global_norm(term)) <= c * (1 + 1e-5)
        without = dict(batch, mask=batch["mask"] * (1 - np.eye(4, dtype=np.float32)[i]))
        rest, _, _ = fn(params, frozen, without, c)
        diff = float(optax.global_norm(jax.tree.map(jnp.subtract, full, rest)))
        assert c * (1 - 1e-4) <= diff <= c * (1 + 1e-5)


def test_padding_rows_contribute_nothing():
    loss, params, frozen, batch = _setup("native", 4, 6, 3)
    batch["mask"][:] = [1, 0, 1, 0]
    got, _, _ = _run(ghost.clipped_grad_sum, loss, params, frozen, batch, 1.0)
    real = {k: v[np.array([0, 2])] for k, v in batch.items()}
    want, _, _ = _run(ghost.clipped_grad_sum, loss, params, frozen, real, 1.0)
    _assert_trees_close(want, got, rtol=1e-5)


class _Toy(nn.Module):
    """A toy model on the taps: a table used twice (lookup and tied output), a dense used twice."""

    @nn.compact
    def __call__(self, ids, x):
        table = self.param("table", nn.initializers.normal(1.0), (11, 5))
        w = self.param("w", nn.initializers.normal(1.0), (5, 5))
        bias = self.param("bias", nn.initializers.normal(1.0), (5,))
        h = ghost.lookup(self, "table", table, ids) + x
        h = jnp.tanh(ghost.dense(self, "w", h, w))
        h = ghost.bias(self, "bias", ghost.dense(self, "w", h, w), bias)  # w twice: dense x dense cross term
        return ghost.dense(self, "table", h, table, transpose=True)


def _toy_loss(model):
    def loss(params, frozen, batch, key):
        out = model.apply(params, batch["ids"], batch["x"])
        return jnp.sum(jnp.square(out - 0.3), axis=(1, 2)), {}
    return loss


@pytest.mark.parametrize("seed", range(2))
def test_shared_parameters_cross_terms_equal_vmap(seed):
    model = _Toy()
    rng = np.random.default_rng(seed)
    batch = {"ids": rng.integers(0, 11, (5, 3)).astype(np.int32), "x": rng.normal(size=(5, 3, 5)).astype(np.float32),
             "mask": np.ones(5, np.float32)}
    params = model.init(jax.random.PRNGKey(seed), batch["ids"], batch["x"])
    per_example = clipping.per_example_grads(_toy_loss(model), params, {}, batch, jax.random.PRNGKey(0))
    fn = _ghost_fn(_toy_loss(model))
    for c in (0.01, 1.0, 1e3):
        got, _, norms = fn(params, {}, batch, c)
        np.testing.assert_allclose(norms, clipping.global_norms(per_example), rtol=2e-5)
        _assert_trees_close(_clipped_reference(per_example, c), got)


def test_non_finite_example_contributes_zero():
    model = _Toy()
    rng = np.random.default_rng(0)
    batch = {"ids": rng.integers(0, 11, (3, 3)).astype(np.int32), "x": rng.normal(size=(3, 3, 5)).astype(np.float32),
             "mask": np.ones(3, np.float32)}
    params = model.init(jax.random.PRNGKey(0), batch["ids"], batch["x"])
    bad = dict(batch, x=batch["x"].copy())
    bad["x"][1, 0, 0] = np.inf
    got, _, norms = _run(ghost.clipped_grad_sum, _toy_loss(model), params, {}, bad, 1.0)
    assert not np.isfinite(np.asarray(norms)[1])
    want, _, _ = _run(ghost.clipped_grad_sum, _toy_loss(model), params, {}, dict(batch, mask=np.array([1, 0, 1.0],
                                                                                                       np.float32)), 1.0)
    _assert_trees_close(want, got, rtol=1e-6)


def test_untapped_parameter_is_refused():
    class Plain(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(2)(x)

    model = Plain()
    batch = {"x": np.ones((2, 3), np.float32), "mask": np.ones(2, np.float32)}
    params = model.init(jax.random.PRNGKey(0), batch["x"])

    def loss(p, f, b, k):
        return jnp.sum(model.apply(p, b["x"]), axis=1), {}

    with pytest.raises(ghost.GhostClippingError, match="Dense_0/bias.*not computed through a ghost tap"):
        ghost.clipped_grad_sum(loss, params, {}, batch, jax.random.PRNGKey(0), 1.0)


def _core_sums(loss, params, frozen, batch):
    """{clipping method: (the training core's accumulated clipped sum, its metrics)} for one microbatch."""
    sums = {}
    for method in clipping.METHODS:
        strategy = DPSGDStrategy(clip_norm=0.3, noise_multiplier=1.0, expected_batch_size=4.0, clipping=method)
        fns = core.make_train_functions(loss, optax.sgd(1.0), strategy, donate=False)
        state = fns.init_state(params, frozen, rng=0)
        acc, metrics = fns.accumulate_step(state, fns.init_accumulator(state), fns.shard_batch(batch))
        sums[method] = (acc["inner"]["grad_sum"], metrics)
    return sums


def test_strategy_in_the_training_core_equals_vmap():
    loss, params, frozen, batch = _setup("native", 4, 8, 5)
    sums = _core_sums(loss, params, frozen, batch)
    _assert_trees_close(sums["vmap"][0], sums["ghost"][0])
    for k in ("loss_sum", "count", "clipped"):
        np.testing.assert_allclose(sums["ghost"][1][k], sums["vmap"][1][k], rtol=1e-5)


def test_strategy_settings_checked():
    with pytest.raises(ValueError, match="clipping must be one of"):
        DPSGDStrategy(clip_norm=1.0, noise_multiplier=1.0, expected_batch_size=4.0, clipping="fast")
    with pytest.raises(ValueError, match="vmapped clipping only"):
        UserDPSGDStrategy(clip_norm=1.0, noise_multiplier=1.0, expected_batch_size=4.0, clipping="ghost")


def _temp_bytes(method, b):
    loss, params, frozen, batch = _setup("native", b, 8, 0, d_model=64, vocab=1024)
    batch["mask"][:] = 1.0
    fn = jax.jit(clipping.method(method), static_argnums=(0, 5))
    compiled = fn.lower(loss, params, frozen, batch, jax.random.PRNGKey(0), 1.0).compile()
    mem = compiled.memory_analysis()
    if mem is None:
        pytest.skip("no compiled memory analysis on this backend")
    return mem.temp_size_in_bytes, sum(x.size * 4 for x in jax.tree.leaves(params))


@pytest.mark.slow  # compiles two models at two batch sizes (~35 s)
def test_temporary_memory_does_not_grow_with_per_example_gradients():
    """Per extra example, the vmapped step needs >= one gradient copy; the ghost step a small fraction."""
    ghost_2, param_bytes = _temp_bytes("ghost", 2)
    ghost_8, _ = _temp_bytes("ghost", 8)
    vmap_2, _ = _temp_bytes("vmap", 2)
    vmap_8, _ = _temp_bytes("vmap", 8)
    assert (vmap_8 - vmap_2) / 6 >= param_bytes
    assert (ghost_8 - ghost_2) / 6 <= 0.25 * param_bytes


# ----------------------------------------------------------------------------- LoRA and the label contrast
# Tolerance of the LoRA / contrast comparisons with the vmapped clipping: both sides are float32 and compute
# the same quantities in different orders (a norm from Gram matrices sum_{n,m} (x_n.x_m)(g_n.g_m), or from a
# per-example gradient formed in one batched einsum, against vmap's per-example jax.grad). Each is a sum of at
# most a few thousand float32 products (here N <= 4 x 40 positions, d <= 64); the rounding of such sums is
# O(sqrt(terms) * 2^-24) relative, ~1e-6, with the worst case (terms * 2^-24) still below 1e-4. The ghost
# norm is a sum of squares recovered as sqrt(sum of signed products), which loses up to a factor of a few
# more where the products cancel, hence rtol 1e-4 on the norms (not tuned to this CPU: every value is at
# least 1e3 times the float32 epsilon away from it), and on the clipped sums relative to their largest entry.
LORA_RTOL = 1e-4


def _lora_setup(variant, targets, b, t, seed, *, contrast=0, rank=8, mode="lora", target_only=False):
    """A tiny LoRA model (adapters on `targets`), random non-zero adapters, and a Prefix-LM batch with padding
    rows; with `contrast` = K > 0, the label contrast's batch ([B, K, T] rows) and loss instead."""
    cfg = get_config("tiny", vocab_size=61, max_len=64, num_layers=1, d_model=32, num_heads=2, head_dim=16, d_ff=48,
                     lora_rank=rank, lora_alpha=2.0 * rank, lora_targets=targets, **VARIANTS[variant])
    model = Transformer(cfg)
    rng = np.random.default_rng(seed)
    toks = rng.integers(0, 61, (b, t)).astype(np.int32)
    trainable = ("lora",) if mode == "lora" else ("params",)
    params, frozen = lm.split_variables(model.init(jax.random.PRNGKey(seed), toks), trainable)
    keys = iter(jax.random.split(jax.random.PRNGKey(seed + 100), 256))
    params = jax.tree.map(lambda p: p + 0.2 * jax.random.normal(next(keys), p.shape), params)  # b != 0
    mask = np.ones(b, np.float32)
    mask[rng.permutation(b)[: b // 3]] = 0.0  # padding rows
    if not contrast:
        weights = np.ones((b, t), np.float32)
        weights[:, : rng.integers(1, t)] = 0.0
        batch = {"inputs": toks, "targets": rng.integers(0, 61, (b, t)).astype(np.int32), "weights": weights,
                 "mask": mask}
        return lm.make_lm_loss(model, z_loss=1e-4, target_only=target_only), params, frozen, batch
    k = contrast
    inputs = rng.integers(0, 61, (b, k, t)).astype(np.int32)
    inputs[:, :, t // 2:] = inputs[:, :1, t // 2:]  # the same text after every label prompt
    weights = np.ones((b, k, t), np.float32)
    weights[:, :, : t // 2] = 0.0  # the label prompt: no loss on it
    batch = {"contrast_inputs": inputs, "contrast_targets": rng.integers(0, 61, (b, k, t)).astype(np.int32),
             "contrast_weights": weights, "contrast_label": rng.integers(0, k, b).astype(np.int32), "mask": mask}
    return lm.make_label_contrast_loss(model, 1.0, z_loss=1e-4, target_only=target_only), params, frozen, batch


# (variant, targets, contrast K, the most weighted tokens of a row): t = 40 gives head widths 16, 32 and 40,
# so 10, 25 and 40 take each of the three branches.
TARGET_ONLY_CASES = [("native", "all", 0, 10), ("gpt2", "mlp", 0, 25), ("native", "attention", 0, 40),
                     ("native", "all", 2, 10)]


@pytest.mark.parametrize("variant,targets,k,most", TARGET_ONLY_CASES)
def test_target_only_head_under_ghost_equals_the_full_head_under_vmap(variant, targets, k, most):
    """dp-tune's LoRA + ghost loss runs the output layer only at weighted positions (`lm.row_sums`): its
    per-example norms, losses and clipped sums are the full-head loss's under vmapped clipping."""
    t, seed = 40, 11
    full, params, frozen, batch = _lora_setup(variant, targets, 5, t, seed, contrast=k)
    target_only = _lora_setup(variant, targets, 5, t, seed, contrast=k, target_only=True)[0]
    key = "contrast_weights" if k else "weights"
    w = np.array(batch[key])
    rng = np.random.default_rng(seed)
    for i in range(w.shape[0]):  # each row: the prefix as set up, then padding after a random length
        end = t if i == 0 else int(rng.integers(t // 2, t))
        w[i, ..., end:] = 0.0
        w[i, ..., : max(0, end - most)] = 0.0  # at most `most` weighted tokens
    w[0, ..., t - most:] = 1.0  # the first row exactly `most`
    batch = {**batch, key: w}
    assert int((w > 0).sum(-1).max()) == most
    want = jax.jit(lambda p, f, b, c: clipping.clipped_grad_sum(full, p, f, b, jax.random.PRNGKey(0), c))
    got_fn = _ghost_fn(target_only)
    for c in (0.05, 1e4):
        want_sum, want_losses, want_norms = want(params, frozen, batch, c)
        got_sum, losses, norms = got_fn(params, frozen, batch, c)
        np.testing.assert_allclose(norms, want_norms, rtol=LORA_RTOL)
        np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
        _assert_trees_close(want_sum, got_sum, rtol=LORA_RTOL)


def _assert_equals_vmap(loss, params, frozen, batch, cs=(0.05, 1.0, 1e4)):
    """Norms and clipped sums of the ghost path equal the vmapped clipping's (padding rows masked on both)."""
    fn = _ghost_fn(loss)
    vmapped = jax.jit(lambda p, f, b, c: clipping.clipped_grad_sum(loss, p, f, b, jax.random.PRNGKey(0), c))
    for c in cs:
        want, want_losses, want_norms = vmapped(params, frozen, batch, c)
        got, losses, norms = fn(params, frozen, batch, c)
        np.testing.assert_allclose(norms, want_norms, rtol=LORA_RTOL)
        np.testing.assert_allclose(losses, want_losses, rtol=1e-6)
        assert jax.tree.structure(got) == jax.tree.structure(want)
        _assert_trees_close(want, got, rtol=LORA_RTOL)
    return norms


# (variant, lora targets, t, seed): t = 4 keeps the adapters' factors (ghost norms), t = 40 forms their
# per-example gradients; "gpt2" is untied (lm_head) with biases and learned positions, "native" tied.
LORA_CASES = [("native", "attention", 4, 0), ("native", "mlp", 40, 1), ("gpt2", "all", 4, 2), ("gpt2", "mlp", 40, 3)]


@pytest.mark.parametrize("variant,targets,t,seed", LORA_CASES + [
    pytest.param("gemma", "all", 4, 4, marks=pytest.mark.slow)])  # remat, grouped-query attention, q/k norms
def test_lora_norms_and_clipped_sums_equal_vmap(variant, targets, t, seed):
    loss, params, frozen, batch = _lora_setup(variant, targets, 5, t, seed)
    assert set(params) == {"lora"} and batch["mask"].min() == 0.0
    _assert_equals_vmap(loss, params, frozen, batch)


def test_lora_plan_taps_both_adapter_matrices_and_leaves_the_base_plain():
    for t, want in ((4, "factors"), (40, "grad")):
        loss, params, frozen, batch = _lora_setup("native", "all", 2, t, 0)
        with ghost._Session(discover=True, batch_size=2) as s:
            jax.eval_shape(loss, params, frozen, batch, jax.random.PRNGKey(0))
        plan = ghost._plan(dict(s.uses), params)
        assert set(plan) == {("lora", *path) for path in _paths(params["lora"])}
        assert plan[("lora", "layer_0", "attention", "q", "a")][0].mode == want
        assert plan[("lora", "layer_0", "mlp", "down", "b")][0].mode == want
        assert ("params", "layer_0", "attention", "q", "kernel") in s.uses  # seen, but frozen: no probe


def _paths(tree):
    return [tuple(k.key for k in path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


# (variant, targets, K, t, seed, mode): K = 2 is the sampled form (own label + one other; also the full form of
# 2 labels), K = 4 the full form of 4 labels: the loss is one function of the batch's K rows per example.
CONTRAST_CASES = [("native", "all", 2, 4, 0, "lora"), ("native", "attention", 4, 6, 1, "lora"),
                  ("gpt2", "mlp", 4, 20, 2, "lora"), ("gpt2", "all", 2, 4, 3, "lora"),
                  ("native", "all", 2, 4, 4, "full")]


@pytest.mark.parametrize("variant,targets,k,t,seed,mode", CONTRAST_CASES)
def test_label_contrast_rows_regroup_per_example_and_equal_vmap(variant, targets, k, t, seed, mode):
    """The contrast loss runs the model on B * K example-major rows: ghost regroups them per example."""
    loss, params, frozen, batch = _lora_setup(variant, targets, 5, t, seed, contrast=k, mode=mode)
    assert getattr(loss, ghost.ROW_LAYOUT_ATTR) == ghost.EXAMPLE_MAJOR
    _assert_equals_vmap(loss, params, frozen, batch)


@pytest.mark.parametrize("contrast", [0, 4])
def test_lora_per_example_terms_bounded_and_padding_rows_exactly_zero(contrast):
    loss, params, frozen, batch = _lora_setup("gpt2", "all", 5, 6, 7, contrast=contrast)
    fn = _ghost_fn(loss)
    c = 0.05
    full, _, norms = fn(params, frozen, batch, c)
    real = np.flatnonzero(batch["mask"])
    assert np.all(np.asarray(norms)[real] > c)  # every real example is clipped: the bound is tight
    for i in real:
        term, _, _ = fn(params, frozen, dict(batch, mask=np.eye(5, dtype=np.float32)[i]), c)
        assert float(optax.global_norm(term)) <= c * (1 + 1e-5)  # float32 rounding of w_i G_i's norm
    # padding rows: whatever they hold, the sum is bitwise the same (their pieces are zeroed before every sum)
    pad = np.flatnonzero(batch["mask"] == 0)
    other = {k: v.copy() for k, v in batch.items()}
    rng = np.random.default_rng(0)
    for key, v in other.items():
        if key != "mask" and v.dtype == np.int32:
            v[pad] = rng.integers(0, 2 if key == "contrast_label" else 61, v[pad].shape)
    changed, _, _ = fn(params, frozen, other, c)
    for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(changed)):
        np.testing.assert_array_equal(a, b)
    nothing, _, _ = fn(params, frozen, dict(batch, mask=np.zeros(5, np.float32)), c)
    assert all(not np.any(np.asarray(x)) for x in jax.tree.leaves(nothing))


class _Rows(nn.Module):
    """The toy's layers (lookup, dense twice, bias, tied output) on R rows per example, as the contrast runs them."""

    @nn.compact
    def __call__(self, ids, x):
        return _Toy(name="toy")(ids, x)


def _rows_loss(model, layout):
    """Per-example loss over R rows per example, the rows stacked "example" major (i * R + r) or "label"
    major (r * B + i); declared example-major either way."""

    def loss(params, frozen, batch, key):
        ids, x = batch["ids"], batch["x"]  # [B, R, N], [B, R, N, 5]
        b, r = ids.shape[:2]
        if layout == "example":
            out = model.apply(params, ids.reshape(b * r, -1), x.reshape(b * r, *x.shape[2:]))
            out = out.reshape(b, r, *out.shape[1:])
        else:
            out = model.apply(params, ids.swapaxes(0, 1).reshape(r * b, -1),
                              x.swapaxes(0, 1).reshape(r * b, *x.shape[2:]))
            out = out.reshape(r, b, *out.shape[1:]).swapaxes(0, 1)
        return jnp.sum(jnp.square(out - 0.3), axis=(1, 2, 3)), {}

    return ghost.example_major_rows(loss)


def _rows_batch(seed, b=4, r=3):
    rng = np.random.default_rng(seed)
    return {"ids": rng.integers(0, 11, (b, r, 3)).astype(np.int32),
            "x": rng.normal(size=(b, r, 3, 5)).astype(np.float32), "mask": np.ones(b, np.float32)}


@pytest.mark.parametrize("seed", range(2))
def test_grouped_rows_on_every_tap_kind_equal_vmap_and_a_wrong_layout_is_caught(seed):
    """Lookup, dense (twice: cross terms), bias and the tied output on R = 3 rows per example; a loss that
    declares example-major rows but stacks them label-major gets other norms: the comparison has power."""
    model = _Rows()
    batch = _rows_batch(seed)
    params = model.init(jax.random.PRNGKey(seed), batch["ids"][:, 0], batch["x"][:, 0])
    per_example = clipping.per_example_grads(_rows_loss(model, "example"), params, {}, batch, jax.random.PRNGKey(0))
    want_norms = clipping.global_norms(per_example)
    for layout in ("example", "label"):
        got, _, norms = _ghost_fn(_rows_loss(model, layout))(params, {}, batch, 1.0)
        if layout == "example":
            np.testing.assert_allclose(norms, want_norms, rtol=LORA_RTOL)
            _assert_trees_close(_clipped_reference(per_example, 1.0), got, rtol=LORA_RTOL)
        else:  # the vmapped clipping is right for either stacking; ghost only for the declared one
            assert not np.allclose(norms, want_norms, rtol=1e-2)


def test_more_rows_than_examples_without_a_declaration_is_refused():
    model = _Rows()
    batch = _rows_batch(0)
    params = model.init(jax.random.PRNGKey(0), batch["ids"][:, 0], batch["x"][:, 0])
    declared = _rows_loss(model, "example")

    def undeclared(*args):
        return declared(*args)

    with pytest.raises(ghost.GhostClippingError, match="runs on 12 rows for a batch of 4 examples.*declare"):
        ghost.clipped_grad_sum(undeclared, params, {}, batch, jax.random.PRNGKey(0), 1.0)
    odd = dict(batch, mask=np.ones(5, np.float32))  # 12 rows are not a multiple of 5 examples
    with pytest.raises(ghost.GhostClippingError, match="not a multiple of 5"):
        ghost.clipped_grad_sum(declared, params, {}, odd, jax.random.PRNGKey(0), 1.0)


def test_untapped_lora_leaf_is_refused():
    class PlainLora(nn.Module):
        @nn.compact
        def __call__(self, x):
            w = self.param("w", nn.initializers.normal(1.0), (3, 2))
            a = self.variable("lora", "a", lambda: jnp.ones((3, 2)))
            return ghost.dense(self, "w", x, w) + jnp.dot(x, a.value)  # the adapter bypasses the taps

    model = PlainLora()
    batch = {"x": np.ones((2, 3), np.float32), "mask": np.ones(2, np.float32)}
    params, frozen = lm.split_variables(model.init(jax.random.PRNGKey(0), batch["x"]), ("lora",))

    def loss(p, f, b, k):
        return jnp.sum(model.apply(lm.merge_variables(p, f), b["x"]), axis=1), {}

    with pytest.raises(ghost.GhostClippingError, match="lora/a is not computed through a ghost tap"):
        ghost.clipped_grad_sum(loss, params, frozen, batch, jax.random.PRNGKey(0), 1.0)


def test_a_name_in_two_collections_is_refused_not_merged():
    class Clash(nn.Module):
        @nn.compact
        def __call__(self, x):
            w = self.param("w", nn.initializers.normal(1.0), (3, 2))
            other = self.variable("lora", "w", lambda: jnp.ones((3, 2)))
            return ghost.dense(self, "w", x, w) + jnp.dot(x, other.value)

    model = Clash()
    batch = {"x": np.ones((2, 3), np.float32), "mask": np.ones(2, np.float32)}
    variables = model.init(jax.random.PRNGKey(0), batch["x"])

    def loss(p, f, b, k):
        return jnp.sum(model.apply(lm.merge_variables(p, f), b["x"]), axis=1), {}

    for trainable in (("params",), ("lora",), ("params", "lora")):
        params, frozen = lm.split_variables(variables, trainable)
        with pytest.raises(ghost.GhostClippingError, match=r"w: a tap must name exactly one variable.*lora.*params"):
            ghost.clipped_grad_sum(loss, params, frozen, batch, jax.random.PRNGKey(0), 1.0)


def test_soft_prompts_are_refused_with_their_reason():
    cfg = get_config("tiny", vocab_size=61, max_len=64, num_layers=1, d_model=32, num_heads=2, head_dim=16, d_ff=48,
                     prompt_length=3)
    model = Transformer(cfg)
    toks = np.zeros((2, 4), np.int32)
    params, frozen = lm.split_variables(model.init(jax.random.PRNGKey(0), toks), ("prompt",))
    batch = {"inputs": toks, "targets": toks, "weights": np.ones((2, 4), np.float32), "mask": np.ones(2, np.float32)}
    with pytest.raises(ghost.GhostClippingError, match="soft prompts.*vmapped clipping"):
        ghost.clipped_grad_sum(lm.make_lm_loss(model), params, frozen, batch, jax.random.PRNGKey(0), 1.0)


@pytest.mark.parametrize("contrast", [0, 2])
def test_lora_strategy_in_the_training_core_equals_vmap(contrast):
    loss, params, frozen, batch = _lora_setup("native", "all", 4, 6, 5, contrast=contrast)
    sums = _core_sums(loss, params, frozen, batch)
    _assert_trees_close(sums["vmap"][0], sums["ghost"][0], rtol=LORA_RTOL)
    for k in ("loss_sum", "count", "clipped"):
        np.testing.assert_allclose(sums["ghost"][1][k], sums["vmap"][1][k], rtol=1e-5)
