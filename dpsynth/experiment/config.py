"""The experiment config: one YAML file, parsed into frozen, validated dataclasses.

An experiment names the public corpus, the sensitive labeled dataset, the model preset and a
grid (DP modes x epsilons x learning rates x clipping norms x sampling settings x data
multiples). Every trial of the grid shares the stages that do not depend on its grid point
(tokenizer, dedup, pretraining), which the runner caches by content hash.

Schema (every key optional unless marked; defaults in the dataclasses below)::

    name: demo                      # used in logs and the report
    out: runs/demo                  # output root (the CLI's --out overrides it)
    seed: 0
    base_model: null                # a pretrained model directory (`dpsynth import-model --hf DIR | --gguf FILE
                                    #   --out DIR`): DP tuning starts from it and its tokenizer, in place of the
                                    #   public/dedup/tokenizer/pretrain stages (then leave those sections out);
                                    #   its pretraining data was NOT deduplicated against the sensitive data
    public:                         # the PUBLIC corpus (pretraining + tokenizer)
      embedded: true                # Jane Austen's six novels (the embedded default)
      paths: [../shared/data/public/kjv]   # .txt / .jsonl / .parquet files, dirs or globs
      plant: 0                      # copy N sensitive TRAIN texts into the public corpus (demo)
      max_documents: null
    sensitive:                      # the SENSITIVE labeled dataset
      embedded: true                # fine-food reviews (train 3600 / valid 400 / test 1000)
      train: data/train.csv         # or paths (then embedded: false)
      valid: null                   # default: the last 10% of train (the paper's split)
      test: data/test.csv
      format: auto                  # auto (by suffix) | a labeled format of dpsynth.data.readers.REGISTRY:
                                    #   jsonl | csv | tsv | parquet | label_text (`<label> <text>` lines)
      text_column: text
      label_column: label
      user_column: null             # the user id field (for dp_tune.privacy_unit: user)
      label_names: {0: negative, 1: positive}   # raw label -> name used in prompts (default: as is)
      max_train: null               # keep the first N rows of each split (smaller scale)
      max_valid: null
      max_test: null
      max_dead_letters: null        # fail past "N" records or "P%" of a file's records dead-lettered (default "1%")
      encoding: null                # text encoding of the files (default utf-8; e.g. cp1252, latin-1)
      split: {}                     # dpsynth.data.splits.SplitSpec: split_column, split_values,
                                    #   holdout (tail|hash), valid_fraction, test_fraction, seed,
                                    #   subsample (first|hash: which rows max_* keep)
    tokenizer: {vocab_size: 8000, max_sentences: 200000}
    dedup: {min_tokens: 50,
            also_against: {}}       # name -> a `sensitive:` section: more sensitive sets to cut from the
                                    #   public corpus; experiments listing the same sets share dedup and pretraining
    pretrain: {preset: tiny, steps: 300, seq_len: 128, batch_size: 16, learning_rate: 0.001,
               options: {}}         # the pretrain library's PretrainConfig at PRETRAIN_PRESET; options: its other fields
    dp_tune:                        # the tuner's TuneConfig settings at DP_TUNE_PRESET, plus the grid axes
      modes: [lora]                 # full | prompt | lora
      epsilons: [3]                 # > 0, or .inf / inf for the non-private baseline
      delta: null                   # default 1 / |train|; above 1/N refused unless allow_large_delta: true
      allow_large_delta: false      #   (the model's privacy report then says the delta is weak)
      learning_rates: [0.001]
      mode_learning_rates: {}       # per-mode lr axis, e.g. {full: [0.001], prompt: [0.03]}
      clip_norms: [1.0]
      replicates: 1                 # independent repeats of every DP run (own secret noise seed, own generation seed)
      recipe: manual                # manual | auto (dpsynth.train.recipe: batch, steps and learning rate chosen
      token_budget: null            #   from |D_train|, the mode and max_tokens; learning_rates, batch_size,
                                    #   epochs and steps are then not used; token_budget caps its compute)
      batch_size: 64                # expected (Poisson) batch size
      epochs: 1.0                   # or steps: N
      steps: null
      max_tokens: 128               # prefix + target tokens per example; auto (recipe auto): a DP quantile of D_train's
                                    #   lengths at 2% of epsilon (docs/dp.md)
      loss: prefix                  # prefix | full
      label_dropout: 0.0            # p: examples train under the null prompt with probability p (guidance contrast null)
      label_contrast: auto          # lambda of the label contrast (unguided samples carry the label; K passes per
                                    #   example, 2 above 4 labels); auto: 1 with recipe auto, else 0 (docs/dp.md;
                                    #   options: {label_contrast_form: full | sampled} picks the form)
      lora_rank: 8
      prompt_length: 16
      accountant: rdp               # rdp | pld
      privacy_unit: example         # example | user (needs sensitive.user_column, max_examples_per_user)
      max_examples_per_user: null   # K: rows kept per user (user level); delta then defaults to 1/|users|
      mechanism: dpsgd              # dpsgd | bandmf (banded correlated noise; needs bands)
      bands: null
      options: {}                   # any other TuneConfig field, e.g. {time_budget: 600}: seconds of DP-SGD steps
                                    #   instead of token_budget (recipe auto; measured on the run's machine)
    generate:
      samplings: [{temperature: 1.0, top_k: 0, num_decodes: 1}]   # each entry: the sampling options of
                                    #   dpsynth.generate.sampler_config.SamplerConfig (`SamplingOptions`: also min_p,
                                    #   guidance, guidance_contrast: others | null (needs dp_tune.label_dropout > 0))
      multiples: [1]                # synthetic train size = multiple x |train|
      valid_fraction: 0.1           # synthetic valid size = valid_fraction x synthetic train
      max_tokens: 128               # null: the length the model was DP-tuned on (what dp_tune.max_tokens auto chose)
      batch_size: 32                # or auto: the largest whose compiled sampler fits the device (options:
                                    #   memory_limit: the device's, on CPU the host's available; and memory_headroom)
      audit_memorisation: false     # longest overlap with D_train: an owner-only audit, NOT DP, written to ROOT/private
      label_distribution: uniform   # uniform (free) | dp_histogram (Gaussian noise on D_train's
      label_noise_multiplier: null  #   label counts, sigma given here; composed into the privacy report;
                                    #   each private dp_tune run reserves it: reserve_label_noise_multiplier)
      options: {}                   # any other dpsynth.generate.plan.GenerateConfig field (its batch_size is
                                    #   the section's, at the preset 32), validated by it when the file loads
    evaluate:
      classifiers: [wordcnn]        # wordcnn | backbone
      baselines: true               # real data and DP-on-real at the same epsilons
      options: {}                   # e.g. {mauve_seeds: [0], dp_epochs: 3} (dpsynth.evaluate.scoring.EvaluateConfig)
    select:                         # DP selection on the real D_valid of one corpus per DP run (off by default)
      epsilon: null                 # e.g. 1: exponential mechanism on correct predictions (dpsynth.evaluate.dp_select);
                                    #   with a positional D_valid each private dp_tune run reserves it
                                    #   (reserve_selection_epsilon), so the release meets dp_tune.epsilons
      mechanism: exponential        # exponential | gaussian
      options: {}                   # e.g. {cnn: small, max_epochs: 3, repeats: 1}

Unknown keys and bad values raise `ConfigError` naming the YAML key, e.g.
`dp_tune.epsilons[1]: must be > 0 or inf, got -1`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import typing
from collections.abc import Mapping
from typing import Any

from dpsynth import binding
from dpsynth.data import readers
from dpsynth.data import tokenizer_training as tokenizer_lib
from dpsynth.dedup import config as dedup_config_lib
from dpsynth.dp.accounting import ACCOUNTANTS  # noqa: F401 (the section's accountants are the tuner's)
from dpsynth.errors import DpsynthError
from dpsynth.evaluate import dp_select as dp_select_lib
from dpsynth.evaluate import registry
from dpsynth.evaluate import scoring as scoring_lib
from dpsynth.generate import plan as generate_plan_lib
from dpsynth.generate.sampler_config import SamplingOptions
from dpsynth.train import pretrain as pretrain_lib
from dpsynth.train import tune_config as tune_config_lib
from dpsynth.train.recipe import AUTO, MODES, RECIPES

LOSSES = ("prefix", "full")
FORMATS = ("auto",) + readers.LABELED_FORMATS  # auto: by suffix; the others: `dpsynth.data.readers.REGISTRY`
LABEL_DISTRIBUTIONS = ("uniform", "dp_histogram")


class ConfigError(DpsynthError, ValueError):
    """An invalid experiment config; the message starts with the YAML key at fault."""

    kind = "config error"


# Field metadata key of a setting added after stage caches existed (declared in `dpsynth.binding`,
# with `stage_dict`, so library configs mark their own settings the same way).
UNLESS_DEFAULT = binding.UNLESS_DEFAULT
stage_dict = binding.stage_dict
to_dict = binding.plain


def _added(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
           unless_default: bool | str = True) -> Any:
    """`dataclasses.field` of a setting hashed only when set (see `UNLESS_DEFAULT`)."""
    return binding.setting(default, default_factory=default_factory, unless_default=unless_default)


# ----------------------------------------------------------------------------- sections


def _check_encoding(encoding: str | None, key: str) -> None:
    from dpsynth.data import readers

    try:
        readers.check_encoding(encoding)
    except readers.InputError as e:
        raise ConfigError(f"{key}.encoding: {str(e).split(': ', 1)[1]}") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class PublicConfig:
    """The public corpus: the embedded Austen novels and/or files."""

    embedded: bool = True
    paths: tuple[str, ...] = ()
    plant: int = 0
    max_documents: int | None = None
    encoding: str | None = _added(None)  # of the files (default utf-8; readers.check_encoding)

    def validate(self, key: str) -> None:
        _check_encoding(self.encoding, key)
        if not self.embedded and not self.paths:
            raise ConfigError(f"{key}: needs `embedded: true` or at least one entry in `paths`")
        _check(self.plant >= 0, f"{key}.plant", f"must be >= 0, got {self.plant}")
        _check(self.max_documents is None or self.max_documents > 0, f"{key}.max_documents", "must be > 0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SensitiveConfig:
    """The sensitive labeled dataset: the embedded fine-food reviews or files."""

    embedded: bool = True
    train: str | None = None
    valid: str | None = None
    test: str | None = None
    format: str = "auto"
    text_column: str = "text"
    label_column: str = "label"
    user_column: str | None = _added(None)  # the user id of each row (dp_tune.privacy_unit: user)
    label_names: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    max_train: int | None = None
    max_valid: int | None = None
    max_test: int | None = None
    split: Mapping[str, Any] = _added(default_factory=dict)
    max_dead_letters: str | None = _added(None)  # N records or "P%" of those read (default dead_letters.DEFAULT_LIMIT)
    encoding: str | None = _added(None)  # of the files (default utf-8; readers.check_encoding)

    def validate(self, key: str) -> None:
        from dpsynth.data import dead_letters
        from dpsynth.data.splits import SplitError, SplitSpec

        _check_encoding(self.encoding, key)
        try:
            dead_letters.parse_limit(self.max_dead_letters)
        except ValueError as e:
            raise ConfigError(f"{key}.max_dead_letters: {e}") from None

        if self.embedded and (self.train or self.valid or self.test):
            raise ConfigError(f"{key}: give either `embedded: true` or file paths (train/valid/test), not both")
        if self.embedded and self.user_column:
            raise ConfigError(f"{key}.user_column: the embedded reviews have no user column; give your own files")
        known = [f.name for f in dataclasses.fields(SplitSpec)]
        for name in self.split:
            _check(name in known, f"{key}.split.{name}", f"unknown key (known: {', '.join(known)})")
        try:
            spec = SplitSpec(**dict(self.split))
        except SplitError as e:
            raise ConfigError(f"{key}.split: {e}") from None
        if not self.embedded:
            _check(bool(self.train), f"{key}.train", "is required when `embedded: false`")
            _check(bool(self.test) != (spec.test_fraction > 0), f"{key}.test",
                   "give a test file, or `split: {holdout: hash, test_fraction: F}` to carve it from train (not both)")
        _choice(self.format, FORMATS, f"{key}.format")
        for raw, name in self.label_names.items():
            _check(isinstance(name, str) and bool(name.strip()), f"{key}.label_names.{raw}", f"must be a non-empty string, got {name!r}")
        _check(len(set(self.label_names.values())) == len(self.label_names), f"{key}.label_names", "names must be distinct")
        for name in ("max_train", "max_valid", "max_test"):
            value = getattr(self, name)
            _check(value is None or value > 0, f"{key}.{name}", f"must be > 0, got {value}")


def _validate_tokenizer(self, key: str) -> None:
    """The library's validation (`tokenizer_training.TokenizerConfig.__post_init__`), named by key."""
    try:
        tokenizer_lib.TokenizerConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
    except binding.SettingError as e:
        raise ConfigError(f"{key}.{e.field}: {e.message}") from None


