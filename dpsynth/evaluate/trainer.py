"""Training one downstream classifier on the shared training core, with early stopping.

Every run uses `dpsynth.train.core.make_train_functions` (the one core): per-example softmax
cross-entropy as `loss_fn`, `optax.adamw` with the learning rate and weight decay injected as
optimizer-state hyperparameters, so a whole non-private sweep compiles its step once. Early
stopping keeps the parameters of the epoch with the best validation accuracy and stops after
`patience` epochs without improvement. Each run scores its best epoch on every test set with
`dpsynth.evaluate.scores` (accuracy, balanced accuracy, macro-F1, from one pass of
predictions); early stopping reads validation accuracy only.

The model is a `Model` bundle built by a classifier family of `dpsynth.evaluate.registry`;
the trainer never asks which family it is.

DP-Adam (`Trainer.train_dp`, the DP-on-real baseline), formal guarantee: Poisson sampling
(`dpsynth.dp.sampling`), per-example clipping to C and Gaussian noise sigma C through
`DPSGDStrategy`, sigma from the privacy plan (`DPConfig.plan`, `dpsynth.dp.plan.plan_privacy`;
from the accountant only), so that one run of T = plan.steps steps is (epsilon, delta)-DP for
D_train under add-or-remove adjacency (with `compositions=k`: k such runs together). The
sampling and noise are seeded from a secret 64-bit seed (`dpsynth.dp.seeds`), never written.
Validation never stops a DP run early (exactly T steps run).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dpsynth.dp import private_selection, selection
from dpsynth.evaluate import scores as scores_lib
from dpsynth.train import core, loop

# Seconds between step-level progress lines of one training run (as the DP tuner).
PROGRESS_INTERVAL = 10.0
# Tag of the noise key's stream, derived from a trial's secret seed.
_NOISE_STREAM = 0x7E5


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
        the paper; declared as a side channel): `dpsynth.dp.selection`.
      seed: the Poisson-sampling and noise seed. None (default): a secret 64-bit seed from
        the OS entropy pool per sweep, never written anywhere. A fixed seed makes the noise
        reproducible by whoever knows it (a side channel in the report; tests only).
      select_epsilon: choose the sweep's setting on D_valid with DP at this epsilon
        (`dpsynth.dp.private_selection`: the exponential mechanism on the correct predictions;
        every trial then keeps its LAST epoch, so no trial reads D_valid); None (default): the
        non-DP choice and best-epoch selection, a declared side channel.
      valid_split: how D_valid was split from D (`private_selection.SPLITS`): "files" / "hash"
        compose the selection in parallel with the training, "positional" sequentially.
    """

    epsilon: float
    delta: float | None = None
    clip_norm: float = 1.0
    expected_batch_size: int = 64
    epochs: float = 5.0
    microbatch_size: int = 16
    accountant: str = "rdp"
    sparse_embedding: bool = True
    sweep_accounting: str = selection.COMPOSED
    seed: int | None = dataclasses.field(default=None, repr=False)
    select_epsilon: float | None = None
    valid_split: str = "files"

    def __post_init__(self):
        if self.select_epsilon is not None and not (self.select_epsilon > 0 and math.isfinite(self.select_epsilon)):
            raise ValueError(f"select_epsilon must be finite and > 0 (or None), got {self.select_epsilon}")
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError(f"DP epsilon must be finite and > 0, got {self.epsilon}")
        if self.clip_norm <= 0 or self.expected_batch_size < 1 or self.epochs <= 0 or self.microbatch_size < 1:
            raise ValueError("clip_norm, expected_batch_size, epochs and microbatch_size must be positive")
        selection.check_accounting(self.sweep_accounting)
        if self.valid_split not in private_selection.SPLITS:
            raise ValueError(f"valid_split must be one of {private_selection.SPLITS}, got {self.valid_split!r}")

    @classmethod
    def for_dataset(cls, num_train: int, *, epsilon: float, expected_batch_size: int, microbatch_size: int,
                    **settings) -> "DPConfig":
        """The DP-on-real settings for a training set of `num_train` examples: the expected batch
        and the microbatch are capped at `num_train`; `settings` are the other fields."""
        return cls(epsilon=epsilon, expected_batch_size=min(expected_batch_size, num_train),
                   microbatch_size=min(microbatch_size, num_train), **settings)

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
                     int(dataset_size), selection.compositions(self.sweep_accounting, int(trials)))


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


