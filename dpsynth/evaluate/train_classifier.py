"""Downstream classifiers: the sweep (lr x wd [x C] x repeats) and the protocol on records and files.

Protocol (Kurakin et al. 2023): train on synthetic train, select (early stopping and the
learning-rate / weight-decay sweep) on synthetic valid, test on real test. Baselines: the same
on real train / real valid (epsilon = inf), and DP-on-real: DP-Adam (`trainer.Trainer.train_dp`)
with Poisson sampling, sweeping the clipping norm too.

The classifier is a family of `dpsynth.evaluate.registry` (`ClassifierSpec.kind`, built by
`registry.make`); one run is `dpsynth.evaluate.trainer.Trainer`; selection and the sweep's
accounting are `dpsynth.dp.selection`'s (shared with the DP tuner's sweep).

DP-on-real, formal guarantee. The privacy plan comes from `dpsynth.dp.plan.plan_privacy`
(sigma from the accountant only). With `sweep_accounting="composed"` (default) the k trials of
the sweep (grid x repeats, all on the same D_train) are each calibrated with
`compositions=k`, so that all k trained classifiers (every intermediate parameter) together
are (epsilon, delta)-DP for D_train under add-or-remove adjacency; the ledger records the k
trials and is checked against the target before the first step. With "selected-only" (the
paper's accounting) each trial alone meets the target and only the selected one is accounted.
Poisson sampling and noise are seeded from a secret 64-bit seed (`dpsynth.dp.seeds`), drawn
per sweep and never written anywhere. The WordCNN vocabulary comes from public data by
default (the pieces of the pretrained model's SentencePiece tokenizer, or hashed words).
Non-DP side channels, listed in the privacy report: early stopping and the selection read real
D_valid; the label set and |D_train| are read without DP; a D_train vocabulary if asked for.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from dpsynth import fileio
from dpsynth.dp import private_selection
from dpsynth.dp import selection as selection_lib
from dpsynth.evaluate import classifiers, registry
from dpsynth.evaluate import scores as scores_lib
from dpsynth.evaluate.trainer import DPConfig, Split, TrainConfig, Trainer

logger = logging.getLogger("dpsynth.evaluate")

# A small CPU default grid and a wider one; the sweep is configurable either way.
SMALL_LR_GRID = (1e-3, 3e-3)
SMALL_WD_GRID = (1e-4,)
WIDE_LR_GRID = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
WIDE_WD_GRID = (0.0, 1e-4, 1e-3, 1e-2)

# Tag of the streams derived from the secret sweep seed (one per trial).
_TRIAL_STREAM = 0xC1A55


# ----------------------------------------------------------------------------- sweeps


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepConfig:
    """Grid and repeats. Attributes: learning_rates, weight_decays, clip_norms (DP only),
    repeats (seeds 0..repeats-1), train (the per-run settings; lr/wd/seed are overridden)."""

    learning_rates: tuple[float, ...] = SMALL_LR_GRID
    weight_decays: tuple[float, ...] = SMALL_WD_GRID
    clip_norms: tuple[float, ...] = (0.5, 1.0)
    repeats: int = 3
    train: TrainConfig = TrainConfig()

    def __post_init__(self):
        if not self.learning_rates or not self.weight_decays or not self.clip_norms or self.repeats < 1:
            raise ValueError("the sweep needs non-empty grids and repeats >= 1")


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """All trials and the selected hyperparameters (best mean validation accuracy).

    `trials` rows: {"learning_rate", "weight_decay", "clip_norm", "seed" (the public repeat
    index: parameter init and non-private shuffling, never the DP seed), "valid_accuracy",
    "<test name>_accuracy", "epsilon" (of that trial alone), "noise_multiplier",
    "<test name>_balanced_accuracy", "<test name>_macro_f1"}. `test_mean` / `test_std` are the
    accuracy's mean and (population) standard deviation over the repeats of the selected setting,
    per test name; `score_mean` / `score_std` the same for every score, {test name: {"accuracy",
    "balanced_accuracy", "macro_f1"}} (`dpsynth.evaluate.scores`). The selection reads validation
    accuracy only. `privacy`: the DP-on-real sweep's privacy report (`dpsynth.dp.report` format;
    None when non-private).
    """

    trials: list[dict]
    selected: dict
    valid_mean: float
    test_mean: dict[str, float]
    test_std: dict[str, float]
    privacy: dict | None = None
    score_mean: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    score_std: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)


def trial_seed(sweep_seed: int, trial: int) -> int:
    """The sampling/noise seed of trial `trial`: a 64-bit function of the (secret) sweep seed."""
    state = np.random.SeedSequence([int(sweep_seed) % (1 << 64), _TRIAL_STREAM, int(trial)]).generate_state(2, np.uint32)
    return (int(state[0]) << 32) | int(state[1])


def sweep_side_channels(dp: DPConfig, *, trials: int, repeats: int, grid: str,
                        vocabulary: dict | None = None) -> list[dict]:
    """The non-DP releases of a DP-on-real sweep about the sensitive data (for its privacy report)."""
    channels = [
        {"name": "label set", "detail": "the label names are read from D_train without DP (the per-label counts "
                                        "are not released)"},
        {"name": "dataset sizes", "detail": "|D_train| sets q and delta = 1/|D_train| by default; the sizes of "
                                            "D_train and D_valid are recorded without DP"},
    ]
    if dp.select_epsilon is None:
        channels.append(selection_lib.selection_channel(dp.sweep_accounting, sweep=selection_lib.DP_ON_REAL,
                                                        trials=trials, grid=grid, repeats=repeats))
    elif dp.sweep_accounting == selection_lib.SELECTED_ONLY:
        channels.append(selection_lib.selection_channel(dp.sweep_accounting, sweep=selection_lib.DP_ON_REAL,
                                                        trials=trials, grid=grid, repeats=repeats))
    if vocabulary is not None and vocabulary.get("source") == "train":
        channels.append({"name": "vocabulary from D_train", "detail":
                         f"the WordCNN vocabulary ({vocabulary['detail']}) was read from D_train without DP and "
                         "shapes every trained classifier; use the default (a public tokenizer's pieces or hashed "
                         "words) for a DP baseline"})
    if dp.seed is not None:
        channels.append({"name": "fixed seed", "detail": "the sweep used a user-supplied seed for its Poisson sampling "
                         "and noise: anyone who knows it can regenerate the noise, which voids the guarantee. Use the "
                         "default (a secret seed from the OS entropy pool) for any release"})
    return channels


def run_sweep(trainer: Trainer, train: Split, valid: Split, tests: Mapping[str, Split], sweep: SweepConfig,
              dp: DPConfig | None = None, progress: Callable[[], None] | None = None, *,
              report_extra: Mapping[str, Any] | None = None, max_tokens: int = 512) -> SweepResult:
    """Every (lr, wd[, clip]) x repeat; selects by mean validation accuracy over repeats.

    With `dp`: the plan of each of the k trials is `dp.plan(N, k)`, the budget is checked for
    the whole sweep before the first step, the trials draw their sampling/noise seeds from one
    secret sweep seed, and the result carries the sweep's privacy report (ledger, epsilons by
    every accountant, side channels; `report_extra` is merged into it, its "vocabulary" entry
    also adds a side channel when it came from D_train).
    """
    from dpsynth.dp import seeds
    from dpsynth.dp.ledger import PrivacyLedger
    from dpsynth.progress import Progress

    clips = sweep.clip_norms if dp is not None else (None,)
    grid = [(lr, wd, clip, rep) for lr in sweep.learning_rates for wd in sweep.weight_decays for clip in clips
            for rep in range(sweep.repeats)]
    total = len(grid)
    plan, sweep_seed, ledger = None, None, None
    if dp is not None:
        plan = dp.plan(len(train.x), total)
        ledger = PrivacyLedger(delta=plan.delta, target_epsilon=dp.epsilon, accountant=plan.accountant)
        accounted = selection_lib.compositions(dp.sweep_accounting, total)
        ledger.check_budget([plan.ledger_entry(steps=plan.steps, clip_norm=1.0, name="dp_on_real")] * accounted)
        sweep_seed = dp.seed if dp.seed is not None else seeds.secret_seed()
        logger.info("DP-on-real: %d trials, %s accounting, sigma %.4g, %d steps each, q %.4g", total,
                    dp.sweep_accounting, plan.noise_multiplier, plan.steps, plan.sampling_probability)
    trials = []
    bar = Progress(total=total, desc="dp classifier sweep" if dp else "classifier sweep", unit="trial", interval=30.0)
    for i, (lr, wd, clip, rep) in enumerate(grid):
        cfg = dataclasses.replace(sweep.train, learning_rate=lr, weight_decay=wd, seed=rep)
        desc = f"{'dp classifier' if dp else 'classifier'} trial {i + 1}/{total}"
        if dp is None:
            r = trainer.train(train, valid, tests, cfg, desc=desc)
        else:
            r = trainer.train_dp(train, valid, tests, cfg, dataclasses.replace(dp, clip_norm=clip), plan=plan,
                                 seed=trial_seed(sweep_seed, i), desc=desc)
        row = {"learning_rate": lr, "weight_decay": wd, "clip_norm": clip, "seed": rep,
               "valid_accuracy": r.valid_accuracy, "best_epoch": r.best_epoch, "epsilon": r.epsilon,
               "noise_multiplier": r.noise_multiplier}
        if dp is not None:
            row["steps"] = r.steps
        row.update({f"{k}_accuracy": v for k, v in r.test_accuracy.items()})
        for k, test_scores in r.test_scores.items():
            row.update({f"{k}_{m}": test_scores[m] for m in scores_lib.METRICS if m != "accuracy"})
        trials.append(row)
        bar.update(1, valid_accuracy=r.valid_accuracy)
        if progress is not None:
            progress()
    bar.close()
    groups: dict[tuple, list[dict]] = {}
    for t in trials:
        groups.setdefault((t["learning_rate"], t["weight_decay"], t["clip_norm"]), []).append(t)
    settings = list(groups)
    dp_selection = None
    if dp is not None and dp.select_epsilon is not None:  # DP on D_valid: the mean correct count of each setting
        dp_selection = private_selection.DpSelection(epsilon=dp.select_epsilon)
        counts = [float(np.mean([round(r["valid_accuracy"] * len(valid.y)) for r in groups[k]])) for k in settings]
        rng = np.random.default_rng(trial_seed(sweep_seed, total))  # a stream of its own from the secret seed
        key = settings[dp_selection.choose(counts, rng)]
    else:
        key = settings[selection_lib.best([float(np.mean([r["valid_accuracy"] for r in groups[k]])) for k in settings],
                                          higher_is_better=True)]
    rows = groups[key]
    test_mean = {k: float(np.mean([r[f"{k}_accuracy"] for r in rows])) for k in tests}
    test_std = {k: float(np.std([r[f"{k}_accuracy"] for r in rows])) for k in tests}
    score_mean = {k: {m: float(np.mean([r[f"{k}_{m}"] for r in rows])) for m in scores_lib.METRICS} for k in tests}
    score_std = {k: {m: float(np.std([r[f"{k}_{m}"] for r in rows])) for m in scores_lib.METRICS} for k in tests}
    selected = {"learning_rate": key[0], "weight_decay": key[1], "clip_norm": key[2]}
    privacy = None
    if dp is not None:
        chosen = next(i for i, t in enumerate(trials) if t is rows[0])  # the selected setting's first repeat
        for i in selection_lib.accounted_trials(dp.sweep_accounting, total, chosen):
            ledger.record_steps(plan.ledger_entry(steps=trials[i]["steps"], clip_norm=trials[i]["clip_norm"],
                                                  name=f"dp_on_real trial {i}"))
        ledger.check_budget()
        if dp_selection is not None:  # after the budget check: D_valid is a part of its own (`guarantee`)
            ledger.record_selection(dp_selection.ledger_entry(len(settings), name="dp_on_real selection",
                                                              group=private_selection.group_size(dp.valid_split)))
        grid_text = (f"learning_rate {list(sweep.learning_rates)} x weight_decay {list(sweep.weight_decays)} x "
                     f"clip_norm {list(sweep.clip_norms)} x {sweep.repeats} repeats")
        extra = dict(report_extra or {})
        channels = sweep_side_channels(dp, trials=total, repeats=sweep.repeats, grid=grid_text,
                                       vocabulary=extra.get("vocabulary"))
        privacy = build_privacy_report(ledger, plan, dp, trials=total, selected=selected, grid=grid_text,
                                       side_channels=channels, extra=extra, max_tokens=max_tokens)
    return SweepResult(trials, selected, float(np.mean([r["valid_accuracy"] for r in rows])), test_mean, test_std,
                       privacy, score_mean, score_std)


def build_privacy_report(ledger, plan, dp: DPConfig, *, trials: int, selected: dict, grid: str,
                         side_channels: Sequence[dict], extra: Mapping[str, Any] | None = None,
                         max_tokens: int = 512) -> dict:
    """The DP-on-real sweep's privacy report (`dpsynth.dp.report` schema, the tuner's format)."""
    from dpsynth.dp import report as report_lib

    composed = dp.sweep_accounting == selection_lib.COMPOSED
    training = {"mode": "dp_on_real", "optimizer": "DP-Adam (adamw on the noised clipped mean)",
                "noise_multiplier": plan.noise_multiplier, "sampling_probability": plan.sampling_probability,
                "expected_batch_size": plan.expected_batch_size, "dataset_size": plan.dataset_size,
                "steps": plan.steps, "epochs": plan.epochs, "clip_norms": _clips(ledger),
                "microbatch_size": dp.microbatch_size, "trials": trials, "compositions": plan.compositions}
    covers = (f"all {trials} classifiers trained by this sweep (every intermediate parameter) and everything "
              "computed from them without further access to D_train (their accuracies, the selection): post-processing"
              if composed else
              "the selected trial's classifier (every intermediate parameter) and what is computed from it alone; "
              "NOT the other trials of the sweep (see side channels)")
    out_extra = {"baseline": "dp_on_real", "sweep_accounting": dp.sweep_accounting, "plan": plan.to_json(),
                 "covers": covers,
                 "selection": {"trials": trials, "grid": grid, "selected": dict(selected),
                               "selected_by": "mean accuracy on the real D_valid over repeats"},
                 **dict(extra or {})}
    if dp.select_epsilon is not None:
        out_extra["selection"]["selected_by"] = (
            f"the exponential mechanism at epsilon {dp.select_epsilon:g} on each setting's mean count of correct "
            "predictions on the real D_valid (every trial keeps its last epoch: no trial reads D_valid)")
    rep = report_lib.build_report(ledger, training=training, contamination_sha256=None, side_channels=side_channels,
                                  max_tokens_per_example=max_tokens, extra=out_extra)
    if dp.select_epsilon is not None:  # the training (D_train) and the selection (D_valid) composed
        g = private_selection.guarantee(ledger.entries, ledger.delta, private_selection.composition(dp.valid_split))
        rep["epsilon"] = {k: report_lib._fmt_eps(v) for k, v in g["epsilon"].items()}
        rep["selection"].update(
            mechanism=private_selection.EXPONENTIAL, epsilon=dp.select_epsilon, split=dp.valid_split,
            composition=g["composition"],
            epsilon_by_dataset={d: {k: report_lib._fmt_eps(v) for k, v in e.items()}
                                for d, e in g["epsilon_by_dataset"].items()},
            epsilon_sequential={k: report_lib._fmt_eps(v) for k, v in g["epsilon_sequential"].items()})
    return rep


def _clips(ledger) -> list[float]:
    return sorted({float(e["clip_norm"]) for e in ledger.entries if e["mechanism"] == "dpsgd"})


# ----------------------------------------------------------------------------- the protocol


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClassifierSpec:
    """Which classifier. Attributes: kind (a name of `dpsynth.evaluate.registry`), wordcnn (its sizes),
    model_dir (the pretrained LM for "backbone"; its tokenizer for the WordCNN's "tokenizer"
    vocabulary), max_len (backbone tokens), options (the family's own settings by name,
    `registry.ClassifierKind.settings`: e.g. {"vocabulary": "hashing"} for the WordCNN,
    `wordcnn.WordCNNSettings`; {"pooling": "last", "freeze": True, "truncate": "tail"} for the
    backbone, `backbone.BackboneSettings`)."""

    kind: str = "wordcnn"
    wordcnn: classifiers.WordCNNConfig = classifiers.WordCNNConfig()
    model_dir: str | None = None
    max_len: int = 128
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        kind = registry.get(self.kind)
        kind.settings_of(self)  # the family's own settings: ValueError naming a bad one
        if kind.needs_model_dir and self.model_dir is None:
            raise ValueError(f"the {self.kind} classifier needs model_dir (a dpsynth checkpoint directory)")
        kind.check(self)

    @property
    def input_len(self) -> int:
        """Tokens (WordCNN: words or pieces) kept per example."""
        return registry.get(self.kind).input_len(self)


def check_records(name: str, records: Sequence[Mapping]) -> None:
    """Raises ValueError naming the set and the record for empty or non-text rows or missing labels."""
    if not records:
        raise ValueError(f"{name}: no examples")
    for i, r in enumerate(records):
        t = r.get("text")
        if not isinstance(t, str) or not t.strip():
            raise ValueError(f"{name}: record {i} (id {r.get('id', '?')}) has an empty or non-text 'text'")
        if r.get("label") in (None, ""):
            raise ValueError(f"{name}: record {i} (id {r.get('id', '?')}) has no label")


def check_label_sets(sets: Mapping[str, Sequence[Mapping]]) -> classifiers.LabelMap:
    """The shared label map; raises ValueError when any two sets have different label sets."""
    label_sets = {name: frozenset(str(r["label"]) for r in recs) for name, recs in sets.items()}
    first_name, first = next(iter(label_sets.items()))
    for name, labels in label_sets.items():
        if labels != first:
            raise ValueError(
                f"label sets differ: {name} has {sorted(labels)}, {first_name} has {sorted(first)} "
                f"(only in {name}: {sorted(labels - first)}; missing: {sorted(first - labels)})")
    return classifiers.LabelMap(tuple(sorted(first)))


def classify(train: Sequence[Mapping], valid: Sequence[Mapping], tests: Mapping[str, Sequence[Mapping]],
             spec: ClassifierSpec = ClassifierSpec(), sweep: SweepConfig = SweepConfig(),
             dp: DPConfig | None = None, backbone: Any = None,
             progress: Callable[[], None] | None = None) -> SweepResult:
    """Sweeps a classifier trained on `train`, selected on `valid`, scored on each of `tests`.

    Records are mappings with "text" and "label". All label sets must be equal. With `dp`, the
    training is DP-Adam (DP-on-real baseline), sweeping `sweep.clip_norms` too, and the result
    carries its privacy report (`SweepResult.privacy`); the WordCNN vocabulary then comes from
    public data unless its vocabulary setting is "train" (a side channel in the report). `backbone`:
    the pretrained LM (`dpsynth.evaluate.backbone.Backbone`) when the caller loaded it already.
    """
    named = {"train": train, "valid": valid, **{f"test '{k}'": v for k, v in tests.items()}}
    for name, recs in named.items():
        check_records(name, recs)
    labels = check_label_sets(named)
    private = dp is not None
    needs_train_text = registry.get(spec.kind).reads_train_texts(spec, private)
    model = registry.make(spec, [r["text"] for r in train] if needs_train_text else None, len(labels.labels),
                          backbone=backbone, private=private)

    def split(recs):
        return Split(model.featurize([r["text"] for r in recs]), labels.encode([str(r["label"]) for r in recs]))

    extra = {"classifier": spec.kind, "vocabulary": model.vocabulary} if private else None
    return run_sweep(Trainer(model), split(train), split(valid), {k: split(v) for k, v in tests.items()}, sweep, dp,
                     progress, report_extra=extra, max_tokens=spec.input_len)


def privacy_summary(report: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a DP-on-real privacy report that go into result tables (metrics.json)."""
    return {"epsilon_spent": dict(report["epsilon"]), "delta": report["delta"], "accountant": report["accountant"],
            "target_epsilon": report["target_epsilon"], "sweep_accounting": report["sweep_accounting"],
            "trials_accounted": sum(1 for e in report["ledger"]["entries"] if e["mechanism"] == "dpsgd"),
            "noise_multiplier": report["training"]["noise_multiplier"], "steps": report["training"]["steps"],
            "vocabulary": (report.get("vocabulary") or {}).get("source"),
            "side_channels": [dict(c) for c in report["side_channels"]]}