# The tokenizer: the library's vocab_size and max_sentences (their one declaration and validation),
# with the experiment's smaller sample as a preset; both values enter the pinned stage hashes.
TOKENIZER_PRESET = {"max_sentences": 200_000}
TokenizerConfig = binding.subconfig(
    "TokenizerConfig", tokenizer_lib.TokenizerConfig, lambda f: f.name in ("vocab_size", "max_sentences"),
    module=__name__, preset=TOKENIZER_PRESET, namespace={"validate": _validate_tokenizer},
    doc="SentencePiece trained on a sample of the public corpus (`dpsynth.data.tokenizer_training."
        "TokenizerConfig`'s vocab_size and max_sentences, at `TOKENIZER_PRESET`).")


def _validate_dedup(self, key: str) -> None:
    """min_tokens by the library's `DedupConfig`; every `also_against` entry as a `sensitive:` section."""
    _library_check(dedup_config_lib.DedupConfig, {"min_tokens": self.min_tokens}, key, ("min_tokens",), {})
    for name, section in self.also_against.items():
        _check(bool(name) and "=" not in name and "/" not in name, f"{key}.also_against.{name}",
               "names a dataset: non-empty, without '=' or '/'")
        self.sensitive_config(name).validate(f"{key}.also_against.{name}")


