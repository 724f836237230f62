"""What a DP-tuning run releases about itself, and what it keeps private.

The privacy report of a run (`RunReporter`, written with every checkpoint and at the end,
format: `dpsynth.dp.report`), its declared non-DP side channels (`side_channels`), and the
names of the owner-only files of the private state directory whose contents are never
released (`LOSSES_FILE`, `COUNTS_FILE`, with the notices written into them).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from dpsynth.dp import report as report_lib
from dpsynth.dp import selection as selection_lib
from dpsynth.dp.ledger import PrivacyLedger
from dpsynth.dp.plan import PrivacyPlan
from dpsynth.train.prompts import manifest_fields

LOSSES_FILE = "losses.json"  # non-DP train/valid losses, in the private state dir
COUNTS_FILE = "counts.json"  # exact non-DP counts (truncated examples, rows dropped per user), in the private state dir
NON_DP_COUNTS_NOTICE = ("exact counts over D_train/D_valid computed without noise: NOT differentially private; for "
                        "the data owner only, never published with the model")
NON_DP_LOSSES_NOTICE = ("losses on D_train/D_valid computed without noise: NOT differentially private; for the data "
                        "owner only, never published with the model")

PRIVATE_STATE_CHANNEL = {
    "name": "private state", "detail": "checkpoints (optimizer state and the secret sampling/noise seed), the non-DP "
    "train/valid losses and any sweep trials are kept in an owner-only state directory outside the model directory "
    "(default `<model dir>.private/`, mode 0700); nothing in it is released or covered by this report"}


def selection_channel(selection: dict) -> dict:
    """The side channel of a sweep's validation-based selection (`dpsynth.dp.selection`)."""
    return selection_lib.selection_channel(selection["accounting"], sweep=selection_lib.DP_TUNE,
                                           trials=selection["trials"], grid=selection["grid"])


def side_channels(config, labels_from_data: bool, selection: dict | None, auto_recipe: bool = False,
                  dp_length: bool = False, imported: bool = False) -> list[dict]:
    """The declared non-DP side channels of a run with `config` (a `tune_config.TuneConfig`).

    `imported`: the base model was imported (`imported_base_channel` says so): the statement that
    the base was pretrained on a corpus deduplicated against D (`PUBLIC_OVERLAP_CHANNEL`) would be
    false, so it is left out."""
    channels = [dict(report_lib.LABEL_SET_CHANNEL)]
    if labels_from_data:
        channels[0] = {"name": "label set", "detail": "the label names were read from D_train without DP (their "
                       "per-label counts are not released); pass the label set explicitly to avoid this"}
    channels += [] if imported else [dict(report_lib.PUBLIC_OVERLAP_CHANNEL)]
    channels.append(dict(report_lib.COMPOSITION_CHANNEL))
    channels.append({"name": "dataset sizes", "detail": "|D_train| sets q and delta = 1/|D_train| by default; the "
                     "size of D_train is recorded without DP" + ("; the automatic recipe chose the batch size, steps and "
                     "learning rate from it (and from " + ("the example length chosen with DP, in the ledger, and " if dp_length else "")
                     + "public settings only)" if auto_recipe else "")})
    channels.append({"name": "truncation count", "detail": f"training examples longer than {config.max_tokens} "
                     "tokens were truncated to it; how many is not released (an exact count would reveal whether one "
                     f"long example is in D_train): it stays in the private state ({COUNTS_FILE})"})
    channels.append(dict(PRIVATE_STATE_CHANNEL))
    if selection:
        channels.append(selection_channel(selection))
    if config.seed is not None and config.private:
        channels.append({"name": "fixed seed", "detail": "the run used a user-supplied seed (its value is not "
                         "recorded here) for its Poisson sampling and noise: anyone who knows it can regenerate the "
                         "noise, which voids the guarantee. Use the default (a secret seed from the OS entropy pool) "
                         "for any release"})
    return channels


PROBE_FILE = "contamination_probe.json"  # the contamination probe's verdict (NOT DP), in the private state dir
PROBE_RUN = ("a contamination probe was run on this base model before tuning (`dpsynth probe`); its verdict and "
             f"figures are statistics of D computed without DP, so they are not published here: they are kept in the "
             f"owner-only private state ({PROBE_FILE})")
PROBE_NOT_RUN = ("no contamination probe was run (`dpsynth probe`): whether the base model already knows D is "
                 "unknown")


def imported_base_channel(source: dict, probe_run: bool = False) -> dict:
    """The side channel of a third-party pretrained base model (its pretraining data is unchecked).

    `probe_run`: whether `dp-tune --contamination-probe` recorded a probe of this base. Only that
    fact is published: the probe's verdict and figures read D without DP (`dpsynth.evaluate.contamination`)."""
    return {"name": "pretrained base model", "detail":
            f"the base model was imported ({source.get('family')} from {source.get('path')}, config SHA-256 "
            f"{source.get('config_sha256')}). DP covers the fine-tuning data; the base model's pretraining data was not "
            "deduplicated against D (NOT checked against the sensitive data), so text of D that was in that pretraining "
            "corpus can be reproduced without any bound (dpsynth's own pretraining deduplicates against D first); "
            + (PROBE_RUN if probe_run else PROBE_NOT_RUN)}


