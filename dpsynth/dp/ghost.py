"""Ghost / book-keeping clipping: per-example clipped gradient sums without per-example gradients.

The vmapped clipping (`dpsynth.dp.clipping.clipped_grad_sum`) materialises B copies of every
trainable array. Here (after Bu et al.'s book-keeping, "fastDP") one forward and ONE backward pass
give, for every use of a trainable parameter, what its per-example gradient is made of; the
per-example norms and the clipped sum are computed from those pieces:

* a dense use `y = x @ W` (x [B, N, d_in], output gradient g [B, N, d_out]) has per-example
  gradient G_i = sum_n x_in g_in^T. Its norm is either the ghost norm
  ||G_i||^2 = sum_{n,m} (x_in . x_im)(g_in . g_im) (cost N^2 (d_in + d_out), kept: x and g), or
  G_i itself is formed inside the backward (cost N d_in d_out, kept: G_i, which is then smaller
  than x and g). Per layer, the cheaper one is chosen: ghost iff N (d_in + d_out) <= d_in d_out
  (the book-keeping rule), so nothing kept is larger than the layer's activations;
* a lookup `take(E, ids)` (token embedding, learned positions) is a dense use with one-hot x:
  (x_in . x_im) = [ids_in == ids_im];
* a parameter used twice (the input embedding tied to the output layer, logits = h E^T) gets
  the cross term: ||G_in + G_out||^2 = ||G_in||^2 + 2 <G_in, G_out> + ||G_out||^2, with
  <G_in, G_out>_i = sum_{n,m} g_im[ids_in] (e_in . h_im);
* norm scales and biases: the per-example gradient [B, d] (a sum over positions) directly.

Then w_i = min(1, C / ||g_i||) (0 for padding rows and for a non-finite norm) and the clipped sum
is sum_i w_i G_i per parameter: x^T (w g) for a dense use, a scatter of w e for a lookup, sum_i w_i G_i
for a formed one. No second backward pass.

How the pieces leave the model: the layers of `dpsynth.models.transformer` call `dense`, `lookup`,
`scale` and `bias` below instead of the plain ops (a LoRA adapter `(x @ a) @ b` is two `dense` uses,
of "a" and of "b"). Outside a clipping session they ARE the plain ops. A tap names its variable by
(module, name); the session resolves the variable's collection from the module (a name held by two
collections of one module raises: never merged), so each trainable leaf (collection, path) of any
trainable collection ("params" in full tuning, "lora" for adapters) maps to its own uses, and the
taps of frozen variables stay plain ops (they get no probe). Soft prompts ("prompt") have no tap and
are refused.

`clipped_grad_sum` first traces the loss abstractly (`jax.eval_shape`) in a "discover" session
(each call records its parameter, shapes and use), plans each use, then differentiates the loss
with respect to zero "probes", one per use, passed to the layers through the session: each
layer's custom VJP returns the use's pieces as its probe's cotangent (the pieces, not a
derivative: valid only for this one vjp, never exposed as a gradient).

Several model rows per example (the label contrast, `dpsynth.train.lm.make_label_contrast_loss`,
runs the model on B * K rows): the taps then see a leading batch of R * B. A loss that does this
must declare the layout of its rows with `example_major_rows` (the attribute `ROW_LAYOUT_ATTR`):
example i owns the CONTIGUOUS rows i * R .. i * R + R - 1 (what `x[B, K, T].reshape(B * K, T)`
gives). The pieces are then regrouped per example: factors [B * R, N, d] -> [B, R * N, d] (the
per-example gradient sum_r sum_n x_rn g_rn^T is one longer sum over positions), formed and
elementwise per-row gradients [B * R, ...] -> summed over the R rows. A tap batch other than B
without the declaration raises `GhostClippingError`; a wrong declaration (e.g. a label-major
layout, rows r * B + i) cannot be detected here and would mix examples: the declaring loss's test
compares its norms with the vmapped clipping (tests/dp/test_ghost.py).

Formal guarantee (same as the vmapped clipping): each real example's term w_i G_i has L2 norm
<= C and padding rows contribute exactly 0, so the sum has add-or-remove-one sensitivity C, PROVIDED
(1) every use of every trainable parameter goes through these taps (checked: a trainable parameter
without a tap raises `GhostClippingError`; the layer tests compare with the vmapped clipping on
every layer type, full and LoRA), (2) the loss is per-example separable, and (3) when the model
runs on R * B rows, the loss declares, truthfully, that example i owns rows i * R .. i * R + R - 1
(checked where declared: the label contrast's norms equal the vmapped clipping's).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import defaultdict
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpsynth.errors import DpsynthError

PyTree = Any
Key = tuple[str, ...]

_LOCAL = threading.local()
_MAX_EXACT_ID = 2**24  # ids travel as float32 cotangents: exact below this

# The row layout a loss declares (attribute ROW_LAYOUT_ATTR of the loss function) when it runs the
# model on R * B rows for B examples: EXAMPLE_MAJOR = example i owns rows i * R .. i * R + R - 1.
ROW_LAYOUT_ATTR = "ghost_row_layout"
EXAMPLE_MAJOR = "example_major"


def example_major_rows(loss_fn):
    """Declares (and returns) `loss_fn`: it runs the model on R * B rows, example i's in rows i * R .. i * R + R - 1.

    A privacy-critical claim: ghost clipping regroups the taps' pieces by it (module docstring).
    """
    setattr(loss_fn, ROW_LAYOUT_ATTR, EXAMPLE_MAJOR)
    return loss_fn


class GhostClippingError(DpsynthError, ValueError):
    """The loss or model cannot be clipped by the ghost path (untapped or unsupported parameter use)."""


@dataclasses.dataclass
class _Use:
    """One use of a parameter: its kind, how it is planned and the shapes of its pieces."""

    kind: str  # "dense" | "lookup" | "elementwise"
    param_shape: tuple[int, ...]
    a: jax.ShapeDtypeStruct | None = None  # dense/lookup: the param-axis-0 factor [B, N, d0] (ids [B, N])
    b: jax.ShapeDtypeStruct | None = None  # the param-axis-1 factor [B, N, d1]
    mode: str = "factors"  # "factors": (a, b) kept; "grad": the per-example gradient [B, *param] formed


class _Session:
    """One clipping pass: `batch_size` examples B; `grouped`: the loss declared example-major rows."""

    def __init__(self, discover: bool, batch_size: int, grouped: bool = False, uses=None, probes=None):
        self.discover = discover
        self.batch_size = batch_size
        self.grouped = grouped
        self.uses: dict[Key, list[_Use]] = defaultdict(list) if uses is None else uses
        self.probes = probes
        self.seen: dict[Key, int] = defaultdict(int)

    def check_rows(self, key: Key, rows: int):
        """Refuses a tap batch that is neither B nor (declared example-major) a multiple of B."""
        b = self.batch_size
        if rows == b or (self.grouped and rows % b == 0 and rows > 0):
            return
        raise GhostClippingError(
            f"{'/'.join(key)}: the model runs on {rows} rows for a batch of {b} examples; a loss that runs several "
            f"rows per example must declare their layout (dpsynth.dp.ghost.example_major_rows)"
            + (f", and {rows} is not a multiple of {b}" if self.grouped else ""))

    def __enter__(self):
        if getattr(_LOCAL, "session", None) is not None:
            raise GhostClippingError("ghost clipping sessions cannot nest")
        _LOCAL.session = self
        return self

    def __exit__(self, *exc):
        _LOCAL.session = None

    def next_use(self, key: Key):
        """(use, probe) of the next call for `key` in tap mode (None: not trainable)."""
        i = self.seen[key]
        self.seen[key] += 1
        if key not in self.probes:
            return None, None
        if i >= len(self.probes[key]):
            raise GhostClippingError(f"parameter {'/'.join(key)} is used more often than at discovery")
        return self.uses[key][i], self.probes[key][i]


def _session() -> _Session | None:
    return getattr(_LOCAL, "session", None)


def _key(module, name: str) -> Key:
    """(collection, *module path, name) of the variable `name` of `module`: exactly one collection must hold it."""
    cols = sorted(c for c, v in module.variables.items() if name in v)
    where = "/".join((*module.path, name))
    if len(cols) != 1:
        raise GhostClippingError(f"{where}: a tap must name exactly one variable, but collections {cols} hold "
                                 f"'{name}' in this module")
    return (cols[0], *module.path, name)


def _sds(shape, dtype) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(int(s) for s in shape), jnp.dtype(dtype))


def _flat(x, b: int):
    """[R * B, ..., d] -> [B, R * N, d]: example i's rows (i * R .. i * R + R - 1, example-major) as one sequence."""
    return x.reshape(b, -1, x.shape[-1])


