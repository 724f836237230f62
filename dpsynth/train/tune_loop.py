"""The training loop of a `dp_tune` run (`train_run`, on `dpsynth.train.loop.run_loop`).

From step 0, or from the checkpoint (its fingerprint, ledger and noise multiplier checked first),
each step's Poisson batch (with label dropout, or the sampled label contrast's rows) is gathered, stepped and recorded in the privacy
ledger (`strategy_ledger_entry`: sigma and C read from the strategy object that adds the noise);
every `checkpoint_every` steps the state is checkpointed with the ledger and the privacy report
refreshed.
"""

from __future__ import annotations

import functools
import io
import logging
from typing import Any

import jax
import numpy as np

from dpsynth.dp import report as report_lib, sampling, seeds
from dpsynth.dp.ledger import BudgetExceeded, PrivacyLedger
from dpsynth.dp.mechanisms.run import recorded_strategies
from dpsynth.dp.plan import PrivacyPlan
from dpsynth.dp.users import gather_users
from dpsynth.train import tune_report
from dpsynth.train.prompts import label_dropout_rows
from dpsynth.train.tune_config import TRAINABLE, TuneError, Prepared
from dpsynth.train.tune_data import TuneData, gather_train
from dpsynth.train.tune_model import make_step_functions
from dpsynth.train.tune_resume import CHECKPOINT_FORMAT, accounted_settings, fingerprint_mismatch, run_settings

logger = logging.getLogger("dpsynth.train.finetune")  # the tuner's one logger, whichever module logs


def strategy_ledger_entry(plan: PrivacyPlan, strategy, *, steps: int, clip_norm: float,
                          strategy_sha256: str | None = None) -> dict[str, Any]:
    """The ledger entry of `steps` steps run with `strategy`: sigma and C are read from the object that
    adds the noise (one source of truth; `MeanGradient` adds none: sigma 0, epsilon inf). BandMF
    entries carry the strategy matrix's `strategy_sha256`."""
    sigma = float(getattr(strategy, "noise_multiplier", 0.0))
    entry = plan.ledger_entry(steps=steps, clip_norm=getattr(strategy, "clip_norm", clip_norm),
                              strategy_sha256=strategy_sha256)
    entry["noise_multiplier"] = sigma
    return entry