def check_contamination_probe(probe: dict, base_dir: str) -> None:
    """Raises `TuneError` unless `probe` (a `dpsynth probe` report, `dpsynth.evaluate.contamination.read_probe`)
    probed the model in `base_dir` (the SHA-256 of its manifest)."""
    from dpsynth import fileio
    from dpsynth.train.tune_config import TuneError

    sha = fileio.sha256_file(os.path.join(base_dir, "manifest.json"))
    if probe.get("model_manifest_sha256") != sha:
        raise TuneError(f"--contamination-probe: the probe is of another model ({probe.get('model_dir')}), not of the "
                        f"base {base_dir} (its manifest differs); run `dpsynth probe --model {base_dir}`")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunReporter:
    """Builds a run's privacy report from its ledger so far (`reporter(ledger)`).

    Attributes:
        config: the run's `tune_config.TuneConfig` (recipe resolved); plan: its `PrivacyPlan`.
        recipe: the automatic recipe (`dpsynth.train.recipe.Recipe`) or None.
        labels, labels_from_data: the label set, and whether it was read from D_train.
        selection: the sweep's selection when this run is its winner, else None.
        base_dir, base_manifest_sha256, base_source: the base model (an imported one's provenance).
        embedding_clipping: how an imported base's input table is clipped ("sparse ..."/"dense").
        contamination_sha256: the pretraining corpus's contamination report.
        probe_run: whether a contamination probe of the base was recorded (`dp-tune --contamination-probe`;
            only this fact is published, `imported_base_channel`).
        mech: the run's `dpsynth.dp.mechanisms.run.RunMechanism` (None: non-private).
        sigma: the noise multiplier of the strategy that adds the noise.
    """

    config: Any
    plan: PrivacyPlan
    recipe: Any
    labels: list[str]
    labels_from_data: bool
    selection: dict | None
    base_dir: str
    base_manifest_sha256: str
    base_source: dict | None
    embedding_clipping: str
    contamination_sha256: str | None
    mech: Any
    sigma: float
    probe_run: bool = False

    def __call__(self, ledger: PrivacyLedger) -> dict:
        config, plan, recipe, mech = self.config, self.plan, self.recipe, self.mech
        training = {
            "mode": config.mode, "noise_multiplier": self.sigma, "clip_norm": config.clip_norm,
            "sampling_probability": plan.sampling_probability, "expected_batch_size": plan.expected_batch_size,
            "dataset_size": plan.dataset_size, "steps": ledger.steps_recorded, "planned_steps": plan.steps,
            "compositions": plan.compositions,
            "epochs": plan.epochs_of(ledger.steps_recorded), "optimizer": config.optimizer,
            "learning_rate": config.learning_rate, "max_batch_size": config.max_batch_size,
            "microbatch_size": config.microbatch_size, "sampling": report_lib.SAMPLING_METHOD,
            "loss": ("Prefix-LM (label prompt not trained on), per-example mean over target tokens"
                     if not config.full_lm else "full LM (label prompt trained on; ablation)")
                    + (f" + {config.contrast:g} x label contrast (-log p(label | text) under the model's "
                       + ("own likelihoods of the text after its label's prompt and one other label's, drawn per step "
                          "(sampled form)" if config.label_contrast_form == "sampled" else
                          "own likelihoods of the text after every label prompt") + ")" if config.contrast else ""),
            "gradient": "per-example clipping + Gaussian noise / expected batch" if config.private
                        else "NON-PRIVATE mean gradient (epsilon = inf baseline)",
            **manifest_fields(config.template, self.labels, config.label_dropout),
            **({"recipe": recipe.to_json()} if recipe else {}),
            "base_model": os.path.abspath(self.base_dir), "base_manifest_sha256": self.base_manifest_sha256,
        }
        if plan.reserved:  # the target covers later releases too (`TuneConfig.reserve_selection_epsilon`,
            # `TuneConfig.reserve_label_noise_multiplier`)
            if config.reserve_selection_epsilon:
                training["reserve_selection_epsilon"] = config.reserve_selection_epsilon
            if config.reserve_label_noise_multiplier:
                training["reserve_label_noise_multiplier"] = config.reserve_label_noise_multiplier
            training["reserved"] = [dict(e) for e in plan.reserved]
        channels = side_channels(config, self.labels_from_data, self.selection, recipe is not None,
                                 dp_length=bool(recipe is not None and recipe.example_length),
                                 imported=bool(self.base_source))
        if self.base_source:
            training["base_source"] = {k: v for k, v in self.base_source.items() if not k.startswith("hf_")}
            training["embedding_clipping"] = self.embedding_clipping
            training["contamination_probe_run"] = self.probe_run
            channels.append(imported_base_channel(self.base_source, self.probe_run))
        if mech is not None:
            training.update(mech.training_fields())
            channels += mech.side_channels()
        return report_lib.build_report(
            ledger, training=training, contamination_sha256=self.contamination_sha256,
            side_channels=channels,
            max_tokens_per_example=config.max_tokens,
            extra={"selection": self.selection} if self.selection else None,
            **(mech.report_kwargs() if mech else {}))
