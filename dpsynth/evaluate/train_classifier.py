"""Training downstream classifiers with the shared training core; sweeps, repeats, DP-on-real.

Protocol (Kurakin et al. 2023): train on synthetic train, select (early stopping and the
learning-rate / weight-decay sweep) on synthetic valid, test on real test. Baselines: the same
on real train / real valid (epsilon = inf), and DP-on-real: DP-Adam through `DPSGDStrategy`
with Poisson sampling, the noise multiplier calibrated by `dpsynth.dp.accounting` for each
target epsilon, sweeping the clipping norm.

Every trial runs on `dpsynth.train.core.make_train_functions` (the one core): per-example
softmax cross-entropy as `loss_fn`, `optax.adamw` with the learning rate and weight decay
injected as optimizer-state hyperparameters, so a whole non-private sweep compiles its step
once. Early stopping keeps the parameters of the epoch with the best validation accuracy and
stops after `patience` epochs without improvement.

DP-on-real side channel (as in the paper and recorded in the result): early stopping and the
hyperparameter selection read the real validation set, which is not covered by the DP
guarantee of the training run.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dpsynth.evaluate import classifiers
from dpsynth.train import core

logger = logging.getLogger("dpsynth.evaluate")

# A small CPU default grid and a wider one; the sweep is configurable either way.
SMALL_LR_GRID = (1e-3, 3e-3)
SMALL_WD_GRID = (1e-4,)
WIDE_LR_GRID = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
WIDE_WD_GRID = (0.0, 1e-4, 1e-3, 1e-2)


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
      accountant: "rdp" or "pld" (calibration).
      sparse_embedding: clip a declared input-embedding table (WordCNN) with the exact sparse
        path of `dpsynth.dp.sparse` (same clipped sum, far cheaper) instead of vmap(grad).
    """

    epsilon: float
    delta: float | None = None
    clip_norm: float = 1.0
    expected_batch_size: int = 64
    epochs: float = 5.0
    microbatch_size: int = 16
    accountant: str = "rdp"
    sparse_embedding: bool = True

    def __post_init__(self):
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError(f"DP epsilon must be finite and > 0, got {self.epsilon}")
        if self.clip_norm <= 0 or self.expected_batch_size < 1 or self.epochs <= 0 or self.microbatch_size < 1:
            raise ValueError("clip_norm, expected_batch_size, epochs and microbatch_size must be positive")


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
    """One training run: best validation accuracy, test accuracies of the best epoch."""

    valid_accuracy: float
    test_accuracy: dict[str, float]
    best_epoch: int
    epochs: int
    steps: int
    epsilon: float = math.inf
    noise_multiplier: float = 0.0


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

    def variables(self, params, frozen):
        return {"params": {**frozen, **params}}


def wordcnn_model(train_texts: Sequence[str], num_classes: int, config: classifiers.WordCNNConfig,
                  seed: int = 0) -> Model:
    """A fresh WordCNN with a vocabulary fitted on `train_texts` (its own training set)."""
    feat = classifiers.WordFeaturizer.fit(train_texts, config)
    module = classifiers.WordCNN(feat.vocab_size, num_classes, config)
    params = module.init(jax.random.PRNGKey(seed), jnp.zeros((1, config.max_len), jnp.int32))["params"]
    return Model(module, params, {}, feat, "wordcnn", embedding_path=("embed", "embedding"))


