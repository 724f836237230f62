"""DP tuner: sensitivity in every mode, Prefix-LM masking through the model, end-to-end run, resume
equivalence, budget refusal, bad input before any compute, and the canary audit of the tuner."""

import dataclasses
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpsynth.dp import report
from dpsynth.models import get_config
from dpsynth.models.directory import load_model
from dpsynth.train import audit, finetune, lm, sweep, tune_config, tune_model, tune_resume
from dpsynth.train.checkpoint import TrainCheckpointer
from tests.train.conftest import assert_each_example_moves_the_clipped_sum_by_at_most_c, make_records
from tests.dp.ledgers import merged, same_epsilon, without_run, without_runs


SMALL = get_config("tiny", vocab_size=64, max_len=32, num_layers=1, d_model=32, num_heads=2, head_dim=16, d_ff=64)


class _CharTokenizer:
    """Characters -> ids 4..63 (the SMALL model's vocabulary)."""

    def encode(self, text):
        return np.array([4 + ord(c) % 60 for c in text], np.int32)


def _encoded_batch(seed, n=6):
    """Real Prefix-LM rows: even rows under their label prompt, odd rows under the null prompt
    (label dropout's rows), as the tuner feeds them."""
    from dpsynth.train import prompts

    records = make_records(n, seed)
    cfg = prompts.ExampleConfig(template="[{label}] ", max_tokens=40)
    labeled = prompts.encode_examples(records, _CharTokenizer(), ["great", "other"], cfg, pad_to=40)
    null = prompts.encode_null_examples(records, _CharTokenizer(), cfg, pad_to=40)
    pick = lambda a, b: np.stack([a[i] if i % 2 == 0 else b[i] for i in range(n)])
    batch = {k: pick(labeled.arrays()[k], null.arrays()[k]) for k in ("inputs", "targets", "weights")}
    return dict(batch, mask=np.ones(n, np.float32))


def _random_setup(mode, seed, rows="random"):
    config = tune_config.TuneConfig(mode=mode, lora_rank=2, prompt_length=3)
    model_config = tune_model.tuned_model_config(SMALL, config)
    from dpsynth.models import Transformer

    base = Transformer(SMALL).init(jax.random.PRNGKey(seed), jnp.zeros((1, 4), jnp.int32))["params"]
    variables = tune_model.init_variables(model_config, base, config)
    # Random (non-zero) adapters so every trainable leaf gets gradient.
    variables = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.PRNGKey(seed + 1), x.shape), variables)
    params, frozen = lm.split_variables(variables, tune_config.TRAINABLE[mode])
    rng = np.random.default_rng(seed)
    n, t = 5, 12
    targets = rng.integers(4, 64, (n, t)).astype(np.int32)
    weights = (rng.random((n, t)) > 0.3).astype(np.float32)
    batch = {"inputs": rng.integers(4, 64, (n, t)).astype(np.int32), "targets": targets, "weights": weights,
             "mask": np.ones(n, np.float32)}
    if rows == "encoded":
        batch = _encoded_batch(seed)
    return tune_model.make_loss_fn(model_config, config), params, frozen, batch


@pytest.mark.parametrize("rows", ["random", "encoded"])
@pytest.mark.parametrize("mode", ["full", "prompt", "lora"])
def test_sensitivity_of_clipped_sum_in_every_mode(mode, rows):
    """Every example's clipped contribution is <= C, also for real rows under label and null prompts."""
    loss_fn, params, frozen, batch = _random_setup(mode, seed=3, rows=rows)
    assert_each_example_moves_the_clipped_sum_by_at_most_c(loss_fn, params, frozen, batch, clip_norm=0.05)


@pytest.mark.parametrize("rows", ["random", "encoded"])
def test_prefix_targets_get_no_gradient_through_the_model(rows):
    """Changing the targets of weight-0 positions (the label or null prompt, padding) changes no gradient."""
    loss_fn, params, frozen, batch = _random_setup("lora", seed=5, rows=rows)
    if rows == "encoded":
        assert (batch["weights"][1, :3] == 0).all() and batch["weights"][1, 3] == 1  # null prefix BOS "[] "
    changed = dict(batch, targets=np.where(batch["weights"] == 0, (batch["targets"] + 7) % 60 + 4, batch["targets"]))
    g = jax.jit(jax.grad(lambda p, b: loss_fn(p, frozen, b, None)[0].sum()))
    for a, b in zip(jax.tree.leaves(g(params, batch)), jax.tree.leaves(g(params, changed))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    # Per-example normalisation: each row's loss is the mean over its weighted target tokens,
    # computed independently from the model's logits (tests.train.reference.prefix_lm_loss).
    from dpsynth.models import Transformer
    from tests.train.reference import prefix_lm_loss

    model_config = tune_model.tuned_model_config(SMALL, tune_config.TuneConfig(mode="lora", lora_rank=2))
    logits = Transformer(model_config).apply(lm.merge_variables(params, frozen), batch["inputs"])
    expected = prefix_lm_loss(logits, batch["targets"], batch["weights"])
    np.testing.assert_allclose(loss_fn(params, frozen, batch, None)[0], expected, rtol=1e-5)
    doubled = dict(batch, weights=batch["weights"] * 2.0)  # scaling the weights leaves a mean unchanged
    np.testing.assert_allclose(loss_fn(params, frozen, doubled, None)[0], expected, rtol=1e-5)


# ---------------------------------------------------------------------------------- runs

TRAIN, VALID = make_records(120, 1), make_records(30, 2, "v")
BASE_CFG = tune_config.TuneConfig(mode="lora", epsilon=4.0, batch_size=24, steps=4, microbatch_size=16, max_tokens=32,
                           checkpoint_every=2, lora_rank=2, learning_rate=1e-2)


@pytest.fixture(scope="module")
def full_run(tiny_base, tmp_path_factory):
    base_dir, _ = tiny_base
    out = str(tmp_path_factory.mktemp("tune") / "lora")
    res = finetune.dp_tune(base_dir, TRAIN, VALID, out, BASE_CFG, progress_interval=1e9)
    return base_dir, out, res


def test_end_to_end_model_dir_report_and_only_trainable_changes(full_run):
    base_dir, out, res = full_run
    assert res.steps == 4 and res.epsilon["rdp"] <= 4.0 and res.noise_multiplier > 0
    rep = report.load_report(out)
    assert rep["private"] and rep["training"]["mode"] == "lora" and rep["training"]["steps"] == 4
    assert rep["contamination_sha256"] == "c0" * 32  # read from the base manifest
    assert rep["delta"] == pytest.approx(1 / len(TRAIN))
    assert {c["name"] for c in rep["side_channels"]} >= {"label set", "private state", "truncation count",
                                                        "public pretraining corpus", "other releases about the same data"}
    assert "valid_loss" not in rep["training"] and "valid_loss" not in json.dumps(rep)  # non-DP: private state only
    # The private state: a 0700 sibling outside the model dir, with the checkpoints and the non-DP losses.
    state = tune_resume.default_state_dir(out)
    assert res.state_dir == state and state == os.path.abspath(out) + ".private"
    assert os.stat(state).st_mode & 0o777 == 0o700
    assert os.path.isdir(os.path.join(state, "checkpoints")) and not os.path.exists(os.path.join(out, "checkpoints"))
    with open(os.path.join(state, "losses.json")) as f:
        losses = json.load(f)
    assert losses["valid_loss"] == res.valid_loss and losses["dp"] is False
    assert os.stat(os.path.join(state, "losses.json")).st_mode & 0o777 == 0o600
    _assert_owner_only(os.path.join(state, "checkpoints"))  # Orbax's files too, not only behind the 0700 parent
    assert os.path.exists(os.path.join(out, "privacy_report.md"))
    tuned, base = load_model(out), load_model(base_dir)
    assert tuned.manifest["prompt_template"] == BASE_CFG.template and tuned.manifest["collections"] == ["lora"]
    for a, b in zip(jax.tree.leaves(tuned.variables["params"]), jax.tree.leaves(base.variables["params"])):
        np.testing.assert_array_equal(a, b)
    init = tune_model.init_variables(tuned.config, base.variables["params"], BASE_CFG)["lora"]
    assert any(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(tuned.variables["lora"]), jax.tree.leaves(init)))
    assert math.isfinite(res.valid_loss)