def _dedup_sensitive_config(self, name: str) -> "SensitiveConfig":
    """The `SensitiveConfig` of one `also_against` entry."""
    return _build(SensitiveConfig, self.also_against[name], f"dedup.also_against.{name}")


# The dedup's cut (`dpsynth.dedup.config.DedupConfig`'s min_tokens, declared and validated there; the
# stage runs one native thread per CPU) and `also_against` (more sensitive sets to cut, as `sensitive:`).
DedupConfig = binding.subconfig(
    "DedupConfig", dedup_config_lib.DedupConfig, lambda f: f.name == "min_tokens", module=__name__,
    extra=[("also_against", Mapping[str, Any], dataclasses.field(default_factory=dict))],
    namespace={"validate": _validate_dedup, "sensitive_config": _dedup_sensitive_config},
    doc="Removal of >= min_tokens sequences shared with the sensitive data (`dpsynth.dedup.config.DedupConfig`'s "
        "min_tokens; `also_against`: more sensitive sets to cut, each a `sensitive:` section).")


# The experiment's defaults for the pretraining library's settings: a named, CPU-sized preset over
# `dpsynth.train.pretrain.PretrainConfig`'s own (which stay `dpsynth pretrain`'s), overridable in
# the `pretrain:` section. These five values enter the pinned stage hashes.
PRETRAIN_PRESET = {"preset": "tiny", "steps": 300, "seq_len": 128, "batch_size": 16, "learning_rate": 1e-3}