def train_run(prep: Prepared, data: TuneData, variables: dict, loss_fn, mech, strategy, *, run_seed: int,
           fingerprint: str, reporter: tune_report.RunReporter, out_dir: str, mesh, stop_after: int | None,
           progress_interval: float, fsdp: bool = False):
    """The one training loop (`dpsynth.train.loop`), from step 0 or the checkpoint; returns
    (state, ledger, non-DP loss sums, first step run)."""
    from dpsynth.train import lm, loop
    from dpsynth.train.checkpoint import TrainCheckpointer

    config, plan, ckpt_dir = prep.config, prep.plan, prep.ckpt_dir
    params, frozen = lm.split_variables(variables, TRAINABLE[config.mode])
    fns = make_step_functions(loss_fn, config, strategy, mesh=mesh, fsdp=fsdp)
    per_user = mech is not None and mech.per_user  # microbatches are [users, W] slot matrices
    mb_rows = mech.rows_per_microbatch if mech is not None else config.microbatch_size
    local = fns.process_rows(mb_rows)  # the rows (users) of every microbatch this process feeds
    primary = jax.process_index() == 0
    rng = jax.random.fold_in(seeds.jax_key(run_seed), 0x7E5)
    state = fns.init_state(params, frozen, rng=rng)
    batches = mech.batches if mech is not None else sampling.PoissonSampler(
        plan.dataset_size, plan.expected_batch_size, config.microbatch_size, seed=run_seed,
        max_batch_size=config.max_batch_size)  # non-private: the same Poisson batches, no noise
    sigma = reporter.sigma
    ledger = PrivacyLedger(delta=plan.delta, target_epsilon=config.epsilon, accountant=config.accountant)
    for spent in plan.spent:  # spent on D_train before the first step (the DP example length)
        ledger.record_selection(spent)

    def entry(steps: int) -> dict[str, Any]:
        return strategy_ledger_entry(plan, strategy, steps=steps, clip_norm=config.clip_norm,
                                     strategy_sha256=mech.strategy_sha256 if mech is not None else None)

    checkpointer = TrainCheckpointer(ckpt_dir, max_to_keep=2, private=True)  # in the private state dir: 0700/0600
    try:
        if prep.resume_meta is not None:
            meta = prep.resume_meta
            if meta.get("format") != CHECKPOINT_FORMAT or meta.get("fingerprint") != fingerprint:
                raise TuneError(f"{ckpt_dir}: checkpoint was made with {fingerprint_mismatch(meta, config)}; resume "
                                "with the same flags and files, or use a new --out")
            state, meta = checkpointer.restore(state)  # `_prepare` read its metadata: the checkpoint exists
            state = fns.place_state(state)
            ledger = PrivacyLedger.from_json(meta["ledger"], where=ckpt_dir)
            recorded = {e.get("noise_multiplier") for e in ledger.entries if e.get("name") == "dp_tune"}
            if recorded - {sigma}:
                raise TuneError(f"{ckpt_dir}: the checkpoint's ledger records noise multiplier(s) {sorted(recorded)} "
                                f"but this run adds noise with {sigma}; refusing to resume")
            if mech is not None and recorded_strategies(ledger.entries) - {mech.strategy_sha256}:
                raise TuneError(f"{ckpt_dir}: the checkpoint's ledger records BandMF strategy "
                                f"{sorted(recorded_strategies(ledger.entries))} but this run would add noise with "
                                f"{mech.strategy_sha256}; refusing to resume")
            if ledger.steps_recorded != int(state.step):
                raise TuneError(f"{ckpt_dir}: ledger records {ledger.steps_recorded} steps but the state is at step "
                                f"{int(state.step)}; the checkpoint is inconsistent")
            logger.info("resumed at step %d of %d", int(state.step), plan.steps)
        start = int(state.step)
        remaining = plan.steps - start
        if remaining < 0:
            raise BudgetExceeded(f"the checkpoint is at step {start}, past the {plan.steps} planned steps")
        ledger.check_budget([entry(remaining)] if remaining else [])  # refuses to start/continue past the budget

        def save_checkpoint(done: int, state) -> None:
            meta = {"format": CHECKPOINT_FORMAT, "fingerprint": fingerprint, "settings": run_settings(config),
                    "ledger": ledger.to_json(),
                    "noise_multiplier": sigma, "sampling_seed": run_seed, "next_step": int(state.step),
                    **accounted_settings(config, plan),
                    **({"example_length": prep.length.to_json()} if prep.length is not None else {}),
                    **({"time_budget": prep.time_budget.to_json()} if prep.time_budget is not None else {})}
            checkpointer.save(state, meta)  # every process (multi-host Orbax); JSON meta by process 0
            if primary:
                report_lib.write_report(out_dir, reporter(ledger))  # the report follows the checkpoints

        def batch(step: int) -> list[dict[str, np.ndarray]]:
            indices = [label_dropout_rows(m, step, seed=run_seed, p=config.label_dropout, num_examples=len(data.train))
                       for m in batches.microbatches(step)]
            return [gather_users(data.train_arrays, m[local]) if per_user
                    else gather_train(data.train_arrays, m[local], step, seed=run_seed, form=config.label_contrast_form)
                    for m in indices]

        losses = {"sum": 0.0, "count": 0.0}  # the non-DP train loss of the steps run (private state only)

        def after_step(done: int, state, metrics) -> dict[str, float]:
            ledger.record_steps(entry(1))
            losses["sum"] += float(metrics["loss_sum"])
            losses["count"] += float(metrics["count"])
            return {"loss": float(metrics["loss"])}

        state = loop.run_loop(
            state, start=start, total=plan.steps, stop_after=stop_after, batch=batch,
            step=functools.partial(fns.accumulated_step, global_rows=mb_rows),
            after_step=after_step, save=save_checkpoint, checkpoint_every=config.checkpoint_every,
            desc=f"dp-tune[{config.mode}]", progress_interval=progress_interval,
            stream=None if primary else io.StringIO()).state
    finally:
        checkpointer.close()
    return state, ledger, losses, start
