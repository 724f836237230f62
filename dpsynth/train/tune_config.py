"""The configuration of a `dp_tune` run: what the user sets, and what it resolves to before any compute.

`TuneConfig` (checked on construction, `TuneError` otherwise) and the values of its fields (`MODES`,
`OPTIMIZERS`, `PROMPT_INITS`; `TRAINABLE`: the variable collections each mode trains); an automatic
recipe (`resolve_recipe`) and example length (`resolve_example_length`: a DP quantile of D_train's
lengths); the run's privacy plan (`plan_run`, `plan_for_records`; `user_ids` at user level); and
`Prepared`, what `dp_tune`'s checks before any compute decided (`dpsynth.train.finetune._prepare`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpsynth import fileio
from dpsynth.dp import accounting, seeds
from dpsynth.dp import mechanisms
from dpsynth.dp.mechanisms.run import count_users
from dpsynth.dp.plan import PrivacyPlan
from dpsynth.dp.plan import plan_privacy as _plan_privacy
from dpsynth.errors import DpsynthError
from dpsynth.train import recipe as recipe_lib
from dpsynth.train.prompts import DEFAULT_MAX_TOKENS, DEFAULT_TEMPLATE, ExampleConfig, example_lengths, prompt_ids

logger = logging.getLogger("dpsynth.train.finetune")  # the tuner's one logger, whichever module logs

MODES = recipe_lib.MODES
TRAINABLE = {"full": ("params",), "prompt": ("prompt",), "lora": ("lora",)}
# The modes whose trainable variables the ghost clipping taps (`dpsynth.dp.ghost`; soft prompts have no tap).
GHOST_MODES = ("full", "lora")
# `TuneConfig.clipping`'s default: ghost where it applies, else vmap (`dpsynth.train.tune_model.clipping_method`).
AUTO_CLIPPING = "auto"
OPTIMIZERS = ("adam", "adafactor")
PROMPT_INITS = ("uniform", "vocab")


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
        label_contrast: lambda, the weight of a label-contrast term added to each example's
            Prefix-LM loss: the cross-entropy of its label under the model's own Bayes classifier,
            -log softmax_y(log p(x | prompt_y')) over the label set (uniform prior; the text's
            summed log-likelihood under every label prompt, `dpsynth.train.lm.make_label_contrast_loss`).
            It spends more of each clipped gradient on what tells the labels apart, so that the
            generator's own samples carry the label. 0 = off. "auto" (default): the automatic
            recipe's choice (`dpsynth.train.recipe.auto_label_contrast`: 1 for at most 4 labels
            where the run allows it), off with a manual recipe; resolved before any compute
            (`dpsynth.train.tune_model.resolve_label_contrast`). Each example is still one privacy unit (its K rows are one
            clipped gradient): no DP property changes; the step costs K forward and backward
            passes per example instead of one (the full form; 2 with the sampled form).
        label_contrast_form: the label contrast's form (`dpsynth.train.recipe.contrast_form`): "full",
            the K-way term (K rows per example); "sampled", softplus(s_k' - s_y) of the own label y
            against ONE other label k' drawn uniformly per (step, example) from the run's seed
            (`dpsynth.train.tune_data.sampled_contrast_labels`; 2 rows per example for any K; between
            1/(K-1) of the full term and the full term in expectation, equal at K = 2); "auto"
            (default): full for at most `recipe.CONTRAST_MAX_LABELS` labels, sampled above; resolved
            with the weight (`resolve_label_contrast`; a resumed run keeps its checkpoint's form).
            Either form is part of each example's loss: the same clipping, sensitivity and privacy.
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
            (per-example gradients) or "ghost" (full and LoRA modes, example-level DP-SGD or
            BandMF, with or without the label contrast: the same clipped sum without per-example
            gradient copies or per-example forward passes, `dpsynth.dp.ghost`; with LoRA, the output
            layer then runs only where the loss looks, `dpsynth.train.lm.row_sums`). The same mechanism
            and accounting either way. "auto" (the default): ghost where it applies, else vmap
            (`dpsynth.train.tune_model.clipping_method`; ghost was the faster in every measured
            setting, docs/measured.md).
        reserve_selection_epsilon: the epsilon of a later DP selection on D_valid (`dpsynth select`,
            exponential mechanism) that composes SEQUENTIALLY with this run: D_valid split from D
            positionally (e.g. its last 10%), so that one record may change both D_train and
            D_valid. The target epsilon then covers both: sigma is calibrated on the run composed
            with the selection accounted at twice this epsilon (group privacy of a positional
            split, `dpsynth.dp.private_selection.reserved_entry`; RDP accountant), and the privacy
            report records the reservation. 0 (default): nothing reserved; a data-independent split
            (own files, a hash) composes in parallel and needs none.
        reserve_label_noise_multiplier: sigma of a later DP label histogram of D_train (`dpsynth
            select --label-source`, the experiment's `dp_histogram` labels; e.g.
            `dpsynth.dp.histogram.DEFAULT_NOISE_MULTIPLIER`) that the target covers too: sigma of
            the run is calibrated on the run composed with that Gaussian mechanism
            (`dpsynth.dp.histogram.reserved_entry`), so that the model and a histogram drawn at this
            sigma or more stay within the target; the privacy report records it and `dpsynth
            select` draws at it by default. 0 (default): nothing reserved (a histogram drawn later
            then exceeds the target, and `dpsynth select` refuses it). Example level only.
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
    label_contrast: float | str = recipe_lib.AUTO
    label_contrast_form: str = recipe_lib.AUTO
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
    clipping: str = AUTO_CLIPPING
    reserve_selection_epsilon: float = 0.0
    reserve_label_noise_multiplier: float = 0.0

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
        elif isinstance(self.max_tokens, str) or isinstance(self.max_tokens, bool):
            raise TuneError(f"max_tokens must be a number of tokens or 'auto', got {self.max_tokens!r}")
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
        c = self.label_contrast
        if c != recipe_lib.AUTO:
            if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0.0 <= c < math.inf:
                raise TuneError(f"label_contrast must be a finite number >= 0 or 'auto', got {c!r}")
            object.__setattr__(self, "label_contrast", float(c))
        if self.label_contrast_form not in recipe_lib.CONTRAST_FORMS:
            raise TuneError(f"label_contrast_form must be one of {recipe_lib.CONTRAST_FORMS}, got "
                            f"{self.label_contrast_form!r}")
        r = self.reserve_selection_epsilon
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 <= r < math.inf:
            raise TuneError(f"reserve_selection_epsilon must be a finite number >= 0, got {r!r}")
        object.__setattr__(self, "reserve_selection_epsilon", float(r))
        if r and not self.private:
            raise TuneError("reserve_selection_epsilon: a non-private run (epsilon inf) has no budget to reserve from")
        if r and self.accountant != "rdp":
            raise TuneError("reserve_selection_epsilon: the reserved pure-DP selection is composed by the RDP "
                            "accountant only: pass --accountant rdp")
        h = self.reserve_label_noise_multiplier
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not 0.0 <= h < math.inf:
            raise TuneError(f"reserve_label_noise_multiplier must be a finite number >= 0 (0: none), got {h!r}")
        object.__setattr__(self, "reserve_label_noise_multiplier", float(h))
        if h and not self.private:
            raise TuneError("reserve_label_noise_multiplier: a non-private run (epsilon inf) has no budget to reserve "
                            "from")
        if h and self.privacy_unit != "example":
            raise TuneError("reserve_label_noise_multiplier: a DP label histogram does not compose into a user-level "
                            "model (one user may change several counts)")
        from dpsynth.dp.clipping import METHODS as clipping_methods

        if self.clipping not in (AUTO_CLIPPING, *clipping_methods):
            raise TuneError(f"clipping must be one of {(AUTO_CLIPPING, *clipping_methods)}, got {self.clipping!r}")
        if self.clipping not in ("vmap", AUTO_CLIPPING) and (self.mode not in GHOST_MODES or self.privacy_unit != "example"):
            raise TuneError(f"--clipping {self.clipping} is for --mode full or lora at example level (prompt tuning "
                            "and user-level DP keep the vmapped clipping)")
        conflict = self.contrast_conflict()
        if conflict and self.label_contrast not in (0.0, recipe_lib.AUTO):  # ("auto" turns the contrast off instead)
            raise TuneError(conflict)

    def contrast_conflict(self) -> str | None:
        """Why this run cannot take a label contrast, or None."""
        if self.label_dropout:
            return "label_contrast and label_dropout both change which rows train an example: use one"
        if self.privacy_unit != "example":
            return "label_contrast supports example-level runs (privacy_unit 'example')"
        return None

    @property
    def contrast(self) -> float:
        """The label contrast's weight (0: off). "auto" is off with a manual recipe; the automatic
        one's choice needs the label set and the model (`tune_model.resolve_label_contrast`)."""
        if self.label_contrast == recipe_lib.AUTO:
            if self.recipe != "auto":
                return 0.0
            raise TuneError("label_contrast 'auto' of the automatic recipe is resolved before the run's step is "
                            "built (`resolve_label_contrast`)")
        return self.label_contrast

    def contrast_form(self, labels: int) -> str:
        """The label contrast's form ("full" or "sampled") over K = `labels` labels (`recipe.contrast_form`)."""
        return recipe_lib.contrast_form(self.label_contrast_form, labels)

    def contrast_rows(self, labels: int) -> int:
        """Rows per example of the label contrast over K = `labels` labels: K (full) or 2 (sampled)."""
        return recipe_lib.contrast_rows(self.label_contrast_form, labels)

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
        for name, off in (("label_dropout", 0.0), ("label_contrast", 0.0), ("recipe", "manual"), ("token_budget", None), ("time_budget", None),
                          ("allow_large_delta", False), ("clipping", "vmap"), ("reserve_selection_epsilon", 0.0),
                          ("reserve_label_noise_multiplier", 0.0)):
            if d[name] == off:  # off: the fingerprint of runs made before it existed holds
                del d[name]
        if d.get("clipping") == AUTO_CLIPPING:  # (a run begun before "auto" was the default, at "vmap", resumes:
            del d["clipping"]  # the method changes no accounted setting, only how the same clipped sum is formed)
        if d["label_contrast_form"] == "full" or not d.get("label_contrast", 0.0):  # the one form before there were two
            del d["label_contrast_form"]
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
                             allow_large_delta=config.allow_large_delta, spent=spent if config.private else (),
                             reserved=reserved_entries(config))
    except accounting.PrivacyConfigError as e:
        raise TuneError(str(e)) from e


def reserved_entries(config: TuneConfig) -> tuple[dict, ...]:
    """The ledger entries the run's target covers after it (`TuneConfig.reserve_selection_epsilon`,
    `TuneConfig.reserve_label_noise_multiplier`)."""
    if not config.private:
        return ()
    from dpsynth.dp import histogram, private_selection

    out = []
    if config.reserve_label_noise_multiplier:
        out.append(histogram.reserved_entry(config.reserve_label_noise_multiplier))
    if config.reserve_selection_epsilon:
        out.append(private_selection.reserved_entry(config.reserve_selection_epsilon))
    return tuple(out)


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


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What the checks before any compute decided (`dpsynth.train.finetune._prepare`)."""

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
    pending_seconds: float | None = None  # a time budget still to measure (`resolve_time_budget`)
