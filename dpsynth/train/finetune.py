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
checkpoint's is refused before any training compute (`resume_differences`). The privacy report
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
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import logging
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dpsynth import fileio
from dpsynth.dp import accounting, report as report_lib, sampling, seeds
from dpsynth.dp.ledger import BudgetExceeded, PrivacyLedger
from dpsynth.dp import mechanisms
from dpsynth.dp.mechanisms.run import build_run_mechanism, count_users, recorded_strategies, strategy_differences
from dpsynth.dp.users import UserColumnError, gather_users
from dpsynth.dp.plan import PrivacyPlan
from dpsynth.dp.plan import plan_privacy as _plan_privacy
from dpsynth.errors import DpsynthError
from dpsynth.owner_only import check_outside, make_private_dir, write_private_json
from dpsynth.train import recipe as recipe_lib
from dpsynth.train import release, tune_report
from dpsynth.train.prompts import (DEFAULT_MAX_TOKENS, DEFAULT_TEMPLATE, EncodedExamples, ExampleConfig, encode_examples,
                                   encode_null_examples, example_lengths, label_dropout_rows,
                                   manifest_fields, prompt_ids)

logger = logging.getLogger("dpsynth.train.finetune")

MODES = recipe_lib.MODES
TRAINABLE = {"full": ("params",), "prompt": ("prompt",), "lora": ("lora",)}
OPTIMIZERS = ("adam", "adafactor")
PROMPT_INITS = ("uniform", "vocab")
LENGTH_BUCKET = 16  # rows are padded to a multiple of this (fewer distinct compiled shapes)
CHECKPOINT_FORMAT = "dpsynth.dp_tune_checkpoint"
STATE_SUFFIX = ".private"  # default private state dir: a sibling `<out>.private/` of the model dir