def test_tuning_and_generation_use_identical_prefix_ids(full_run, tmp_path):
    """The label-prompt contract end to end: the rows the tuner trained on and the prompts the
    generator samples from the tuned directory (template and labels read from its manifest)."""
    import types

    from dpsynth.generate import model_info, plan as plan_lib, transforms
    from dpsynth.train.prompts import encode_examples

    _, out, _ = full_run
    tok = load_model(out).tokenizer
    enc = encode_examples(TRAIN, tok, ["great", "other"], BASE_CFG.example_config())
    tuned = {}
    for i, rec in enumerate(TRAIN):
        row = np.concatenate([enc.inputs[i, :1], enc.targets[i]])
        tuned.setdefault(rec["label"], row[: int(np.argmax(enc.weights[i] > 0)) + 1])  # BOS + label prompt

    class RecordingSampler:
        def __init__(self):
            self.seen = []

        def sample(self, params, prompts, keys, contrasts=None):
            self.seen += [np.asarray(p) for p in prompts]
            n = len(prompts)
            return types.SimpleNamespace(tokens=np.zeros((n, 1), np.int32), lengths=np.zeros(n, np.int32),
                                         finished=np.ones(n, bool), scores=np.zeros(n))

    info = model_info.read_model_info(out)
    plan = plan_lib.make_plan(plan_lib.GenerateConfig(model_dir=out, out_dir=str(tmp_path), num_examples=8, max_len=32),
                              info)
    os.makedirs(os.path.join(str(tmp_path), plan_lib.SHARD_DIR))
    sampler, spec = RecordingSampler(), plan.specs[0]
    transforms.generate_shard(plan, model_info.ModelBundle(decoder=None, params=None, tokenizer=tok), sampler, spec)
    assert set(spec.labels) == set(tuned) == {"great", "other"}
    for label, ids in zip(spec.labels, sampler.seen, strict=True):
        assert ids.dtype == np.int32
        np.testing.assert_array_equal(ids, tuned[label])


def test_label_dropout_changes_no_dp_property(full_run, tmp_path):
    """Label dropout trains some examples under the null prompt: the plan, sigma, ledger and epsilon
    are those of the same run without it; the model learns from the null rows and says so."""
    base_dir, out, res = full_run
    cfg = dataclasses.replace(BASE_CFG, label_dropout=0.5)
    drop = finetune.dp_tune(base_dir, TRAIN, VALID, str(tmp_path / "drop"), cfg, progress_interval=1e9)
    assert drop.noise_multiplier == res.noise_multiplier and drop.steps == res.steps
    assert drop.epsilon == res.epsilon and drop.delta == res.delta
    strip = lambda rep: [{k: v for k, v in e.items() if k not in ("name", "run")} for e in rep["ledger"]["entries"]]
    assert strip(drop.report) == strip(res.report)
    tuned = load_model(str(tmp_path / "drop"))
    assert tuned.manifest["label_dropout"] == 0.5 and drop.report["training"]["label_dropout"] == 0.5
    assert "label_dropout" not in load_model(out).manifest and "label_dropout" not in res.report["training"]
    assert tuned.manifest["dp_tune"]["config"]["label_dropout"] == 0.5
    with pytest.raises(tune_config.TuneError, match="label_dropout"):
        dataclasses.replace(BASE_CFG, label_dropout=1.0)


@pytest.mark.slow  # make test-slow: ~35 s
def test_auto_recipe_run_uses_and_reports_its_choice(tiny_base, tmp_path):
    base_dir, _ = tiny_base
    cfg = dataclasses.replace(BASE_CFG, recipe="auto", token_budget=len(TRAIN) * 32 * 2.0, steps=None)
    resolved, chosen = tune_config.resolve_recipe(cfg, len(TRAIN))
    res = finetune.dp_tune(base_dir, TRAIN, VALID, str(tmp_path / "auto"), cfg, progress_interval=1e9)
    plan = tune_config.plan_run(cfg, len(TRAIN))  # what a dry run shows
    training = res.report["training"]
    assert res.steps == chosen.steps == plan.steps and res.noise_multiplier == plan.noise_multiplier
    assert training["expected_batch_size"] == pytest.approx(chosen.batch_size) == plan.expected_batch_size
    assert training["learning_rate"] == chosen.learning_rate != BASE_CFG.learning_rate
    # Rule 5: the label contrast for this two-label set, after the rest of the recipe's choices.
    assert training["recipe"]["name"] == "auto" and training["recipe"]["why"][:-1] == list(chosen.why)
    assert training["recipe"]["why"][-1].startswith("label contrast 1: ") and training["recipe"]["label_contrast"] == 1.0
    assert "label contrast" in training["loss"]
    assert load_model(str(tmp_path / "auto")).manifest["dp_tune"]["config"]["label_contrast"] == 1.0
    manual = finetune.dp_tune(base_dir, TRAIN, VALID, str(tmp_path / "manual"), BASE_CFG, progress_interval=1e9)
    assert "contrast" not in manual.report["training"]["loss"]
    assert "label_contrast" not in load_model(str(tmp_path / "manual")).manifest["dp_tune"]["config"]
    assert res.epsilon["rdp"] <= cfg.epsilon
    assert any("automatic recipe" in c["detail"] for c in res.report["side_channels"])
    with pytest.raises(tune_config.TuneError, match="recipe"):
        sweep.sweep(base_dir, TRAIN, VALID, str(tmp_path / "s"), cfg, learning_rates=[0.1], clip_norms=[1.0])