@dataclasses.dataclass
class Model:
    """A Flax classifier with its initial parameters split into trainable and frozen parts.

    What a classifier family's `make` returns (`dpsynth.evaluate.registry`): `module` maps
    int32 ids [B, T] to logits [B, num_classes] (`module.apply(variables, x)`), `featurize`
    turns texts into those ids.
    """

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


def classification_loss(model: Model):
    """The per-example softmax cross-entropy of `model` (the core's `loss_fn`), with "correct" as aux."""

    def loss_fn(params, frozen, batch, key):
        del key
        logits = model.module.apply(model.variables(params, frozen), batch["x"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])
        return loss, {"correct": (logits.argmax(-1) == batch["y"]).astype(jnp.float32)}
    return loss_fn


def embedded_loss(model: Model, spec):
    """The same loss as `classification_loss`, written over the embedded inputs (`dpsynth.dp.sparse`)."""
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
            loss_fn = classification_loss(self.model) if spec is None else embedded_loss(self.model, spec)
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
             valid: Split, tests: Mapping[str, Split], config: TrainConfig, patience: int | None, desc: str,
             keep_last: bool = False):
        """`total` steps on the outer loop, validated after every epoch (early stopping; `keep_last`:
        the last epoch's parameters are kept, whatever their validation accuracy).

        Returns (best valid accuracy, its epoch, epochs run, the scores of the best epoch's
        parameters on each test set (`ClassificationScores`), steps run).
        """
        stopper = _EarlyStopping(lambda state: self.accuracy(state.params, state.frozen, valid, config.eval_batch_size),
                                 steps_per_epoch, patience, keep_last)
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

    def dp_mechanism(self, dp: DPConfig, plan, *, num_units: int, seed: int):
        """(strategy, Poisson sampler) of `plan`, built by its registered mechanism
        (`dpsynth.dp.mechanisms`); with sparse-embedding clipping (same result, no per-example
        table copies) when the model declares an embedding table and `dp.sparse_embedding`."""
        from dpsynth.dp import mechanisms, sparse

        mech = mechanisms.get(plan.mechanism)
        built = mech.build(plan, clip_norm=dp.clip_norm, num_units=num_units, microbatch_size=dp.microbatch_size,
                           seed=seed, per_user=False)
        path = self.model.embedding_path if dp.sparse_embedding else None
        if not path:
            return built.strategy, built.sampler
        spec = sparse.EmbeddingSpec(param_path=path, ids_key="x")
        return mech.sparse_embedding_strategy(plan, clip_norm=dp.clip_norm, embedding=spec), built.sampler

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
        strategy, sampler = self.dp_mechanism(dp, plan, num_units=n, seed=seed)
        fns = self.fns(strategy, key=("dp", dp.clip_norm, sigma, plan.expected_batch_size, strategy.embedding))
        steps_per_epoch = max(1, math.ceil(1.0 / q))
        examples = {"x": train.x, "y": train.y}
        state = self._init_state(fns, config, rng=jax.random.fold_in(seeds.jax_key(seed), _NOISE_STREAM))

        def batch(step: int) -> list[dict]:
            return [sampling.gather(examples, m) for m in sampler.microbatches(step)]

        best, best_epoch, epochs, tests_scores, steps = self._run(
            state, step=fns.accumulated_step, batch=batch, steps_per_epoch=steps_per_epoch, total=total_steps,
            valid=valid, tests=tests, config=config, patience=None, desc=desc, keep_last=dp.select_epsilon is not None)
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
    `keep_last`: keeps the last epoch's parameters instead (the parameters never depend on the
    validation set; what a DP selection on it needs).
    """

    def __init__(self, accuracy: Callable[[Any], float], steps_per_epoch: int, patience: int | None,
                 keep_last: bool = False):
        self._accuracy, self._steps_per_epoch, self._patience = accuracy, steps_per_epoch, patience
        self._keep_last = keep_last
        self.best_acc, self.best_epoch, self.best_params, self.epochs = -1.0, 0, None, 0
        self._stop = False

    def evaluate(self, done: int, state) -> None:
        epoch = math.ceil(done / self._steps_per_epoch)
        self.epochs = epoch
        acc = self._accuracy(state)
        if acc > self.best_acc or self._keep_last:
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