# The WordCNN sizes of `ClassifyConfig.cnn`: the paper's, or a small one for CPU runs.
CNN_SIZES = ("paper", "small")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClassifyConfig:
    """The settings of `classify_files`, one per `dpsynth classify` flag (`dpsynth.binding`).

    Attributes:
        classifier: a registered classifier (`registry.names()`: "wordcnn", "backbone").
        model: pretrained LM directory (`ClassifierSpec.model_dir`): the backbone, or the DP
            WordCNN's tokenizer vocabulary.
        cnn: the WordCNN's sizes, one of `CNN_SIZES`.
        learning_rates, weight_decays: the sweep's grid; None = `SMALL_LR_GRID` / `SMALL_WD_GRID`.
        repeats: trials per grid point.
        max_epochs: epochs per trial (early stopping on the valid set).
        epsilon: DP-Adam at this epsilon (DP-on-real); None = non-private.
        delta: None = 1/|train| (`DPConfig.delta`).
        clip_norms: the DP sweep's clipping norms.
        expected_batch_size: DP Poisson batch (capped at |train|).
        dp_epochs: DP training epochs.
        accountant: "rdp" or "pld".
        sweep_accounting: "composed" (all trials meet epsilon) or "selected-only".
        seed: fixed DP seed (tests only); None = a secret seed.
        select_epsilon: DP: choose the setting with DP on --valid at this epsilon (`DPConfig.select_epsilon`).
        valid_split: DP: how --valid was split from D ("files", "hash" or "positional").
        classifier_options: {family: {setting: value}}: the families' own settings
            (`registry.ClassifierKind.settings`; flags `--<family>-<setting>`, e.g. --wordcnn-vocabulary,
            --backbone-pooling); the chosen classifier's are used.
    """

    classifier: str = "wordcnn"
    model: str | None = None
    cnn: str = "paper"
    learning_rates: tuple[float, ...] | None = None
    weight_decays: tuple[float, ...] | None = None
    repeats: int = 3
    max_epochs: int = 10
    epsilon: float | None = None
    delta: float | None = None
    clip_norms: tuple[float, ...] = (0.5, 1.0)
    expected_batch_size: int = 64
    dp_epochs: float = 5.0
    accountant: str = "rdp"
    sweep_accounting: str = "composed"
    seed: int | None = None
    select_epsilon: float | None = None
    valid_split: str = "files"
    classifier_options: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)