def test_reserved_selection_is_calibrated_reported_and_not_recorded(tiny_base, tmp_path):
    """`reserve_selection_epsilon`: sigma is the plan's (calibrated on the run and the reserved
    selection together), the ledger holds only what the run spent (less than the target), the report
    says what is reserved, and a resume with another reservation is refused (another plan)."""
    from dpsynth.dp import private_selection as ps
    from dpsynth.dp import report as report_lib

    base_dir, _ = tiny_base
    cfg = dataclasses.replace(BASE_CFG, reserve_selection_epsilon=0.2)
    out = str(tmp_path / "reserved")
    finetune.dp_tune(base_dir, TRAIN, VALID, out, cfg, stop_after=2, progress_interval=1e9)
    with pytest.raises(tune_config.TuneError, match="reserved"):
        finetune.dp_tune(base_dir, TRAIN, VALID, out, dataclasses.replace(cfg, reserve_selection_epsilon=0.1),
                         resume=True, progress_interval=1e9)
    res = finetune.dp_tune(base_dir, TRAIN, VALID, out, cfg, resume=True, progress_interval=1e9)
    plan = tune_config.plan_run(cfg, len(TRAIN))
    assert res.noise_multiplier == plan.noise_multiplier > tune_config.plan_run(BASE_CFG, len(TRAIN)).noise_multiplier
    assert all(e["name"] != ps.RESERVED_NAME for e in res.report["ledger"]["entries"])
    assert res.epsilon["rdp"] < cfg.epsilon
    assert ps.reserved_epsilon(res.report) == 0.2 and res.report["training"]["reserved"] == [ps.reserved_entry(0.2)]
    assert "reserved (not spent by this run" in report_lib.render_markdown(res.report)


@pytest.mark.slow  # make test-slow: ~54 s
def test_auto_length_and_time_budget_are_chosen_once_composed_and_kept_on_resume(tiny_base, tmp_path, monkeypatch):
    """--max-tokens auto: the length is one of the candidates, its selection is the ledger's first
    entry (on D_train), the tuning's sigma is calibrated after it so that both meet the target.
    --time-budget: the run's own step is timed (here at a fixed figure, for a deterministic plan)
    and the recipe spends seconds x speed. A resumed run takes both from its checkpoint instead of
    choosing (and spending) or measuring again."""
    from dpsynth.train import recipe

    timed = []

    def fixed_speed(step, *, example_tokens, **_):
        step()  # the run's compiled accumulation runs
        timed.append(example_tokens)
        return 4000.0

    monkeypatch.setattr(recipe, "measure_speed", fixed_speed)
    base_dir, _ = tiny_base
    cfg = dataclasses.replace(BASE_CFG, recipe="auto", max_tokens="auto", time_budget=1.5, steps=None, seed=5)
    out = str(tmp_path / "auto_len")
    part = finetune.dp_tune(base_dir, TRAIN, VALID, out, cfg, stop_after=1, progress_interval=1e9)
    res = finetune.dp_tune(base_dir, TRAIN, VALID, out, cfg, resume=True, progress_interval=1e9)
    assert timed == [BASE_CFG.microbatch_size * 32]  # measured once, at microbatch x the chosen length
    budget = res.report["training"]["recipe"]["time_budget"]
    assert budget == {"seconds": 1.5, "example_tokens_per_second": 4000.0, "microbatch": 16, "token_budget": 6000.0}
    want = recipe.auto_recipe(dataset_size=len(TRAIN), mode="lora", max_tokens=32, token_budget=6000.0)
    assert (res.steps, res.report["training"]["expected_batch_size"]) == (want.steps, pytest.approx(want.batch_size))
    chosen = res.report["training"]["recipe"]["example_length"]
    length = chosen["max_tokens"]
    assert length == 32  # (what seed 5 draws on this data: 90% of its rows fit 32 tokens)
    assert length in chosen["candidates"] and min(chosen["candidates"]) >= 32 and max(chosen["candidates"]) <= 129
    assert load_model(out).manifest["dp_tune"]["config"]["max_tokens"] == length
    entries = res.report["ledger"]["entries"]
    assert without_run(entries[0]) == chosen["entry"] == {"mechanism": "exponential", "name": "recipe example length",
                                             "epsilon": pytest.approx(0.08), "candidates": len(chosen["candidates"]),
                                             "dataset": "D_train"}
    assert [e["mechanism"] for e in entries].count("exponential") == 1  # the resume did not spend again
    assert cfg.epsilon * 0.99 < res.epsilon["rdp"] <= cfg.epsilon * (1 + 1e-6)
    manual = tune_config.plan_run(dataclasses.replace(cfg, max_tokens=length, time_budget=None, token_budget=6000.0),
                                  len(TRAIN))
    assert part.steps < res.steps == manual.steps
    assert res.noise_multiplier > manual.noise_multiplier  # the tuning spends what the length left
    why = res.report["training"]["recipe"]["why"]
    assert any(w.startswith(f"example length {length} tokens") for w in why)
    assert why[-1].startswith("label contrast 1: ")  # (chosen before the step was timed, kept when the recipe was rebuilt)
    with pytest.raises(tune_config.TuneError, match="sweep"):
        sweep.sweep(base_dir, TRAIN, VALID, str(tmp_path / "s"), dataclasses.replace(cfg, recipe="auto"),
                    learning_rates=[0.1, 0.2], clip_norms=[1.0])


