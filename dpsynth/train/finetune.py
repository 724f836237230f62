"""DP fine-tuning of a pretrained dpsynth LM on the sensitive training set (`dpsynth dp-tune`).

Modes (the trainable subset is a variable collection of `dpsynth.models.Transformer`):
  * "full": every base parameter ("params");
  * "prompt": a soft prompt only ("prompt"; uniform [-0.01, 0.01] init, or rows of the
    vocabulary embedding with `prompt_init="vocab"`);
  * "lora": LoRA adapters only ("lora"; rank, alpha, targets).

One step (`dpsynth.train.core` + `dpsynth.dp.strategy.DPSGDStrategy`): a Poisson batch
(`dpsynth.dp.sampling`, expected size B = q N, default 1024), split into padded
microbatches, per-example Prefix-LM gradients of the trainable subset clipped to C, summed,
Gaussian noise sigma C, divided by B, then Adam (fixed lr) or Adafactor. sigma comes from the
privacy plan (`dpsynth.dp.plan.plan_privacy`) so that the whole run is (epsilon, delta)-DP. The
ledger records the sigma of the strategy object that adds the noise (one source of truth); it is
saved with the privacy plan in every checkpoint and checked against the budget before the
first step. A resume whose plan, clipping norm, mode or BandMF strategy differs from the
checkpoint's is refused before any training compute (`tune_resume.resume_differences`). The privacy report
is written next to the model, before its manifest (`dpsynth.train.release`). `epsilon = inf`
runs the same loop without clipping or noise (plain mean gradient): the non-private baseline.

Privacy unit and mechanism (`dpsynth.dp.mechanisms.run`): `privacy_unit="user"` groups rows by
their "user" field (read with a user column), keeps at most `max_examples_per_user` rows per
user (chosen with the secret seed), samples users and clips each user's mean gradient
(`dpsynth.dp.users`); `mechanism="bandmf"` with `bands` adds banded correlated noise with
cyclic Poisson sampling (`dpsynth.dp.bandmf`), whose noise state is part of the checkpointed
training state, so a resumed run ends with the parameters of an uninterrupted one.

Multi-host (several JAX processes, `dpsynth.train.sharding.initialize_distributed` first, a
`mesh` over every process's devices): every process runs `dp_tune` with the same arguments.
The secret seed is drawn once, on process 0, and broadcast (`seeds.shared_secret_seed`), so
every process draws the same Poisson batches; each process gathers only its rows of every
microbatch, and the core's step runs on global arrays, so each example's gradient is clipped
once (on the device holding it) and the noise is drawn once from the one replicated key and
added to the global sum. The checkpoints are Orbax multi-host (the ledger is in their JSON
metadata, written by process 0) and process 0 alone writes the privacy report. Tested in 2
processes x 4 CPU devices against 1 process x 8 devices (tests/train/test_finetune.py).

Everything that can be wrong with the input is checked before any compute: unknown labels,
an empty or single-label training set, epsilon <= 0, delta outside (0, 1) or above 1/N (unless
`allow_large_delta`), an unreachable target; examples
longer than `max_tokens` are truncated and counted.

Where the parts live (split along the lines of the t5x trainer): `dpsynth.train.tune_config`
(`TuneConfig`, `TuneError`, the recipe, the privacy plan), `tune_resume` (the private state
directory, a checkpoint's accounted settings, the resume check), `tune_data` (the rows),
`tune_model` (the tuned model, loss, optimizer, mechanism and step functions, sized to the
machine), `tune_loop` (the one training loop) and `tune_report` (the privacy report). This module
keeps `dp_tune`, its run stages and `TuneResult`, and re-exports `TuneConfig`, `TuneError` and
`plan_run`, the names user code imports from it (`__all__`; new code imports them from
`tune_config`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import jax

from dpsynth import fileio
from dpsynth.dp import disjoint, seeds
from dpsynth.dp import report as report_lib
from dpsynth.dp.ledger import PrivacyLedger
from dpsynth.dp.mechanisms.run import count_users
from dpsynth.owner_only import make_private_dir, write_private_json
from dpsynth.train import recipe as recipe_lib
from dpsynth.train import release, tune_report
from dpsynth.train.prompts import manifest_fields
from dpsynth.train.tune_config import (TRAINABLE, TuneConfig, TuneError, Prepared, plan_for_records, plan_run,
                                       resolve_example_length, resolve_recipe, user_ids)
from dpsynth.train.tune_data import TuneData, data_fingerprint, encode_data
from dpsynth.train.tune_loop import train_run
from dpsynth.train.tune_model import (build_mechanism, resolve_label_contrast, resolve_microbatch, resolve_time_budget,
                                      tuned_model_config, embedding_spec, evaluate_loss, init_variables,
                                      make_eval_fn, make_loss_fn)
from dpsynth.train.tune_resume import read_resume_meta, resolve_state_dir, resume_differences, run_fingerprint

__all__ = ("TuneConfig", "TuneError", "TuneResult", "dp_tune", "plan_run")

logger = logging.getLogger("dpsynth.train.finetune")  # the tuner's one logger, whichever module logs


@dataclasses.dataclass
class TuneResult:
    """What a run produced.

    `train_loss`, `valid_loss`, `truncated_train` and `truncated_valid` are PRIVATE: computed on
    D_train/D_valid without DP. They are written only to the private state
    (`state_dir/losses.json`, `state_dir/counts.json`), never into `out_dir`; callers must not put
    them in anything that travels with the model.
    """

    out_dir: str
    steps: int
    noise_multiplier: float
    epsilon: dict[str, float | None]
    delta: float
    valid_loss: float
    train_loss: float
    truncated_train: int
    truncated_valid: int
    report: dict
    seconds: float
    state_dir: str = ""


def _released_config(config: TuneConfig) -> dict[str, Any]:
    """The config as recorded in the released manifest: the seed's value is withheld."""
    d = config.to_json()
    d["seed"] = "secret (OS entropy)" if config.seed is None else "fixed (value withheld)"
    return d