def _validate_pretrain(self, key: str) -> None:
    """The library's validation (`PretrainConfig.__post_init__`, with `options`), its message named by key."""
    from dpsynth.models import get_config

    settings = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "options"}
    try:
        get_config(self.preset)
    except (ValueError, KeyError) as e:
        raise ConfigError(f"{key}.preset: must name a model preset ({str(e).strip(chr(39))})") from None
    _library_check(pretrain_lib.PretrainConfig, {**settings, **dict(self.options)}, key, settings, self.options)


# Pretraining of the decoder-only LM on the cleaned public corpus: the library's settings (their one
# declaration, default and validation) at the experiment's preset; `options` sets any other of them.
PretrainConfig = binding.subconfig(
    "PretrainConfig", pretrain_lib.PretrainConfig,
    lambda f: f.name in PRETRAIN_PRESET, module=__name__, preset=PRETRAIN_PRESET,
    extra=[("options", Mapping[str, Any], dataclasses.field(default_factory=dict))],
    namespace={"validate": _validate_pretrain},
    doc="Pretraining (`dpsynth.train.pretrain.PretrainConfig`'s preset, steps, seq_len, batch_size and "
        "learning_rate at `PRETRAIN_PRESET`; `options`: any other of its fields).")


# The experiment's defaults for the tuner's settings: a named, CPU-sized preset over
# `dpsynth.train.tune_config.TuneConfig`'s own (which stay `dpsynth dp-tune`'s paper-scale ones),
# overridable in the `dp_tune:` section. These values enter the pinned stage hashes.
DP_TUNE_PRESET = {"batch_size": 64, "epochs": 1.0, "max_tokens": 128, "prompt_length": 16}
# The tuner's settings that are keys of the `dp_tune:` section (any other goes through `options`).
DP_TUNE_SETTINGS = ("delta", "recipe", "token_budget", "batch_size", "epochs", "steps", "max_tokens", "label_dropout",
                    "label_contrast", "lora_rank", "prompt_length", "accountant", "privacy_unit",
                    "max_examples_per_user", "mechanism", "bands", "allow_large_delta")
# Settings added after stage caches existed: they enter the `dp_tune` hashes only when set
# (label_contrast by its own rule: `dpsynth.experiment.plan.label_contrast_key`).
_DP_TUNE_ADDED = ("recipe", "token_budget", "label_dropout", "label_contrast", "privacy_unit", "max_examples_per_user",
                  "mechanism", "bands", "allow_large_delta")


def _validate_dp_tune(self, key: str) -> None:
    """The grid axes here; every tuner setting by the tuner (`TuneConfig.__post_init__`, once per
    mode, with `options`), its message named by key."""
    _nonempty(self.modes, f"{key}.modes")
    for i, mode in enumerate(self.modes):
        _choice(mode, MODES, f"{key}.modes[{i}]")
    _nonempty(self.epsilons, f"{key}.epsilons")
    for i, eps in enumerate(self.epsilons):
        _check(eps > 0 and not math.isnan(eps), f"{key}.epsilons[{i}]", f"must be > 0 or inf, got {eps}")
    _nonempty(self.learning_rates, f"{key}.learning_rates")
    for i, lr in enumerate(self.learning_rates):
        _check(lr > 0, f"{key}.learning_rates[{i}]", f"must be > 0, got {lr}")
    for mode, lrs in self.mode_learning_rates.items():
        sub = f"{key}.mode_learning_rates.{mode}"
        _choice(mode, MODES, sub)
        _check(mode in self.modes, sub, f"names a mode that is not in {key}.modes")
        values = _listed(lrs)
        _nonempty(values, sub)
        for i, lr in enumerate(values):
            try:
                ok = not isinstance(lr, bool) and 0 < float(lr) < math.inf  # YAML 1.1 reads 1e-3 as a string
            except (TypeError, ValueError):
                ok = False
            _check(ok, f"{sub}[{i}]", f"must be a number > 0, got {lr!r}")
    _check(self.replicates >= 1, f"{key}.replicates", f"must be >= 1, got {self.replicates}")
    _choice(self.recipe, RECIPES, f"{key}.recipe")
    if self.recipe == "auto":
        _check(len(self.learning_rates) == 1 and not self.mode_learning_rates, f"{key}.recipe",
               "auto chooses the learning rate itself: drop learning_rates / mode_learning_rates (or use recipe: manual)")
    if "label_contrast" in self.options and self.label_contrast != AUTO:
        raise ConfigError(f"{key}: label_contrast is given twice, as a key and in options: keep the key")
    _nonempty(self.clip_norms, f"{key}.clip_norms")
    for i, c in enumerate(self.clip_norms):
        _check(c > 0 and math.isfinite(c), f"{key}.clip_norms[{i}]", f"must be > 0, got {c}")
    if (self.steps is None) == (self.epochs is None):
        raise ConfigError(f"{key}: give exactly one of `epochs` and `steps` (set the other to null)")
    _choice(self.loss, LOSSES, f"{key}.loss")
    settings = {n: getattr(self, n) for n in DP_TUNE_SETTINGS if getattr(self, n) is not None}
    for mode in self.modes:
        _library_check(tune_config_lib.TuneConfig, {
            **settings, "mode": mode, "epsilon": self.epsilons[0], "clip_norm": self.clip_norms[0],
            "full_lm": self.loss == "full", **dict(self.options)}, key, DP_TUNE_SETTINGS, self.options)