class TuneError(DpsynthError, ValueError):
    """Bad tuning input or configuration (raised before any compute)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TuneConfig:
    """Configuration of one DP tuning run.

    Attributes:
        mode: "full", "prompt" or "lora".
        epsilon: target epsilon (math.inf: non-private baseline).
        delta: target delta; None = 1 / |train|.
        accountant: accountant the budget is calibrated and enforced with ("rdp" as in the paper, or "pld").
        batch_size: expected (Poisson) logical batch size B = q N (paper: 1024).
        microbatch_size: examples per compiled microbatch (padded; memory knob), or "auto": the
            largest whose compiled step fits the device memory less a headroom, found before
            training (`dpsynth.train.resources.largest_microbatch`; example-level runs).
        steps: number of DP-SGD steps; None = ceil(epochs / q).
        epochs: expected passes over the data (used when steps is None).
        learning_rate: fixed learning rate.
        clip_norm: per-example L2 clipping norm C.
        optimizer: "adam" (default) or "adafactor".
        lora_rank, lora_alpha, lora_targets: LoRA settings (mode "lora").
        prompt_length, prompt_init: soft-prompt settings (mode "prompt").
        template: label prompt ("{label}" is replaced by the label name).
        max_tokens: maximum tokens per example (BOS + prompt + text + EOS); longer are truncated.
            "auto" (with recipe "auto"): a DP quantile of D_train's lengths, chosen at a small share
            of epsilon that the ledger composes with the tuning (`dpsynth.train.recipe.choose_example_length`).
        full_lm: also train on the label prompt (ablation; default Prefix-LM).
        label_dropout: p, the probability with which each sampled example trains under the null
            prompt instead of its label prompt at a step (`dpsynth.train.prompts.label_dropout_rows`),
            so the model also learns the unconditional text distribution that label-guided
            sampling can contrast with (`--guidance-contrast null`). 0 = off. Changes no DP property.
        z_loss: z-loss coefficient of the LM loss (0 by default for tuning).
        max_batch_size: optional cap on the Poisson batch (truncation; PLD accounting only).
        seed: seed of the sampling stream and the noise keys. None (default) draws a secret
            64-bit seed from the OS entropy pool (`dpsynth.dp.seeds`), kept only in the
            private checkpoint; an explicit seed makes the noise reproducible by whoever knows
            it (tests, debugging) and is flagged in the privacy report.
        checkpoint_every: steps between checkpoints (and privacy-report refreshes).
        privacy_unit: "example" (default) or "user" (records need a "user" field; delta then
            defaults to 1 / |users| and the batch size counts users).
        max_examples_per_user: K, the contribution bound (user level; required there).
        mechanism: "dpsgd" (default) or "bandmf" (banded correlated noise, cyclic Poisson).
        bands: BandMF bands b (required with "bandmf").
        recipe: "manual" (default: batch_size, steps/epochs and learning_rate as given) or
            "auto": `dpsynth.train.recipe` chooses them from |D_train|, the mode, max_tokens and
            `token_budget` (the given values are ignored; the choice and its reasons go into the
            privacy report).
        token_budget: example-tokens an automatic recipe may process (None: the recipe's default).
        time_budget: seconds of DP-SGD steps an automatic recipe may spend instead (example level):
            the token budget is the run's compiled step's measured speed on this machine times it
            (`dpsynth.train.recipe.TimeBudget`; recorded in the checkpoint, so a resume keeps it).
        allow_large_delta: accept a delta above 1/N (N = |D_train|, or users at user level), which
            protects nobody (`dpsynth.dp.accounting.weak_delta`); refused by default, and the privacy
            report's headline then says the delta is weak.
        clipping: how per-example clipping is computed (`dpsynth.dp.clipping.METHODS`): "vmap"
            (default: per-example gradients) or "ghost" (full mode only, example-level DP-SGD or
            BandMF: the same clipped sum without per-example gradient copies, `dpsynth.dp.ghost`).
            The same mechanism and accounting either way.
    """

    mode: str = "lora"
    epsilon: float = 3.0
    delta: float | None = None
    accountant: str = accounting.DEFAULT_ACCOUNTANT
    batch_size: float = 1024
    microbatch_size: int | str = 32
    steps: int | None = None
    epochs: float = 10.0
    learning_rate: float = 3e-3
    clip_norm: float = 1.0
    optimizer: str = "adam"
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_targets: str = "all"
    prompt_length: int = 20
    prompt_init: str = "uniform"
    template: str = DEFAULT_TEMPLATE
    max_tokens: int | str = DEFAULT_MAX_TOKENS
    full_lm: bool = False
    label_dropout: float = 0.0
    z_loss: float = 0.0
    max_batch_size: int | None = None
    seed: int | None = None
    checkpoint_every: int = 50
    privacy_unit: str = "example"
    max_examples_per_user: int | None = None
    mechanism: str = mechanisms.DEFAULT
    bands: int | None = None
    recipe: str = "manual"
    token_budget: float | None = None
    time_budget: float | None = None
    allow_large_delta: bool = False
    clipping: str = "vmap"

    def __post_init__(self):
        if self.mode not in MODES:
            raise TuneError(f"mode must be one of {MODES}, got {self.mode!r}")
        if not (math.isinf(self.epsilon) and self.epsilon > 0):
            try:
                accounting.check_epsilon(self.epsilon)
            except accounting.PrivacyConfigError as e:
                raise TuneError(str(e)) from e
        if self.delta is not None:
            try:
                accounting.check_delta(self.delta)
            except accounting.PrivacyConfigError as e:
                raise TuneError(str(e)) from e
        if self.accountant not in accounting.ACCOUNTANTS:
            raise TuneError(f"accountant must be one of {accounting.ACCOUNTANTS}, got {self.accountant!r}")
        if self.max_batch_size is not None and self.accountant != "pld":
            raise TuneError("a batch-size cap (truncated Poisson sampling) is only analysed by the PLD accountant: "
                            "pass --accountant pld or drop --max-batch-size")
        if not self.batch_size > 0:
            raise TuneError(f"batch_size must be > 0, got {self.batch_size}")
        # One spelling per value (24 and 24.0 are the same plan; the resume fingerprint must agree).
        for name in ("epsilon", "batch_size", "epochs", "learning_rate", "clip_norm", "lora_alpha", "z_loss"):
            object.__setattr__(self, name, float(getattr(self, name)))
        if self.microbatch_size == "auto":
            if self.privacy_unit == "user":
                raise TuneError("microbatch_size 'auto' supports example-level runs; give --microbatch-size at user level")
        elif not isinstance(self.microbatch_size, int) or self.microbatch_size < 1:
            raise TuneError(f"microbatch_size must be >= 1, got {self.microbatch_size}")
        if self.steps is not None and self.steps < 1:
            raise TuneError(f"steps must be >= 1, got {self.steps}")
        if self.steps is None and not self.epochs > 0:
            raise TuneError(f"epochs must be > 0, got {self.epochs}")
        if not self.learning_rate > 0 or not self.clip_norm > 0:
            raise TuneError("learning_rate and clip_norm must be > 0")
        if self.optimizer not in OPTIMIZERS:
            raise TuneError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.mode == "lora" and self.lora_rank < 1:
            raise TuneError(f"lora_rank must be >= 1 in lora mode, got {self.lora_rank}")
        if self.mode == "prompt" and self.prompt_length < 1:
            raise TuneError(f"prompt_length must be >= 1 in prompt mode, got {self.prompt_length}")
        if self.prompt_init not in PROMPT_INITS:
            raise TuneError(f"prompt_init must be one of {PROMPT_INITS}, got {self.prompt_init!r}")
        if self.checkpoint_every < 1:
            raise TuneError("checkpoint_every must be >= 1")
        if self.privacy_unit not in ("example", "user"):
            raise TuneError(f"privacy_unit must be 'example' or 'user', got {self.privacy_unit!r}")
        if self.privacy_unit == "user" and (self.max_examples_per_user is None or self.max_examples_per_user < 1):
            raise TuneError("privacy_unit 'user' needs max_examples_per_user >= 1 (--max-examples-per-user K)")
        if self.mechanism not in mechanisms.names():
            raise TuneError(f"mechanism must be one of {mechanisms.names()}, got {self.mechanism!r}")
        problem = mechanisms.get(self.mechanism).check_settings(bands=self.bands, max_batch_size=self.max_batch_size)
        if problem:
            setting, message = problem
            raise TuneError(f"--{setting.replace('_', '-')}: {message}")
        if self.recipe not in recipe_lib.RECIPES:
            raise TuneError(f"recipe must be one of {recipe_lib.RECIPES}, got {self.recipe!r}")
        if self.max_tokens == recipe_lib.AUTO:
            if self.recipe != "auto":
                raise TuneError("max_tokens 'auto' is chosen by the automatic recipe: pass recipe 'auto' (--recipe auto)")
            if self.privacy_unit != "example":
                raise TuneError("max_tokens 'auto' supports example-level runs (one user may move several counts of "
                                "the length quantile); give --max-tokens N at user level")
            if self.private and self.accountant != "rdp":
                raise TuneError("max_tokens 'auto' is a pure-DP selection that only the RDP accountant composes: "
                                "pass --accountant rdp, or give --max-tokens N")
        else:
            ExampleConfig(template=self.template, max_tokens=self.max_tokens, full_lm=self.full_lm)
        if self.token_budget is not None and not self.token_budget > 0:
            raise TuneError(f"token_budget must be > 0, got {self.token_budget}")
        if self.token_budget is not None and self.recipe != "auto":
            raise TuneError("token_budget is a setting of the automatic recipe: pass recipe 'auto' (--recipe auto)")
        if self.time_budget is not None:
            if not self.time_budget > 0:
                raise TuneError(f"time_budget must be > 0 seconds, got {self.time_budget}")
            if self.recipe != "auto":
                raise TuneError("time_budget is a setting of the automatic recipe: pass recipe 'auto' (--recipe auto)")
            if self.token_budget is not None:
                raise TuneError("give token_budget or time_budget, not both")
            if self.privacy_unit != "example":
                raise TuneError("time_budget supports example-level runs; give --token-budget at user level")
            object.__setattr__(self, "time_budget", float(self.time_budget))
        if not 0.0 <= self.label_dropout < 1.0:
            raise TuneError(f"label_dropout must be in [0, 1), got {self.label_dropout}")
        object.__setattr__(self, "label_dropout", float(self.label_dropout))
        from dpsynth.dp.clipping import METHODS as clipping_methods

        if self.clipping not in clipping_methods:
            raise TuneError(f"clipping must be one of {clipping_methods}, got {self.clipping!r}")
        if self.clipping != "vmap" and (self.mode != "full" or self.privacy_unit != "example"):
            raise TuneError(f"--clipping {self.clipping} is for --mode full at example level (LoRA and prompt "
                            "tuning keep the vmapped clipping)")

    @property
    def private(self) -> bool:
        return not math.isinf(self.epsilon)

    def example_config(self) -> ExampleConfig:
        if self.max_tokens == recipe_lib.AUTO:
            raise TuneError("max_tokens 'auto' is resolved from D_train before examples are encoded "
                            "(`resolve_example_length`)")
        return ExampleConfig(template=self.template, max_tokens=self.max_tokens, full_lm=self.full_lm)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["epsilon"] = "inf" if math.isinf(self.epsilon) else self.epsilon
        for name, off in (("label_dropout", 0.0), ("recipe", "manual"), ("token_budget", None), ("time_budget", None),
                          ("allow_large_delta", False), ("clipping", "vmap")):
            if d[name] == off:  # off: the fingerprint of runs made before it existed holds
                del d[name]
        return d


def resolve_recipe(config: TuneConfig, num_units: int) -> tuple[TuneConfig, recipe_lib.Recipe | None]:
    """`config` with an automatic recipe's batch size, steps and learning rate filled in (and the
    recipe), or `config` unchanged (and None) for a manual one. `num_units`: N of the plan
    (examples, or users at user level)."""
    if config.recipe != "auto":
        return config, None
    if config.max_tokens == recipe_lib.AUTO:
        raise TuneError("max_tokens 'auto' is chosen from D_train's token lengths: resolve it first "
                        "(`resolve_example_length`, done by dp_tune), or give max_tokens")
    try:
        rec = recipe_lib.auto_recipe(dataset_size=num_units, mode=config.mode, max_tokens=config.max_tokens,
                                     token_budget=config.token_budget)
    except recipe_lib.RecipeError as e:
        raise TuneError(str(e)) from e
    return dataclasses.replace(config, batch_size=rec.batch_size, steps=rec.steps,
                               learning_rate=rec.learning_rate), rec


def plan_run(config: TuneConfig, num_train: int, *, compositions: int = 1, num_users: int | None = None,
             spent: tuple[dict, ...] = ()) -> PrivacyPlan:
    """The run's privacy plan (`dpsynth.dp.plan.plan_privacy`); raises TuneError if unreachable.

    An automatic recipe is resolved first (`resolve_recipe`), so the plan is the run's.

    `compositions = k`: one of k sweep trials, calibrated so that all k together meet the target.
    At user level `num_users` (the distinct users of D_train) is the plan's dataset size. A
    non-private run (epsilon inf) is planned at example level with DP-SGD: it has no unit.
    `spent`: ledger entries spent on D_train before the run (the DP example length) that the
    target covers too.
    """
    if num_train < 1:
        raise TuneError("empty training set")
    user = config.private and config.privacy_unit == "user"
    if user and not num_users:
        raise TuneError("a user-level plan needs the number of users of D_train")
    config, _ = resolve_recipe(config, num_users if user else num_train)
    try:
        return _plan_privacy(dataset_size=num_users if user else num_train, expected_batch_size=config.batch_size,
                             steps=config.steps, epochs=config.epochs, epsilon=config.epsilon, delta=config.delta,
                             accountant=config.accountant, max_batch_size=config.max_batch_size,
                             compositions=compositions,
                             mechanism=config.mechanism if config.private else mechanisms.DEFAULT,
                             bands=config.bands if config.private else None,
                             privacy_unit="user" if user else "example",
                             allow_large_delta=config.allow_large_delta, spent=spent if config.private else ())
    except accounting.PrivacyConfigError as e:
        raise TuneError(str(e)) from e


# Accounted settings a resume must share with its checkpoint besides the privacy plan's own fields
# (`dpsynth.dp.plan.PLAN_FIELDS`: dataset size, expected batch, steps, sigma, epsilon, delta, accountant, cap,
# compositions): the clipping norm (the sensitivity) and the mode (the trainable subset).
RESUME_FIELDS = ("clip_norm", "mode", "max_examples_per_user")


def accounted_settings(config: TuneConfig, plan: PrivacyPlan) -> dict[str, Any]:
    """What a checkpoint records of the privacy plan it was trained under (compared on resume)."""
    return {"privacy_plan": plan.to_json(), "clip_norm": float(config.clip_norm), "mode": config.mode,
            "max_examples_per_user": config.max_examples_per_user if plan.privacy_unit == "user" else None}


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


# ============================================================================ model plumbing


def _tuned_model_config(base_config, config: TuneConfig):
    base = base_config.base()
    if config.mode == "lora":
        return base.replace(lora_rank=config.lora_rank, lora_alpha=config.lora_alpha, lora_targets=config.lora_targets)
    if config.mode == "prompt":
        return base.replace(prompt_length=config.prompt_length)
    return base


def init_variables(model_config, base_params: dict, config: TuneConfig) -> dict:
    """Base params from the checkpoint plus freshly initialised adapters of the mode."""
    from dpsynth.models import Transformer

    variables = {"params": base_params}
    if config.mode == "full":
        return variables
    # Adapter initialisation is data-independent and public: a fixed key, separate from the
    # (secret) sampling/noise seed, so runs that differ only in that seed start identically.
    key = jax.random.fold_in(jax.random.PRNGKey(0), 0xADA)
    coll = TRAINABLE[config.mode][0]
    # Only the adapter collection is returned, so XLA drops the base-parameter initialisers.
    init = jax.jit(lambda k: Transformer(model_config).init(k, jnp.zeros((1, 4), jnp.int32))[coll])(key)
    if config.mode == "prompt" and config.prompt_init == "vocab":
        ids = jax.random.randint(jax.random.fold_in(key, 1), (config.prompt_length,), 4, model_config.vocab_size)
        init = {"embedding": jnp.asarray(base_params["embedding"])[ids]}
    variables[coll] = init
    return variables


def make_step_functions(loss_fn, config: TuneConfig, strategy, *, mesh: tuple[int, int] | None = None,
                        fsdp: bool = False):
    """The training core's step functions of a run (`dpsynth.train.core.TrainFunctions`): what `_train`
    steps with and what the resource plan (`dpsynth.train.resources`) compiles on abstract arrays.
    `fsdp`: parameters also split over the mesh's data axis (`dpsynth.models.sharding.FSDP_RULES`)."""
    from dpsynth.models.sharding import FSDP_RULES, LOGICAL_RULES
    from dpsynth.train import core, sharding

    return core.make_train_functions(loss_fn, make_optimizer(config), strategy,
                                     mesh=sharding.make_mesh(*mesh) if mesh is not None else None,
                                     rules=FSDP_RULES if fsdp else LOGICAL_RULES)