def _prepare(train_records: Sequence[dict], config: TuneConfig, *, labels, compositions: int, mesh, out_dir: str,
             state_dir: str | None, resume: bool, base_dir: str) -> Prepared:
    """Every check that needs no model or compute: the data, the recipe and plan, the mesh, the
    directories, and a resume's accounted settings against its checkpoint (metadata read once)."""
    if not train_records:
        raise TuneError("empty training set: nothing to tune on")
    classes = sorted({str(r.get("label")) for r in train_records})
    if len(classes) < 2:  # before any budget is spent: a one-class model cannot make labeled data
        raise TuneError(f"D_train has a single label ({classes[0]!r} in all {len(train_records)} records): a model "
                        "tuned on it cannot generate (or guide towards) any other class; check --label-column, "
                        "or the file")
    labels_from_data = labels is None
    if labels is None:
        labels = sorted({str(r.get("label")) for r in train_records})
    labels = [str(l) for l in labels]
    train_users = user_ids(config, train_records)
    state_dir = resolve_state_dir(out_dir, state_dir)
    ckpt_dir = os.path.join(state_dir, "checkpoints")
    if config.max_tokens == recipe_lib.AUTO and compositions > 1:
        raise TuneError("--max-tokens auto chooses the length once per run; a sweep's trials would each choose "
                        "(and spend) again: give --max-tokens N to a sweep")
    early = resume and (config.max_tokens == recipe_lib.AUTO or config.time_budget is not None)
    resume_meta = read_resume_meta(ckpt_dir) if early else None
    config, length = resolve_example_length(config, base_dir, train_records, labels, resume_meta=resume_meta)
    timing, pending = None, None
    if config.time_budget is not None:  # measured once (`resolve_time_budget`); a resume takes the checkpoint's
        if resume_meta is not None:
            if not resume_meta.get("time_budget"):
                raise TuneError("--time-budget: the checkpoint was made without a time budget; resume with its flags")
            timing = recipe_lib.TimeBudget.from_json(resume_meta["time_budget"])
        else:
            pending = config.time_budget
        config = dataclasses.replace(config, time_budget=None, token_budget=timing.token_budget if timing else None)
    config, recipe = resolve_recipe(config, count_users(train_users) if train_users is not None else len(train_records))
    for line in recipe.why if recipe and pending is None else ():  # (a pending budget: logged once measured)
        logger.info("recipe auto: %s", line)
    if recipe is not None and timing is not None:
        recipe = recipe.with_time(timing)
    if recipe is not None and length is not None:  # (first: the length is chosen before the budget is spent)
        recipe = recipe.with_length(length)
    plan = plan_for_records(config, train_records, compositions=compositions,
                            spent=(length.entry,) if length is not None and length.entry else ())
    if jax.process_count() > 1 and (mesh is None or mesh[0] * mesh[1] != jax.device_count()):
        raise TuneError(f"multi-host run: the mesh {mesh} must use all {jax.device_count()} devices of the "
                        f"{jax.process_count()} processes (--mesh-data x --mesh-model)")
    user_level = config.private and config.privacy_unit == "user"
    # (user-level microbatches hold users: they are padded with empty users to the data axis instead)
    if mesh is not None and not user_level and config.microbatch_size != "auto" and config.microbatch_size % mesh[0]:
        raise TuneError(f"microbatch_size {config.microbatch_size} must be divisible by the mesh data axis {mesh[0]}")
    if not resume and os.path.isdir(ckpt_dir) and os.listdir(ckpt_dir):
        half = release.status(out_dir)
        raise TuneError(f"{ckpt_dir} holds the checkpoints of an earlier run: pass --resume to continue it, or give "
                        "a new --out / --state-dir to start afresh" + (f" ({out_dir}: {half})" if half else ""))
    try:  # a finished model is never mixed with a new run's report; a half-written one is said and replaced
        half = release.status(out_dir) if resume else release.check_fresh_run(out_dir)
    except release.ReleaseError as e:
        raise TuneError(str(e)) from e
    if half:
        logger.warning("%s: %s; this run %s it", out_dir, half,
                       "rewrites" if resume else "replaces")
    if resume and resume_meta is None:
        resume_meta = read_resume_meta(ckpt_dir)
    if resume_meta is not None:  # the accounted settings must match the checkpoint's, checked before any compute
        diffs = resume_differences(resume_meta, config, plan)
        if diffs:
            raise TuneError(
                f"{ckpt_dir}: refusing to resume: this run's privacy plan differs from the checkpoint's, so the noise "
                "added and the noise accounted would disagree: "
                + "; ".join(f"{name}: checkpoint {a!r}, this run {b!r}" for name, a, b in diffs)
                + ". Resume with the checkpoint's settings, or start a fresh run in a new --out")
    return Prepared(config=config, recipe=recipe, length=length, plan=plan, labels=labels, labels_from_data=labels_from_data,
                     train_users=train_users, state_dir=state_dir, ckpt_dir=ckpt_dir, resume_meta=resume_meta,
                     time_budget=timing, pending_seconds=pending)