def _library_check(cls: type, kwargs: Mapping[str, Any], key: str, settings, options) -> None:
    """Builds the library's `cls` from a section's values (its validation, the one there is); a
    refusal becomes a `ConfigError` named by the YAML key of the setting or option at fault."""
    try:
        binding.make_config(cls, kwargs, key + ".options")
    except (ValueError, TypeError) as e:
        message = str(e)
        if message.startswith(key + ".options."):  # an unknown option: already named by key
            raise ConfigError(message) from None
        raise ConfigError(_named(key, message, settings, options)) from None


def _named(key: str, message: str, settings, options) -> str:
    """A library's validation message with the YAML key of the setting it starts with ("steps must
    be ...", "min_tokens: must be ..." (a `binding.SettingError`), "--bands: must be ...", an `options` entry's name) or else the section's key."""
    names = [(n, f"{key}.{n}") for n in settings] + [(n, f"{key}.options.{n}") for n in options]
    for name, where in sorted(names, key=lambda x: len(x[0]), reverse=True):
        for prefix in (name + ": ", name + " ", f"--{name.replace('_', '-')}: ", f"--{name.replace('_', '-')} "):
            if message.startswith(prefix):
                return f"{where}: {message[len(prefix):]}"
    return f"{key}: {message}"


def _learning_rates_for(self, mode: str) -> tuple[float | None, ...]:
    """The learning-rate axis of `mode` (its `mode_learning_rates` entry, else `learning_rates`);
    `(None,)` with the automatic recipe, which chooses it."""
    if self.recipe == "auto":
        return (None,)
    if mode not in self.mode_learning_rates:
        return self.learning_rates
    return tuple(float(x) for x in _listed(self.mode_learning_rates[mode]))


# DP fine-tuning: the tuner's settings (`DP_TUNE_SETTINGS`: their one declaration, default and
# validation are `TuneConfig`'s) at the experiment's preset, plus the grid axes: lists of its
# `mode`, `epsilon`, `learning_rate` and `clip_norm`, independent repeats, `loss` (full = its
# `full_lm`) and `options` (any other TuneConfig field, e.g. `time_budget`).
DPTuneConfig = binding.subconfig(
    "DPTuneConfig", tune_config_lib.TuneConfig, lambda f: f.name in DP_TUNE_SETTINGS, module=__name__,
    preset=DP_TUNE_PRESET, unless_default=_DP_TUNE_ADDED,
    # Experiment values keep their types in the hashes (`batch_size: 64`), and epochs is null with steps.
    retype={"batch_size": int, "epochs": float | None},
    extra=[("modes", tuple[str, ...], dataclasses.field(default=("lora",))),
           ("epsilons", tuple[float, ...], dataclasses.field(default=(3.0,))),
           ("learning_rates", tuple[float, ...], dataclasses.field(default=(1e-3,))),
           ("mode_learning_rates", Mapping[str, Any], dataclasses.field(default_factory=dict)),
           ("clip_norms", tuple[float, ...], dataclasses.field(default=(1.0,))),
           ("replicates", int, dataclasses.field(default=1)),
           ("loss", str, dataclasses.field(default="prefix")),
           ("options", Mapping[str, Any], dataclasses.field(default_factory=dict))],
    namespace={"validate": _validate_dp_tune, "learning_rates_for": _learning_rates_for},
    doc="""DP fine-tuning (`dpsynth.train.tune_config.TuneConfig` at `DP_TUNE_PRESET`, plus the grid axes).

    Keys: the tuner's settings in `DP_TUNE_SETTINGS` (delta, recipe, token_budget, batch_size,
    epochs, steps, max_tokens, label_dropout, label_contrast, lora_rank, prompt_length, accountant, privacy_unit,
    max_examples_per_user, mechanism, bands, allow_large_delta): declared, defaulted and
    validated by `TuneConfig`, except the experiment's CPU-sized preset (batch_size 64, epochs 1,
    max_tokens 128, prompt_length 16; the tuner's paper-scale defaults stay `dpsynth dp-tune`'s)
    and "exactly one of epochs and steps". The grid axes `modes`, `epsilons`, `learning_rates`
    (1e-3; per mode `mode_learning_rates`, e.g. `{full: [0.001], prompt: [0.03]}`) and
    `clip_norms`; `replicates` (independent repeats); `loss: full` is the tuner's `full_lm`;
    `options` sets any other `TuneConfig` field (e.g. `time_budget: 600`, `microbatch_size`).
    `max_tokens: auto` and `options.time_budget` (with `recipe: auto`) let each run choose its
    example length (DP) and its token budget (this machine's speed) when it starts;
    `generate.max_tokens: null` then samples at the chosen length.
    """)