def _flat_sds(x, b: int) -> jax.ShapeDtypeStruct:
    """The abstract value of `_flat(x, b)`."""
    return _sds((b, int(np.prod(x.shape[:-1])) // b, x.shape[-1]), x.dtype)


# ----------------------------------------------------------------------------- taps (model side)
def dense(module, name: str, x, w, *, transpose: bool = False, preferred_element_type=None):
    """`x @ w` (`x @ w.T` with `transpose`) where `w` is (a cast of) the parameter `name` of `module`."""

    def op(x, w):
        return jnp.dot(x, w.T if transpose else w, preferred_element_type=preferred_element_type)

    s = _session()
    if s is None:
        return op(x, w)
    key = _key(module, name)
    bsz = s.batch_size
    if s.discover:
        s.check_rows(key, x.shape[0])
        y = jax.eval_shape(op, x, w)
        a, b = (x, y) if not transpose else (y, x)
        s.uses[key].append(_Use("dense", tuple(w.shape), _flat_sds(a, bsz), _flat_sds(b, bsz)))
        return op(x, w)
    use, probe = s.next_use(key)
    if use is None:
        return op(x, w)

    @jax.custom_vjp
    def tapped(x, w, probe):
        return op(x, w)

    def fwd(x, w, probe):
        return op(x, w), (x, w)

    def bwd(res, g):
        x, w = res
        dx, dw = jax.vjp(op, x, w)[1](g)
        a, b = (_flat(x, bsz), _flat(g, bsz)) if not transpose else (_flat(g, bsz), _flat(x, bsz))
        if use.mode == "grad":
            pieces = jnp.einsum("bna,bnc->bac", a, b, preferred_element_type=jnp.float32)
        else:
            pieces = {"a": a.astype(use.a.dtype), "b": b.astype(use.b.dtype)}
        return dx, dw, pieces

    tapped.defvjp(fwd, bwd)
    return tapped(x, w, probe)


def lookup(module, name: str, table, ids):
    """`take(table, ids, axis=0)` where `table` is (a cast of) the parameter `name` of `module`."""

    def op(table):
        return jnp.take(table, ids, axis=0)

    s = _session()
    if s is None:
        return op(table)
    key = _key(module, name)
    bsz = s.batch_size
    if s.discover:
        s.check_rows(key, ids.shape[0])
        e = jax.eval_shape(op, table)
        s.uses[key].append(_Use("lookup", tuple(table.shape), _sds((bsz, ids.size // bsz), jnp.float32),
                                _flat_sds(e, bsz)))
        return op(table)
    use, probe = s.next_use(key)
    if use is None:
        return op(table)

    @jax.custom_vjp
    def tapped(table, probe):
        return op(table)

    def fwd(table, probe):
        return op(table), table

    def bwd(table, e):
        (dtable,) = jax.vjp(op, table)[1](e)
        return dtable, {"a": ids.reshape(bsz, -1).astype(jnp.float32), "b": _flat(e, bsz).astype(use.b.dtype)}

    tapped.defvjp(fwd, bwd)
    return tapped(table, probe)


def _elementwise(module, name: str, x, p, op):
    s = _session()
    if s is None:
        return op(x, p)
    key = _key(module, name)
    bsz = s.batch_size
    if s.discover:
        s.check_rows(key, x.shape[0])
        s.uses[key].append(_Use("elementwise", tuple(p.shape), mode="grad"))
        return op(x, p)
    use, probe = s.next_use(key)
    if use is None:
        return op(x, p)

    @jax.custom_vjp
    def tapped(x, p, probe):
        return op(x, p)

    def fwd(x, p, probe):
        return op(x, p), (x, p)

    def bwd(res, g):
        x, p = res
        dx, dp = jax.vjp(op, x, p)[1](g)
        # per-example dp: the same vjp with the batch axis kept (p broadcast over all other axes)
        per = jax.vmap(lambda xi, gi: jax.vjp(op, xi[None], p)[1](gi[None])[1])(x, g)
        per = jnp.sum(per.astype(jnp.float32).reshape((bsz, -1) + p.shape), axis=1)  # example-major rows: sum over R
        return dx, dp, per

    tapped.defvjp(fwd, bwd)
    return tapped(x, p, probe)


def scale(module, name: str, x, s):
    """`x * s` (s broadcast over the last axis) where `s` is (a function of) the parameter `name`."""
    return _elementwise(module, name, x, s, lambda x, s: x * s)


def bias(module, name: str, x, b):
    """`x + b` (b broadcast over the last axis) where `b` is (a cast of) the parameter `name`."""
    return _elementwise(module, name, x, b, lambda x, b: x + b)


# ----------------------------------------------------------------------------- the plan
def _leaves(params: PyTree) -> tuple[list[Key], Any]:
    """The trainable leaves' keys (collection, *path) in tree order, and the tree's structure."""
    flat, tree = jax.tree_util.tree_flatten_with_path(params)
    return [tuple(k.key for k in path) for path, _ in flat], tree


def _plan(uses: dict[Key, list[_Use]], params: PyTree) -> dict[Key, list[_Use]]:
    """Maps each trainable leaf (collection, path), of every trainable collection, to its tap uses, checks
    that it has some, and chooses each use's mode (see module doc). Uses of frozen variables are dropped."""
    keys, _ = _leaves(params)
    leaves = dict(zip(keys, jax.tree.leaves(params)))
    planned = {}
    for key, leaf in leaves.items():
        key_uses = uses.get(key)
        if not key_uses:
            raise GhostClippingError(f"trainable parameter {'/'.join(key)} is not computed through a ghost tap "
                                     "(dpsynth.dp.ghost): use the vmapped clipping for this model")
        for u in key_uses:
            if u.param_shape != tuple(leaf.shape):
                raise GhostClippingError(f"{'/'.join(key)}: tapped shape {u.param_shape} != parameter {leaf.shape}")
            if u.kind == "lookup" and u.param_shape[0] > _MAX_EXACT_ID:
                raise GhostClippingError(f"{'/'.join(key)}: tables above {_MAX_EXACT_ID} rows are not supported")
        kinds = {u.kind for u in key_uses}
        if "elementwise" in kinds and len(kinds) > 1:
            raise GhostClippingError(f"{'/'.join(key)}: mixed elementwise and matrix uses are not supported")
        out = []
        for u in key_uses:
            if u.kind == "dense" and len(key_uses) == 1:
                n, d0, d1 = u.a.shape[1], u.param_shape[0], u.param_shape[1]
                u = dataclasses.replace(u, mode="factors" if n * (d0 + d1) <= d0 * d1 else "grad")
            out.append(u)
        planned[key] = out
    return planned


def _zero_probes(planned: dict[Key, list[_Use]], batch_size: int) -> dict[Key, list[PyTree]]:
    def one(u):
        if u.mode == "grad":
            return jnp.zeros((batch_size,) + u.param_shape, jnp.float32)
        return {"a": jnp.zeros(u.a.shape, u.a.dtype), "b": jnp.zeros(u.b.shape, u.b.dtype)}

    return {k: [one(u) for u in us] for k, us in planned.items()}


# ----------------------------------------------------------------------------- norms and sums
def _a_gram(u: _Use, pu, v: _Use, pv):
    """[B, N_u, N_v]: the per-example inner products a_u,n . a_v,m (ids are one-hot rows)."""
    if u.kind == "lookup" and v.kind == "lookup":
        return (pu["a"][:, :, None] == pv["a"][:, None, :]).astype(jnp.float32)
    if u.kind == "lookup":
        return _a_gram(v, pv, u, pu).transpose(0, 2, 1)
    if v.kind == "lookup":  # a_u,n [d0] . onehot(ids_m) = a_u,n[ids_m]
        ids = pv["a"].astype(jnp.int32)
        idx = jnp.broadcast_to(ids[:, None, :], (ids.shape[0], pu["a"].shape[1], ids.shape[1]))
        return jnp.take_along_axis(pu["a"], idx, axis=2).astype(jnp.float32)
    return jnp.einsum("bna,bma->bnm", pu["a"], pv["a"], preferred_element_type=jnp.float32)


def _inner(u: _Use, pu, v: _Use, pv):
    """Per-example <G_u, G_v> [B] of two factored uses of one parameter."""
    bb = jnp.einsum("bnc,bmc->bnm", pu["b"], pv["b"], preferred_element_type=jnp.float32)
    return jnp.sum(_a_gram(u, pu, v, pv) * bb, axis=(1, 2))


def _sq_norms(planned, pieces, batch_size: int):
    total = jnp.zeros((batch_size,), jnp.float32)
    for key, us in planned.items():
        ps = pieces[key]
        grads = [p for u, p in zip(us, ps) if u.mode == "grad"]
        if grads:
            per = sum(grads[1:], grads[0])
            total += jnp.sum(jnp.square(per).reshape(batch_size, -1), axis=1)
        fac = [(u, p) for u, p in zip(us, ps) if u.mode == "factors"]
        for i, (u, pu) in enumerate(fac):
            total += _inner(u, pu, u, pu)
            for v, pv in fac[i + 1:]:
                total += 2.0 * _inner(u, pu, v, pv)
    return total


def _weighted_sum(u: _Use, p, w, keep):
    """sum_i w_i G_i of one use (rows with keep = False contribute exactly 0, even if non-finite)."""
    if u.mode == "grad":
        p = jnp.where(keep.reshape((-1,) + (1,) * (p.ndim - 1)), p, 0.0)
        return jnp.einsum("b...,b->...", p, w)
    kb = keep[:, None, None]
    b = jnp.where(kb, p["b"] * w[:, None, None].astype(p["b"].dtype), 0)
    if u.kind == "lookup":
        ids = jnp.where(keep[:, None], p["a"].astype(jnp.int32), 0).reshape(-1)
        return jnp.zeros(u.param_shape, jnp.float32).at[ids].add(b.reshape(-1, b.shape[-1]).astype(jnp.float32))
    a = jnp.where(kb, p["a"], 0)
    return jnp.einsum("bna,bnc->ac", a, b, preferred_element_type=jnp.float32)


def clipped_grad_sum(loss_fn, params: PyTree, frozen: PyTree, batch: dict, key: jax.Array, clip_norm: float):
    """Ghost-clipped sum over real examples; the same contract as `clipping.clipped_grad_sum`.

    `params` may hold any trainable collections whose variables the model uses through the taps
    ("params", "lora"; not "prompt"). A loss that runs the model on R * B rows must carry the
    example-major declaration (`example_major_rows`). Returns (clipped_sum like params, per-example
    losses [B], per-example gradient norms [B]); losses and norms are non-private diagnostics. Raises
    `GhostClippingError` when a trainable parameter is not computed through a tap, or the rows are
    undeclared (see the module docstring).
    """
    if "mask" not in batch:
        raise ValueError("batch needs a 'mask' [B] array (1 = real example, 0 = padding)")
    if "prompt" in params:
        raise GhostClippingError("ghost clipping does not support soft prompts (trainable collection 'prompt' has no "
                                 "tap): use the vmapped clipping for prompt tuning")
    layout = getattr(loss_fn, ROW_LAYOUT_ATTR, None)
    if layout not in (None, EXAMPLE_MAJOR):
        raise GhostClippingError(f"loss row layout {layout!r} is not supported (only {EXAMPLE_MAJOR!r})")
    mask = batch["mask"]
    bsz = mask.shape[0]
    session = dict(batch_size=bsz, grouped=layout == EXAMPLE_MAJOR)
    with _Session(discover=True, **session) as found:
        # a fresh function: a cached abstract trace would skip the taps' recording
        jax.eval_shape(lambda *args: loss_fn(*args), params, frozen, batch, key)
    planned = _plan(dict(found.uses), params)

    def losses_of(probes):
        with _Session(discover=False, uses=planned, probes=probes, **session) as tapped:
            per_example, _ = loss_fn(params, frozen, batch, key)
        missing = [k for k, us in planned.items() if tapped.seen[k] != len(us)]
        if missing:  # an unread probe would drop a use's share of the norm
            raise GhostClippingError(f"parameter {'/'.join(missing[0])} was used differently than at discovery")
        return per_example

    losses, vjp = jax.vjp(losses_of, _zero_probes(planned, bsz))
    (pieces,) = vjp(jnp.ones_like(losses))
    norms = jnp.sqrt(jnp.maximum(_sq_norms(planned, pieces, bsz), 0.0))
    keep = (mask > 0) & jnp.isfinite(norms)
    w = jnp.where(keep, jnp.minimum(1.0, clip_norm / jnp.maximum(norms, 1e-30)), 0.0)
    keys, tree = _leaves(params)
    grads = [sum(_weighted_sum(u, p, w, keep) for u, p in zip(planned[k], pieces[k])).astype(jnp.float32)
             for k in keys]
    return jax.tree_util.tree_unflatten(tree, grads), losses, norms