def planned_step(base_config, config: TuneConfig, plan: PrivacyPlan, *, mesh: tuple[int, int] | None = None,
                 fsdp: bool = False):
    """(tuned model config, step functions) of a run of `config` under the privacy `plan` on a base
    model of `base_config`, built as `dp_tune` builds them (`_tuned_model_config`, `make_loss_fn`,
    `_build_mechanism`, `make_step_functions`) but without data, weights or a secret seed (the
    example-level strategy does not depend on it): what the resource plan compiles."""
    model_config = _tuned_model_config(base_config, config)
    prep = _Prepared(config=config, recipe=None, length=None, plan=plan, labels=[], labels_from_data=False, train_users=None,
                     state_dir="", ckpt_dir="", resume_meta=None)
    _, strategy = _build_mechanism(prep, model_config, run_seed=0, num_rows=plan.dataset_size, mesh=mesh)
    return model_config, make_step_functions(make_loss_fn(model_config, config), config, strategy, mesh=mesh, fsdp=fsdp)


@dataclasses.dataclass(frozen=True)
class CompiledSteps:
    """A run's step programs compiled on abstract arrays (`compile_steps`)."""

    model_config: Any
    fns: Any  # dpsynth.train.core.TrainFunctions
    state: Any  # the abstract TrainState
    accumulate: Any  # dpsynth.train.resources.ProgramCost of one microbatch
    apply: Any  # ... of the optimizer step (None when not asked for)