# One sampling setting of the generator (a grid point): the sampling options of the library's
# `SamplerConfig`, declared and validated there.
SamplingConfig = SamplingOptions


# The generation job's settings that the stage sets itself (from the grid point, the model and the
# sizes): not `options`.
GENERATE_STAGE_SET = ("model_dir", "out_dir", "num_examples", "valid_examples", "seed", "sampling", "max_len",
                      "batch_size", "allow_non_private", "label_distribution")


def _validate_generate(self, key: str) -> None:
    """The experiment's own keys here; `batch_size` and every `options` entry by the job's config
    (`dpsynth.generate.plan.GenerateConfig.__post_init__`), its message named by key."""
    _choice(self.label_distribution, LABEL_DISTRIBUTIONS, f"{key}.label_distribution")
    if self.label_distribution == "dp_histogram":
        _check(self.label_noise_multiplier is not None and self.label_noise_multiplier > 0,
               f"{key}.label_noise_multiplier", "must be > 0 with `label_distribution: dp_histogram` "
               f"(sigma of the Gaussian mechanism on the label counts), got {self.label_noise_multiplier}")
    else:
        _check(self.label_noise_multiplier is None, f"{key}.label_noise_multiplier",
               "only applies to `label_distribution: dp_histogram`")
    _nonempty(self.samplings, f"{key}.samplings")
    for i, s in enumerate(self.samplings):
        try:
            s.validate()
        except binding.SettingError as e:
            raise ConfigError(f"{key}.samplings[{i}].{e.field}: {e.message}") from None
    _nonempty(self.multiples, f"{key}.multiples")
    for i, m in enumerate(self.multiples):
        _check(m > 0 and math.isfinite(m), f"{key}.multiples[{i}]", f"must be > 0, got {m}")
    _check(0 < self.valid_fraction <= 1, f"{key}.valid_fraction", f"must be in (0, 1], got {self.valid_fraction}")
    _check(self.max_tokens is None or self.max_tokens >= 8, f"{key}.max_tokens",
           f"must be >= 8 (or null: the length DP tuning trained on), got {self.max_tokens}")
    for name in self.options:
        _check(name not in GENERATE_STAGE_SET, f"{key}.options.{name}",
               "is set by the experiment (the grid point, the model, the sizes, generate.max_tokens / batch_size)")
    _library_check(generate_plan_lib.GenerateConfig, {"model_dir": "", "out_dir": "", "num_examples": 1,
                                                      "batch_size": self.batch_size, **dict(self.options)},
                   key, ("batch_size",), self.options)


# Synthetic-data generation: the job's `batch_size` (declared, defaulted and validated by
# `dpsynth.generate.plan.GenerateConfig`) at the experiment's CPU-sized preset (32), the grid axes
# `samplings` (the library's `SamplingOptions`) and `multiples`, the experiment's own keys, and
# `options` (any other job setting, e.g. `examples_per_shard`, `memory_limit`, `postprocess`).
GenerateConfig = binding.subconfig(
    "GenerateConfig", generate_plan_lib.GenerateConfig, lambda f: f.name == "batch_size", module=__name__,
    preset={"batch_size": 32},
    extra=[("samplings", tuple[SamplingOptions, ...], dataclasses.field(default=(SamplingOptions(),))),
           ("multiples", tuple[float, ...], dataclasses.field(default=(1.0,))),
           ("valid_fraction", float, dataclasses.field(default=0.1)),
           # null: the length the model was DP-tuned on (with dp_tune.max_tokens: auto); the job's max_len
           ("max_tokens", int | None, dataclasses.field(default=128)),
           ("audit_memorisation", bool, dataclasses.field(default=False)),
           ("label_distribution", str, _added("uniform")),
           ("label_noise_multiplier", float | None, _added(None, unless_default="label_distribution")),
           ("options", Mapping[str, Any], dataclasses.field(default_factory=dict))],
    namespace={"validate": _validate_generate},
    doc="""Synthetic-data generation (`dpsynth.generate.plan.GenerateConfig`'s batch_size at 32, plus the grid).

    Keys: `samplings` and `multiples` (grid axes: sampling options; synthetic train size as a
    multiple of |D_train|), `valid_fraction` (synthetic valid size as a fraction of train),
    `max_tokens` (the job's max_len; null: the length DP tuning chose), `batch_size` (the job's, or
    auto with `options.memory_limit`), `audit_memorisation`, `label_distribution` (uniform |
    dp_histogram) with `label_noise_multiplier`, and `options`: any other job setting, validated
    by the job's config when the file loads.
    """)