def dp_tune(
    base_dir: str,
    train_records: Sequence[dict],
    valid_records: Sequence[dict],
    out_dir: str,
    config: TuneConfig = TuneConfig(),
    *,
    labels: Sequence[str] | None = None,
    contamination_sha256: str | None = None,
    resume: bool = False,
    stop_after: int | None = None,
    selection: dict | None = None,
    state_dir: str | None = None,
    compositions: int = 1,
    progress_interval: float = 10.0,
    mesh: tuple[int, int] | None = None,
    fsdp: bool = False,
    memory_limit: int | None = None,
    memory_headroom: float = 0.10,
    contamination_probe: dict | None = None,
) -> TuneResult:
    """DP-tunes the model in `base_dir` on `train_records`; writes the tuned model to `out_dir`.

    Args:
        base_dir: a model directory (`dpsynth.models.directory.save_model` layout).
        train_records, valid_records: {"id", "text", "label"} records of D_train / D_valid.
        out_dir: the releasable model directory: config, tokenizer, adapters only + base pointer
            for lora/prompt (all params for full), `privacy_report.json`/`.md` and the manifest.
            Nothing else is written there (no seed, no checkpoint, no non-DP loss).
        config: the run's configuration.
        labels: the label set (default: the sorted labels of D_train, a side channel).
        contamination_sha256: SHA-256 of the pretraining corpus's contamination report
            (default: read from the base manifest when recorded there).
        resume: continue from the latest checkpoint in `state_dir/checkpoints`. Refused before any
            compute when the checkpoint's privacy plan (dataset size, expected batch, steps, sigma,
            epsilon, delta, accountant, cap, compositions), clipping norm, mode or BandMF strategy
            (`strategy_sha256`) differs from this run's; the message names each differing field
            with both values.
        stop_after: checkpoint and stop once this step is reached (time-sliced runs; resume later).
        selection: recorded in the report when this run is a sweep trial's winner.
        mesh: (data, model) device mesh shape (`dpsynth.train.sharding.make_mesh`); None = one
            device. Required with several processes, over all of their devices. Every privacy
            unit and mechanism runs on it with the privacy of one device (one clipped term per
            unit, noise once on the global sum, BandMF noise state sharded and checkpointed).
        fsdp: also shard the parameters (base and trainable) and the optimizer state over the
            mesh's data axis (`dpsynth.models.sharding.FSDP_RULES`; the layout `dpsynth plan
            --fsdp` plans): per-device parameter memory / data axis, the same updates.
        state_dir: the private state directory (created 0700): checkpoints with the secret seed,
            `losses.json` (non-DP train/valid losses), D_train's record hashes (`dpsynth.dp.disjoint`,
            for `dpsynth select`'s check that D_valid is disjoint). Default `<out_dir>.private/`; must lie
            outside `out_dir`.
        compositions: k > 1 for one of k sweep trials that together meet the target
            (`dpsynth.dp.plan.plan_privacy(compositions=k)`).
        memory_limit, memory_headroom: with `microbatch_size="auto"`, the bytes per device the
            compiled step may use (default: the device's own limit; on CPU the host's available memory over its CPU devices) and the
            fraction of it left free.
        contamination_probe: the report of `dpsynth probe` run on this base
            (`dpsynth.evaluate.contamination.read_probe`; refused when it probed another model),
            copied (NOT DP) into the private state
            (`tune_report.PROBE_FILE`); the privacy report of an imported base says only that a probe
            ran (else that none did), never its verdict or figures.

    Raises:
        TuneError: bad input (before any compute). BudgetExceeded: the run (or its
        continuation) would exceed the budget.

    The run: `_prepare` (checks before any compute) -> load and `encode_data` the data (`tune_data`) ->
    `build_mechanism` (`tune_model`) -> `train_run` (the one loop, checkpoints: `tune_loop`) -> `_write_outputs`.
    """
    from dpsynth.models.directory import load_model

    t0 = time.monotonic()
    if fsdp and (mesh is None or mesh[0] < 2):
        raise TuneError("fsdp shards the parameters over the mesh's data axis: give a mesh with a data axis of 2 or "
                        "more devices (--mesh-data D)")
    prep = _prepare(train_records, config, labels=labels, compositions=compositions, mesh=mesh, out_dir=out_dir,
                    state_dir=state_dir, resume=resume, base_dir=base_dir)
    config = prep.config
    probe = contamination_probe
    if probe is not None:
        tune_report.check_contamination_probe(probe, base_dir)
    base = load_model(base_dir)
    # Host copies: every leaf of the initial state then has the same (uncommitted) placement, so
    # the step functions compile once instead of again when jit outputs come back committed.
    base_params = jax.device_get(base.variables["params"])
    model_config = tuned_model_config(base.config, config)
    if config.max_tokens - 1 > model_config.max_len:
        raise TuneError(f"max_tokens {config.max_tokens} needs {config.max_tokens - 1} positions but the model supports "
                        f"max_len {model_config.max_len}; lower --max-tokens")
    prep = resolve_label_contrast(prep, model_config)  # (before the data: its K rows per example)
    config = prep.config
    data = encode_data(train_records, valid_records, base.tokenizer, prep.labels, config)
    prep = resolve_microbatch(prep, base.config, base_params, data, mesh=mesh, memory_limit=memory_limit,
                               headroom=memory_headroom, fsdp=fsdp)
    prep = resolve_time_budget(prep, train_records, data, model_config, base_params, mesh=mesh,
                                compositions=compositions, fsdp=fsdp)
    config = prep.config
    # The seed of the sampling stream and the noise keys: secret by default (see dpsynth.dp.seeds);
    # a resumed run continues with the seed stored in its (private) checkpoint.
    if prep.resume_meta is not None and "sampling_seed" in prep.resume_meta:
        run_seed = int(prep.resume_meta["sampling_seed"])
    else:
        run_seed = config.seed if config.seed is not None else seeds.shared_secret_seed()
    # The mechanism (strategy + batches) of the plan: user grouping and bounding, and the cyclic
    # sampler's groups, are functions of the secret seed, so a resume rebuilds the same ones.
    mech, strategy = build_mechanism(prep, model_config, run_seed=run_seed, num_rows=len(train_records), mesh=mesh)
    # One source of truth for sigma: what the ledger, the budget check, the report and the
    # checkpoint record is read from the strategy object that adds the noise.
    sigma = float(getattr(strategy, "noise_multiplier", 0.0))
    reporter = tune_report.RunReporter(
        config=config, plan=prep.plan, recipe=prep.recipe, labels=prep.labels, labels_from_data=prep.labels_from_data,
        selection=selection, base_dir=base_dir,
        base_manifest_sha256=fileio.sha256_file(os.path.join(base_dir, "manifest.json")),
        # An imported base (dpsynth import-model): its provenance travels into the report and manifest.
        base_source=base.manifest.get("source") or base.manifest.get("base_source"),
        embedding_clipping="sparse (exact, untied input table)" if embedding_spec(model_config, config) else "dense",
        contamination_sha256=(contamination_sha256 if contamination_sha256 is not None
                              else base.manifest.get("contamination_sha256")),
        mech=mech, sigma=sigma, probe_run=probe is not None)
    make_private_dir(prep.state_dir)
    if jax.process_index() == 0:  # exact counts computed without DP: the private state, never the report
        write_private_json(os.path.join(prep.state_dir, tune_report.COUNTS_FILE), {
            "truncated_train": int(data.train.truncated),
            "truncated_valid": int(data.valid.truncated) if data.valid else 0,
            **(mech.private_counts() if mech is not None else {}), "dp": False, "notice": tune_report.NON_DP_COUNTS_NOTICE})
        # D_train's record hashes (NOT DP; owner-only): `dpsynth select` checks D_valid against them (`dpsynth.dp.disjoint`).
        disjoint.write_hashes(prep.state_dir, train_records)
        if probe is not None:  # the probe's verdict and figures (NOT DP): the private state, never the report
            write_private_json(os.path.join(prep.state_dir, tune_report.PROBE_FILE), probe)
    fingerprint = run_fingerprint(config, data_fingerprint(data.train_arrays), base.tokenizer.sha256)
    loss_fn = make_loss_fn(model_config, config)
    state, ledger, losses, start = train_run(
        prep, data, init_variables(model_config, base_params, config), loss_fn, mech, strategy,
        run_seed=run_seed, fingerprint=fingerprint, reporter=reporter, out_dir=out_dir, mesh=mesh,
        stop_after=stop_after, progress_interval=progress_interval, fsdp=fsdp)
    return _write_outputs(prep, data, state, ledger, losses, start, loss_fn=loss_fn, reporter=reporter, base=base,
                          base_dir=base_dir, model_config=model_config, out_dir=out_dir, sigma=sigma, t0=t0)