def compile_steps(base_config, config: TuneConfig, plan: PrivacyPlan, *, microbatch: int, row_length: int,
                  param_dtype: str = "float32", base_params=None, mesh: tuple[int, int] | None = None,
                  fsdp: bool = False, apply: bool = True) -> CompiledSteps:
    """Compiles the accumulate (one microbatch of `microbatch` rows of `row_length` tokens) and apply
    programs of a run on abstract arrays: `planned_step`'s functions with the state `dp_tune` would
    hold (the base's "params" in `param_dtype`, or shaped like `base_params`, an abstract tree)."""
    from dpsynth.train import lm, resources
    from dpsynth.train import sharding as sharding_lib

    config = dataclasses.replace(config, microbatch_size=microbatch)
    model_config, fns = planned_step(base_config, config, plan, mesh=mesh, fsdp=fsdp)
    trainable, frozen = lm.split_variables(resources.abstract_variables(model_config, param_dtype, base_params),
                                           TRAINABLE[config.mode])
    state = fns.abstract_state(trainable, frozen)
    acc = fns.abstract_accumulator(state)
    batch = resources.abstract_batch(microbatch, row_length,
                                     sharding_lib.batch_sharding(fns.mesh) if fns.mesh is not None else None)
    accumulate = resources.program_cost("accumulate", fns.lower("accumulate", state, acc, batch))
    applied = resources.program_cost("apply", fns.lower("apply", state, acc)) if apply else None
    return CompiledSteps(model_config=model_config, fns=fns, state=state, accumulate=accumulate, apply=applied)


def auto_microbatch(base_config, config: TuneConfig, plan: PrivacyPlan, *, row_length: int,
                    mesh: tuple[int, int] | None, limit_bytes: int, headroom: float, fsdp: bool = False,
                    param_dtype: str = "float32", base_params=None):
    """`resources.largest_microbatch` over the run's compiled steps (the larger of accumulate and
    apply; multiples of the mesh's data axis, at most the expected batch)."""
    from dpsynth.train import resources

    multiple = mesh[0] if mesh is not None else 1
    common = dict(row_length=row_length, mesh=mesh, fsdp=fsdp, param_dtype=param_dtype, base_params=base_params)
    applied = compile_steps(base_config, config, plan, microbatch=multiple, **common).apply.total_bytes

    def peak(m: int) -> int:
        return max(applied, compile_steps(base_config, config, plan, microbatch=m, apply=False,
                                          **common).accumulate.total_bytes)

    maximum = int(math.ceil(plan.expected_batch_size / multiple)) * multiple
    return resources.largest_microbatch(peak, limit_bytes=limit_bytes, headroom=headroom, maximum=maximum,
                                        multiple=multiple)