def test_resume_is_exact_for_params_and_ledger(full_run, tmp_path):
    base_dir, _, _ = full_run
    out = str(tmp_path / "resumed")
    part = finetune.dp_tune(base_dir, TRAIN, VALID, out, BASE_CFG, stop_after=2, progress_interval=1e9)
    assert part.steps == 2 and not os.path.exists(os.path.join(out, "manifest.json"))  # no model until done
    assert report.load_report(out)["training"]["steps"] == 2  # the report follows the checkpoints
    # The (secret) seed lives only in the private checkpoint; the resumed run must continue with it.
    seed = TrainCheckpointer(os.path.join(tune_resume.default_state_dir(out), "checkpoints")).read_meta()["sampling_seed"]
    res = finetune.dp_tune(base_dir, TRAIN, VALID, out, BASE_CFG, resume=True, progress_interval=1e9)
    assert res.steps == 4
    out_full = str(tmp_path / "uninterrupted")
    finetune.dp_tune(base_dir, TRAIN, VALID, out_full, dataclasses.replace(BASE_CFG, seed=seed), progress_interval=1e9)
    a, b = load_model(out), load_model(out_full)
    for x, y in zip(jax.tree.leaves(a.variables["lora"]), jax.tree.leaves(b.variables["lora"])):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
    ra, rb = report.load_report(out), report.load_report(out_full)
    assert without_runs(ra)["ledger"] == without_runs(rb)["ledger"] and ra["epsilon"] == same_epsilon(rb)
    # Continuing with more steps is another privacy plan: refused before any step.
    with pytest.raises(tune_config.TuneError, match="steps: checkpoint 4, this run 8"):
        finetune.dp_tune(base_dir, TRAIN, VALID, out, dataclasses.replace(BASE_CFG, steps=8), resume=True)


# ---------------------------------------------------------------------------------- resume and the privacy plan

# The audit's case: tiny preset, LoRA, epsilon 4, 120 examples, expected batch 24, 8 steps stopped after 2.
AUDIT_CFG = dataclasses.replace(BASE_CFG, steps=8)
AUDIT_FLAGS = ["--mode", "lora", "--epsilon", "4", "--batch-size", "24", "--steps", "8", "--microbatch-size", "16",
               "--max-tokens", "32", "--checkpoint-every", "2", "--lora-rank", "2", "--learning-rate", "0.01",
               "--labels", "great", "other"]


def _cli(base_dir, data, out, *flags):
    from trainers import dp_tune as cli

    return cli.main(["--base", base_dir, "--train", str(data), "--out", str(out), *AUDIT_FLAGS, *flags])


@pytest.fixture(scope="module")
def stopped_run(tiny_base, tmp_path_factory):
    """`dpsynth dp-tune ... --steps 8 --stop-after 2`: (base_dir, train file, out) checkpointed at step 2."""
    base_dir, _ = tiny_base
    root = tmp_path_factory.mktemp("stopped")
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in TRAIN))
    out = root / "out"
    assert _cli(base_dir, data, out, "--stop-after", "2") == 0
    return base_dir, data, out


def _copy(src, tmp_path):
    """Copies a model dir and its private state (the sibling `<src>.private`)."""
    import shutil

    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    shutil.copytree(tune_resume.default_state_dir(str(src)), tune_resume.default_state_dir(str(dst)))
    return dst


@pytest.mark.parametrize("change, field, before, after", [
    (dict(steps=3), "steps", 8, 3),  # the audit's reproduction (it used to be accepted)
    (dict(epsilon=2.0), "target_epsilon", 4.0, 2.0),
    (dict(delta=1e-4), "delta", 1 / 120, 1e-4),
    (dict(batch_size=30), "expected_batch_size", 24.0, 30.0),
    (dict(clip_norm=0.5), "clip_norm", 1.0, 0.5),
    (dict(mode="prompt"), "mode", "lora", "prompt"),
    (dict(accountant="pld"), "accountant", "rdp", "pld"),
    ("fewer examples", "dataset_size", 120, 100),
])
def test_resume_with_another_privacy_plan_is_refused_before_any_compute(stopped_run, monkeypatch, change, field,
                                                                        before, after):
    base_dir, _, out = stopped_run
    from dpsynth.models import directory as checkpoint  # where dp_tune loads the base model from

    def no_compute(*a, **k):
        raise AssertionError("the model was loaded: the refusal must come before any compute")

    monkeypatch.setattr(checkpoint, "load_model", no_compute)
    records = TRAIN[:100] if change == "fewer examples" else TRAIN
    cfg = AUDIT_CFG if change == "fewer examples" else dataclasses.replace(AUDIT_CFG, **change)
    with pytest.raises(tune_config.TuneError) as e:
        finetune.dp_tune(base_dir, records, VALID, str(out), cfg, resume=True)
    msg = str(e.value)
    assert f"{field}: checkpoint {before!r}, this run {after!r}" in msg and "refusing to resume" in msg
    if field in ("steps", "target_epsilon", "delta", "expected_batch_size", "accountant", "dataset_size"):
        assert "noise_multiplier: checkpoint" in msg  # sigma would change with it: both named


