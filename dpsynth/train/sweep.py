"""A hyperparameter sweep of the DP tuner (`dpsynth dp-tune --sweep-lr/--sweep-clip`).

`sweep` runs `dpsynth.train.finetune.dp_tune` once per grid point (learning rate x clipping
norm) in the private state, selects the trial with the lowest D_valid loss and releases that
model alone. Selection and the two accounting modes ("composed", "selected-only") are
`dpsynth.dp.selection`'s, shared with the DP-on-real classifier sweep.

Formal guarantee ("composed"): each of the k trials is calibrated with `compositions=k`, so the
k trained models together are (epsilon, delta)-DP for D_train; the released report's ledger
holds every trial's entries. The selection reads D_valid without DP (a declared side channel).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from collections.abc import Sequence

import jax

from dpsynth import fileio
from dpsynth.dp import report as report_lib
from dpsynth.dp import selection as selection_lib
from dpsynth.dp.ledger import PrivacyLedger
from dpsynth.owner_only import make_private_dir, write_private_json
from dpsynth.models.sharding import sync
from dpsynth.train import release
from dpsynth.train.finetune import TuneResult, dp_tune
from dpsynth.train.tune_config import TuneConfig, TuneError, plan_for_records
from dpsynth.train.tune_report import NON_DP_LOSSES_NOTICE
from dpsynth.train.tune_resume import resolve_state_dir

logger = logging.getLogger("dpsynth.train.finetune")

SWEEP_FILE = "sweep.json"  # every trial's grid point and validation loss, in the sweep's private state dir


def sweep(
    base_dir: str,
    train_records: Sequence[dict],
    valid_records: Sequence[dict],
    out_dir: str,
    config: TuneConfig,
    *,
    learning_rates: Sequence[float],
    clip_norms: Sequence[float],
    sweep_accounting: str = "composed",
    state_dir: str | None = None,
    **kwargs,
) -> tuple[TuneResult, list[dict]]:
    """Grid over learning rate x clipping norm; releases the trial with the lowest D_valid loss.

    Accounting (`sweep_accounting`):
      * "composed" (default): each of the k trials is calibrated with
        `plan_privacy(compositions=k)`, so the composition of all k meets the target
        (epsilon, delta); the released report's ledger holds every trial's steps and its epsilon
        is that of the k-fold composition. The selection on D_valid is a declared non-DP side
        channel.
      * "selected-only" (the paper's way): each trial is calibrated to the target on its own and
        only the selected trial is accounted; the report says so in its side channels.

    Every trial runs in the private state (`state_dir/trials/<i>/{model,state}`); only the
    selected model and its report are written to `out_dir`. The validation losses stay in the
    private state (`state_dir/sweep.json`), never in `out_dir`.
    """
    selection_lib.check_accounting(sweep_accounting, TuneError)
    if config.recipe == "auto":
        raise TuneError("a sweep tries learning rates, which the automatic recipe chooses itself: use recipe 'manual' "
                        "for a sweep")
    if not valid_records:
        raise TuneError("a sweep selects by loss on D_valid: give a non-empty validation set")
    grid = [(float(lr), float(c)) for lr in learning_rates for c in clip_norms]
    if not grid:
        raise TuneError("an empty sweep grid: give at least one learning rate and one clipping norm")
    k = len(grid)
    compositions = selection_lib.compositions(sweep_accounting, k)
    plan_for_records(config, train_records, compositions=compositions)  # fail fast before any trial
    state_dir = resolve_state_dir(out_dir, state_dir)
    make_private_dir(state_dir)
    trials, results = [], []
    for i, (lr, c) in enumerate(grid):
        trial_config = dataclasses.replace(config, learning_rate=lr, clip_norm=c)
        tdir = os.path.join(state_dir, "trials", f"{i:03d}")
        res = dp_tune(base_dir, train_records, valid_records, os.path.join(tdir, "model"), trial_config,
                      state_dir=os.path.join(tdir, "state"), compositions=compositions, **kwargs)
        results.append(res)
        trials.append({"trial": i, "learning_rate": lr, "clip_norm": c, "valid_loss": res.valid_loss,
                       "epsilon": res.epsilon, "noise_multiplier": res.noise_multiplier})
        logger.info("sweep trial %d of %d done", i + 1, k)  # the loss goes to the private state, not to logs
    best = trials[selection_lib.best([t["valid_loss"] for t in trials], higher_is_better=False)]
    selection = {"trials": k, "grid": f"learning_rate {list(learning_rates)} x clip_norm {list(clip_norms)}",
                 "selected_by": "lowest loss on D_valid (not DP)", "accounting": sweep_accounting,
                 "selected": {key: best[key] for key in ("trial", "learning_rate", "clip_norm")}}
    primary = jax.process_index() == 0  # multi-host: one process copies and writes
    if primary:
        write_private_json(os.path.join(state_dir, SWEEP_FILE), {
            "selection": selection, "trials": trials, "dp": False, "notice": NON_DP_LOSSES_NOTICE})

    # ------------------------------------------------------------ the release: the selected model only
    src = os.path.join(state_dir, "trials", f"{best['trial']:03d}", "model")
    os.makedirs(out_dir, exist_ok=True)
    if primary:
        release.unmark(out_dir)  # written again last, after the composed report
    for name in os.listdir(src) if primary else ():
        if name in (report_lib.REPORT_JSON, report_lib.REPORT_MD, release.MANIFEST):
            continue  # rebuilt below
        s_, d_ = os.path.join(src, name), os.path.join(out_dir, name)
        if os.path.isdir(s_):
            shutil.copytree(s_, d_, dirs_exist_ok=True)
        else:
            shutil.copy2(s_, d_)
    sync(f"dpsynth sweep copy {out_dir}")
    rep = report_lib.load_report(src)
    if sweep_accounting == selection_lib.COMPOSED:  # selected-only: the selected trial's report as it is
        ledger = PrivacyLedger(delta=rep["delta"], target_epsilon=config.epsilon, accountant=config.accountant)
        for t, res in zip(trials, results):  # every trial's entries count
            for e in res.report["ledger"]["entries"]:
                ledger.entries.append({**e, "name": f"{e.get('name', 'dp_tune')} (sweep trial {t['trial']})"})
        rep = report_lib.refresh(rep, ledger)
    rep["side_channels"] = [ch for ch in rep["side_channels"] if not ch["name"].startswith("validation-based")]
    rep["side_channels"].append(selection_lib.selection_channel(sweep_accounting, sweep=selection_lib.DP_TUNE,
                                                                trials=k, grid=selection["grid"]))
    rep["selection"] = selection
    if primary:
        report_lib.write_report(out_dir, rep)
        manifest = fileio.read_json(os.path.join(src, release.MANIFEST))
        manifest["dp_tune"].update(epsilon=rep["epsilon"], sweep={"trials": k, "accounting": sweep_accounting,
                                                                   "selected": selection["selected"]})
        manifest.update(release.report_fields(out_dir))
        fileio.write_json(os.path.join(out_dir, release.MANIFEST), manifest)  # last: the directory is complete
    chosen = results[best["trial"]]
    result = TuneResult(out_dir=out_dir, steps=chosen.steps, noise_multiplier=chosen.noise_multiplier,
                        epsilon=report_lib.ledger_of(rep).epsilons(), delta=rep["delta"],
                        valid_loss=best["valid_loss"], train_loss=chosen.train_loss,
                        truncated_train=chosen.truncated_train, truncated_valid=chosen.truncated_valid, report=rep,
                        seconds=sum(r.seconds for r in results), state_dir=state_dir)
    return result, trials