def make_optimizer(config: TuneConfig) -> optax.GradientTransformation:
    if config.optimizer == "adafactor":
        return optax.adafactor(learning_rate=config.learning_rate)
    return optax.adam(config.learning_rate)


# Full tuning of a model with an untied input embedding (imported Llama, Mistral, large Qwen2)
# clips that table on the exact sparse path of `dpsynth.dp.sparse` (same clipped sum, no
# per-example [vocab, d_model] gradient); a tied table is also the output layer and stays dense.

def embedding_spec(model_config, config: TuneConfig):
    """The sparse-clipping declaration of the input embedding, or None (tied, not full, not private)."""
    from dpsynth.dp import sparse

    if config.mode != "full" or model_config.tie_embeddings or not config.private:
        return None
    return sparse.EmbeddingSpec(param_path=("params", "embedding"), ids_key="inputs")


def make_loss_fn(model_config, config: TuneConfig):
    """The per-example Prefix-LM loss over (trainable, frozen) collections (`dpsynth.train.lm`);
    a `sparse.EmbeddedLoss` when `embedding_spec` declares the input table."""
    from dpsynth.models import Transformer
    from dpsynth.train import lm

    model = Transformer(model_config)
    loss_fn = lm.make_lm_loss(model, z_loss=config.z_loss)
    spec = embedding_spec(model_config, config)
    if spec is None:
        return loss_fn
    from dpsynth.dp import sparse

    def from_embedded(rest, frozen, batch, embedded, key):
        """`loss_fn` with the looked-up rows given: the table is not read, so a zero stand-in keeps
        the tree whole (XLA drops it)."""
        del key
        table = jnp.zeros((model_config.vocab_size, model_config.d_model), jnp.float32)
        params = sparse.merge_table(rest, spec.param_path, table)
        logits = model.apply(lm.merge_variables(params, frozen), batch["inputs"], segment_ids=batch.get("segment_ids"),
                             positions=batch.get("positions"), embedded=embedded)
        ce, z = lm.cross_entropy_with_z_loss(logits, batch["targets"], config.z_loss)
        w = batch["weights"].astype(jnp.float32)
        tokens = jnp.sum(w, axis=-1)
        per_example = jnp.sum((ce + z) * w, axis=-1) / jnp.maximum(tokens, 1.0)
        return per_example, {"ce_sum": jnp.sum(ce * w, axis=-1), "tokens": tokens}

    return sparse.EmbeddedLoss(spec, from_embedded)


def _row_length(enc: EncodedExamples, limit: int) -> int:
    need = enc.inputs.shape[1]
    return min(int(math.ceil(need / LENGTH_BUCKET) * LENGTH_BUCKET), limit)


def _pad_cols(a: np.ndarray, length: int) -> np.ndarray:
    if a.shape[1] >= length:
        return a[:, :length]
    return np.pad(a, ((0, 0), (0, length - a.shape[1])))


