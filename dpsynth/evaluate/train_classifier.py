"""Training downstream classifiers with the shared training core; sweeps, repeats, DP-on-real.

Protocol (Kurakin et al. 2023): train on synthetic train, select (early stopping and the
learning-rate / weight-decay sweep) on synthetic valid, test on real test. Baselines: the same
on real train / real valid (epsilon = inf), and DP-on-real: DP-Adam through `DPSGDStrategy`
with Poisson sampling, sweeping the clipping norm too.

Each trial scores its best epoch on every test set with `dpsynth.evaluate.scores` (accuracy,
balanced accuracy, macro-F1, from one pass of predictions); early stopping and the selection
read validation accuracy only.

Every trial runs on `dpsynth.train.core.make_train_functions` (the one core): per-example
softmax cross-entropy as `loss_fn`, `optax.adamw` with the learning rate and weight decay
injected as optimizer-state hyperparameters, so a whole non-private sweep compiles its step
once. Early stopping keeps the parameters of the epoch with the best validation accuracy and
stops after `patience` epochs without improvement.

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
import functools
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dpsynth.evaluate import classifiers
from dpsynth.evaluate import scores as scores_lib
from dpsynth.train import core, loop

logger = logging.getLogger("dpsynth.evaluate")

# A small CPU default grid and a wider one; the sweep is configurable either way.
SMALL_LR_GRID = (1e-3, 3e-3)
SMALL_WD_GRID = (1e-4,)
WIDE_LR_GRID = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
WIDE_WD_GRID = (0.0, 1e-4, 1e-3, 1e-2)

SWEEP_ACCOUNTINGS = ("composed", "selected-only")
# Where the WordCNN vocabulary comes from: "auto" = the own training set when training is
# non-private, else "tokenizer" with a model_dir and "hashing" without one.
VOCABULARIES = ("auto", "tokenizer", "hashing", "train")
# Seconds between step-level progress lines of one training run (as the DP tuner).
PROGRESS_INTERVAL = 10.0
# Tags of the streams derived from the secret sweep seed (per trial) and of the noise key.
_TRIAL_STREAM, _NOISE_STREAM = 0xC1A55, 0x7E5


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training run. Attributes: batch_size (non-private), max_epochs, patience (epochs
    without validation improvement before stopping), eval_batch_size, learning_rate,
    weight_decay, seed."""

    batch_size: int = 32
    max_epochs: int = 10
    patience: int = 2
    eval_batch_size: int = 256
    learning_rate: float = 1e-3
    weight_decay: float = 1e-4
    seed: int = 0

    def __post_init__(self):
        if min(self.batch_size, self.max_epochs, self.patience, self.eval_batch_size) < 1:
            raise ValueError("batch_size, max_epochs, patience and eval_batch_size must be >= 1")
        if self.learning_rate <= 0 or self.weight_decay < 0:
            raise ValueError("learning_rate must be > 0 and weight_decay >= 0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DPConfig:
    """DP-SGD (DP-Adam) settings for the DP-on-real baseline.

    Attributes:
      epsilon: target epsilon (finite, > 0).
      delta: target delta; None = 1 / |train|.
      clip_norm: per-example L2 clipping norm C.
      expected_batch_size: q * N of the Poisson sampling.
      epochs: expected passes over the data (steps = ceil(epochs / q)).
      microbatch_size: fixed shape of the padded microbatches.
      accountant: "rdp" or "pld" (calibration and the budget check).
      sparse_embedding: clip a declared input-embedding table (WordCNN) with the exact sparse
        path of `dpsynth.dp.sparse` (same clipped sum, far cheaper) instead of vmap(grad).
      sweep_accounting: "composed" (all k trials of a sweep together meet epsilon) or
        "selected-only" (each trial alone meets it; only the selected one is accounted, as in
        the paper; declared as a side channel).
      seed: the Poisson-sampling and noise seed. None (default): a secret 64-bit seed from
        the OS entropy pool per sweep, never written anywhere. A fixed seed makes the noise
        reproducible by whoever knows it (a side channel in the report; tests only).
    """

    epsilon: float
    delta: float | None = None
    clip_norm: float = 1.0
    expected_batch_size: int = 64
    epochs: float = 5.0
    microbatch_size: int = 16
    accountant: str = "rdp"
    sparse_embedding: bool = True
    sweep_accounting: str = "composed"
    seed: int | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self):
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError(f"DP epsilon must be finite and > 0, got {self.epsilon}")
        if self.clip_norm <= 0 or self.expected_batch_size < 1 or self.epochs <= 0 or self.microbatch_size < 1:
            raise ValueError("clip_norm, expected_batch_size, epochs and microbatch_size must be positive")
        if self.sweep_accounting not in SWEEP_ACCOUNTINGS:
            raise ValueError(f"sweep_accounting must be one of {SWEEP_ACCOUNTINGS}, got {self.sweep_accounting!r}")

    def public(self) -> dict[str, Any]:
        """The settings that may be published (everything but the seed)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "seed"}
        out["fixed_seed"] = self.seed is not None
        return out

    def plan(self, dataset_size: int, trials: int = 1):
        """The privacy plan of one trial of a k-trial sweep (`dpsynth.dp.plan.plan_privacy`).

        "composed": calibrated with `compositions=trials`; "selected-only": with 1. The plan
        does not depend on the clipping norm or the seed (sigma is relative to C).
        """
        return _plan(self.expected_batch_size, self.epochs, self.epsilon, self.delta, self.accountant,
                     int(dataset_size), int(trials) if self.sweep_accounting == "composed" else 1)


@functools.lru_cache(maxsize=64)
def _plan(expected_batch_size, epochs, epsilon, delta, accountant, dataset_size, compositions):
    """`plan_privacy`, memoised: a calibration is a deterministic function of these arguments
    and costs seconds (the evaluate stage asks for the same plan once per classifier)."""
    from dpsynth.dp.plan import plan_privacy

    return plan_privacy(dataset_size=dataset_size, expected_batch_size=expected_batch_size, epochs=epochs,
                        epsilon=epsilon, delta=delta, accountant=accountant, compositions=compositions)


@dataclasses.dataclass(frozen=True)
class Split:
    """Featurized examples: ids int32 [N, T] and labels int32 [N]."""

    x: np.ndarray
    y: np.ndarray

    def __post_init__(self):
        if len(self.x) != len(self.y) or len(self.x) == 0:
            raise ValueError(f"a split needs as many labels as examples (> 0), got {len(self.x)} and {len(self.y)}")


@dataclasses.dataclass(frozen=True)
class TrialResult:
    """One training run: best validation accuracy, test accuracies of the best epoch, and that
    epoch's scores on every test set (`test_scores[name]`: {"accuracy", "balanced_accuracy",
    "macro_f1"}, `dpsynth.evaluate.scores`; selection and early stopping read accuracy only)."""

    valid_accuracy: float
    test_accuracy: dict[str, float]
    best_epoch: int
    epochs: int
    steps: int
    epsilon: float = math.inf
    noise_multiplier: float = 0.0
    test_scores: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)


# ----------------------------------------------------------------------------- the model bundle


@dataclasses.dataclass
class Model:
    """A Flax classifier with its initial parameters split into trainable and frozen parts."""

    module: Any
    params: Any
    frozen: Any
    featurize: Callable[[Sequence[str]], np.ndarray]
    name: str
    # Path of an input-embedding table used only as `table[x]` (the DP path clips it sparsely).
    embedding_path: tuple[str, ...] | None = None
    # Where the input vocabulary came from: {"source", "detail", "size"}.
    vocabulary: dict | None = None

    def variables(self, params, frozen):
        return {"params": {**frozen, **params}}


def wordcnn_model(train_texts: Sequence[str] | None, num_classes: int, config: classifiers.WordCNNConfig,
                  seed: int = 0, *, vocabulary: str = "train", tokenizer: Any = None,
                  tokenizer_source: str = "the tokenizer") -> Model:
    """A fresh WordCNN; its input vocabulary comes from `vocabulary`.

    Args:
      train_texts: the training texts; read only when `vocabulary == "train"`.
      vocabulary: "train" (the `config.vocab_words` most frequent words of `train_texts`),
        "tokenizer" (the pieces of `tokenizer`, a public SentencePiece model: the CNN reads
        piece ids, `config.max_len` of them) or "hashing" (words hashed into
        `config.vocab_words` buckets; no data).
      tokenizer: a `dpsynth.tokens.Tokenizer` for "tokenizer"; tokenizer_source names it.
    """
    if vocabulary == "train":
        if train_texts is None:
            raise ValueError("a vocabulary from the training set needs its texts")
        feat = classifiers.WordFeaturizer.fit(train_texts, config)
        vocab = {"source": "train", "detail": f"the {feat.vocab.size - 2} most frequent words of the training set",
                 "size": feat.vocab_size}
    elif vocabulary == "tokenizer":
        if tokenizer is None:
            raise ValueError("a vocabulary from tokenizer pieces needs a tokenizer (a model_dir)")
        feat = classifiers.SubwordFeaturizer(tokenizer, config.max_len)
        vocab = {"source": "tokenizer", "size": feat.vocab_size,
                 "detail": f"the {feat.vocab_size} SentencePiece pieces of {tokenizer_source} (sha256 "
                           f"{tokenizer.sha256}); texts are read as piece ids"}
    elif vocabulary == "hashing":
        feat = classifiers.HashingWordFeaturizer(config.vocab_words, config.max_len)
        vocab = {"source": "hashing", "size": feat.vocab_size,
                 "detail": f"words hashed (CRC-32) into {config.vocab_words} buckets; no data read"}
    else:
        raise ValueError(f"WordCNN vocabulary must be one of {VOCABULARIES[1:]}, got {vocabulary!r}")
    module = classifiers.WordCNN(feat.vocab_size, num_classes, config)
    params = module.init(jax.random.PRNGKey(seed), jnp.zeros((1, config.max_len), jnp.int32))["params"]
    return Model(module, params, {}, feat, "wordcnn", embedding_path=("embed", "embedding"), vocabulary=vocab)


@dataclasses.dataclass(frozen=True)
class Backbone:
    """A pretrained LM: `ModelConfig`, base parameters and its `Tokenizer`."""

    config: Any
    params: Any
    tokenizer: Any

    @classmethod
    def load(cls, model_dir: str) -> "Backbone":
        from dpsynth.models.directory import load_model  # Orbax (~0.5 s to import): only when a model is loaded

        loaded = load_model(model_dir)
        return cls(loaded.config, loaded.variables["params"], loaded.tokenizer)


def backbone_model(backbone: Backbone, num_classes: int, *, pooling: str = "mean", max_len: int = 128,
                   freeze_backbone: bool = False, seed: int = 0) -> Model:
    """The pretrained LM plus a fresh linear head; the whole model or only the head trains."""
    import dataclasses as dc

    cfg = backbone.config
    if getattr(cfg, "lora_rank", 0) or getattr(cfg, "prompt_length", 0):
        cfg = dc.replace(cfg, lora_rank=0, prompt_length=0)  # the classifier uses the base weights
    if max_len > cfg.max_len:
        raise ValueError(f"max_len {max_len} exceeds the backbone's max_len {cfg.max_len}")
    feat = classifiers.SubwordFeaturizer(backbone.tokenizer, max_len)
    module = classifiers.BackboneClassifier(cfg, num_classes, pooling, pad_id=feat.pad_id)
    init = module.init(jax.random.PRNGKey(seed), jnp.zeros((1, max_len), jnp.int32))["params"]
    head = {"head": init["head"]}
    base = {"backbone": jax.tree.map(jnp.asarray, backbone.params)}
    vocab = {"source": "tokenizer", "size": feat.vocab_size,
             "detail": f"the pretrained model's tokenizer (sha256 {backbone.tokenizer.sha256})"}
    if freeze_backbone:
        return Model(module, head, base, feat, "backbone-head", vocabulary=vocab)
    return Model(module, {**base, **head}, {}, feat, "backbone", vocabulary=vocab)


# ----------------------------------------------------------------------------- training


def _loss_fn(model: Model):
    def loss_fn(params, frozen, batch, key):
        del key
        logits = model.module.apply(model.variables(params, frozen), batch["x"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])
        return loss, {"correct": (logits.argmax(-1) == batch["y"]).astype(jnp.float32)}
    return loss_fn


def _embedded_loss(model: Model, spec):
    """The same loss as `_loss_fn`, written over the embedded inputs (`dpsynth.dp.sparse`)."""
    from dpsynth.dp import sparse

    def from_embedded(rest, frozen, batch, embedded, key):
        del key
        logits = model.module.apply(model.variables(rest, frozen), batch["x"], embedded=embedded)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])
        return loss, {"correct": (logits.argmax(-1) == batch["y"]).astype(jnp.float32)}

    return sparse.EmbeddedLoss(spec, from_embedded)


def make_optimizer() -> optax.GradientTransformation:
    """AdamW with learning rate and weight decay as state hyperparameters (one compile per sweep)."""
    return optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3, weight_decay=1e-4)


def _set_hyper(opt_state, learning_rate: float, weight_decay: float):
    hp = dict(opt_state.hyperparams)
    hp["learning_rate"] = jnp.asarray(learning_rate, jnp.float32)
    hp["weight_decay"] = jnp.asarray(weight_decay, jnp.float32)
    return opt_state._replace(hyperparams=hp)


class Trainer:
    """Runs trials of one model on the training core; compiled functions are reused across trials.

    Every run prints step-level progress (rate, ETA) at most every `progress_interval` seconds.
    """

    def __init__(self, model: Model, progress_interval: float = PROGRESS_INTERVAL):
        self.model = model
        self.progress_interval = progress_interval
        self.optimizer = make_optimizer()
        self._fns: dict[Any, core.TrainFunctions] = {}
        module, variables = model.module, model.variables
        self._predict = jax.jit(lambda p, f, x: module.apply(variables(p, f), x).argmax(-1))

    def fns(self, strategy=None, key=("mean",)) -> core.TrainFunctions:
        if key not in self._fns:
            spec = getattr(strategy, "embedding", None)
            loss_fn = _loss_fn(self.model) if spec is None else _embedded_loss(self.model, spec)
            self._fns[key] = core.make_train_functions(loss_fn, self.optimizer, strategy)
        return self._fns[key]

    def predict(self, params, frozen, split: Split, batch_size: int) -> np.ndarray:
        """Predicted class ids [N] of `split`, in fixed-shape batches of `batch_size`."""
        preds = []
        for start in range(0, len(split.x), batch_size):
            x = split.x[start : start + batch_size]
            n = len(x)
            if n < batch_size:  # fixed shape: pad and ignore
                x = np.concatenate([x, np.zeros((batch_size - n, x.shape[1]), x.dtype)])
            preds.append(np.asarray(self._predict(params, frozen, x))[:n])
        return np.concatenate(preds)

    def accuracy(self, params, frozen, split: Split, batch_size: int) -> float:
        """The share of correct predictions on `split` (what early stopping and selection read)."""
        return scores_lib.accuracy(split.y, self.predict(params, frozen, split, batch_size))

    def score(self, params, frozen, split: Split, batch_size: int) -> scores_lib.ClassificationScores:
        """Accuracy, balanced accuracy and macro-F1 on `split` from one pass of predictions."""
        return scores_lib.classification_scores(split.y, self.predict(params, frozen, split, batch_size))

    def _init_state(self, fns, config: TrainConfig, rng=None):
        params = jax.tree.map(jnp.array, self.model.params)  # fresh copies: steps donate buffers
        opt_state = _set_hyper(self.optimizer.init(params), config.learning_rate, config.weight_decay)
        return fns.init_state(params, self.model.frozen, rng=config.seed if rng is None else rng, opt_state=opt_state)

    def _run(self, state, *, step: Callable, batch: Callable[[int], Any], steps_per_epoch: int, total: int,
             valid: Split, tests: Mapping[str, Split], config: TrainConfig, patience: int | None, desc: str):
        """`total` steps on the outer loop, validated after every epoch (early stopping).

        Returns (best valid accuracy, its epoch, epochs run, the scores of the best epoch's
        parameters on each test set (`ClassificationScores`), steps run).
        """
        stopper = _EarlyStopping(lambda state: self.accuracy(state.params, state.frozen, valid, config.eval_batch_size),
                                 steps_per_epoch, patience)
        state = loop.run_loop(
            state, start=0, total=total, batch=batch, step=step,
            after_step=lambda done, state, metrics: {"epoch": math.ceil(done / steps_per_epoch)},
            evaluate=stopper.evaluate, eval_every=steps_per_epoch, should_stop=stopper.should_stop, desc=desc,
            progress_interval=self.progress_interval).state
        params = stopper.best_params
        tests_scores = {name: self.score(params, state.frozen, s, config.eval_batch_size) for name, s in tests.items()}
        return stopper.best_acc, stopper.best_epoch, stopper.epochs, tests_scores, int(state.step)

    def train(self, train: Split, valid: Split, tests: Mapping[str, Split], config: TrainConfig,
              desc: str = "classifier") -> TrialResult:
        """Non-private training with shuffled fixed-size batches (last batch padded and masked)."""
        fns = self.fns()
        state = self._init_state(fns, config)
        n, bs = len(train.x), config.batch_size
        examples = {"x": train.x, "y": train.y}
        steps_per_epoch = math.ceil(n / bs)
        orders: dict[int, np.ndarray] = {}  # the current epoch's permutation

        def batch(step: int) -> dict:
            epoch, k = step // steps_per_epoch + 1, step % steps_per_epoch
            if epoch not in orders:
                orders.clear()
                orders[epoch] = np.random.default_rng([config.seed, epoch]).permutation(n)
            idx = orders[epoch][k * bs : (k + 1) * bs]
            idx = np.concatenate([idx, -np.ones(bs - len(idx), np.int64)])
            return fns.shard_batch(_gather(examples, idx))

        best, best_epoch, epochs, tests_scores, steps = self._run(
            state, step=fns.train_step, batch=batch, steps_per_epoch=steps_per_epoch,
            total=config.max_epochs * steps_per_epoch, valid=valid, tests=tests, config=config,
            patience=config.patience, desc=desc)
        return _trial_result(best, tests_scores, best_epoch, epochs, steps)

    def dp_strategy(self, dp: DPConfig, sigma: float, expected_batch_size: float):
        """`DPSGDStrategy`; sparse-embedding clipping (same result, no per-example table copies)
        when the model declares an embedding table and `dp.sparse_embedding`."""
        from dpsynth.dp import sparse
        from dpsynth.dp.strategy import DPSGDStrategy

        path = self.model.embedding_path if dp.sparse_embedding else None
        spec = sparse.EmbeddingSpec(param_path=path, ids_key="x") if path else None
        return DPSGDStrategy(clip_norm=dp.clip_norm, noise_multiplier=sigma,
                             expected_batch_size=expected_batch_size, embedding=spec)

    def train_dp(self, train: Split, valid: Split, tests: Mapping[str, Split], config: TrainConfig,
                 dp: DPConfig, *, plan=None, seed: int | None = None, desc: str = "dp classifier") -> TrialResult:
        """DP-Adam: Poisson batches, clipped per-example gradients, calibrated Gaussian noise.

        Args:
          plan: the `PrivacyPlan` of this trial (default: `dp.plan(len(train.x))`, one trial);
            its sigma is the sigma of the strategy that adds the noise, its T the steps run.
          seed: the sampling/noise seed (default: `dp.seed`, else a fresh secret seed). It is
            never returned, logged or written; the public `config.seed` plays no part here.

        `config.max_epochs` is ignored: the plan fixes the number of steps T; validation runs
        after every ceil(1 / q) steps ("an epoch") and never stops the run early, so exactly T
        steps run (the returned `steps`).
        """
        from dpsynth.dp import accounting, sampling, seeds

        n = len(train.x)
        plan = plan if plan is not None else dp.plan(n)
        if plan.dataset_size != n:
            raise ValueError(f"the privacy plan is for {plan.dataset_size} examples, the training set has {n}")
        if seed is None:
            seed = dp.seed if dp.seed is not None else seeds.secret_seed()
        q, sigma, total_steps = plan.sampling_probability, plan.noise_multiplier, plan.steps
        strategy = self.dp_strategy(dp, sigma, plan.expected_batch_size)
        fns = self.fns(strategy, key=("dp", dp.clip_norm, sigma, plan.expected_batch_size, strategy.embedding))
        sampler = sampling.PoissonSampler(n, plan.expected_batch_size, dp.microbatch_size, seed=seed)
        steps_per_epoch = max(1, math.ceil(1.0 / q))
        examples = {"x": train.x, "y": train.y}
        state = self._init_state(fns, config, rng=jax.random.fold_in(seeds.jax_key(seed), _NOISE_STREAM))

        def batch(step: int) -> list[dict]:
            return [sampling.gather(examples, m) for m in sampler.microbatches(step)]

        best, best_epoch, epochs, tests_scores, steps = self._run(
            state, step=fns.accumulated_step, batch=batch, steps_per_epoch=steps_per_epoch, total=total_steps,
            valid=valid, tests=tests, config=config, patience=None, desc=desc)
        if steps != total_steps:
            raise RuntimeError(f"DP-on-real ran {steps} steps, the privacy plan has {total_steps}")
        spent = accounting.epsilon(q, total_steps, sigma, plan.delta, plan.accountant)
        return _trial_result(best, tests_scores, best_epoch, epochs, steps, epsilon=spent, noise_multiplier=sigma)


def _trial_result(best: float, tests_scores: Mapping[str, scores_lib.ClassificationScores], best_epoch: int,
                  epochs: int, steps: int, **kw) -> TrialResult:
    return TrialResult(best, {k: s.accuracy for k, s in tests_scores.items()}, best_epoch, epochs, steps,
                       test_scores={k: s.as_dict() for k, s in tests_scores.items()}, **kw)


class _EarlyStopping:
    """The `evaluate` and `should_stop` hooks of a classifier run.

    Validation accuracy after every epoch; keeps the parameters of the best epoch (the first of
    equal ones) and stops once `patience` epochs passed without improvement (None: never).
    """

    def __init__(self, accuracy: Callable[[Any], float], steps_per_epoch: int, patience: int | None):
        self._accuracy, self._steps_per_epoch, self._patience = accuracy, steps_per_epoch, patience
        self.best_acc, self.best_epoch, self.best_params, self.epochs = -1.0, 0, None, 0
        self._stop = False

    def evaluate(self, done: int, state) -> None:
        epoch = math.ceil(done / self._steps_per_epoch)
        self.epochs = epoch
        acc = self._accuracy(state)
        if acc > self.best_acc:
            self.best_acc, self.best_epoch, self.best_params = acc, epoch, jax.device_get(state.params)
        elif self._patience is not None and epoch - self.best_epoch >= self._patience:
            self._stop = True

    def should_stop(self, done: int, state) -> bool:
        return self._stop


def _gather(examples: dict, idx: np.ndarray) -> dict:
    mask = idx >= 0
    safe = np.where(mask, idx, 0)
    out = {k: v[safe] for k, v in examples.items()}
    out["mask"] = mask.astype(np.float32)
    return out


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
    if dp.sweep_accounting == "composed":
        channels.append({"name": "validation-based selection", "detail":
                         f"{trials} trials ({grid}) were trained on D_train, each with noise calibrated so that all "
                         f"{trials} together meet the target (epsilon, delta) (the ledger holds all {trials}); early "
                         "stopping and the choice of the setting read the real D_valid, and the D_valid accuracies "
                         "are recorded, without DP with respect to D_valid"})
    else:
        channels.append({"name": "selected-only accounting", "detail":
                         f"the paper's accounting: each of the {trials} trials ({grid}) was trained on D_train at the "
                         "full target (epsilon, delta) on its own and only the selected trial is in the ledger. The "
                         f"other {trials - 1} trials (including the {repeats - 1} other repeats whose accuracies enter "
                         "the reported mean) and the selection on the real D_valid are NOT covered: all that was "
                         f"computed together is only the composition of {trials} such runs"})
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
        accounted = total if dp.sweep_accounting == "composed" else 1
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
        if dp is not None and dp.sweep_accounting == "composed":
            ledger.record_steps(plan.ledger_entry(steps=r.steps, clip_norm=clip, name=f"dp_on_real trial {i}"))
        bar.update(1, valid_accuracy=r.valid_accuracy)
        if progress is not None:
            progress()
    bar.close()
    groups: dict[tuple, list[dict]] = {}
    for t in trials:
        groups.setdefault((t["learning_rate"], t["weight_decay"], t["clip_norm"]), []).append(t)
    key, rows = max(groups.items(), key=lambda kv: np.mean([r["valid_accuracy"] for r in kv[1]]))
    test_mean = {k: float(np.mean([r[f"{k}_accuracy"] for r in rows])) for k in tests}
    test_std = {k: float(np.std([r[f"{k}_accuracy"] for r in rows])) for k in tests}
    score_mean = {k: {m: float(np.mean([r[f"{k}_{m}"] for r in rows])) for m in scores_lib.METRICS} for k in tests}
    score_std = {k: {m: float(np.std([r[f"{k}_{m}"] for r in rows])) for m in scores_lib.METRICS} for k in tests}
    selected = {"learning_rate": key[0], "weight_decay": key[1], "clip_norm": key[2]}
    privacy = None
    if dp is not None:
        if dp.sweep_accounting == "selected-only":
            i = next(i for i, t in enumerate(trials) if t is rows[0])  # the selected setting's first repeat
            ledger.record_steps(plan.ledger_entry(steps=rows[0]["steps"], clip_norm=rows[0]["clip_norm"],
                                                  name=f"dp_on_real trial {i}"))
        ledger.check_budget()
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

    composed = dp.sweep_accounting == "composed"
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
    return report_lib.build_report(ledger, training=training, contamination_sha256=None, side_channels=side_channels,
                                   max_tokens_per_example=max_tokens, extra=out_extra)


def _clips(ledger) -> list[float]:
    return sorted({float(e["clip_norm"]) for e in ledger.entries if e["mechanism"] == "dpsgd"})


# ----------------------------------------------------------------------------- the protocol


CLASSIFIERS = ("wordcnn", "backbone")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClassifierSpec:
    """Which classifier. Attributes: kind ("wordcnn" | "backbone"), wordcnn (its sizes),
    model_dir (the pretrained LM for "backbone"; its tokenizer for the WordCNN's "tokenizer"
    vocabulary), pooling ("mean" | "last"), max_len (backbone tokens), freeze_backbone (train
    the head only), vocabulary (the WordCNN's input vocabulary, one of `VOCABULARIES`: "auto" =
    its own training set when training is non-private; for DP training the public pieces of
    model_dir's tokenizer, or hashed words without a model_dir; "train" under DP is a declared
    side channel)."""

    kind: str = "wordcnn"
    wordcnn: classifiers.WordCNNConfig = classifiers.WordCNNConfig()
    model_dir: str | None = None
    pooling: str = "mean"
    max_len: int = 128
    freeze_backbone: bool = False
    vocabulary: str = "auto"

    def __post_init__(self):
        if self.kind not in CLASSIFIERS:
            raise ValueError(f"classifier must be one of {CLASSIFIERS}, got {self.kind!r}")
        if self.kind == "backbone" and self.model_dir is None:
            raise ValueError("the backbone classifier needs model_dir (a dpsynth checkpoint directory)")
        if self.pooling not in classifiers.POOLINGS:
            raise ValueError(f"pooling must be one of {classifiers.POOLINGS}, got {self.pooling!r}")
        if self.vocabulary not in VOCABULARIES:
            raise ValueError(f"vocabulary must be one of {VOCABULARIES}, got {self.vocabulary!r}")
        if self.vocabulary == "tokenizer" and self.model_dir is None:
            raise ValueError("the 'tokenizer' vocabulary needs model_dir (a model directory with tokenizer.model)")

    def wordcnn_vocabulary(self, private: bool) -> str:
        """The WordCNN vocabulary source for a private or non-private training set."""
        if self.vocabulary != "auto":
            return self.vocabulary
        if not private:
            return "train"
        return "tokenizer" if self.model_dir else "hashing"

    @property
    def input_len(self) -> int:
        """Tokens (WordCNN: words or pieces) kept per example."""
        return self.wordcnn.max_len if self.kind == "wordcnn" else self.max_len


def build_model(spec: ClassifierSpec, train_texts: Sequence[str] | None, num_classes: int,
                backbone: Backbone | None = None, *, private: bool = False) -> Model:
    """A fresh model for one training set.

    The WordCNN vocabulary is `spec.wordcnn_vocabulary(private)`; `train_texts` is read only
    when that is "train" (with `private`, only if the user asked for it).
    """
    if spec.kind == "wordcnn":
        vocabulary = spec.wordcnn_vocabulary(private)
        tokenizer, source = None, "the tokenizer"
        if vocabulary == "tokenizer":
            if backbone is not None:
                tokenizer = backbone.tokenizer
            else:
                from dpsynth.tokens import load_tokenizer

                tokenizer = load_tokenizer(spec.model_dir)
            source = f"{spec.model_dir}/{tokenizer.filename}"
        return wordcnn_model(train_texts if vocabulary == "train" else None, num_classes, spec.wordcnn,
                             vocabulary=vocabulary, tokenizer=tokenizer, tokenizer_source=source)
    backbone = backbone if backbone is not None else Backbone.load(spec.model_dir)
    return backbone_model(backbone, num_classes, pooling=spec.pooling, max_len=spec.max_len,
                          freeze_backbone=spec.freeze_backbone)


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
             dp: DPConfig | None = None, backbone: Backbone | None = None,
             progress: Callable[[], None] | None = None) -> SweepResult:
    """Sweeps a classifier trained on `train`, selected on `valid`, scored on each of `tests`.

    Records are mappings with "text" and "label". All label sets must be equal. With `dp`, the
    training is DP-Adam (DP-on-real baseline), sweeping `sweep.clip_norms` too, and the result
    carries its privacy report (`SweepResult.privacy`); the WordCNN vocabulary then comes from
    public data unless `spec.vocabulary == "train"` (a side channel in the report).
    """
    named = {"train": train, "valid": valid, **{f"test '{k}'": v for k, v in tests.items()}}
    for name, recs in named.items():
        check_records(name, recs)
    labels = check_label_sets(named)
    private = dp is not None
    needs_train_text = spec.kind == "wordcnn" and spec.wordcnn_vocabulary(private) == "train"
    model = build_model(spec, [r["text"] for r in train] if needs_train_text else None, len(labels.labels), backbone,
                        private=private)

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
        classifier: "wordcnn" or "backbone" (`ClassifierSpec.kind`).
        model: pretrained LM directory (`ClassifierSpec.model_dir`): the backbone, or the DP
            WordCNN's tokenizer vocabulary.
        pooling: the backbone's pooling ("mean" | "last").
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
        vocabulary: the WordCNN vocabulary, one of `VOCABULARIES`.
        seed: fixed DP seed (tests only); None = a secret seed.
    """

    classifier: str = "wordcnn"
    model: str | None = None
    pooling: str = "mean"
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
    vocabulary: str = "auto"
    seed: int | None = None