def test_a_fresh_run_over_an_earlier_runs_checkpoints_is_refused(stopped_run, monkeypatch):
    base_dir, _, out = stopped_run
    from dpsynth.models import directory as checkpoint  # where dp_tune loads the base model from

    monkeypatch.setattr(checkpoint, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(tune_config.TuneError, match="checkpoints of an earlier run: pass --resume"):
        finetune.dp_tune(base_dir, TRAIN, VALID, str(out), AUDIT_CFG)


def test_sigma_used_equals_sigma_recorded_at_every_step_of_a_resumed_run(stopped_run, tmp_path, monkeypatch):
    """Spies on the strategy of every step the core runs and on every ledger record; a resume with
    other steps (the audit's reproduction) must not run a single step with another sigma."""
    from dpsynth.dp.ledger import PrivacyLedger
    from dpsynth.train import core

    base_dir, _, src = stopped_run
    out = str(_copy(src, tmp_path))
    plan = tune_config.plan_run(AUDIT_CFG, len(TRAIN))
    used, recorded = [], []
    real_step, real_record = core.TrainFunctions.accumulated_step, PrivacyLedger.record_steps

    def step(self, state, mbs, **kw):
        used.append(float(self.strategy.noise_multiplier))
        return real_step(self, state, mbs, **kw)

    def record(self, entry):
        recorded.append(float(entry["noise_multiplier"]))
        return real_record(self, entry)

    monkeypatch.setattr(core.TrainFunctions, "accumulated_step", step)
    monkeypatch.setattr(PrivacyLedger, "record_steps", record)
    try:  # 8 steps stopped after 2, resumed with 3 steps: refused now (it used to run with a fresh sigma)
        finetune.dp_tune(base_dir, TRAIN, VALID, out, dataclasses.replace(AUDIT_CFG, steps=3), resume=True,
                         progress_interval=1e9)
    except tune_config.TuneError:
        pass
    res = finetune.dp_tune(base_dir, TRAIN, VALID, out, AUDIT_CFG, resume=True, progress_interval=1e9)
    assert used == recorded and len(used) == 6  # steps 2..7, each: sigma used == sigma recorded
    assert set(used) == {plan.noise_multiplier}
    assert res.steps == 8 and res.noise_multiplier == plan.noise_multiplier
    rep = report.load_report(out)
    assert [e["noise_multiplier"] for e in merged(rep["ledger"]["entries"])] == [plan.noise_multiplier]
    assert rep["epsilon"]["rdp"] <= 4.0 and rep["training"]["noise_multiplier"] == plan.noise_multiplier
    meta = TrainCheckpointer(os.path.join(tune_resume.default_state_dir(out), "checkpoints")).read_meta()
    assert meta["privacy_plan"] == plan.to_json()  # the checkpoint stores the plan


@pytest.mark.slow  # make test-slow: ~25 s; resume exactness stays in test_resume_is_exact_for_params_and_ledger
def test_cli_stop_after_then_resume(stopped_run, tmp_path, capsys):
    base_dir, data, src = stopped_run
    out = _copy(src, tmp_path)
    capsys.readouterr()
    assert report.load_report(str(out))["training"]["steps"] == 2
    assert not os.path.exists(out / "manifest.json")  # no model until the run is complete
    rc = _cli(base_dir, data, out, "--resume", "--steps", "3")  # argparse: the last --steps wins
    assert rc == 2 and "another configuration (differs in --steps)" in capsys.readouterr().err  # dpsynth.outdir
    assert _cli(base_dir, data, out, "--resume", "--stop-after", "5") == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"] == 5
    assert _cli(base_dir, data, out, "--resume") == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"] == 8
    assert load_model(str(out)).manifest["dp_tune"]["steps"] == 8


def test_a_resume_with_another_setting_names_it_and_an_older_checkpoint_gets_a_hint(stopped_run, tmp_path):
    """The checkpoint records its settings, so a resume that changed one (not an accounted one, which
    `resume_differences` names) is refused with the flag; a checkpoint written before settings were
    recorded gets the generic reason, plus the way back for an automatic-recipe run of that time."""
    base_dir, _, src = stopped_run
    out = str(_copy(src, tmp_path))
    with pytest.raises(tune_config.TuneError, match=r"another configuration or data \(differs in --learning-rate\)"):
        finetune.dp_tune(base_dir, TRAIN, VALID, out, dataclasses.replace(AUDIT_CFG, learning_rate=0.02), resume=True,
                         progress_interval=1e9)
    meta = TrainCheckpointer(os.path.join(tune_resume.default_state_dir(out), "checkpoints")).read_meta()
    resolved = dataclasses.replace(AUDIT_CFG, label_contrast=0.0)  # as the run resolved "auto" (manual recipe: off)
    assert tune_resume.fingerprint_mismatch(meta, resolved).endswith("the training data or the tokenizer differ)")
    older = {k: v for k, v in meta.items() if k != "settings"}
    assert tune_resume.fingerprint_mismatch(older, resolved) == "another configuration or data"
    auto = dataclasses.replace(resolved, recipe="auto", label_contrast=1.0)
    assert "resume it with --label-contrast 0" in tune_resume.fingerprint_mismatch(older, auto)


@pytest.mark.parametrize("change,msg", [
    (dict(epsilon=0.0), "epsilon"),
    (dict(epsilon=-2.0), "epsilon"),
    (dict(delta=1.0), "delta"),
    (dict(mode="adapter"), "mode"),
    (dict(clipping="fast"), "clipping must be one of"),
    (dict(mode="prompt", clipping="ghost"), "--clipping ghost is for --mode full or lora"),
    (dict(clipping="ghost", privacy_unit="user", max_examples_per_user=2), "--clipping ghost is for .* example level"),
])
def test_bad_config(change, msg):
    with pytest.raises(tune_config.TuneError, match=msg):
        dataclasses.replace(BASE_CFG, **change)


@pytest.mark.slow  # two full-mode runs (~35 s); the core's equality is tests/dp/test_ghost.py's
def test_full_mode_ghost_clipping_trains_the_same_model(tiny_base, tmp_path):
    """--clipping ghost runs the same DP mechanism: same seed, same released weights (float tolerance)."""
    base_dir, _ = tiny_base
    cfg = dataclasses.replace(BASE_CFG, mode="full", steps=2, seed=3, clip_norm=0.1)
    assert "clipping" not in cfg.to_json()  # the default keeps earlier runs' fingerprints
    weights = {}
    for method in ("vmap", "ghost"):
        out = str(tmp_path / method)
        finetune.dp_tune(base_dir, TRAIN, VALID, out, dataclasses.replace(cfg, clipping=method), progress_interval=1e9)
        weights[method] = load_model(out).variables["params"]
    for a, b in zip(jax.tree.leaves(weights["vmap"]), jax.tree.leaves(weights["ghost"])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # make test-slow: ~25 s; ghost = vmap for LoRA, norm by norm, stays in tests/dp/test_ghost.py
def test_lora_ghost_clipping_trains_the_same_adapters(tiny_base, tmp_path):
    """dp-tune --mode lora --clipping ghost: the same DP mechanism as the vmapped clipping (same seed, same
    released adapters up to float32 rounding of the clipped sums, tests/dp/test_ghost.py's LORA_RTOL)."""
    base_dir, _ = tiny_base
    cfg = dataclasses.replace(BASE_CFG, steps=2, seed=3, clip_norm=0.1)
    weights = {}
    for method in ("vmap", "ghost"):
        out = str(tmp_path / method)
        finetune.dp_tune(base_dir, TRAIN, VALID, out, dataclasses.replace(cfg, clipping=method), progress_interval=1e9)
        weights[method] = load_model(out).variables["lora"]
    assert jax.tree.structure(weights["vmap"]) == jax.tree.structure(weights["ghost"])
    for a, b in zip(jax.tree.leaves(weights["vmap"]), jax.tree.leaves(weights["ghost"])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_bad_input_fails_before_any_compute(tiny_base, tmp_path):
    base_dir, _ = tiny_base
    out = str(tmp_path / "out")
    with pytest.raises(tune_config.TuneError, match="empty"):
        finetune.dp_tune(base_dir, [], VALID, out, BASE_CFG)
    bad_valid = VALID + [{"id": "z", "text": "x", "label": "meh"}]
    with pytest.raises(tune_config.TuneError, match="unknown label 'meh'"):
        finetune.dp_tune(base_dir, TRAIN, bad_valid, out, BASE_CFG)
    with pytest.raises(tune_config.TuneError, match="unreachable"):
        finetune.dp_tune(base_dir, TRAIN, VALID, out, dataclasses.replace(BASE_CFG, epsilon=1e-4, steps=10**6))
    with pytest.raises(tune_config.TuneError, match="max_len"):
        finetune.dp_tune(base_dir, TRAIN, VALID, out, dataclasses.replace(BASE_CFG, max_tokens=1000))
    assert not os.path.exists(out)


def test_cli_reports_errors(tiny_base, tmp_path, capsys):
    from trainers import dp_tune as cli

    base_dir, _ = tiny_base
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in TRAIN))
    rc = cli.main(["--base", base_dir, "--train", str(data), "--out", str(tmp_path / "o"), "--epsilon", "0"])
    assert rc == 2 and "epsilon must be > 0" in capsys.readouterr().err
    rc = cli.main(["--base", base_dir, "--train", str(data), "--out", str(tmp_path / "o"), "--delta", "2"])
    assert rc == 2 and "delta" in capsys.readouterr().err
    rc = cli.main(["--base", base_dir, "--train", str(data), "--out", str(tmp_path / "o"), "--distributed",
                   "--coordinator-address", "127.0.0.1:1", "--num-processes", "2", "--process-id", "2"])
    assert rc == 2 and "--process-id 2 must be in [0, --num-processes 2)" in capsys.readouterr().err
    rc = cli.main(["--base", base_dir, "--train", str(data), "--out", str(tmp_path / "o"), "--mesh-data", "3",
                   "--microbatch-size", "16", "--batch-size", "24", "--steps", "2"])
    assert rc == 2 and "divisible by the mesh data axis 3" in capsys.readouterr().err


def _release_files(out):
    """Every file under a released model dir, as (relative path, bytes)."""
    found = []
    for root, _, files in os.walk(out):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found.append((os.path.relpath(path, out), f.read()))
    return found


def _assert_no_losses_released(out):
    for rel, data in _release_files(out):
        assert b"valid_loss" not in data and b"train_loss" not in data, rel


SWEEP_CFG = dataclasses.replace(BASE_CFG, steps=2)


def test_sweep_composed_by_default_accounts_every_trial(tiny_base, tmp_path):
    """Default sweep: each of k trials calibrated with compositions=k, the released report's ledger
    and epsilon cover all k, the selection is a declared side channel, only the winner is released."""
    from dpsynth.dp import accounting

    base_dir, _ = tiny_base
    out = str(tmp_path / "sweep")
    result, trials = sweep.sweep(base_dir, TRAIN, VALID, out, SWEEP_CFG, learning_rates=[1e-3, 3e-2],
                                 clip_norms=[1.0], progress_interval=1e9)
    composed = tune_config.plan_run(SWEEP_CFG, len(TRAIN), compositions=2)
    single = tune_config.plan_run(SWEEP_CFG, len(TRAIN))
    assert composed.noise_multiplier > single.noise_multiplier
    assert all(t["noise_multiplier"] == composed.noise_multiplier for t in trials)
    rep = report.load_report(out)
    assert sum(e["steps"] for e in rep["ledger"]["entries"]) == 2 * SWEEP_CFG.steps  # both trials accounted
    expected = accounting.epsilon(composed.sampling_probability, 2 * SWEEP_CFG.steps, composed.noise_multiplier,
                                  composed.delta, "rdp")
    assert rep["epsilon"]["rdp"] == pytest.approx(expected) and expected <= SWEEP_CFG.epsilon
    assert result.epsilon["rdp"] == pytest.approx(expected)
    assert rep["selection"]["accounting"] == "composed" and rep["selection"]["trials"] == 2
    best = min(trials, key=lambda t: t["valid_loss"])
    assert rep["selection"]["selected"]["trial"] == best["trial"] and rep["training"]["compositions"] == 2
    channel = {c["name"]: c["detail"] for c in rep["side_channels"]}["validation-based selection"]
    assert "cover all 2 trials" in channel and "NOT differentially private" in channel
    assert load_model(out).manifest["dp_tune"]["epsilon"] == rep["epsilon"]
    # Only the selected model is released; the trials and the validation losses stay private.
    assert not os.path.exists(os.path.join(out, "trials")) and not os.path.exists(os.path.join(out, "checkpoints"))
    _assert_no_losses_released(out)
    with open(os.path.join(result.state_dir, sweep.SWEEP_FILE)) as f:
        assert [t["valid_loss"] for t in json.load(f)["trials"]] == [t["valid_loss"] for t in trials]
    assert sorted(os.listdir(os.path.join(result.state_dir, "trials"))) == ["000", "001"]
    _assert_owner_only(os.path.join(result.state_dir, "trials"))  # each trial's model and checkpoints


def _assert_owner_only(root):
    """Every directory under `root` 0700, every file 0600 (and there are files)."""
    modes = {}
    for d, _, files in os.walk(root):
        modes[d] = os.stat(d).st_mode & 0o777
        modes.update({os.path.join(d, f): os.stat(os.path.join(d, f)).st_mode & 0o777 for f in files})
    assert any(os.path.isfile(p) for p in modes)
    assert {p: m for p, m in modes.items() if m != (0o700 if os.path.isdir(p) else 0o600)} == {}


def test_sweep_selected_only_accounts_one_trial_and_says_so(tiny_base, tmp_path):
    base_dir, _ = tiny_base
    out = str(tmp_path / "sweep")
    result, trials = sweep.sweep(base_dir, TRAIN, VALID, out, SWEEP_CFG, learning_rates=[1e-3, 3e-2],
                                 clip_norms=[1.0], sweep_accounting="selected-only", progress_interval=1e9)
    single = tune_config.plan_run(SWEEP_CFG, len(TRAIN))
    assert all(t["noise_multiplier"] == single.noise_multiplier for t in trials)
    rep = report.load_report(out)
    assert sum(e["steps"] for e in rep["ledger"]["entries"]) == SWEEP_CFG.steps  # one trial accounted
    assert rep["epsilon"]["rdp"] <= SWEEP_CFG.epsilon and rep["selection"]["accounting"] == "selected-only"
    channel = {c["name"]: c["detail"] for c in rep["side_channels"]}[
        "validation-based selection (selected-only accounting)"]
    assert "ONLY THE SELECTED TRIAL IS ACCOUNTED" in channel and "never written to this directory" in channel
    assert not os.path.exists(os.path.join(out, "trials"))
    _assert_no_losses_released(out)
    assert sorted(os.listdir(os.path.join(result.state_dir, "trials"))) == ["000", "001"]
    with pytest.raises(tune_config.TuneError, match="sweep_accounting"):
        sweep.sweep(base_dir, TRAIN, VALID, out, SWEEP_CFG, learning_rates=[1e-3], clip_norms=[1.0],
                    sweep_accounting="paper")


def test_cli_fixed_seed_and_training_text_never_reach_out(tiny_base, tmp_path, capsys):
    """`dpsynth dp-tune --seed 987654321123`: neither the seed (as text or as little-endian int64
    bytes) nor any training text is in any file under --out; all of it is in the private state."""
    import struct

    base_dir, _ = tiny_base
    seed = 987654321123
    data, valid = tmp_path / "train.jsonl", tmp_path / "valid.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in TRAIN))
    valid.write_text("".join(json.dumps(r) + "\n" for r in VALID))
    out, state = tmp_path / "release" / "model", tmp_path / "owner" / "state"
    assert _cli(base_dir, data, out, "--steps", "2", "--seed", str(seed), "--valid", str(valid),
                "--state-dir", str(state)) == 0
    printed = capsys.readouterr()
    assert "valid_loss" not in printed.out and str(seed) not in printed.out + printed.err
    files = _release_files(out)
    assert {"manifest.json", "privacy_report.json", "privacy_report.md"} <= {rel for rel, _ in files}
    needles = [str(seed).encode(), struct.pack("<q", seed)]
    from dpsynth import outdir

    seed_digest = outdir.run_record(outdir.MODEL, "dp-tune", {"seed": seed})["config"]["seed"]  # unless withheld
    needles.append(seed_digest.encode())  # a hash of a guessable value in the run record is the value
    needles += [r["text"].encode() for r in TRAIN + VALID if len(r["text"]) >= 12]
    for rel, blob in files:
        for needle in needles:
            assert needle not in blob, f"{rel} contains {needle!r}"
    _assert_no_losses_released(out)
    # The overridden state dir is used (not the default sibling), owner-only, and holds the seed.
    assert not os.path.exists(tune_resume.default_state_dir(str(out)))
    assert os.stat(state).st_mode & 0o777 == 0o700
    meta = TrainCheckpointer(os.path.join(state, "checkpoints")).read_meta()
    assert meta["sampling_seed"] == seed
    assert "fixed seed" in {c["name"] for c in report.load_report(str(out))["side_channels"]}
    # A state dir inside the released dir is refused.
    assert _cli(base_dir, data, tmp_path / "o2", "--state-dir", str(tmp_path / "o2" / "state")) == 2
    assert "inside the released directory" in capsys.readouterr().err


def test_prompt_initialisations():
    from dpsynth.models import Transformer

    base = Transformer(SMALL).init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"]
    uni = tune_config.TuneConfig(mode="prompt", prompt_length=5)
    v = tune_model.init_variables(tune_model.tuned_model_config(SMALL, uni), base, uni)["prompt"]["embedding"]
    assert v.shape == (5, SMALL.d_model) and float(jnp.max(jnp.abs(v))) <= 0.01 and float(jnp.std(v)) > 0.003
    voc = dataclasses.replace(uni, prompt_init="vocab")
    w = np.asarray(tune_model.init_variables(tune_model.tuned_model_config(SMALL, voc), base, voc)["prompt"]["embedding"])
    table = np.asarray(base["embedding"])
    for row in w:  # every prompt vector is a (non-special) vocabulary embedding
        matches = np.where(np.all(table == row, axis=1))[0]
        assert matches.size >= 1 and matches[0] >= 4


def test_default_seed_is_secret_and_never_released(full_run, tmp_path):
    """Without --seed the noise/sampling seed comes from OS entropy: runs differ, and the seed
    appears nowhere in the released report or manifest; a fixed seed is flagged."""
    base_dir, out_a, _ = full_run
    out_b = str(tmp_path / "again")
    finetune.dp_tune(base_dir, TRAIN, VALID, out_b, BASE_CFG, progress_interval=1e9)
    la, lb = load_model(out_a).variables["lora"], load_model(out_b).variables["lora"]
    assert any(not np.allclose(x, y) for x, y in zip(jax.tree.leaves(la), jax.tree.leaves(lb)))
    seed = TrainCheckpointer(os.path.join(tune_resume.default_state_dir(out_b), "checkpoints")).read_meta()["sampling_seed"]
    assert seed.bit_length() > 32  # 64-bit entropy (fails with probability 2^-32)
    for name in ("privacy_report.json", "privacy_report.md", "manifest.json"):
        with open(os.path.join(out_b, name)) as f:
            assert str(seed) not in f.read()
    assert "fixed seed" not in {c["name"] for c in report.load_report(out_b)["side_channels"]}
    out_c = str(tmp_path / "fixed")
    finetune.dp_tune(base_dir, TRAIN, VALID, out_c, dataclasses.replace(BASE_CFG, seed=7), progress_interval=1e9)
    assert "fixed seed" in {c["name"] for c in report.load_report(out_c)["side_channels"]}


# ---------------------------------------------------------------------------------- canary audit


def _audit(tiny_base, tmp_path, epsilon, steps, canaries):
    base_dir, _ = tiny_base
    cfg = tune_config.TuneConfig(mode="full", epsilon=epsilon, batch_size=16, steps=steps, microbatch_size=16,
                                 max_tokens=32, learning_rate=1e-2, checkpoint_every=10**6, seed=1)
    return audit.canary_audit(base_dir, make_records(48, 1), str(tmp_path / f"eps{epsilon}"), cfg,
                              num_canaries=canaries, repeats=1, canary_length=10, labels=["great", "other"])


def test_canaries_near_chance_with_dp_and_memorised_without(tiny_base, tmp_path):
    private = _audit(tiny_base, tmp_path, 1.0, 40, 32)
    baseline = _audit(tiny_base, tmp_path, math.inf, 40, 32)
    assert baseline.auroc > 0.95 and baseline.mean_exposure > private.chance_exposure + 2
    assert baseline.auroc_p_value < 0.01
    # (the hull AUROC's chance level for 32 vs 32 canaries is about 0.58, its 95th percentile 0.69)
    assert private.auroc < 0.8 and private.auroc_chance < 0.65
    assert private.mean_exposure < private.chance_exposure + 1.0
    assert private.epsilon_lower_bound <= 1.0


@pytest.mark.slow
def test_canary_audit_longer_runs(tiny_base, tmp_path):
    private = _audit(tiny_base, tmp_path, 1.0, 300, 64)
    baseline = _audit(tiny_base, tmp_path, math.inf, 300, 64)
    assert baseline.auroc > 0.98
    assert private.auroc < 0.7 and private.epsilon_lower_bound <= 1.0


# ---------------------------------------------------------------------------------- several processes

MULTI_CFG = dict(epsilon=4.0, batch_size=24, steps=4, microbatch_size=16, max_tokens=32, checkpoint_every=2,
                 lora_rank=2, prompt_length=4, learning_rate=1e-2)


def _tune_in(n, base_dir, out, modes, config, **kw):
    from tests import multiprocess

    results = multiprocess.run("tests.train.multihost_cases:finetune_case", num_processes=n, devices=8 // n,
                               kwargs=dict(base_dir=base_dir, out=out, modes=modes, config=config, train=TRAIN,
                                           valid=VALID, mesh=[8, 1], **kw), timeout=900, with_stderr=True)
    assert [(r["process"], r["processes"]) for r in results] == [(i, n) for i in range(n)]
    return results


def _trainable_diff(a_dir, b_dir, mode):
    a, b = load_model(a_dir).variables, load_model(b_dir).variables
    coll = tune_config.TRAINABLE[mode][0]
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
               for x, y in zip(jax.tree.leaves(a[coll]), jax.tree.leaves(b[coll])))