def _data_fingerprint(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(arrays):
        h.update(k.encode())
        h.update(np.ascontiguousarray(arrays[k]).tobytes())
    return h.hexdigest()


def make_eval_fn(loss_fn):
    """Jitted masked sum of per-example losses of one batch."""
    return jax.jit(lambda p, f, b: jnp.sum(loss_fn(p, f, b, jax.random.PRNGKey(0))[0] * b["mask"]))


def evaluate_loss(eval_fn, params, frozen, arrays: dict[str, np.ndarray], batch_size: int) -> float:
    """Mean per-example loss over `arrays` (the quantity used for model selection)."""
    n = next(iter(arrays.values())).shape[0]
    total = 0.0
    for lo in range(0, n, batch_size):
        idx = np.arange(lo, lo + batch_size)
        idx = np.where(idx < n, idx, -1)
        total += float(eval_fn(params, frozen, sampling.gather(arrays, idx)))
    return total / max(n, 1)


# ============================================================================ the run


def user_ids(config: TuneConfig, records: Sequence[dict], where: str = "D_train") -> list[str] | None:
    """The records' user ids at user level (None otherwise); TuneError naming a record without one."""
    if not (config.private and config.privacy_unit == "user"):
        return None
    out = []
    for i, r in enumerate(records):
        u = r.get("user")
        if u is None or not str(u).strip():
            raise TuneError(f"{where} record {r.get('id', i + 1)}: no user id; user-level DP needs the data read "
                            "with its user column (--user-column)")
        out.append(str(u))
    return out


def plan_for_records(config: TuneConfig, records: Sequence[dict], *, compositions: int = 1,
                     spent: tuple[dict, ...] = ()) -> PrivacyPlan:
    """`plan_run` for D_train's records (counts the users at user level)."""
    ids = user_ids(config, records)
    return plan_run(config, len(records), compositions=compositions,
                    num_users=count_users(ids) if ids is not None else None, spent=spent)


def resolve_example_length(config: TuneConfig, base_dir: str, records: Sequence[dict], labels: Sequence[str], *,
                           resume_meta: dict | None = None) -> tuple[TuneConfig, recipe_lib.LengthChoice | None]:
    """`config` with max_tokens "auto" replaced by the DP quantile of D_train's row lengths under the
    tokenizer of `base_dir` (and the choice), or unchanged (and None). A resume takes the choice its
    checkpoint recorded (nothing is spent again). The selection's randomness: the fixed seed of a
    test run, else a secret one (`dpsynth.dp.seeds`)."""
    from dpsynth.data.tokenizers import load_tokenizer
    from dpsynth.models.config import ModelConfig
    from dpsynth.models.directory import CONFIG

    if config.max_tokens != recipe_lib.AUTO:
        return config, None
    if resume_meta is not None:
        if not resume_meta.get("example_length"):
            raise TuneError("--max-tokens auto: the checkpoint was made with a given --max-tokens; resume with it")
        choice = recipe_lib.LengthChoice.from_json(resume_meta["example_length"])
    else:
        tokenizer = load_tokenizer(base_dir)
        max_positions = ModelConfig.from_dict(fileio.read_json(os.path.join(base_dir, CONFIG))).max_len
        longest_prompt = max(prompt_ids(tokenizer, config.template, label).size for label in labels)
        lengths = example_lengths(records, tokenizer, config.template)
        seed = config.seed if config.seed is not None else seeds.shared_secret_seed()
        try:
            candidates = recipe_lib.length_candidates(max_positions=max_positions, min_tokens=longest_prompt + 2)
            choice = recipe_lib.choose_example_length(lengths, target_epsilon=config.epsilon, candidates=candidates,
                                                      rng=np.random.default_rng([seed & (2**64 - 1), 0x1E6]))
        except recipe_lib.RecipeError as e:
            raise TuneError(str(e)) from e
    logger.info("recipe auto: %s", choice.why)
    return dataclasses.replace(config, max_tokens=choice.max_tokens), choice


def _released_config(config: TuneConfig) -> dict[str, Any]:
    """The config as recorded in the released manifest: the seed's value is withheld."""
    d = config.to_json()
    d["seed"] = "secret (OS entropy)" if config.seed is None else "fixed (value withheld)"
    return d


@dataclasses.dataclass(frozen=True)
class _Prepared:
    """What the checks before any compute decided (`_prepare`)."""

    config: TuneConfig  # with an automatic recipe (and example length) resolved
    recipe: recipe_lib.Recipe | None
    length: recipe_lib.LengthChoice | None  # the DP example length of `--max-tokens auto`
    plan: PrivacyPlan
    labels: list[str]
    labels_from_data: bool
    train_users: list[str] | None
    state_dir: str
    ckpt_dir: str
    resume_meta: dict | None  # the checkpoint's metadata (read once), when resuming
    time_budget: recipe_lib.TimeBudget | None = None  # the measured token budget of `--time-budget`
    pending_seconds: float | None = None  # a time budget still to measure (`_resolve_time_budget`)


def _prepare(train_records: Sequence[dict], config: TuneConfig, *, labels, compositions: int, mesh, out_dir: str,
             state_dir: str | None, resume: bool, base_dir: str) -> _Prepared:
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
    resume_meta = _read_resume_meta(ckpt_dir) if early else None
    config, length = resolve_example_length(config, base_dir, train_records, labels, resume_meta=resume_meta)
    timing, pending = None, None
    if config.time_budget is not None:  # measured once (`_resolve_time_budget`); a resume takes the checkpoint's
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
        resume_meta = _read_resume_meta(ckpt_dir)
    if resume_meta is not None:  # the accounted settings must match the checkpoint's, checked before any compute
        diffs = resume_differences(resume_meta, config, plan)
        if diffs:
            raise TuneError(
                f"{ckpt_dir}: refusing to resume: this run's privacy plan differs from the checkpoint's, so the noise "
                "added and the noise accounted would disagree: "
                + "; ".join(f"{name}: checkpoint {a!r}, this run {b!r}" for name, a, b in diffs)
                + ". Resume with the checkpoint's settings, or start a fresh run in a new --out")
    return _Prepared(config=config, recipe=recipe, length=length, plan=plan, labels=labels, labels_from_data=labels_from_data,
                     train_users=train_users, state_dir=state_dir, ckpt_dir=ckpt_dir, resume_meta=resume_meta,
                     time_budget=timing, pending_seconds=pending)


def _read_resume_meta(ckpt_dir: str) -> dict:
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


@dataclasses.dataclass(frozen=True)
class _Data:
    """D_train / D_valid as padded Prefix-LM rows (rows N..2N-1: the null prompt, with label dropout)."""

    train: EncodedExamples
    valid: EncodedExamples | None
    train_arrays: dict[str, np.ndarray]
    valid_arrays: dict[str, np.ndarray] | None


def _encode(train_records: Sequence[dict], valid_records: Sequence[dict], tokenizer, labels: list[str],
            config: TuneConfig) -> _Data:
    try:
        train = encode_examples(train_records, tokenizer, labels, config.example_config(), where="D_train")
        valid = (encode_examples(valid_records, tokenizer, labels, config.example_config(), where="D_valid")
                 if valid_records else None)
    except ValueError as e:
        raise TuneError(str(e)) from e
    if train.truncated:
        logger.info("D_train: %d of %d examples truncated to %d tokens", train.truncated, len(train), config.max_tokens)
    length = _row_length(train, config.max_tokens - 1)
    null_train = None
    if config.label_dropout:  # rows N..2N-1: the same examples under the null prompt
        null_train = encode_null_examples(train_records, tokenizer, config.example_config(), where="D_train")
        length = max(length, _row_length(null_train, config.max_tokens - 1))
    train_arrays = {k: _pad_cols(v, length) for k, v in train.arrays().items()}
    if null_train is not None:
        train_arrays = {k: np.concatenate([v, _pad_cols(null_train.arrays()[k], length)]) for k, v in train_arrays.items()}
    valid_arrays = ({k: _pad_cols(v, _row_length(valid, config.max_tokens - 1)) for k, v in valid.arrays().items()}
                    if valid else None)
    return _Data(train=train, valid=valid, train_arrays=train_arrays, valid_arrays=valid_arrays)


def _resolve_microbatch(prep: _Prepared, base_config, base_params, data: _Data, *, mesh, memory_limit: int | None,
                        headroom: float) -> _Prepared:
    """`prep` with microbatch_size "auto" replaced by the largest microbatch whose compiled step (the
    run's own, on the abstract base and the data's row length) fits `memory_limit` less `headroom`;
    the choice and its figures are logged. Unchanged for a given microbatch."""
    config = prep.config
    if config.microbatch_size != "auto":
        return prep
    from dpsynth.train import resources

    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), base_params)
    choice = auto_microbatch(base_config, config, prep.plan, row_length=data.train_arrays["inputs"].shape[1], mesh=mesh,
                             limit_bytes=resources.memory_limit(memory_limit), headroom=headroom, base_params=abstract)
    logger.info("microbatch auto: %s", choice.describe())
    return dataclasses.replace(prep, config=dataclasses.replace(config, microbatch_size=choice.microbatch))