@dataclasses.dataclass(frozen=True)
class Backbone:
    """A pretrained LM: `ModelConfig`, base parameters and its `Tokenizer`."""

    config: Any
    params: Any
    tokenizer: Any

    @classmethod
    def load(cls, model_dir: str) -> "Backbone":
        from dpsynth.train.checkpoint import load_model  # models package, lazily

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
    if freeze_backbone:
        return Model(module, head, base, feat, "backbone-head")
    return Model(module, {**base, **head}, {}, feat, "backbone")


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
    """Runs trials of one model on the training core; compiled functions are reused across trials."""

    def __init__(self, model: Model):
        self.model = model
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

    def accuracy(self, params, frozen, split: Split, batch_size: int) -> float:
        correct = 0
        for start in range(0, len(split.x), batch_size):
            x = split.x[start : start + batch_size]
            n = len(x)
            if n < batch_size:  # fixed shape: pad and ignore
                x = np.concatenate([x, np.zeros((batch_size - n, x.shape[1]), x.dtype)])
            pred = np.asarray(self._predict(params, frozen, x))[:n]
            correct += int((pred == split.y[start : start + n]).sum())
        return correct / len(split.x)

    def _init_state(self, fns, config: TrainConfig):
        params = jax.tree.map(jnp.array, self.model.params)  # fresh copies: steps donate buffers
        opt_state = _set_hyper(self.optimizer.init(params), config.learning_rate, config.weight_decay)
        return fns.init_state(params, self.model.frozen, rng=config.seed, opt_state=opt_state)

    def _early_stopping(self, state, step_epoch: Callable, valid: Split, tests: Mapping[str, Split],
                        config: TrainConfig):
        best = (-1.0, 0, None)
        epochs = 0
        for epoch in range(1, config.max_epochs + 1):
            state = step_epoch(state, epoch)
            epochs = epoch
            acc = self.accuracy(state.params, state.frozen, valid, config.eval_batch_size)
            if acc > best[0]:
                best = (acc, epoch, jax.device_get(state.params))
            elif epoch - best[1] >= config.patience:
                break
        params = best[2]
        tests_acc = {name: self.accuracy(params, state.frozen, s, config.eval_batch_size) for name, s in tests.items()}
        return best[0], best[1], epochs, tests_acc, int(state.step)

    def train(self, train: Split, valid: Split, tests: Mapping[str, Split], config: TrainConfig) -> TrialResult:
        """Non-private training with shuffled fixed-size batches (last batch padded and masked)."""
        fns = self.fns()
        state = self._init_state(fns, config)
        n, bs = len(train.x), config.batch_size
        examples = {"x": train.x, "y": train.y}

        def step_epoch(state, epoch):
            order = np.random.default_rng([config.seed, epoch]).permutation(n)
            for start in range(0, n, bs):
                idx = order[start : start + bs]
                idx = np.concatenate([idx, -np.ones(bs - len(idx), np.int64)])
                state, _ = fns.train_step(state, fns.shard_batch(_gather(examples, idx)))
            return state

        best, best_epoch, epochs, tests_acc, steps = self._early_stopping(state, step_epoch, valid, tests, config)
        return TrialResult(best, tests_acc, best_epoch, epochs, steps)

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
                 dp: DPConfig) -> TrialResult:
        """DP-Adam: Poisson batches, clipped per-example gradients, calibrated Gaussian noise.

        `config.max_epochs` is ignored: the privacy budget fixes the number of steps
        (ceil(dp.epochs / q)); validation runs after every ceil(1 / q) steps ("an epoch").
        """
        from dpsynth.dp import accounting, sampling

        n = len(train.x)
        delta = dp.delta if dp.delta is not None else 1.0 / n
        q = accounting.sampling_probability(n, dp.expected_batch_size)
        total_steps = accounting.steps_for_epochs(dp.epochs, q)
        sigma = accounting.calibrate_noise_multiplier(dp.epsilon, delta, q, total_steps, dp.accountant)
        strategy = self.dp_strategy(dp, sigma, q * n)
        fns = self.fns(strategy, key=("dp", dp.clip_norm, sigma, q * n, strategy.embedding))
        sampler = sampling.PoissonSampler(n, q * n, dp.microbatch_size, seed=config.seed)
        steps_per_epoch = max(1, math.ceil(1.0 / q))
        num_epochs = math.ceil(total_steps / steps_per_epoch)
        examples = {"x": train.x, "y": train.y}
        state = self._init_state(fns, config)

        def step_epoch(state, epoch):
            first = (epoch - 1) * steps_per_epoch
            for step in range(first, min(total_steps, first + steps_per_epoch)):
                mbs = [sampling.gather(examples, m) for m in sampler.microbatches(step)]
                state, _ = fns.accumulated_step(state, mbs)
            return state

        run_config = dataclasses.replace(config, max_epochs=num_epochs, patience=num_epochs)
        best, best_epoch, epochs, tests_acc, steps = self._early_stopping(state, step_epoch, valid, tests, run_config)
        spent = accounting.epsilon(q, total_steps, sigma, delta, dp.accountant)
        return TrialResult(best, tests_acc, best_epoch, epochs, steps, epsilon=spent, noise_multiplier=sigma)


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

    `trials` rows: {"learning_rate", "weight_decay", "clip_norm", "seed", "valid_accuracy",
    "<test name>_accuracy", "epsilon", "noise_multiplier"}. `test_mean` / `test_std` are over
    the repeats of the selected setting, per test name.
    """

    trials: list[dict]
    selected: dict
    valid_mean: float
    test_mean: dict[str, float]
    test_std: dict[str, float]


def run_sweep(trainer: Trainer, train: Split, valid: Split, tests: Mapping[str, Split], sweep: SweepConfig,
              dp: DPConfig | None = None, progress: Callable[[], None] | None = None) -> SweepResult:
    """Every (lr, wd[, clip]) x repeat; selects by mean validation accuracy over repeats."""
    from dpsynth.progress import Progress

    clips = sweep.clip_norms if dp is not None else (None,)
    trials = []
    total = len(sweep.learning_rates) * len(sweep.weight_decays) * len(clips) * sweep.repeats
    bar = Progress(total=total, desc="dp classifier sweep" if dp else "classifier sweep", unit="trial", interval=30.0)
    for lr in sweep.learning_rates:
        for wd in sweep.weight_decays:
            for clip in clips:
                for seed in range(sweep.repeats):
                    cfg = dataclasses.replace(sweep.train, learning_rate=lr, weight_decay=wd, seed=seed)
                    if dp is None:
                        r = trainer.train(train, valid, tests, cfg)
                    else:
                        r = trainer.train_dp(train, valid, tests, cfg, dataclasses.replace(dp, clip_norm=clip))
                    row = {"learning_rate": lr, "weight_decay": wd, "clip_norm": clip, "seed": seed,
                           "valid_accuracy": r.valid_accuracy, "best_epoch": r.best_epoch, "epsilon": r.epsilon,
                           "noise_multiplier": r.noise_multiplier}
                    row.update({f"{k}_accuracy": v for k, v in r.test_accuracy.items()})
                    trials.append(row)
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
    selected = {"learning_rate": key[0], "weight_decay": key[1], "clip_norm": key[2]}
    return SweepResult(trials, selected, float(np.mean([r["valid_accuracy"] for r in rows])), test_mean, test_std)


# ----------------------------------------------------------------------------- the protocol


CLASSIFIERS = ("wordcnn", "backbone")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClassifierSpec:
    """Which classifier. Attributes: kind ("wordcnn" | "backbone"), wordcnn (its sizes),
    model_dir (the pretrained LM for "backbone"), pooling ("mean" | "last"), max_len
    (backbone tokens), freeze_backbone (train the head only)."""

    kind: str = "wordcnn"
    wordcnn: classifiers.WordCNNConfig = classifiers.WordCNNConfig()
    model_dir: str | None = None
    pooling: str = "mean"
    max_len: int = 128
    freeze_backbone: bool = False

    def __post_init__(self):
        if self.kind not in CLASSIFIERS:
            raise ValueError(f"classifier must be one of {CLASSIFIERS}, got {self.kind!r}")
        if self.kind == "backbone" and self.model_dir is None:
            raise ValueError("the backbone classifier needs model_dir (a dpsynth checkpoint directory)")
        if self.pooling not in classifiers.POOLINGS:
            raise ValueError(f"pooling must be one of {classifiers.POOLINGS}, got {self.pooling!r}")


def build_model(spec: ClassifierSpec, train_texts: Sequence[str], num_classes: int,
                backbone: Backbone | None = None) -> Model:
    """A fresh model for one training set (the WordCNN vocabulary comes from that set)."""
    if spec.kind == "wordcnn":
        return wordcnn_model(train_texts, num_classes, spec.wordcnn)
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
    training is DP-Adam (DP-on-real baseline), sweeping `sweep.clip_norms` too.
    """
    named = {"train": train, "valid": valid, **{f"test '{k}'": v for k, v in tests.items()}}
    for name, recs in named.items():
        check_records(name, recs)
    labels = check_label_sets(named)
    model = build_model(spec, [r["text"] for r in train], len(labels.labels), backbone)

    def split(recs):
        return Split(model.featurize([r["text"] for r in recs]), labels.encode([str(r["label"]) for r in recs]))

    return run_sweep(Trainer(model), split(train), split(valid), {k: split(v) for k, v in tests.items()}, sweep, dp,
                     progress)


