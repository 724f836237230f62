"""The one training core shared by pretraining, DP fine-tuning and the downstream classifiers.

What differs between those uses is only the loss function, the trainable subset, the
`GradientStrategy` (plain mean here, DP-SGD in `dpsynth.dp`) and the optimizer:

    fns = make_train_functions(loss_fn, optimizer, MeanGradient(), mesh=None)
    state = fns.init_state(params, frozen, rng=jax.random.PRNGKey(0))
    state, metrics = fns.train_step(state, batch)                 # one microbatch = one step
    # or, with gradient accumulation over microbatches:
    acc = fns.init_accumulator(state)
    for mb in microbatches:
        acc, m = fns.accumulate_step(state, acc, mb)
    state, m = fns.apply_step(state, acc)

Contract of `loss_fn(params, frozen, batch, key) -> (per_example_loss [B], aux)`: `params` is
the trainable pytree, `frozen` the rest (may be {}), `batch` a dict of arrays with a leading
example dimension including "mask" [B] (1 = real example, 0 = padding, so variable-size
batches keep a fixed shape), `key` a PRNG key unique to (step, microbatch). `aux` is a dict of
per-example arrays [B]; their masked sums are reported as metrics.

Randomness: the state holds one base key; step s uses `fold_in(rng, s)`; microbatch m of that
step gets `fold_in(fold_in(step_key, 0), m)` and `finalize` gets `fold_in(step_key, 1)`, so
the noise key of a DP step is independent of the keys its loss saw, and no key repeats across
steps or resumes (the step is part of the checkpointed state).

Every step function is compiled once (fixed shapes), donates the buffers it replaces
(`donate_argnums`), and with a mesh runs under explicit in/out shardings: parameters by the
logical-axis rules of `dpsynth.models.sharding`, batches split over the `data` axis.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from dpsynth.models.sharding import LOGICAL_RULES, param_shardings
from dpsynth.train import sharding as sharding_lib

PyTree = Any
LossFn = Callable[[PyTree, PyTree, dict, jax.Array], tuple[jax.Array, dict]]


@flax.struct.dataclass
class TrainState:
    """Everything a step changes. `rng` is a raw uint32[2] key; per-step keys are fold_ins."""

    step: jax.Array
    params: PyTree
    frozen: PyTree
    opt_state: PyTree
    rng: jax.Array
    noise_state: PyTree = None  # a stateful strategy's noise state (BandMF); None otherwise


class GradientStrategy(Protocol):
    """How microbatches become one gradient (non-private mean, or DP-SGD)."""

    def init_accumulator(self, params: PyTree) -> PyTree:
        """A zero accumulator for `params`."""

    def accumulate(self, loss_fn: LossFn, params: PyTree, frozen: PyTree, batch: dict, key: jax.Array,
                   acc: PyTree) -> tuple[PyTree, dict]:
        """Adds one microbatch; returns (acc, metrics) with at least "loss_sum" and "count"."""

    def finalize(self, acc: PyTree, params: PyTree, key: jax.Array) -> PyTree:
        """The gradient to hand to the optimizer."""

    # Optional, for strategies whose noise is correlated across steps (`dpsynth.dp.bandmf`):
    # `init_noise_state(params, key) -> noise_state` (called once by `init_state`, stored in
    # `TrainState.noise_state` and checkpointed with it) and
    # `finalize_with_noise_state(acc, params, key, noise_state) -> (grads, noise_state)`,
    # which the core then calls instead of `finalize`.


def masked_sums(aux: dict, mask: jax.Array) -> dict:
    """Masked sums of per-example aux values ([B] arrays); scalars pass through."""
    out = {}
    for k, v in (aux or {}).items():
        v = jnp.asarray(v)
        out[k] = jnp.sum(v * mask) if v.ndim >= 1 and v.shape[0] == mask.shape[0] else v
    return out


class MeanGradient:
    """Non-private strategy: gradient of sum(loss * mask) over all microbatches / sum(mask)."""

    def init_accumulator(self, params):
        return {"grad_sum": jax.tree.map(jnp.zeros_like, params), "count": jnp.zeros((), jnp.float32)}

    def accumulate(self, loss_fn, params, frozen, batch, key, acc):
        mask = batch["mask"].astype(jnp.float32)

        def total(p):
            loss, aux = loss_fn(p, frozen, batch, key)
            return jnp.sum(loss * mask), aux

        (loss_sum, aux), grads = jax.value_and_grad(total, has_aux=True)(params)
        count = jnp.sum(mask)
        acc = {"grad_sum": jax.tree.map(jnp.add, acc["grad_sum"], grads), "count": acc["count"] + count}
        return acc, {"loss_sum": loss_sum, "count": count, **masked_sums(aux, mask)}

    def finalize(self, acc, params, key):
        denom = jnp.maximum(acc["count"], 1.0)
        return jax.tree.map(lambda g: g / denom, acc["grad_sum"])


def as_key(rng: int | jax.Array) -> jax.Array:
    """A raw uint32[2] PRNG key from a seed or a key (typed keys are unwrapped)."""
    if isinstance(rng, (int, np.integer)):
        return jax.random.PRNGKey(int(rng))
    rng = jnp.asarray(rng) if not jax.dtypes.issubdtype(getattr(rng, "dtype", None), jax.dtypes.prng_key) else rng
    if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(rng)
    return rng


def step_keys(rng: jax.Array, step: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(accumulate base key, finalize key) of `step`."""
    step_key = jax.random.fold_in(rng, step)
    return jax.random.fold_in(step_key, 0), jax.random.fold_in(step_key, 1)


