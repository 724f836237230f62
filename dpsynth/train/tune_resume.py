"""Resuming a `dp_tune` run: its private state directory, and what a checkpoint must agree on.

The private state directory (`default_state_dir`: the sibling `<out>.private/`; `resolve_state_dir`),
the checkpoints' format tag, the accounted settings a checkpoint records (`accounted_settings`: the
privacy plan, clipping norm, mode and contribution bound), the resume check against them
(`resume_differences`, before any compute), the fingerprint of everything else a resume must keep
(`run_fingerprint`; `fingerprint_mismatch` names what changed) and the one read of the latest
checkpoint's metadata (`read_resume_meta`).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from dpsynth.dp.mechanisms.run import strategy_differences
from dpsynth.dp.plan import PrivacyPlan
from dpsynth.owner_only import check_outside
from dpsynth.train.tune_config import TuneConfig, TuneError

CHECKPOINT_FORMAT = "dpsynth.dp_tune_checkpoint"
STATE_SUFFIX = ".private"  # default private state dir: a sibling `<out>.private/` of the model dir


# Accounted settings a resume must share with its checkpoint besides the privacy plan's own fields
# (`dpsynth.dp.plan.PLAN_FIELDS`: dataset size, expected batch, steps, sigma, epsilon, delta, accountant, cap,
# compositions): the clipping norm (the sensitivity) and the mode (the trainable subset).
RESUME_FIELDS = ("clip_norm", "mode", "max_examples_per_user")


def accounted_settings(config: TuneConfig, plan: PrivacyPlan) -> dict[str, Any]:
    """What a checkpoint records of the privacy plan it was trained under (compared on resume)."""
    return {"privacy_plan": plan.to_json(), "clip_norm": float(config.clip_norm), "mode": config.mode,
            "max_examples_per_user": config.max_examples_per_user if plan.privacy_unit == "user" else None}


# Settings a resume may change: how long the run goes on and how often it saves.
RESUMABLE = ("steps", "epochs", "checkpoint_every")


def run_settings(config: TuneConfig) -> dict[str, Any]:
    """The settings a checkpoint is fingerprinted on (and records, to name a changed one)."""
    return {k: v for k, v in config.to_json().items() if k not in RESUMABLE}


def run_fingerprint(config: TuneConfig, data_fingerprint: str, tokenizer_sha256: str) -> str:
    """SHA-256 of the run's settings, training rows and tokenizer: a resume must match all three."""
    settings = json.dumps(run_settings(config), sort_keys=True)
    return hashlib.sha256(settings.encode() + data_fingerprint.encode() + tokenizer_sha256.encode()).hexdigest()


def fingerprint_mismatch(meta: dict[str, Any], config: TuneConfig) -> str:
    """Why a checkpoint's fingerprint differs from this run's, in words: the settings that changed
    (flags), or the data or tokenizer when no setting did."""
    if "settings" not in meta:  # written before checkpoints recorded their settings
        if config.recipe == "auto" and config.label_contrast != 0:
            return ("another configuration or data (if it was begun by a dpsynth before the label contrast was the "
                    "automatic recipe's default, resume it with --label-contrast 0)")
        return "another configuration or data"
    saved, mine = meta["settings"], run_settings(config)
    changed = sorted(k for k in set(saved) | set(mine) if saved.get(k) != mine.get(k))
    if not changed:
        return "another configuration or data (the same settings: the training data or the tokenizer differ)"
    return "another configuration or data (differs in " + ", ".join("--" + k.replace("_", "-") for k in changed) + ")"


def resume_differences(saved: dict[str, Any], config: TuneConfig, plan: PrivacyPlan) -> list[tuple[str, Any, Any]]:
    """(field, checkpoint's value, this run's value) for every accounted setting that differs.

    Raises:
        TuneError: the checkpoint records no privacy plan (it cannot be checked).
    """
    if "privacy_plan" not in saved:
        raise TuneError("the checkpoint records no privacy plan (made by an older dpsynth), so a resume cannot be "
                        "checked against it; start a fresh run")
    diffs = PrivacyPlan.from_json(saved["privacy_plan"]).differences(plan)
    mine = accounted_settings(config, plan)
    diffs += [(name, saved.get(name), mine[name]) for name in RESUME_FIELDS if saved.get(name) != mine[name]]
    if not diffs:  # the same plan: it must also run the checkpoint's BandMF strategy (`dpsynth.dp.mechanisms.run`)
        diffs += strategy_differences(saved.get("ledger", {}).get("entries", []), plan)
    return diffs


def default_state_dir(out_dir: str) -> str:
    """The default private state directory of a model dir: the sibling `<out>.private/`."""
    return os.path.abspath(out_dir).rstrip(os.sep) + STATE_SUFFIX


def resolve_state_dir(out_dir: str, state_dir: str | None) -> str:
    """The run's private state directory (`state_dir`, default `<out>.private/`); TuneError if inside `out_dir`."""
    state_dir = os.path.abspath(state_dir or default_state_dir(out_dir))
    try:
        check_outside(state_dir, os.path.abspath(out_dir), "the private state directory")
    except ValueError as e:
        raise TuneError(str(e)) from e
    return state_dir


def read_resume_meta(ckpt_dir: str) -> dict:
    """The latest checkpoint's metadata; CheckpointError when there is none."""
    from dpsynth.models.directory import CheckpointError
    from dpsynth.train.checkpoint import TrainCheckpointer

    if not os.path.isdir(ckpt_dir):
        raise CheckpointError(f"{ckpt_dir}: no checkpoint to resume from (drop --resume to start fresh, or pass the "
                              "--state-dir of the run)")
    probe = TrainCheckpointer(ckpt_dir, max_to_keep=2)
    try:
        if probe.latest_step() is None:
            raise CheckpointError(f"{ckpt_dir}: no checkpoint to resume from (drop --resume to start fresh)")
        return probe.read_meta()
    finally:
        probe.close()