@pytest.mark.slow
def test_every_mode_in_two_processes_matches_one_process(tiny_base, tmp_path):
    """2 processes x 4 CPU devices vs 1 process x 8: same Poisson batches on every process, same
    losses (1e-5), parameters (1e-4), ledger and privacy report; the report written by process 0 only."""
    base_dir, _ = tiny_base
    modes = ["full", "prompt", "lora"]
    config = {**MULTI_CFG, "seed": 5}
    one = _tune_in(1, base_dir, str(tmp_path / "one"), modes, config)[0]["modes"]
    two = _tune_in(2, base_dir, str(tmp_path / "two"), modes, config)
    for mode in modes:
        p0, p1 = two[0]["modes"][mode], two[1]["modes"][mode]
        assert p0["steps"] == p1["steps"] == one[mode]["steps"] == 4
        assert p0["batches"] == p1["batches"] == one[mode]["batches"] and len(set(p0["batches"])) == 4
        assert p0["report_writes"] == one[mode]["report_writes"] > 0 and p1["report_writes"] == 0
        for r in (p0, p1):
            assert abs(r["train_loss"] - one[mode]["train_loss"]) < 1e-5
            assert abs(r["valid_loss"] - one[mode]["valid_loss"]) < 1e-5
            assert r["epsilon"] == one[mode]["epsilon"]
        assert _trainable_diff(str(tmp_path / "one" / mode), str(tmp_path / "two" / mode), mode) < 1e-4
        ra, rb = report.load_report(str(tmp_path / "one" / mode)), report.load_report(str(tmp_path / "two" / mode))
        assert "valid_loss" not in ra["training"] and "valid_loss" not in rb["training"]  # private state only
        assert ra == rb  # ledger, epsilon, noise multiplier, side channels: identical


