"""The label-contrast loss (`dp_tune --label-contrast`): its value against an independent reference,
per-example sensitivity <= C with every example's K rows (full form) or its 2 rows (sampled form:
the own label and one other drawn from the run's seed, the step and the example's index alone), the
bounds between the two forms, no gradient into prompt targets, the settings it refuses, and real
tuning runs whose privacy is the run's without it."""

import dataclasses
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpsynth.models import Transformer, get_config
from dpsynth.train import finetune, lm, prompts, recipe as recipe_lib, tune_config, tune_data, tune_model
from dpsynth.train.tune_resume import run_settings
from tests.train.conftest import assert_each_example_moves_the_clipped_sum_by_at_most_c, make_records
from tests.train.reference import prefix_lm_loss

SMALL = get_config("tiny", vocab_size=64, max_len=256, num_layers=1, d_model=32, num_heads=2, head_dim=16, d_ff=64)
LABELS = ["great", "other", "meh"]  # three labels: the prompts differ in length, so do the rows
LABELS5 = ["great", "other", "meh", "fine", "bad"]  # above 4: "auto" samples the other label


class _CharTokenizer:
    def encode(self, text):
        return np.array([4 + ord(c) % 60 for c in text], np.int32)


def _setup(mode="lora", seed=0, weight=0.7, n=6, max_tokens=200, labels=LABELS):
    config = tune_config.TuneConfig(mode=mode, lora_rank=2, prompt_length=3, template="[{label}] ", max_tokens=max_tokens,
                                    label_contrast=weight)
    model_config = tune_model.tuned_model_config(SMALL, config)
    base = Transformer(SMALL).init(jax.random.PRNGKey(seed), jnp.zeros((1, 4), jnp.int32))["params"]
    variables = tune_model.init_variables(model_config, base, config)
    variables = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.PRNGKey(seed + 1), x.shape), variables)
    params, frozen = lm.split_variables(variables, tune_config.TRAINABLE[mode])
    records = [dict(r, label=labels[i % len(labels)]) for i, r in enumerate(make_records(n, seed))]
    plain = prompts.encode_examples(records, _CharTokenizer(), labels, config.example_config())
    arrays = tune_data.contrast_arrays(records, _CharTokenizer(), labels, config, plain.inputs.shape[1])
    batch = dict(arrays, mask=np.ones(n, np.float32))
    return config, model_config, tune_model.make_loss_fn(model_config, config), params, frozen, batch, records, plain


def test_rows_are_the_example_under_every_label_and_the_own_row_is_its_prefix_lm_row():
    config, _, _, _, _, batch, records, plain = _setup(max_tokens=200)
    assert not plain.truncated
    n, k, t = batch["contrast_inputs"].shape
    assert (n, k) == (len(records), len(LABELS))
    for i, r in enumerate(records):
        own = batch["contrast_label"][i]
        assert LABELS[own] == r["label"]
        width = plain.inputs.shape[1]
        np.testing.assert_array_equal(batch["contrast_inputs"][i, own, :width], plain.inputs[i])
        np.testing.assert_array_equal(batch["contrast_weights"][i, own, :width], plain.weights[i])
        for j, label in enumerate(LABELS):  # row j: label j's prompt, then the same text, weight 0 on the prompt
            prefix = prompts.prompt_ids(_CharTokenizer(), config.template, label)
            np.testing.assert_array_equal(batch["contrast_inputs"][i, j, :prefix.size], prefix)
            assert not batch["contrast_weights"][i, j, :prefix.size - 1].any()
            assert batch["contrast_weights"][i, j].sum() == plain.weights[i].sum()  # the same text tokens


def test_a_truncated_text_is_scored_on_the_same_tokens_under_every_label():
    _, _, _, _, _, batch, records, plain = _setup(max_tokens=24)
    assert plain.truncated  # the shorter "[meh] " prompt leaves room for more of the text
    w, targets = batch["contrast_weights"], batch["contrast_targets"]
    for i in range(len(records)):
        scored = [targets[i, j][w[i, j] > 0] for j in range(len(LABELS))]
        for s in scored[1:]:
            np.testing.assert_array_equal(s, scored[0])