# The evaluation's settings that the stage sets itself (the pretrained model, the grid's epsilons,
# `baselines`): not `options`.
EVALUATE_STAGE_SET = ("classifiers", "model_dir", "dp_epsilons", "real_baseline")


def _validate_evaluate(self, key: str) -> None:
    """`classifiers` and every `options` entry by the library's `EvaluateConfig` (with the stage's
    pretrained model as its model_dir), its message named by key."""
    _nonempty(self.classifiers, f"{key}.classifiers")
    for i, c in enumerate(self.classifiers):
        _choice(c, registry.names(), f"{key}.classifiers[{i}]")
    for name in self.options:
        _check(name not in EVALUATE_STAGE_SET, f"{key}.options.{name}",
               "is set by the experiment (evaluate.classifiers / baselines, the pretrained model, the grid's epsilons)")
    _library_check(scoring_lib.EvaluateConfig, {"classifiers": tuple(self.classifiers), "model_dir": "the pretrained model",
                                            **dict(self.options)}, key, ("classifiers",), self.options)


# The batch metric report over every trial's synthetic data: the library's classifier list
# (`dpsynth.evaluate.scoring.EvaluateConfig`, declared and validated there), `baselines` (the
# real-data and DP-on-real peers at the grid's epsilons) and `options` (any other of its fields).
EvaluateConfig = binding.subconfig(
    "EvaluateConfig", scoring_lib.EvaluateConfig, lambda f: f.name == "classifiers", module=__name__,
    extra=[("baselines", bool, dataclasses.field(default=True)),
           ("options", Mapping[str, Any], dataclasses.field(default_factory=dict))],
    namespace={"validate": _validate_evaluate},
    doc="The batch metric report (`dpsynth.evaluate.scoring.EvaluateConfig`'s classifiers; `baselines`: the "
        "real-data and DP-on-real peers; `options`: its other fields, validated by it when the file loads).")


def _validate_select(self, key: str) -> None:
    """Off without an epsilon; else the library's validation (`dp_select.SelectConfig`, with `options`;
    its split follows `sensitive:`), its message named by key."""
    if self.epsilon is None:
        return
    _library_check(dp_select_lib.SelectConfig, {"epsilon": self.epsilon, "mechanism": self.mechanism,
                                                **dict(self.options)}, key, ("epsilon", "mechanism"), self.options)


