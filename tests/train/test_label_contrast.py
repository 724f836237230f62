"""The label-contrast loss (`dp_tune --label-contrast`): its value against an independent reference,
per-example sensitivity <= C with every example's K rows, no gradient into prompt targets, the
settings it refuses, and a real tuning run whose privacy is the run's without it."""

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
from dpsynth.train import finetune, lm, prompts, tune_config, tune_data, tune_model
from tests.train.conftest import assert_each_example_moves_the_clipped_sum_by_at_most_c, make_records
from tests.train.reference import prefix_lm_loss

SMALL = get_config("tiny", vocab_size=64, max_len=256, num_layers=1, d_model=32, num_heads=2, head_dim=16, d_ff=64)
LABELS = ["great", "other", "meh"]  # three labels: the prompts differ in length, so do the rows


class _CharTokenizer:
    def encode(self, text):
        return np.array([4 + ord(c) % 60 for c in text], np.int32)


def _setup(mode="lora", seed=0, weight=0.7, n=6, max_tokens=200):
    config = tune_config.TuneConfig(mode=mode, lora_rank=2, prompt_length=3, template="[{label}] ", max_tokens=max_tokens,
                                    label_contrast=weight)
    model_config = tune_model.tuned_model_config(SMALL, config)
    base = Transformer(SMALL).init(jax.random.PRNGKey(seed), jnp.zeros((1, 4), jnp.int32))["params"]
    variables = tune_model.init_variables(model_config, base, config)
    variables = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.PRNGKey(seed + 1), x.shape), variables)
    params, frozen = lm.split_variables(variables, tune_config.TRAINABLE[mode])
    records = [dict(r, label=LABELS[i % 3]) for i, r in enumerate(make_records(n, seed))]
    plain = prompts.encode_examples(records, _CharTokenizer(), LABELS, config.example_config())
    arrays = tune_data.contrast_arrays(records, _CharTokenizer(), LABELS, config, plain.inputs.shape[1])
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


@pytest.mark.parametrize("settings, message", [
    ({"label_contrast": -1.0}, "finite number >= 0"),
    ({"label_contrast": float("inf")}, "finite number >= 0"),
    ({"label_contrast": 1.0, "label_dropout": 0.1}, "use one"),
    ({"label_contrast": 1.0, "privacy_unit": "user", "max_examples_per_user": 2}, "example-level"),
    ({"label_contrast": 1.0, "mode": "full", "clipping": "ghost"}, "vmapped clipping"),
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
    ({}, False, 5, 0.0, "no label contrast: 5 labels would cost 5 passes per example"),
    ({"label_dropout": 0.1}, False, 2, 0.0, "no label contrast: label_contrast and label_dropout"),
    ({"privacy_unit": "user", "max_examples_per_user": 2}, False, 2, 0.0, "no label contrast: .*example-level"),
    ({"mode": "full", "clipping": "ghost"}, False, 2, 0.0, "no label contrast: .*vmapped clipping"),
    ({"mode": "full"}, True, 2, 0.0, "no label contrast: full tuning of a model with an untied input embedding"),
    ({"mode": "lora"}, True, 2, 1.0, "label contrast 1"),  # (LoRA keeps the dense path)
])
def test_the_automatic_recipe_adds_the_contrast_where_the_run_can_take_it(settings, untied, labels, weight, why):
    """Rule 5 of the recipe: lambda 1 for at most 4 labels; off, with its reason, where an explicit
    contrast would be refused (these settings raise with label_contrast=1) or K passes cost too much."""
    config = tune_config.TuneConfig(recipe="auto", **settings)
    model_config = dataclasses.replace(SMALL, tie_embeddings=not untied)
    got, sentence = tune_model.auto_label_contrast(config, model_config, labels)
    assert got == weight and re.match(why, sentence), sentence
    if weight == 0.0 and labels <= 4 and not untied:
        with pytest.raises(tune_config.TuneError):
            tune_config.TuneConfig(**settings, label_contrast=1.0)


@pytest.mark.parametrize("mechanism", ["dpsgd", "bandmf"])
def test_a_tuning_run_with_the_contrast_is_the_same_mechanism_and_reports_the_loss(tiny_base, tmp_path, mechanism):
    """Also under BandMF (cyclic Poisson sampling, correlated noise): the K rows travel with each example."""
    base_dir, _ = tiny_base
    train, valid = make_records(80, 1), make_records(20, 2, "v")
    cfg = tune_config.TuneConfig(mode="lora", epsilon=4.0, batch_size=16, steps=3, microbatch_size=8, max_tokens=32,
                                 lora_rank=2, learning_rate=1e-2, seed=5, mechanism=mechanism,
                                 bands=2 if mechanism == "bandmf" else None)
    plain = finetune.dp_tune(base_dir, train, valid, str(tmp_path / "plain"), cfg, progress_interval=1e9)
    contrast = finetune.dp_tune(base_dir, train, valid, str(tmp_path / "contrast"),
                                tune_config.TuneConfig(**{**cfg.__dict__, "label_contrast": 1.0}), progress_interval=1e9)
    reports = [json.load(open(os.path.join(r.out_dir, "privacy_report.json"))) for r in (plain, contrast)]
    for key in ("noise_multiplier", "clip_norm", "sampling_probability", "steps"):
        assert reports[0]["training"][key] == reports[1]["training"][key], key
    assert reports[0]["epsilon"] == reports[1]["epsilon"]
    assert "label contrast" in reports[1]["training"]["loss"] and "contrast" not in reports[0]["training"]["loss"]
    assert np.isfinite(contrast.valid_loss)