@pytest.mark.parametrize("weight", [0.0, 0.7, 5.0])
def test_loss_is_the_prefix_lm_loss_plus_weight_times_the_bayes_label_cross_entropy(weight):
    _, model_config, loss_fn, params, frozen, batch, _, plain = _setup(weight=weight)
    if weight == 0.0:  # the tuner builds the plain loss at 0; the contrast loss at 0 is that loss
        loss_fn = lm.make_label_contrast_loss(Transformer(model_config), 0.0)
    loss, aux = loss_fn(params, frozen, batch, None)
    n, k, t = batch["contrast_inputs"].shape
    model = Transformer(model_config)
    log_lik = np.zeros((n, k))
    for j in range(k):  # reference: each label's rows scored on their own
        logits = model.apply(lm.merge_variables(params, frozen), batch["contrast_inputs"][:, j])
        tokens = batch["contrast_weights"][:, j].sum(-1)
        log_lik[:, j] = -np.asarray(prefix_lm_loss(logits, batch["contrast_targets"][:, j],
                                                   batch["contrast_weights"][:, j])) * tokens
    own = batch["contrast_label"]
    logits = model.apply(lm.merge_variables(params, frozen), plain.inputs)
    lm_ref = np.asarray(prefix_lm_loss(logits, plain.targets, plain.weights))
    shifted = log_lik - log_lik.max(-1, keepdims=True)
    bayes_ce = -(shifted[np.arange(n), own] - np.log(np.exp(shifted).sum(-1)))
    np.testing.assert_allclose(aux["contrast"], bayes_ce, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(loss, lm_ref + weight * bayes_ce, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(aux["ce_sum"], -log_lik[np.arange(n), own], rtol=1e-4)
    # A batch without the contrast rows (D_valid) gets the Prefix-LM loss alone.
    valid = {"inputs": plain.inputs, "targets": plain.targets, "weights": plain.weights, "mask": batch["mask"]}
    np.testing.assert_allclose(loss_fn(params, frozen, valid, None)[0], lm_ref, rtol=1e-4)


@pytest.mark.parametrize("mode", ["full", "prompt", "lora"])
def test_sensitivity_of_clipped_sum_with_every_examples_k_rows(mode):
    """One example (all its K rows) moves the clipped sum by at most C: it is one privacy unit."""
    _, _, loss_fn, params, frozen, batch, _, _ = _setup(mode, seed=3, weight=2.0)
    assert_each_example_moves_the_clipped_sum_by_at_most_c(loss_fn, params, frozen, batch, clip_norm=0.01)


def test_prompt_targets_get_no_gradient_under_any_label():
    _, _, loss_fn, params, frozen, batch, _, _ = _setup(weight=3.0)
    w = batch["contrast_weights"]
    changed = dict(batch, contrast_targets=np.where(w == 0, (batch["contrast_targets"] + 7) % 60 + 4,
                                                    batch["contrast_targets"]))
    g = jax.jit(jax.grad(lambda p, b: loss_fn(p, frozen, b, None)[0].sum()))
    for a, b in zip(jax.tree.leaves(g(params, batch)), jax.tree.leaves(g(params, changed))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gradient_steps_on_the_contrast_raise_the_own_labels_margin(seed):
    """What the term is for: descending it makes the text likelier under its own label than the others'.

    Adam at 3e-3 stays in the stable regime of this small problem: the contrast falls to about 1%
    of its start within 30 steps on every seed tried (at 3e-2 the trajectory oscillated, so a bound
    on its 30th step held on one CPU's rounding and not on another's). Halving it leaves a margin of
    about 50x for any floating-point path.
    """
    _, _, loss_fn, params, frozen, batch, _, _ = _setup(weight=1.0, seed=seed)
    contrast = jax.jit(lambda p: jnp.mean(loss_fn(p, frozen, batch, None)[1]["contrast"]))
    before = float(contrast(params))
    opt = optax.adam(3e-3)
    state = opt.init(params)

    @jax.jit
    def step(params, state):
        grads = jax.grad(lambda p: jnp.mean(loss_fn(p, frozen, batch, None)[0]))(params)
        updates, state = opt.update(grads, state)
        return optax.apply_updates(params, updates), state

    for _ in range(30):
        params, state = step(params, state)
    assert float(contrast(params)) < 0.5 * before


def test_the_contrasts_gradient_is_a_descent_direction_of_it():
    """The exact first-order property behind the test above: a step of length h along minus the
    gradient of the contrast term lowers it by about h * |g| (Taylor); half of that is the bound, and
    h is small enough that the second-order term is far below the other half."""
    _, _, loss_fn, params, frozen, batch, _, _ = _setup(weight=1.0)
    contrast = jax.jit(lambda p: jnp.mean(loss_fn(p, frozen, batch, None)[1]["contrast"]))
    g = jax.grad(contrast)(params)
    norm = float(optax.global_norm(g))
    assert norm > 1e-3
    h = 1e-3  # |g| is 20-70 here: the decrease (0.02-0.07) is 1e5 times float32's rounding of the loss
    moved = jax.tree.map(lambda p, d: p - h * d / norm, params, g)
    assert float(contrast(moved)) < float(contrast(params)) - 0.5 * h * norm


# ---------------------------------------------------------------- the sampled form


def _sampled(batch, step, seed=0, indices=None):
    """The sampled form's rows of `batch`'s examples `indices` (default all) at `step` (`gather_train`)."""
    idx = np.arange(batch["contrast_label"].shape[0]) if indices is None else np.asarray(indices)
    return tune_data.gather_train({k: v for k, v in batch.items() if k != "mask"}, idx, step, seed=seed,
                                  form="sampled")


def _log_likelihoods(model_config, params, frozen, batch):
    """s [N, K]: each example's summed log-likelihood under each label prompt, one label's rows at a time."""
    model = Transformer(model_config)
    n, k, _ = batch["contrast_inputs"].shape
    out = np.zeros((n, k))
    for j in range(k):
        logits = model.apply(lm.merge_variables(params, frozen), batch["contrast_inputs"][:, j])
        tokens = batch["contrast_weights"][:, j].sum(-1)
        out[:, j] = -np.asarray(prefix_lm_loss(logits, batch["contrast_targets"][:, j],
                                               batch["contrast_weights"][:, j])) * tokens
    return out


def test_the_sampled_form_feeds_the_own_row_and_the_drawn_labels_row():
    _, _, _, _, _, batch, _, _ = _setup(labels=LABELS5, n=10)
    n, k, t = batch["contrast_inputs"].shape
    own, rows = batch["contrast_label"], np.arange(n)
    draws = []
    for step in range(4):
        got = _sampled(batch, step, seed=11)
        other = tune_data.sampled_contrast_labels(own, step, seed=11, labels=k)
        assert got["contrast_inputs"].shape == (n, 2, t) and not got["contrast_label"].any() and got["mask"].all()
        assert ((other != own) & (other >= 0) & (other < k)).all()
        for key in tune_data.CONTRAST_KEYS:
            np.testing.assert_array_equal(got[key][:, 0], batch[key][rows, own])
            np.testing.assert_array_equal(got[key][:, 1], batch[key][rows, other])
        np.testing.assert_array_equal(other, tune_data.sampled_contrast_labels(own, step, seed=11, labels=k))  # (a resume)
        draws.append(other)
    assert len({d.tobytes() for d in draws}) == 4  # a fresh draw per step (10 examples of 4 others each)
    assert (tune_data.sampled_contrast_labels(own, 0, seed=12, labels=k) != draws[0]).any()  # ... and per seed
    padded = _sampled(batch, 0, seed=11, indices=[2, -1])  # padding: a valid row, masked out
    assert padded["contrast_inputs"].shape == (2, 2, t) and padded["mask"].tolist() == [1.0, 0.0]
    # the full form (and a batch without the contrast) is `sampling.gather`'s
    full = tune_data.gather_train({k_: v for k_, v in batch.items() if k_ != "mask"}, rows, 0, seed=11, form="full")
    np.testing.assert_array_equal(full["contrast_inputs"], batch["contrast_inputs"])
    with pytest.raises(tune_config.TuneError, match="resolved"):  # "auto" never reaches a step: K decides it
        tune_data.gather_train({k_: v for k_, v in batch.items() if k_ != "mask"}, rows, 0, seed=11, form="auto")


def test_the_other_label_is_uniform_over_the_labels_that_are_not_the_own():
    """Over steps, each example's other label is uniform over the K - 1 others (never its own). The draws
    are numpy's PCG64 stream, the same on every machine; the bound is far out in the tail for a
    uniform draw (chi-square with 3 degrees of freedom above 40: probability about 1e-8)."""
    k, steps = 5, 4000
    own = np.arange(10) % k
    draws = np.stack([tune_data.sampled_contrast_labels(own, t, seed=3, labels=k) for t in range(steps)])
    expected = steps / (k - 1)
    for i in range(own.size):
        counts = np.bincount(draws[:, i], minlength=k)
        assert counts[own[i]] == 0
        assert ((counts[np.arange(k) != own[i]] - expected) ** 2 / expected).sum() < 40


def test_the_drawn_label_depends_only_on_the_seed_the_step_and_the_example():
    """Which other label an example is contrasted with is public randomness of (seed, step, index): the
    same whatever batch or microbatch it lands in (alone, beside others, reordered, beside padding) and
    whatever the other examples are, so no example's rows depend on another's (one privacy unit)."""
    _, _, _, _, _, batch, _, _ = _setup(labels=LABELS5, n=8)
    alone = _sampled(batch, 7, seed=2, indices=[3])
    for idx in ([5, 3, 0], [-1, 3, -1, 7], [7, 6, 5, 4, 3, 2, 1, 0]):
        got = _sampled(batch, 7, seed=2, indices=idx)
        for key in tune_data.CONTRAST_KEYS:
            np.testing.assert_array_equal(got[key][idx.index(3)], alone[key][0])
    own = batch["contrast_label"]
    others = np.arange(8) != 3
    for shift in range(1, 5):  # every other example's label changed (their data), example 3's kept
        changed = np.where(others, (own + shift) % 5, own)
        assert (tune_data.sampled_contrast_labels(changed, 7, seed=2, labels=5)[3]
                == tune_data.sampled_contrast_labels(own, 7, seed=2, labels=5)[3])


@pytest.mark.parametrize("mode", ["full", "prompt", "lora"])
def test_sensitivity_of_clipped_sum_with_the_sampled_rows(mode):
    """One example (its 2 sampled rows) moves the clipped sum by at most C: the term is part of its loss."""
    _, _, loss_fn, params, frozen, batch, _, _ = _setup(mode, seed=3, weight=2.0, labels=LABELS5)
    assert_each_example_moves_the_clipped_sum_by_at_most_c(loss_fn, params, frozen, _sampled(batch, 1, seed=4),
                                                           clip_norm=0.01)


@pytest.mark.parametrize("k", [2, 3, 5, 12, 40])
def test_the_sampled_term_bounds_the_full_term_on_random_scores(k):
    """E_k'[softplus(s_k' - s_y)] <= logsumexp_k s_k - s_y <= (K - 1) E_k'[softplus(s_k' - s_y)], equal at
    K = 2: exact inequalities (max <= log(1 + sum) and prod (1 + a) >= 1 + sum a), checked in float64
    with a margin of 1e-9 relative, far above float64 rounding and far below any gap that matters."""
    for seed in range(3):
        rng = np.random.default_rng([k, seed])
        s = rng.normal(0.0, [0.1, 3.0, 30.0][seed], (500, k))
        y = rng.integers(0, k, 500)
        rows = np.arange(500)
        full = np.logaddexp.reduce(s, axis=1) - s[rows, y]
        soft = np.logaddexp(0.0, s - s[rows, y][:, None])
        soft[rows, y] = 0.0
        mean = soft.sum(1) / (k - 1)
        tol = 1e-9 * (1 + np.abs(full))
        assert (mean <= full + tol).all() and (full <= (k - 1) * mean + tol).all()
        if k == 2:
            np.testing.assert_allclose(mean, full, rtol=1e-12, atol=1e-12)
        else:  # strict somewhere: the sampled term is a bound, not the full term
            assert (full - mean > 1e-3).any() and ((k - 1) * mean - full > 1e-3).any()


@pytest.mark.parametrize("labels", [LABELS[:2], LABELS, LABELS5])
def test_the_sampled_loss_is_softplus_of_the_margin_and_bounds_the_full_one(labels):
    """The model's own terms: the 2-row loss is softplus(s_k' - s_y) of the per-label likelihoods
    (an independent reference), and its exact expectation over k' (every other label in turn) bounds
    the full term as above. The terms are computed in float32 from log-likelihoods s of some hundred
    nats, sums of T token log-probabilities each rounded at about 1e-7 of its size; softplus and
    logsumexp have slope <= 1 in each s, so the two paths agree to 1e-6 of sum_k |s_k| (observed:
    about 1e-5 absolute for |s| ~ 150), a margin of some 20x, while a wrong row or label moves a term by
    its whole margin s_k' - s_y."""
    _, model_config, loss_fn, params, frozen, batch, _, _ = _setup(weight=1.0, labels=labels)
    n, k, _ = batch["contrast_inputs"].shape
    own, rows = batch["contrast_label"], np.arange(n)
    s = _log_likelihoods(model_config, params, frozen, batch)
    tol = 1e-6 * (1 + np.abs(s).sum(1))  # [N], see above
    full = np.asarray(loss_fn(params, frozen, batch, None)[1]["contrast"], np.float64)
    terms = np.zeros((n, k - 1))
    for j in range(1, k):
        other = (own + j) % k
        pair = {key: batch[key][rows[:, None], np.stack([own, other], 1)] for key in tune_data.CONTRAST_KEYS}
        pair.update(contrast_label=np.zeros(n, np.int32), mask=batch["mask"])
        terms[:, j - 1] = loss_fn(params, frozen, pair, None)[1]["contrast"]
        assert (np.abs(terms[:, j - 1] - np.logaddexp(0.0, s[rows, other] - s[rows, own])) <= tol).all()
    mean = terms.mean(1)
    assert (mean <= full + tol).all() and (full <= (k - 1) * mean + (k - 1) * tol).all()
    if k == 2:  # one other label: the two forms are the same term
        assert (np.abs(mean - full) <= tol).all()
        sampled = loss_fn(params, frozen, dict(_sampled(batch, 5), mask=batch["mask"]), None)[0]
        assert (np.abs(np.asarray(sampled) - np.asarray(loss_fn(params, frozen, batch, None)[0])) <= tol).all()


def test_the_form_auto_is_full_up_to_4_labels_and_only_the_sampled_form_enters_the_fingerprint():
    config = tune_config.TuneConfig(label_contrast=1.0)
    assert config.label_contrast_form == "auto"
    assert [config.contrast_form(k) for k in (2, 3, 4, 5, 40)] == ["full"] * 3 + ["sampled"] * 2
    assert [config.contrast_rows(k) for k in (2, 3, 4, 5, 40)] == [2, 3, 4, 2, 2]
    full = dataclasses.replace(config, label_contrast_form="full")
    assert full.contrast_rows(40) == 40 and dataclasses.replace(config, label_contrast_form="sampled").contrast_rows(3) == 2
    assert "label_contrast_form" not in full.to_json()  # the one form before there were two: older fingerprints hold
    assert dataclasses.replace(config, label_contrast_form="sampled").to_json()["label_contrast_form"] == "sampled"
    assert "label_contrast_form" not in tune_config.TuneConfig(label_contrast=0.0, label_contrast_form="sampled").to_json()
    with pytest.raises(tune_config.TuneError, match="label_contrast_form must be one of"):
        tune_config.TuneConfig(label_contrast_form="half")


def _prepared(config, labels, resume_meta=None):
    recipe = (recipe_lib.Recipe(batch_size=16.0, steps=20, epochs=1.0, learning_rate=0.01, why=())
              if config.recipe == "auto" else None)
    return tune_config.Prepared(config=config, recipe=recipe, length=None, plan=None, labels=labels,
                                labels_from_data=True, train_users=None, state_dir="", ckpt_dir="",
                                resume_meta=resume_meta)


@pytest.mark.parametrize("given, older, labels", [
    ({"recipe": "auto"}, {"label_contrast": 0.0}, LABELS5),  # the recipe left 5 labels without the contrast
    ({"recipe": "auto"}, {"label_contrast": 1.0}, LABELS),  # ... and gave 3 the full contrast
    ({"label_contrast": 1.0}, {}, LABELS5),  # a contrast forced on 5 labels: the full form
    ({"recipe": "auto", "label_contrast_form": "sampled"}, {"label_contrast": 1.0}, LABELS),  # a new run's, sampled
])
def test_a_resume_goes_on_with_its_checkpoints_contrast(given, older, labels):
    """A checkpoint records the run's resolved settings (the fingerprint a resume must match). A run begun
    before the sampled form (no label_contrast_form recorded: the full one), or before the recipe took
    the contrast above 4 labels (recorded off), resolves "auto" to what it began with: the same settings,
    so its resume is not refused."""
    user = tune_config.TuneConfig(**given)
    began = dataclasses.replace(user, **older, **({} if "label_contrast_form" in given else {"label_contrast_form": "full"}))
    settings = {k: v for k, v in run_settings(began).items() if not (k == "label_contrast_form" and v == "full")}
    resumed = tune_model.resolve_label_contrast(_prepared(user, labels, {"settings": settings}), SMALL)
    assert run_settings(resumed.config) == settings
    fresh = tune_model.resolve_label_contrast(_prepared(user, labels), SMALL).config  # a new run: the rule
    assert fresh.contrast == 1.0 and fresh.label_contrast_form == (given.get("label_contrast_form")
                                                                  or user.contrast_form(len(labels)))
    if user.recipe == "auto" and older["label_contrast"] == 0.0:
        assert "the checkpoint's run began without it" in resumed.recipe.why[-1]


@pytest.mark.slow  # make test-slow: ~43 s
def test_a_run_begun_with_the_full_form_on_5_labels_resumes_under_auto_with_it(tiny_base, tmp_path):
    """End to end: a run of before the two forms (a contrast forced on 5 labels: full, its form
    unrecorded) stopped at step 1 resumes with today's default ("auto", which would sample on 5
    labels) instead of refusing, and goes on with the full form it began with."""
    from dpsynth.models.directory import load_model

    base_dir, _ = tiny_base
    train = [dict(r, label=LABELS5[i % 5]) for i, r in enumerate(make_records(40, 1))]
    cfg = tune_config.TuneConfig(mode="lora", epsilon=4.0, batch_size=8, steps=3, microbatch_size=8, max_tokens=32,
                                 lora_rank=2, learning_rate=1e-2, seed=5, label_contrast=1.0)
    out = str(tmp_path / "out")
    finetune.dp_tune(base_dir, train, [], out, dataclasses.replace(cfg, label_contrast_form="full"), stop_after=1,
                     progress_interval=1e9)
    assert cfg.contrast_form(5) == "sampled"  # what a new run would take
    finetune.dp_tune(base_dir, train, [], out, cfg, resume=True, progress_interval=1e9)
    manifest = load_model(out).manifest["dp_tune"]
    assert manifest["steps"] == 3 and "label_contrast_form" not in manifest["config"]  # (full: the one older form)
    report = json.load(open(os.path.join(out, "privacy_report.json")))
    assert "every label prompt" in report["training"]["loss"]


@pytest.mark.parametrize("settings, message", [
    ({"label_contrast": -1.0}, "finite number >= 0"),
    ({"label_contrast": float("inf")}, "finite number >= 0"),
    ({"label_contrast": 1.0, "label_dropout": 0.1}, "use one"),
    ({"label_contrast": 1.0, "privacy_unit": "user", "max_examples_per_user": 2}, "example-level"),
    ({"label_contrast": 1.0, "mode": "prompt", "clipping": "ghost"}, "prompt tuning .*vmapped clipping"),
])
def test_settings_it_cannot_serve_are_refused(settings, message):
    with pytest.raises(tune_config.TuneError, match=message):
        tune_config.TuneConfig(**settings)


def test_auto_by_default_off_with_a_manual_recipe_and_absent_from_the_fingerprint_when_off():
    config = tune_config.TuneConfig()
    assert config.label_contrast == "auto" and config.contrast == 0.0
    assert tune_model.auto_label_contrast(config, SMALL, 2) == (0.0, None)
    with pytest.raises(tune_config.TuneError, match="resolved"):
        tune_config.TuneConfig(recipe="auto").contrast  # noqa: B018 (no step is built on an unresolved choice)
    assert "label_contrast" not in dataclasses.replace(config, label_contrast=0.0).to_json()
    assert tune_config.TuneConfig(label_contrast=0.5).to_json()["label_contrast"] == 0.5
    with pytest.raises(tune_config.TuneError, match="or 'auto'"):
        tune_config.TuneConfig(label_contrast="much")


@pytest.mark.parametrize("settings, untied, labels, weight, why", [
    ({}, False, 2, 1.0, "label contrast 1: each example also trains the model to tell its label from the other label "),
    ({"mode": "prompt"}, False, 4, 1.0, "label contrast 1: .* from the other 3 labels "),
    ({"mode": "full"}, False, 3, 1.0, "label contrast 1: .* from the other 2 labels "),
    ({}, False, 5, 1.0, "label contrast 1: .* from one of the other 4 labels, drawn at random at each step .*the "
                        "sampled form: 2 passes per example instead of 5"),
    ({}, False, 40, 1.0, "label contrast 1: .* from one of the other 39 labels, drawn .*2 passes per example instead of 40"),
    ({"label_contrast_form": "full"}, False, 5, 1.0, "label contrast 1: .* from the other 4 labels .*5 passes per example"),
    ({"label_contrast_form": "sampled"}, False, 3, 1.0, "label contrast 1: .*one of the other 2 labels, drawn .*2 passes"),
    ({"label_dropout": 0.1}, False, 2, 0.0, "no label contrast: label_contrast and label_dropout"),
    ({"privacy_unit": "user", "max_examples_per_user": 2}, False, 2, 0.0, "no label contrast: .*example-level"),
    ({"mode": "full", "clipping": "ghost"}, False, 2, 1.0, "label contrast 1"),  # ghost regroups the K rows
    ({"mode": "lora", "clipping": "ghost"}, False, 4, 1.0, "label contrast 1"),
    ({"mode": "full"}, True, 2, 0.0, "no label contrast: full tuning of a model with an untied input embedding"),
    ({"mode": "lora"}, True, 2, 1.0, "label contrast 1"),  # (LoRA keeps the dense path)
])
def test_the_automatic_recipe_adds_the_contrast_where_the_run_can_take_it(settings, untied, labels, weight, why):
    """Rule 5 of the recipe: lambda 1 for every label set (the full form up to 4 labels, the sampled form's
    2 passes above); off, with its reason, where an explicit contrast would be refused (these settings
    raise with label_contrast=1)."""
    config = tune_config.TuneConfig(recipe="auto", **settings)
    model_config = dataclasses.replace(SMALL, tie_embeddings=not untied)
    got, sentence = tune_model.auto_label_contrast(config, model_config, labels)
    assert got == weight and re.match(why, sentence), sentence
    if weight == 0.0 and not untied:
        with pytest.raises(tune_config.TuneError):
            tune_config.TuneConfig(**settings, label_contrast=1.0)


@pytest.mark.parametrize("form", [pytest.param("full", marks=pytest.mark.slow), "sampled"])  # ~30 s each
def test_lora_ghost_clipping_with_the_contrast_trains_the_same_adapters(tiny_base, tmp_path, form):
    """dp-tune --mode lora --clipping ghost --label-contrast 1: ghost regroups each example's K rows (full form, 3
    labels; sampled form, 2 of 5) and releases the adapters the vmapped clipping releases (float32 rounding).
    The regrouping's equality for both forms on every layer type: tests/dp/test_ghost.py."""
    from dpsynth.models.directory import load_model

    base_dir, _ = tiny_base
    names = ["great", "other", "meh"] if form == "full" else ["a", "b", "c", "d", "e"]
    train = [dict(r, label=names[i % len(names)]) for i, r in enumerate(make_records(40, 1))]
    cfg = tune_config.TuneConfig(mode="lora", epsilon=4.0, batch_size=16, steps=2, microbatch_size=8, max_tokens=32,
                                 lora_rank=2, learning_rate=1e-2, seed=5, clip_norm=0.1, label_contrast=1.0,
                                 label_contrast_form=form)
    weights = {}
    for method in ("vmap", "ghost"):
        out = str(tmp_path / method)
        finetune.dp_tune(base_dir, train, [], out, dataclasses.replace(cfg, clipping=method), progress_interval=1e9)
        weights[method] = load_model(out).variables["lora"]
    for a, b in zip(jax.tree.leaves(weights["vmap"]), jax.tree.leaves(weights["ghost"])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mechanism, form", [pytest.param("dpsgd", "full", marks=pytest.mark.slow),  # ~22 s
                                             ("bandmf", "sampled")])
def test_a_tuning_run_with_the_contrast_is_the_same_mechanism_and_reports_the_loss(tiny_base, tmp_path, mechanism, form):
    """Also under BandMF (cyclic Poisson sampling, correlated noise): the K rows (or the sampled form's 2,
    here of 5 labels) travel with each example."""
    base_dir, _ = tiny_base
    names = ["great", "other"] if form == "full" else ["a", "b", "c", "d", "e"]
    train = [dict(r, label=names[i % len(names)]) for i, r in enumerate(make_records(80, 1))]
    valid = [dict(r, label=names[i % len(names)]) for i, r in enumerate(make_records(20, 2, "v"))]
    cfg = tune_config.TuneConfig(mode="lora", epsilon=4.0, batch_size=16, steps=3, microbatch_size=8, max_tokens=32,
                                 lora_rank=2, learning_rate=1e-2, seed=5, mechanism=mechanism,
                                 bands=2 if mechanism == "bandmf" else None)
    plain = finetune.dp_tune(base_dir, train, valid, str(tmp_path / "plain"), cfg, progress_interval=1e9)
    contrast = finetune.dp_tune(base_dir, train, valid, str(tmp_path / "contrast"),
                                tune_config.TuneConfig(**{**cfg.__dict__, "label_contrast": 1.0,
                                                          "label_contrast_form": form}), progress_interval=1e9)
    reports = [json.load(open(os.path.join(r.out_dir, "privacy_report.json"))) for r in (plain, contrast)]
    for key in ("noise_multiplier", "clip_norm", "sampling_probability", "steps"):
        assert reports[0]["training"][key] == reports[1]["training"][key], key
    assert reports[0]["epsilon"] == reports[1]["epsilon"]
    assert "label contrast" in reports[1]["training"]["loss"] and "contrast" not in reports[0]["training"]["loss"]
    assert ("sampled form" in reports[1]["training"]["loss"]) == (form == "sampled")
    assert np.isfinite(contrast.valid_loss)