def classify_files(train: str, valid: str, test: str, config: ClassifyConfig = ClassifyConfig(), *,
                   out: str | None = None, privacy_dir: str | None = None, max_dead_letters=0,
                   encoding: str | None = None) -> SweepResult:
    """`classify` on files (JSONL/CSV/Parquet with text,label); writes the trials to `out` as JSON.

    `out` holds the trials, the selected setting, `test_mean` / `test_std` (accuracy) and
    `test_scores_mean` / `test_scores_std` ({test name: {"accuracy", "balanced_accuracy",
    "macro_f1"}}, over the selected setting's repeats).

    With `config.epsilon` (DP-on-real) the privacy report (`privacy_report.json` / `.md`) is
    written to `privacy_dir` (default: the directory of `out`) and its summary goes into `out`;
    `config.seed` (fixed DP seed, tests only) is never written. `max_dead_letters`: rejected records tolerated
    per file (`corpora.read_real`; default none); `encoding`: the files' (default UTF-8).
    """
    import json as json_lib

    from dpsynth.dp import report as report_lib
    from dpsynth.evaluate import corpora

    recs = {name: corpora.read_real(path, name, max_dead_letters=max_dead_letters, encoding=encoding)
            for name, path in (("train", train), ("valid", valid), ("test", test))}
    c = config
    small = classifiers.WordCNNConfig(vocab_words=10_000, embed_dim=64, filters=64, hidden=64, max_len=128)
    spec = ClassifierSpec(kind=c.classifier, model_dir=c.model, wordcnn=small if c.cnn == "small" else classifiers.WordCNNConfig(),
                          options=c.classifier_options.get(c.classifier, {}))
    sweep = SweepConfig(learning_rates=tuple(c.learning_rates or SMALL_LR_GRID),
                        weight_decays=tuple(c.weight_decays or SMALL_WD_GRID), clip_norms=tuple(c.clip_norms),
                        repeats=c.repeats, train=TrainConfig(max_epochs=c.max_epochs))
    dp = None
    if c.epsilon is not None:
        dp = DPConfig.for_dataset(len(recs["train"]), epsilon=c.epsilon, expected_batch_size=c.expected_batch_size,
                                  microbatch_size=16, delta=c.delta, epochs=c.dp_epochs, accountant=c.accountant,
                                  sweep_accounting=c.sweep_accounting, seed=c.seed, select_epsilon=c.select_epsilon,
                                  valid_split=c.valid_split)
    result = classify(recs["train"], recs["valid"], {"real_test": recs["test"]}, spec, sweep, dp)
    privacy = None
    if result.privacy is not None:
        directory = privacy_dir or (os.path.dirname(os.path.abspath(out)) if out else None)
        privacy = privacy_summary(result.privacy)
        if directory:
            json_path, _ = report_lib.write_report(directory, result.privacy)
            privacy["report"] = json_path
    if out:
        with fileio.open_atomic(out) as f:
            json_lib.dump({"selected": result.selected, "valid_mean": result.valid_mean, "test_mean": result.test_mean,
                           "test_std": result.test_std, "trials": result.trials,
                           "dp": dp.public() if dp else None, "privacy": privacy,
                           "test_scores_mean": result.score_mean, "test_scores_std": result.score_std}, f, indent=1)
    return result
