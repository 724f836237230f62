"""A hyperparameter sweep of the DP tuner (`dpsynth dp-tune --sweep-lr/--sweep-clip`).

`sweep` runs `dpsynth.train.finetune.dp_tune` once per grid point (learning rate x clipping
norm) in the private state, selects the trial with the lowest D_valid loss and releases that
model alone. Selection and the two accounting modes ("composed", "selected-only") are
`dpsynth.dp.selection`'s, shared with the DP-on-real classifier sweep.

Formal guarantee ("composed"): each of the k trials is calibrated with `compositions=k`, so the
k trained models together are (epsilon, delta)-DP for D_train; the released report's ledger
holds every trial's entries. By default the selection reads D_valid without DP (a declared side
channel). With `select_epsilon` it is a DP selection instead (`dpsynth.dp.private_selection`):
the exponential mechanism on each trial's score -sum_j min(l_j, B) / B over the examples j of
D_valid (l_j: the example's mean token loss under the trial's model, B = `VALID_LOSS_BOUND`
nats), a score of sensitivity 1 that moves the same way for every trial when one example is
added or removed (monotone); its entry (on D_valid) joins the ledger, and the release is
(max(epsilon_tuning, epsilon_selection), delta)-DP with respect to D when D_valid was split
data-independently (`valid_split` "files" or "hash"), else the sequential composition.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence

import jax

from dpsynth import fileio
from dpsynth.dp import report as report_lib
from dpsynth.dp import private_selection as ps
from dpsynth.dp import selection as selection_lib
from dpsynth.dp.ledger import PrivacyLedger
from dpsynth.owner_only import make_private_dir, restrict_tree, write_private_json
from dpsynth.models.sharding import sync
from dpsynth.train import release
from dpsynth.train.finetune import TuneResult, dp_tune
from dpsynth.train.tune_config import TuneConfig, TuneError, plan_for_records
from dpsynth.train.tune_report import NON_DP_LOSSES_NOTICE
from dpsynth.train.tune_resume import resolve_state_dir

logger = logging.getLogger("dpsynth.train.finetune")

SWEEP_FILE = "sweep.json"  # every trial's grid point and validation loss, in the sweep's private state dir
VALID_LOSS_BOUND = 10.0  # nats: each D_valid example's mean token loss is clipped to this in a DP selection's score


def valid_score(model_dir: str, valid_records: Sequence[dict], config: TuneConfig) -> float:
    """-sum_j min(l_j, B) / B over D_valid (l_j: example j's mean token loss under the model in
    `model_dir`, B = `VALID_LOSS_BOUND`): adding or removing one example moves it by at most 1,
    in the same direction for every model (a monotone score of sensitivity 1)."""
    import numpy as np

    from dpsynth.dp import sampling
    from dpsynth.models.directory import load_model
    from dpsynth.train import lm
    from dpsynth.train.tune_config import TRAINABLE
    from dpsynth.train.tune_model import make_loss_fn
    from dpsynth.train.prompts import encode_examples, labels_of

    model = load_model(model_dir)
    enc = encode_examples(valid_records, model.tokenizer, labels_of(model.manifest), config.example_config(),
                          where="D_valid")
    loss_fn = make_loss_fn(model.config, config)
    params, frozen = lm.split_variables(model.variables, TRAINABLE[config.mode])
    clipped = jax.jit(lambda p, f, b: jax.numpy.sum(jax.numpy.minimum(
        loss_fn(p, f, b, jax.random.PRNGKey(0))[0], VALID_LOSS_BOUND) * b["mask"]))
    arrays, n, total = enc.arrays(), len(enc), 0.0
    for lo in range(0, n, config.microbatch_size):
        idx = np.arange(lo, lo + config.microbatch_size)
        total += float(clipped(params, frozen, sampling.gather(arrays, np.where(idx < n, idx, -1))))
    return -total / VALID_LOSS_BOUND


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
    select_epsilon: float | None = None,
    valid_split: str = "files",
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

    Selection: the lowest D_valid loss (not DP, a declared side channel), or with
    `select_epsilon` a DP selection on D_valid (see the module docstring; composed accounting
    only), `valid_split` saying how D_valid was split from D (`private_selection.SPLITS`).

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
    if select_epsilon is not None:
        if not (select_epsilon > 0 and select_epsilon < float("inf")):
            raise TuneError(f"the sweep's selection epsilon must be a finite number > 0, got {select_epsilon}")
        if sweep_accounting != selection_lib.COMPOSED:
            raise TuneError("a DP selection among the sweep's trials needs --sweep-accounting composed (selected-only "
                            "leaves the other trials unaccounted)")
        if valid_split not in ps.SPLITS:
            raise TuneError(f"valid_split must be one of {ps.SPLITS}, got {valid_split!r}")
        if not config.private:
            raise TuneError("a DP selection among non-private trials protects nothing: drop --sweep-select-epsilon")
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
        if jax.process_index() == 0:  # the trial's model (Orbax writes with the umask's modes): owner-only
            restrict_tree(tdir)
        results.append(res)
        trials.append({"trial": i, "learning_rate": lr, "clip_norm": c, "valid_loss": res.valid_loss,
                       "epsilon": res.epsilon, "noise_multiplier": res.noise_multiplier})
        logger.info("sweep trial %d of %d done", i + 1, k)  # the loss goes to the private state, not to logs
    grid_text = f"learning_rate {list(learning_rates)} x clip_norm {list(clip_norms)}"
    dp_selected = None
    if select_epsilon is None:
        best = trials[selection_lib.best([t["valid_loss"] for t in trials], higher_is_better=False)]
    else:
        dp_selected = _dp_select(trials, results, valid_records, config, epsilon=select_epsilon, split=valid_split,
                                 grid=grid_text)
        best = trials[dp_selected[0]]
    selection = {"trials": k, "grid": grid_text, "accounting": sweep_accounting,
                 "selected_by": "lowest loss on D_valid (not DP)" if dp_selected is None else
                 dp_selected[2]["selection"]["selected_by"],
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
            fileio.copy_tree(s_, d_)
        else:
            fileio.copy_file(s_, d_)
    sync(f"dpsynth sweep copy {out_dir}")
    rep = report_lib.load_report(src)
    if dp_selected is not None:  # every trial's entries and the selection's, composed by `select_release`
        rep = {**dp_selected[2], "selection": {**dp_selected[2]["selection"], **selection}}
    elif sweep_accounting == selection_lib.COMPOSED:  # selected-only: the selected trial's report as it is
        ledger = PrivacyLedger(delta=rep["delta"], target_epsilon=config.epsilon, accountant=config.accountant)
        for t, res in zip(trials, results):  # every trial's entries count
            for e in res.report["ledger"]["entries"]:
                ledger.entries.append({**e, "name": f"{e.get('name', 'dp_tune')} (sweep trial {t['trial']})"})
        rep = report_lib.refresh(rep, ledger)
    rep["side_channels"] = [ch for ch in rep["side_channels"] if not ch["name"].startswith("validation-based")]
    if dp_selected is None:
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
    epsilon = report_lib.ledger_of(rep).epsilons() if dp_selected is None else {
        acc: (None if v is None else float(v)) for acc, v in dp_selected[3].items()}
    result = TuneResult(out_dir=out_dir, steps=chosen.steps, noise_multiplier=chosen.noise_multiplier,
                        epsilon=epsilon, delta=rep["delta"],
                        valid_loss=best["valid_loss"], train_loss=chosen.train_loss,
                        truncated_train=chosen.truncated_train, truncated_valid=chosen.truncated_valid, report=rep,
                        seconds=sum(r.seconds for r in results), state_dir=state_dir)
    return result, trials


def _dp_select(trials: list[dict], results: list[TuneResult], valid_records: Sequence[dict], config: TuneConfig, *,
               epsilon: float, split: str, grid: str):
    """(winner, its ledger entry, the release's report, its epsilon per accountant): the exponential
    mechanism on `valid_score` of every trial, the trials' entries renamed per trial."""
    import numpy as np

    from dpsynth.dp import seeds

    scores = [valid_score(r.out_dir, valid_records, dataclasses.replace(config, learning_rate=t["learning_rate"],
                                                                        clip_norm=t["clip_norm"]))
              for t, r in zip(trials, results)]
    for t, score in zip(trials, scores):
        t["valid_score"] = score  # (private state only, with the losses)
    reports = []
    for t, r in zip(trials, results):
        entries = [{**e, "name": f"{e.get('name', 'dp_tune')} (sweep trial {t['trial']})"}
                   for e in r.report["ledger"]["entries"]]
        reports.append({**r.report, "ledger": {**r.report["ledger"], "entries": entries}})
    rng = np.random.default_rng([config.seed if config.seed is not None else seeds.shared_secret_seed(), 0x5E1])
    mech = ps.DpSelection(epsilon=epsilon)
    names = [f"trial {t['trial']:03d}" for t in trials]
    winner, entry, rep = ps.select_release(
        names, scores, reports, mech, split=split, rng=rng, entry_name=f"dp_selection among {len(trials)} sweep trials",
        selected_by=f"the clipped loss on D_valid (-sum of min(example loss, {VALID_LOSS_BOUND:g}) / "
                    f"{VALID_LOSS_BOUND:g}, sensitivity 1, monotone) of each trial of {grid}, released through "
                    f"exponential selection at epsilon {epsilon:g}",
        covers="the choice of this trial among the sweep's on D_valid (DP, see `selection`)")
    eps = ps.guarantee(rep["ledger"]["entries"], float(rep["delta"]), rep["selection"]["composition"])["epsilon"]
    return winner, entry, rep, eps