# DP selection of one corpus per DP run (mode, epsilon, replicate) on the real D_valid: the library's
# `dpsynth.evaluate.dp_select.SelectConfig` (its epsilon and mechanism as keys, any other field
# through `options`: classifier, cnn, repeats, max_epochs), off unless `epsilon` is set.
SelectConfig = binding.subconfig(
    "SelectConfig", dp_select_lib.SelectConfig, lambda f: f.name in ("epsilon", "mechanism"), module=__name__,
    preset={"epsilon": None}, retype={"epsilon": float | None},
    extra=[("options", Mapping[str, Any], dataclasses.field(default_factory=dict))],
    namespace={"validate": _validate_select},
    doc="DP selection on the real D_valid (`dpsynth.evaluate.dp_select.SelectConfig`'s epsilon and mechanism; "
        "`options`: its other fields); off unless `epsilon` is set.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
    """A whole experiment: data, model, grid. Build with `load_config` / `from_dict`."""

    name: str = "experiment"
    out: str | None = None
    seed: int = 0
    public: PublicConfig = PublicConfig()
    sensitive: SensitiveConfig = SensitiveConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    dedup: DedupConfig = DedupConfig()
    pretrain: PretrainConfig = PretrainConfig()
    dp_tune: DPTuneConfig = DPTuneConfig()
    generate: GenerateConfig = GenerateConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    select: SelectConfig = SelectConfig()
    # A pretrained model directory in place of the public/dedup/tokenizer/pretrain stages (`BASE_MODEL_REPLACES`).
    base_model: str | None = None

    def validate(self, key: str = "") -> None:
        _check(bool(self.name), "name", "must be a non-empty string")
        if self.base_model is not None:
            _validate_base_model(self)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if dataclasses.is_dataclass(value):
                value.validate(f.name)
        if self.public.plant and not self.sensitive.embedded and not self.sensitive.train:
            raise ConfigError("public.plant: needs a sensitive training set to plant from")
        if self.dp_tune.privacy_unit == "user" and not self.sensitive.user_column:
            raise ConfigError("dp_tune.privacy_unit: user needs sensitive.user_column (the field holding the user id)")
        # Releases that cannot be composed: refused now. Imported here, not at the top: dp_accounting
        # takes ~0.9 s to import and loading a config should not pay it.
        from dpsynth.experiment.privacy import unit_conflicts

        for key, message in unit_conflicts(self):
            raise ConfigError(f"{key}: with dp_tune.privacy_unit: user, {message}")

    def replace(self, **sections: Any) -> "ExperimentConfig":
        """A copy with some keys changed, validated: `cfg.replace(pretrain={"steps": 10})`."""
        data = to_dict(self)
        for name, value in sections.items():
            if isinstance(value, Mapping) and isinstance(data.get(name), dict):
                data[name] = {**data[name], **value}
            else:
                data[name] = value
        return from_dict(data)


# The sections a `base_model` replaces: its own weights and tokenizer stand for the public corpus, its
# dedup against the sensitive data, the released tokenizer and the pretraining.
BASE_MODEL_REPLACES = ("public", "dedup", "tokenizer", "pretrain")


def _validate_base_model(config: ExperimentConfig) -> None:
    """`base_model`: a model directory (read as JSON only: no JAX at load time) that is a base, never a
    DP-tuned model (whose own release about some data this experiment would not account for); the
    sections it replaces left at their defaults (a set one would be silently unused)."""
    import json

    from dpsynth.outdir import MANIFEST

    # (`dpsynth.models.directory.MODEL_FORMAT` and `dpsynth.dp.report.REPORT_JSON`: those modules import JAX
    # and dp-accounting, which loading a config does not pay; tests/experiment/test_base_model.py checks equality)
    MODEL_FORMAT, REPORT_JSON = "dpsynth.model", "privacy_report.json"
    path = resolve_path(config.base_model)
    manifest = os.path.join(path, MANIFEST)
    hint = "make one with `dpsynth import-model --hf DIR | --gguf FILE --out DIR`"
    _check(os.path.isdir(path), "base_model", f"{path}: no such directory ({hint})")
    try:
        with open(manifest, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"base_model: {path}: not a dpsynth model directory ({type(e).__name__} reading "
                          f"{MANIFEST}; {hint})") from None
    _check(isinstance(data, dict) and data.get("format") == MODEL_FORMAT, "base_model",
           f"{path}: {MANIFEST} is not a {MODEL_FORMAT} manifest ({hint})")
    _check(not data.get("base") and not os.path.exists(os.path.join(path, REPORT_JSON)), "base_model",
           f"{path}: a DP-tuned model (adapters or a privacy report); give a pretrained or imported base model")
    for name in BASE_MODEL_REPLACES:
        _check(getattr(config, name) == getattr(ExperimentConfig, name), name,
               "not used with base_model (the base model and its tokenizer replace the public corpus, dedup, "
               "tokenizer and pretraining); remove the section")


# ----------------------------------------------------------------------------- parsing


def load_config(path: str) -> ExperimentConfig:
    """Reads and validates a YAML experiment config.

    Relative data paths are resolved against the current directory (as the CLI sees them).

    Raises:
        ConfigError: with the file name and the offending key.
    """
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: config file not found") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from e  # one line
    if data is None:
        data = {}
    try:
        return from_dict(data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def from_dict(data: Mapping[str, Any]) -> ExperimentConfig:
    """Builds and validates an `ExperimentConfig` from a plain mapping (parsed YAML)."""
    config = _build(ExperimentConfig, data, "")
    config.validate()
    return config


def _build(cls: type, data: Any, key: str) -> Any:
    where = key or "(top level)"
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for name, value in data.items():
        sub = f"{key}.{name}" if key else str(name)
        if name not in fields:
            close = difflib.get_close_matches(str(name), list(fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(fields)})"
            raise ConfigError(f"{sub}: unknown key{hint}")
        kwargs[name] = _convert(hints[name], value, sub)
    return cls(**kwargs)


def _convert(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        for tp_i in inner[:-1]:  # e.g. `int | str` (a number or "auto"): the first type the value is
            try:
                return _convert(tp_i, value, key)
            except ConfigError:
                pass
        return _convert(inner[-1], value, key)
    if value is None:
        raise ConfigError(f"{key}: must not be null")
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key)
    if origin is tuple:
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            value = [value]  # a scalar stands for a one-element list
        return tuple(_convert(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
    if origin in (Mapping, dict) or tp is Mapping:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        return {str(k): v for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str) and value.strip().lower() in ("inf", "+inf", "infinity", ".inf"):
            return math.inf
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            try:
                return float(value)  # YAML 1.1 reads `1e-3` as a string
            except (TypeError, ValueError):
                raise ConfigError(f"{key}: expected a number, got {value!r}") from None
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported type {tp!r}")  # a bug in the schema, not in the YAML


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def _choice(value: str, choices: tuple[str, ...], key: str) -> None:
    _check(value in choices, key, f"must be one of {', '.join(choices)}; got {value!r}")


def _listed(value: Any) -> tuple:
    """A YAML list as a tuple; a scalar stands for a one-element list."""
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def _nonempty(values: tuple, key: str) -> None:
    _check(len(values) > 0, key, "must list at least one value")


def resolve_path(path: str, base: str | None = None) -> str:
    """`path` made absolute against `base` (default: the current directory); URLs unchanged."""
    if "://" in path or os.path.isabs(path):
        return path
    return os.path.abspath(os.path.join(base or os.getcwd(), path))