def classify_files(train: str, valid: str, test: str, config: ClassifyConfig = ClassifyConfig(), *,
                   out: str | None = None, privacy_dir: str | None = None, max_dead_letters=0) -> SweepResult:
    """`classify` on files (JSONL/CSV/Parquet with text,label); writes the trials to `out` as JSON.

    `out` holds the trials, the selected setting, `test_mean` / `test_std` (accuracy) and
    `test_scores_mean` / `test_scores_std` ({test name: {"accuracy", "balanced_accuracy",
    "macro_f1"}}, over the selected setting's repeats).

    With `config.epsilon` (DP-on-real) the privacy report (`privacy_report.json` / `.md`) is
    written to `privacy_dir` (default: the directory of `out`) and its summary goes into `out`;
    `config.seed` (fixed DP seed, tests only) is never written. `max_dead_letters`: rejected records tolerated
    per file (`corpora.read_real`; default none).
    """
    import json as json_lib

    from dpsynth.dp import report as report_lib
    from dpsynth.evaluate import corpora

    recs = {name: corpora.read_real(path, name, max_dead_letters=max_dead_letters)
            for name, path in (("train", train), ("valid", valid), ("test", test))}
    c = config
    small = classifiers.WordCNNConfig(vocab_words=10_000, embed_dim=64, filters=64, hidden=64, max_len=128)
    spec = ClassifierSpec(kind=c.classifier, model_dir=c.model, pooling=c.pooling, vocabulary=c.vocabulary,
                          wordcnn=small if c.cnn == "small" else classifiers.WordCNNConfig())
    sweep = SweepConfig(learning_rates=tuple(c.learning_rates or SMALL_LR_GRID),
                        weight_decays=tuple(c.weight_decays or SMALL_WD_GRID), clip_norms=tuple(c.clip_norms),
                        repeats=c.repeats, train=TrainConfig(max_epochs=c.max_epochs))
    dp = None
    if c.epsilon is not None:
        n = len(recs["train"])
        dp = DPConfig(epsilon=c.epsilon, delta=c.delta, expected_batch_size=min(c.expected_batch_size, n),
                      microbatch_size=min(16, n), epochs=c.dp_epochs, accountant=c.accountant,
                      sweep_accounting=c.sweep_accounting, seed=c.seed)
    result = classify(recs["train"], recs["valid"], {"real_test": recs["test"]}, spec, sweep, dp)
    privacy = None
    if result.privacy is not None:
        directory = privacy_dir or (os.path.dirname(os.path.abspath(out)) if out else None)
        privacy = privacy_summary(result.privacy)
        if directory:
            json_path, _ = report_lib.write_report(directory, result.privacy)
            privacy["report"] = json_path
    if out:
        with open(out, "w", encoding="utf-8") as f:
            json_lib.dump({"selected": result.selected, "valid_mean": result.valid_mean, "test_mean": result.test_mean,
                           "test_std": result.test_std, "trials": result.trials,
                           "dp": dp.public() if dp else None, "privacy": privacy,
                           "test_scores_mean": result.score_mean, "test_scores_std": result.score_std}, f, indent=1)
    return result