def _resolve_time_budget(prep: _Prepared, train_records: Sequence[dict], data: _Data, model_config, base_params, *,
                         mesh, compositions: int) -> _Prepared:
    """`prep` with a pending `--time-budget` turned into a token budget: the run's own accumulation
    step (its model, mode, clipping, microbatch and row length) is compiled and timed
    (`recipe.measure_speed`; process 0's figure on several processes), and the recipe and the plan
    are resolved again with that budget. Unchanged without a pending time budget."""
    from dpsynth.train import lm

    if prep.pending_seconds is None:
        return prep
    config = prep.config
    mb = config.microbatch_size
    _, strategy = _build_mechanism(prep, model_config, run_seed=0, num_rows=len(train_records), mesh=mesh)
    fns = make_step_functions(make_loss_fn(model_config, config), config, strategy, mesh=mesh)
    params, frozen = lm.split_variables(init_variables(model_config, base_params, config), TRAINABLE[config.mode])
    state = fns.init_state(params, frozen, rng=jax.random.PRNGKey(0))
    rows = np.arange(mb) % len(data.train)
    batch = sampling.gather(data.train_arrays, rows[fns.process_rows(mb)])

    def step():
        acc, _ = fns.accumulate_step(state, fns.init_accumulator(state), fns.shard_batch(batch, global_rows=mb))
        jax.block_until_ready(acc)

    speed = recipe_lib.measure_speed(step, example_tokens=mb * config.max_tokens)
    if jax.process_count() > 1:  # one figure for every process: the plans must agree
        from jax.experimental import multihost_utils

        speed = float(multihost_utils.broadcast_one_to_all(np.float32(speed)))
    del state
    try:
        timing = recipe_lib.TimeBudget(
            seconds=prep.pending_seconds, example_tokens_per_second=speed, microbatch=int(mb),
            token_budget=recipe_lib.token_budget_for(seconds=prep.pending_seconds, example_tokens_per_second=speed))
        config, recipe = resolve_recipe(dataclasses.replace(config, token_budget=timing.token_budget),
                                        prep.plan.dataset_size)
    except (recipe_lib.RecipeError, TuneError) as e:
        raise TuneError(f"--time-budget {prep.pending_seconds:g} s at the measured {speed:,.0f} example-tokens/s: "
                        f"{e}") from e
    for line in (timing.why,) + recipe.why:
        logger.info("recipe auto: %s", line)
    recipe = recipe.with_time(timing)
    if prep.length is not None:
        recipe = recipe.with_length(prep.length)
    plan = plan_for_records(config, train_records, compositions=compositions, spent=prep.plan.spent)
    return dataclasses.replace(prep, config=config, recipe=recipe, plan=plan, time_budget=timing, pending_seconds=None)