@pytest.mark.slow
def test_secret_seed_shared_by_two_processes_never_logged_and_resumed_across_processes(tiny_base, tmp_path):
    """Without --seed, process 0 draws the seed and broadcasts it: both processes draw the same
    Poisson batches; the seed is in the private checkpoint only (not in any process's output or
    the released files); a run stopped in 2 processes resumes in 2 and equals 1 process with that seed."""
    base_dir, _ = tiny_base
    out = str(tmp_path / "secret")
    first = _tune_in(2, base_dir, out, ["lora"], MULTI_CFG, stop_after=2)
    second = _tune_in(2, base_dir, out, ["lora"], MULTI_CFG, resume=True)
    for run, steps in ((first, 2), (second, 2)):
        a, b = run[0]["modes"]["lora"], run[1]["modes"]["lora"]
        assert a["batches"] == b["batches"] and len(a["batches"]) == steps
    assert second[0]["modes"]["lora"]["steps"] == 4
    state = tune_resume.default_state_dir(os.path.join(out, "lora"))
    seed = TrainCheckpointer(os.path.join(state, "checkpoints")).read_meta()["sampling_seed"]
    assert seed.bit_length() > 32
    for r in first + second:
        assert str(seed) not in r["stderr"]
    for name in ("privacy_report.json", "privacy_report.md", "manifest.json"):
        with open(os.path.join(out, "lora", name)) as f:
            assert str(seed) not in f.read()
    ref = _tune_in(1, base_dir, str(tmp_path / "ref"), ["lora"], {**MULTI_CFG, "seed": seed})[0]["modes"]["lora"]
    assert ref["batches"] == first[0]["modes"]["lora"]["batches"] + second[0]["modes"]["lora"]["batches"]
    assert _trainable_diff(os.path.join(out, "lora"), str(tmp_path / "ref" / "lora"), "lora") < 1e-4
    ra, rb = report.load_report(os.path.join(out, "lora")), report.load_report(str(tmp_path / "ref" / "lora"))
    assert without_runs(ra)["ledger"] == without_runs(rb)["ledger"] and ra["epsilon"] == same_epsilon(rb)