def sum_metrics(a: dict | None, b: dict) -> dict:
    """Adds two metric dicts leaf by leaf (host-side accumulation over microbatches)."""
    return dict(b) if a is None else {k: a[k] + b[k] if k in a else b[k] for k in b}


@dataclasses.dataclass
class TrainFunctions:
    """The compiled step functions and helpers that place state and batches (see module doc)."""

    loss_fn: LossFn
    optimizer: optax.GradientTransformation
    strategy: GradientStrategy
    mesh: Mesh | None = None
    rules: tuple = LOGICAL_RULES
    donate: bool = True

    def __iter__(self):
        """Unpacks as `accumulate_step, apply_step, train_step` (the contract's triple)."""
        return iter((self.accumulate_step, self.apply_step, self.train_step))

    def __post_init__(self):
        self._compiled: dict[str, Callable] = {}
        self._state_sharding = None
        self._acc_sharding = None

    # ---------------------------------------------------------------- placement
    def init_state(self, params: PyTree, frozen: PyTree | None = None, *, rng: int | jax.Array = 0,
                   opt_state: PyTree | None = None, step: int = 0, copy: bool = True) -> TrainState:
        """Places params/frozen (sharded by the logical rules under a mesh) and inits the optimizer.

        With `copy` (default) the caller's arrays are copied first, because the steps donate
        the state's buffers; pass `copy=False` to hand over big arrays without a second copy.
        """
        frozen = {} if frozen is None else frozen
        if copy:
            params, frozen = jax.tree.map(jnp.copy, params), jax.tree.map(jnp.copy, frozen)
        if self.mesh is not None:
            params = sharding_lib.put(params, param_shardings(params, self.mesh, self.rules))
            frozen = sharding_lib.put(frozen, param_shardings(frozen, self.mesh, self.rules))
            rep = sharding_lib.replicated(self.mesh)
        else:
            params, frozen = jax.tree.map(jnp.asarray, params), jax.tree.map(jnp.asarray, frozen)
            rep = None
        if opt_state is None:
            opt_state = jax.jit(self.optimizer.init)(params)
        put = (lambda x: sharding_lib.put(x, rep)) if rep is not None else jnp.asarray
        noise_state = None
        if hasattr(self.strategy, "init_noise_state"):
            noise_state = jax.jit(self.strategy.init_noise_state)(params, as_key(rng))
        state = TrainState(step=put(jnp.asarray(step, jnp.int32)), params=params, frozen=frozen,
                           opt_state=opt_state, rng=put(as_key(rng)), noise_state=noise_state)
        if self.mesh is not None:
            # Optimizer-state shardings follow the compiler's propagation from the params;
            # whatever they are, they become the fixed in/out shardings of every step.
            state = self._on_mesh(state)
            self._state_sharding = jax.tree.map(lambda x: x.sharding, state)
        return state

    def _on_mesh(self, tree: PyTree) -> PyTree:
        """Replicates leaves that the compiler left on a single device (e.g. optax counters)."""
        mesh_devices, rep = set(self.mesh.devices.flat), sharding_lib.replicated(self.mesh)

        def one(x):
            sh = getattr(x, "sharding", None)
            return x if sh is not None and set(sh.device_set) == mesh_devices else sharding_lib.put(x, rep)

        return jax.tree.map(one, tree)

    def _mesh_sharding(self, sh):
        """`_on_mesh` for a sharding: the one a leaf with sharding `sh` gets there."""
        return sh if set(sh.device_set) == set(self.mesh.devices.flat) else sharding_lib.replicated(self.mesh)

    def abstract_state(self, params: PyTree, frozen: PyTree | None = None) -> TrainState:
        """The `TrainState` that `init_state(params, frozen)` builds, as `jax.ShapeDtypeStruct`s
        (with the same shardings under a mesh); `params`/`frozen` may be abstract. Nothing is
        allocated: `lower` compiles the steps on it (`dpsynth.train.resources`)."""
        frozen = {} if frozen is None else frozen
        spec = lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype)  # noqa: E731 (placed arrays are not weak)
        params, frozen = jax.tree.map(spec, params), jax.tree.map(spec, frozen)
        key = jax.ShapeDtypeStruct((2,), jnp.uint32)
        if self.mesh is not None:
            with_sh = lambda t, sh: jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),  # noqa: E731
                                                   t, sh)
            params = with_sh(params, param_shardings(params, self.mesh, self.rules))
            frozen = with_sh(frozen, param_shardings(frozen, self.mesh, self.rules))
        opt_state = jax.eval_shape(self.optimizer.init, params)
        noise_state = (jax.eval_shape(self.strategy.init_noise_state, params, key)
                       if hasattr(self.strategy, "init_noise_state") else None)
        state = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params, frozen=frozen,
                           opt_state=opt_state, rng=key, noise_state=noise_state)
        if self.mesh is None:
            return state
        rep = sharding_lib.replicated(self.mesh)
        opt_sh = jax.tree.map(self._mesh_sharding, jax.jit(self.optimizer.init).lower(params).compile().output_shardings)
        noise_sh = (jax.tree.map(self._mesh_sharding,
                                 jax.jit(self.strategy.init_noise_state).lower(params, key).compile().output_shardings)
                    if noise_state is not None else None)
        state = state.replace(step=jax.ShapeDtypeStruct((), jnp.int32, sharding=rep),
                              rng=jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=rep),
                              opt_state=with_sh(opt_state, opt_sh),
                              noise_state=with_sh(noise_state, noise_sh) if noise_state is not None else None)
        self._state_sharding = jax.tree.map(lambda x: x.sharding, state)
        return state

    def abstract_accumulator(self, state: TrainState) -> dict:
        """The accumulator `init_accumulator(state)` returns, as ShapeDtypeStructs (shardings under a mesh)."""
        acc = jax.eval_shape(self._init_acc, state.params)
        _, a_sh, _, _ = self._shardings(state)
        if a_sh is None:
            return acc
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), acc, a_sh)

    def lower(self, name: str, state: TrainState, *args):
        """The jitted entry point `name` ("accumulate", "apply" or "train", as `accumulate_step`,
        `apply_step` and `train_step` run it) lowered for `(state, *args)`, which may be abstract
        (`abstract_state`, `abstract_accumulator`, a batch of ShapeDtypeStructs): `.compile()` it
        for its `memory_analysis()` and `cost_analysis()`."""
        return self._entry(name, state).lower(state, *args)

    def place_state(self, state: TrainState) -> TrainState:
        """Re-places a state (e.g. restored from a checkpoint as host arrays) like `init_state` would."""
        if self.mesh is None:
            return jax.tree.map(jnp.asarray, state)
        if self._state_sharding is None:
            self.init_state(state.params, state.frozen, rng=state.rng)
        return sharding_lib.put(state, self._state_sharding)

    def shard_batch(self, batch: dict, *, global_rows: int | None = None) -> dict:
        """Puts a host batch on the devices (split over `data` under a mesh).

        Multi-host: either every process passes the same global batch and each keeps its own
        slices, or (with `global_rows`) each process passes only its rows
        `process_rows(global_rows)` of a batch of `global_rows` rows, so it reads no other.
        On one process both are the same.
        """
        if self.mesh is None:
            return jax.tree.map(jnp.asarray, batch)
        if global_rows is not None:
            return sharding_lib.put_process_local(batch, sharding_lib.batch_sharding(self.mesh), global_rows)
        return sharding_lib.put(batch, sharding_lib.batch_sharding(self.mesh))

    def process_rows(self, global_rows: int) -> np.ndarray:
        """Indices of the rows of a `global_rows`-row batch that this process feeds (all of them
        on one process or without a mesh); pass those rows to `shard_batch(..., global_rows=)`."""
        if self.mesh is None:
            return np.arange(global_rows)
        return sharding_lib.process_rows(sharding_lib.batch_sharding(self.mesh), global_rows)

    # ---------------------------------------------------------------- pure step bodies
    def _accumulate(self, state: TrainState, acc: dict, batch: dict):
        base, _ = step_keys(state.rng, state.step)
        key = jax.random.fold_in(base, acc["micro"])
        inner, metrics = self.strategy.accumulate(self.loss_fn, state.params, state.frozen, batch, key,
                                                  acc["inner"])
        return {"inner": inner, "micro": acc["micro"] + 1}, metrics

    def _apply(self, state: TrainState, acc: dict):
        _, final_key = step_keys(state.rng, state.step)
        noise_state = state.noise_state
        if noise_state is not None:
            grads, noise_state = self.strategy.finalize_with_noise_state(acc["inner"], state.params, final_key,
                                                                         noise_state)
        else:
            grads = self.strategy.finalize(acc["inner"], state.params, final_key)
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state, noise_state=noise_state)
        metrics = {"grad_norm": optax.global_norm(grads), "update_norm": optax.global_norm(updates),
                   "param_norm": optax.global_norm(params), "microbatches": acc["micro"]}
        return new_state, metrics

    def _init_acc(self, params):
        return {"inner": self.strategy.init_accumulator(params), "micro": jnp.zeros((), jnp.int32)}

    def _train_step(self, state: TrainState, batch: dict):
        acc, metrics = self._accumulate(state, self._init_acc(state.params), batch)
        state, apply_metrics = self._apply(state, acc)
        count = metrics["count"]
        return state, {**metrics, **apply_metrics, "loss": metrics["loss_sum"] / jnp.maximum(count, 1.0)}

    # ---------------------------------------------------------------- compiled entry points
    def _jit(self, name: str, fun: Callable, donate: tuple[int, ...], in_sh=None, out_sh=None) -> Callable:
        if name not in self._compiled:
            kwargs = {"donate_argnums": donate if self.donate else ()}
            if self.mesh is not None:
                kwargs.update(in_shardings=in_sh, out_shardings=out_sh)
            self._compiled[name] = jax.jit(fun, **kwargs)
        return self._compiled[name]

    def _shardings(self, state):
        if self.mesh is None:
            return None, None, None, None
        if self._state_sharding is None:
            self._state_sharding = jax.tree.map(lambda x: x.sharding, state)
        if self._acc_sharding is None:  # where `_on_mesh` places what the compiler makes of `_init_acc`
            self._acc_sharding = jax.tree.map(self._mesh_sharding,
                                              jax.jit(self._init_acc).lower(state.params).compile().output_shardings)
        return (self._state_sharding, self._acc_sharding, sharding_lib.batch_sharding(self.mesh),
                sharding_lib.replicated(self.mesh))

    def _entry(self, name: str, state: TrainState) -> Callable:
        """The jitted entry point `name` with its donation and shardings (one per name)."""
        s_sh, a_sh, b_sh, rep = self._shardings(state)
        if name == "init_acc":
            return self._jit(name, self._init_acc, (), in_sh=(s_sh.params if s_sh else None,), out_sh=a_sh)
        if name == "accumulate":
            return self._jit(name, self._accumulate, (1,), in_sh=(s_sh, a_sh, b_sh), out_sh=(a_sh, rep))
        if name == "apply":
            return self._jit(name, self._apply, (0,), in_sh=(s_sh, a_sh), out_sh=(s_sh, rep))
        if name == "train":
            return self._jit(name, self._train_step, (0,), in_sh=(s_sh, b_sh), out_sh=(s_sh, rep))
        raise ValueError(f"unknown step {name!r}")

    def init_accumulator(self, state: TrainState) -> dict:
        """A zero accumulator (the strategy's, plus the microbatch counter)."""
        return self._entry("init_acc", state)(state.params)

    def accumulate_step(self, state: TrainState, acc: dict, batch: dict) -> tuple[dict, dict]:
        """Adds one microbatch to `acc` (donated). Returns (acc, metrics sums)."""
        return self._entry("accumulate", state)(state, acc, batch)

    def apply_step(self, state: TrainState, acc: dict) -> tuple[TrainState, dict]:
        """Finalizes the accumulated gradient and updates the state (donated)."""
        return self._entry("apply", state)(state, acc)

    def train_step(self, state: TrainState, batch: dict) -> tuple[TrainState, dict]:
        """One microbatch = one optimizer step (state donated). Metrics include "loss"."""
        return self._entry("train", state)(state, batch)

    def accumulated_step(self, state: TrainState, microbatches: Iterable[dict], *,
                         global_rows: int | None = None) -> tuple[TrainState, dict]:
        """One optimizer step over several microbatches (host loop over `accumulate_step`).

        With `global_rows`, each microbatch holds only this process's rows of a global
        microbatch of that many rows (see `shard_batch`).

        Returns the new state and metrics: the summed accumulate metrics, "loss" (mean over
        real examples) and the apply metrics.
        """
        acc = self.init_accumulator(state)
        total = None
        for mb in microbatches:
            acc, m = self.accumulate_step(state, acc, self.shard_batch(mb, global_rows=global_rows))
            total = sum_metrics(total, m)
        if total is None:
            raise ValueError("accumulated_step needs at least one microbatch")
        state, apply_metrics = self.apply_step(state, acc)
        total = {**total, **apply_metrics}
        total["loss"] = total["loss_sum"] / jnp.maximum(total["count"], 1.0)
        return state, total


def make_train_functions(loss_fn: LossFn, optimizer: optax.GradientTransformation,
                         strategy: GradientStrategy | None = None, mesh: Mesh | None = None, *,
                         rules: tuple = LOGICAL_RULES, donate: bool = True) -> TrainFunctions:
    """Builds the step functions of the core (see the module docstring)."""
    return TrainFunctions(loss_fn=loss_fn, optimizer=optimizer, strategy=strategy or MeanGradient(), mesh=mesh,
                          rules=tuple(rules), donate=donate)