def classify_files(train: str, valid: str, test: str, *, out: str | None = None, kind: str = "wordcnn",
                   model_dir: str | None = None, pooling: str = "mean", cnn: str = "paper",
                   learning_rates: Sequence[float] | None = None, weight_decays: Sequence[float] | None = None,
                   repeats: int = 3, max_epochs: int = 10, epsilon: float | None = None, delta: float | None = None,
                   clip_norms: Sequence[float] = (0.5, 1.0), expected_batch_size: int = 64,
                   dp_epochs: float = 5.0) -> SweepResult:
    """`classify` on files (JSONL/CSV/Parquet with text,label); writes the trials to `out` as JSON."""
    import json as json_lib

    from dpsynth.evaluate import corpora

    recs = {name: corpora.read_real(path, name) for name, path in (("train", train), ("valid", valid), ("test", test))}
    small = classifiers.WordCNNConfig(vocab_words=10_000, embed_dim=64, filters=64, hidden=64, max_len=128)
    spec = ClassifierSpec(kind=kind, model_dir=model_dir, pooling=pooling,
                          wordcnn=small if cnn == "small" else classifiers.WordCNNConfig())
    sweep = SweepConfig(learning_rates=tuple(learning_rates or SMALL_LR_GRID),
                        weight_decays=tuple(weight_decays or SMALL_WD_GRID), clip_norms=tuple(clip_norms),
                        repeats=repeats, train=TrainConfig(max_epochs=max_epochs))
    dp = None
    if epsilon is not None:
        n = len(recs["train"])
        dp = DPConfig(epsilon=epsilon, delta=delta, expected_batch_size=min(expected_batch_size, n),
                      microbatch_size=min(16, n), epochs=dp_epochs)
    result = classify(recs["train"], recs["valid"], {"real_test": recs["test"]}, spec, sweep, dp)
    if out:
        with open(out, "w", encoding="utf-8") as f:
            json_lib.dump({"selected": result.selected, "valid_mean": result.valid_mean, "test_mean": result.test_mean,
                           "test_std": result.test_std, "trials": result.trials,
                           "dp": dataclasses.asdict(dp) if dp else None}, f, indent=1)
    return result