def _write_outputs(prep: Prepared, data: TuneData, state, ledger: PrivacyLedger, losses: dict, start: int, *,
                   loss_fn, reporter: tune_report.RunReporter, base, base_dir: str, model_config, out_dir: str, sigma: float,
                   t0: float) -> TuneResult:
    """The private losses; then, when every planned step ran, the final report and the model (its
    manifest last, tied to the report: `dpsynth.train.release`); else the report so far."""
    from dpsynth.train import lm, sharding
    from dpsynth.models.directory import save_model

    config, plan = prep.config, prep.plan
    primary = jax.process_index() == 0
    valid_loss = (evaluate_loss(make_eval_fn(loss_fn), state.params, state.frozen, data.valid_arrays,
                                config.microbatch_size, desc=f"dp-tune[{config.mode}]: valid loss (NOT DP, private)")
                  if data.valid_arrays is not None else float("nan"))
    final_vars = sharding.gather(lm.merge_variables(state.params, state.frozen))
    rep = reporter(ledger)
    train_loss = losses["sum"] / max(losses["count"], 1.0)
    if primary:
        write_private_json(os.path.join(prep.state_dir, tune_report.LOSSES_FILE), {
            "train_loss": train_loss, "train_loss_steps": f"{start}..{ledger.steps_recorded}",
            "valid_loss": valid_loss, "dp": False, "notice": tune_report.NON_DP_LOSSES_NOTICE})
    finished = ledger.steps_recorded == plan.steps
    if finished and primary:  # the final report first, the manifest (tied to it) last: `dpsynth.train.release`
        release.unmark(out_dir)
        report_lib.write_report(out_dir, rep)
    if finished:
        extra_manifest = {"created_by": "dpsynth dp-tune",
                          **manifest_fields(config.template, prep.labels, config.label_dropout),
                          "dp_tune": {"mode": config.mode, "config": _released_config(config),
                                      "steps": ledger.steps_recorded, "epsilon": rep["epsilon"], "delta": plan.delta,
                                      "noise_multiplier": sigma},
                          "contamination_sha256": reporter.contamination_sha256, "private": rep["private"]}
        if reporter.base_source:
            extra_manifest["base_source"] = reporter.base_source  # what `dpsynth export-model` needs
        if primary:
            extra_manifest.update(release.report_fields(out_dir))
        collections = TRAINABLE[config.mode]
        save_model(out_dir, model_config, final_vars, base.tokenizer, extra_manifest,
                   collections=collections if config.mode != "full" else ("params",),
                   base_dir=None if config.mode == "full" else base_dir, created_by="dpsynth dp-tune")
    elif primary:
        report_lib.write_report(out_dir, rep)
    return TuneResult(out_dir=out_dir, steps=ledger.steps_recorded, noise_multiplier=sigma,
                      epsilon=ledger.epsilons(), delta=plan.delta, valid_loss=valid_loss,
                      train_loss=train_loss, truncated_train=data.train.truncated,
                      truncated_valid=data.valid.truncated if data.valid else 0, report=rep,
                      seconds=time.monotonic() - t0, state_dir=prep.state_dir)