def _build_mechanism(prep: _Prepared, model_config, *, run_seed: int, num_rows: int, mesh):
    """(the run's mechanism or None, the training core's gradient strategy), from the plan."""
    from dpsynth.train import core

    config, plan = prep.config, prep.plan
    if not config.private:
        return None, core.MeanGradient()
    try:
        mech = build_run_mechanism(plan, clip_norm=config.clip_norm, microbatch_size=config.microbatch_size,
                                   seed=run_seed, num_rows=num_rows, user_ids=prep.train_users,
                                   max_examples_per_user=config.max_examples_per_user,
                                   data_shards=mesh[0] if mesh is not None else 1)
    except (UserColumnError, ValueError) as e:
        raise TuneError(str(e)) from e
    spec = embedding_spec(model_config, config)
    if spec is None and config.clipping != "vmap":
        return mech, dataclasses.replace(mech.strategy, clipping=config.clipping)
    if spec is None:
        return mech, mech.strategy
    # exact sparse clipping of an untied input table (imported models, full mode)
    if not mech.mechanism.supports_sparse_embedding or plan.privacy_unit != "example":
        raise TuneError("full tuning of a model with an untied input embedding uses sparse per-example "
                        "clipping, which supports example-level DP-SGD only (use --mode lora or prompt)")
    if config.clipping != "vmap":
        raise TuneError("a model with an untied input embedding uses the sparse clipping path: drop --clipping "
                        f"{config.clipping}")
    return mech, mech.mechanism.sparse_embedding_strategy(plan, clip_norm=config.clip_norm, embedding=spec)


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
    memory_limit: int | None = None,
    memory_headroom: float = 0.10,
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
        state_dir: the private state directory (created 0700): checkpoints with the secret seed,
            `losses.json` (non-DP train/valid losses). Default `<out_dir>.private/`; must lie
            outside `out_dir`.
        compositions: k > 1 for one of k sweep trials that together meet the target
            (`dpsynth.dp.plan.plan_privacy(compositions=k)`).
        memory_limit, memory_headroom: with `microbatch_size="auto"`, the bytes per device the
            compiled step may use (default: the device's own limit; required on CPU) and the
            fraction of it left free.

    Raises:
        TuneError: bad input (before any compute). BudgetExceeded: the run (or its
        continuation) would exceed the budget.

    The run: `_prepare` (checks before any compute) -> load and `_encode` the data ->
    `_build_mechanism` -> `_train` (the one loop, checkpoints) -> `_write_outputs`.
    """
    from dpsynth.models.directory import load_model

    t0 = time.monotonic()
    prep = _prepare(train_records, config, labels=labels, compositions=compositions, mesh=mesh, out_dir=out_dir,
                    state_dir=state_dir, resume=resume, base_dir=base_dir)
    config = prep.config
    base = load_model(base_dir)
    # Host copies: every leaf of the initial state then has the same (uncommitted) placement, so
    # the step functions compile once instead of again when jit outputs come back committed.
    base_params = jax.device_get(base.variables["params"])
    model_config = _tuned_model_config(base.config, config)
    if config.max_tokens - 1 > model_config.max_len:
        raise TuneError(f"max_tokens {config.max_tokens} needs {config.max_tokens - 1} positions but the model supports "
                        f"max_len {model_config.max_len}; lower --max-tokens")
    data = _encode(train_records, valid_records, base.tokenizer, prep.labels, config)
    prep = _resolve_microbatch(prep, base.config, base_params, data, mesh=mesh, memory_limit=memory_limit,
                               headroom=memory_headroom)
    prep = _resolve_time_budget(prep, train_records, data, model_config, base_params, mesh=mesh,
                                compositions=compositions)
    config = prep.config
    # The seed of the sampling stream and the noise keys: secret by default (see dpsynth.dp.seeds);
    # a resumed run continues with the seed stored in its (private) checkpoint.
    if prep.resume_meta is not None and "sampling_seed" in prep.resume_meta:
        run_seed = int(prep.resume_meta["sampling_seed"])
    else:
        run_seed = config.seed if config.seed is not None else seeds.shared_secret_seed()
    # The mechanism (strategy + batches) of the plan: user grouping and bounding, and the cyclic
    # sampler's groups, are functions of the secret seed, so a resume rebuilds the same ones.
    mech, strategy = _build_mechanism(prep, model_config, run_seed=run_seed, num_rows=len(train_records), mesh=mesh)
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
        mech=mech, sigma=sigma)
    make_private_dir(prep.state_dir)
    if jax.process_index() == 0:  # exact counts computed without DP: the private state, never the report
        write_private_json(os.path.join(prep.state_dir, tune_report.COUNTS_FILE), {
            "truncated_train": int(data.train.truncated),
            "truncated_valid": int(data.valid.truncated) if data.valid else 0,
            **(mech.private_counts() if mech is not None else {}), "dp": False, "notice": tune_report.NON_DP_COUNTS_NOTICE})
    fingerprint = hashlib.sha256(json.dumps(
        {k: v for k, v in config.to_json().items() if k not in ("steps", "epochs", "checkpoint_every")},
        sort_keys=True).encode() + _data_fingerprint(data.train_arrays).encode()
        + base.tokenizer.sha256.encode()).hexdigest()
    loss_fn = make_loss_fn(model_config, config)
    state, ledger, losses, start = _train(
        prep, data, init_variables(model_config, base_params, config), loss_fn, mech, strategy,
        run_seed=run_seed, fingerprint=fingerprint, reporter=reporter, out_dir=out_dir, mesh=mesh,
        stop_after=stop_after, progress_interval=progress_interval)
    return _write_outputs(prep, data, state, ledger, losses, start, loss_fn=loss_fn, reporter=reporter, base=base,
                          base_dir=base_dir, model_config=model_config, out_dir=out_dir, sigma=sigma, t0=t0)


def _train(prep: _Prepared, data: _Data, variables: dict, loss_fn, mech, strategy, *, run_seed: int,
           fingerprint: str, reporter: tune_report.RunReporter, out_dir: str, mesh, stop_after: int | None,
           progress_interval: float):
    """The one training loop (`dpsynth.train.loop`), from step 0 or the checkpoint; returns
    (state, ledger, non-DP loss sums, first step run)."""
    from dpsynth.train import lm, loop
    from dpsynth.train.checkpoint import TrainCheckpointer

    config, plan, ckpt_dir = prep.config, prep.plan, prep.ckpt_dir
    params, frozen = lm.split_variables(variables, TRAINABLE[config.mode])
    fns = make_step_functions(loss_fn, config, strategy, mesh=mesh)
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

    checkpointer = TrainCheckpointer(ckpt_dir, max_to_keep=2)
    try:
        if prep.resume_meta is not None:
            meta = prep.resume_meta
            if meta.get("format") != CHECKPOINT_FORMAT or meta.get("fingerprint") != fingerprint:
                raise TuneError(f"{ckpt_dir}: checkpoint was made with another configuration or data; resume with "
                                "the same flags and files, or use a new --out")
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
            meta = {"format": CHECKPOINT_FORMAT, "fingerprint": fingerprint, "ledger": ledger.to_json(),
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
            return [gather_users(data.train_arrays, m[local]) if per_user else sampling.gather(data.train_arrays, m[local])
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


def _write_outputs(prep: _Prepared, data: _Data, state, ledger: PrivacyLedger, losses: dict, start: int, *,
                   loss_fn, reporter: tune_report.RunReporter, base, base_dir: str, model_config, out_dir: str, sigma: float,
                   t0: float) -> TuneResult:
    """The private losses; then, when every planned step ran, the final report and the model (its
    manifest last, tied to the report: `dpsynth.train.release`); else the report so far."""
    from dpsynth.train import lm, sharding
    from dpsynth.models.directory import save_model

    config, plan = prep.config, prep.plan
    primary = jax.process_index() == 0
    valid_loss = (evaluate_loss(make_eval_fn(loss_fn), state.params, state.frozen, data.valid_arrays,
                                config.microbatch_size)
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
