"""Benchmark: noise in the running sum of updates, BandMF vs DP-SGD at equal epsilon.

Peer: DP-SGD (iid noise, Poisson sampling) calibrated to the same (epsilon, delta) on the same
N, expected batch B and T steps. For each number of bands b it prints both calibrated noise
multipliers (PLD) and the ratio of the root-mean-square noise in the prefix sums of the noisy
gradients (the quantity BandMF's strategy is optimised for; the model after t steps of SGD is a
prefix sum of updates):

    RMS(BandMF) / RMS(DP-SGD) = (sigma_b / sigma_1) * sqrt(mean_t ||(A C^{-1})_t||^2 / mean_t t)

with A the T x T prefix-sum matrix and C the optimised, column-normalised b-banded strategy
(`dpsynth.dp.bandmf.optimized_coefs`, cached). A ratio below 1 means less noise in what the
model accumulates at the same epsilon. It says nothing about sampling effects on the gradient
itself; the utility comparison is a training run (see docs/dp.md).

    .venv/bin/python bench/bandmf_noise.py                                    # N=3600, B=64, T=1000
    .venv/bin/python bench/bandmf_noise.py --steps 2000 --bands 2 4 8 16 --epsilon 1

`--train` also trains a toy model through the real training core with both mechanisms at the
same epsilon (`dpsynth.dp.mechanisms.run.build_run_mechanism`: the tuner's strategies and samplers)
and prints the final training loss of each (mean over `--seeds`): linear regression on
synthetic data (d = 20, y = x.w + 0.5 noise), per-example squared loss, clipping norm 1, SGD
with momentum 0.9. A toy, not the LM study.

    .venv/bin/python bench/bandmf_noise.py --train --bands 8 --seeds 3
"""

from __future__ import annotations

import argparse

import numpy as np

from dpsynth.dp import bandmf
from dpsynth.dp.plan import plan_privacy


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset-size", type=int, default=3600)
    p.add_argument("--batch-size", type=float, default=64)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--epsilon", type=float, default=3.0)
    p.add_argument("--bands", type=int, nargs="+", default=[2, 4, 8, 16])
    p.add_argument("--train", action="store_true", help="also train the toy model with both mechanisms")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--learning-rate", type=float, default=0.05)
    args = p.parse_args(argv)
    if args.train:
        train_toy(args)
        return
    n = args.steps
    common = dict(dataset_size=args.dataset_size, expected_batch_size=args.batch_size, steps=n,
                  epsilon=args.epsilon, accountant="pld")
    dpsgd = plan_privacy(**common)
    err_dpsgd = np.mean(np.arange(1, n + 1))
    prefix = np.tril(np.ones((n, n)))
    print(f"N={args.dataset_size} B={args.batch_size:g} T={n} epsilon={args.epsilon:g} delta={dpsgd.delta:.3g} (PLD)")
    print(f"peer DP-SGD: sigma {dpsgd.noise_multiplier:.4f}")
    for b in args.bands:
        plan = plan_privacy(**common, mechanism="bandmf", bands=b)
        coefs = bandmf.optimized_coefs(n, b)
        work = prefix @ np.linalg.inv(bandmf.strategy_matrix(n, coefs))
        err = np.mean(np.sum(work ** 2, axis=1))
        ratio = plan.noise_multiplier / dpsgd.noise_multiplier * np.sqrt(err / err_dpsgd)
        print(f"BandMF b={b:3d}: sigma {plan.noise_multiplier:.4f}  prefix-sum noise RMS / DP-SGD's = {ratio:.3f}")


def train_toy(args) -> None:
    """Final training loss of DP-SGD and BandMF (each band count) on the toy regression."""
    import jax
    import jax.numpy as jnp
    import optax

    from dpsynth.dp.mechanisms.run import build_run_mechanism
    from dpsynth.train import core

    n, d = args.dataset_size, 20
    rng = np.random.default_rng(0)
    w_true = rng.normal(size=d) / np.sqrt(d)
    x = rng.normal(size=(n, d)).astype(np.float32)
    y = (x @ w_true + 0.5 * rng.normal(size=n)).astype(np.float32)
    data = {"x": x, "y": y}

    def loss_fn(params, frozen, batch, key):
        return (batch["x"] @ params["w"] + params["b"] - batch["y"]) ** 2, {}

    def full_loss(params):
        return float(np.mean((x @ np.asarray(params["w"]) + float(params["b"]) - y) ** 2))

    common = dict(dataset_size=n, expected_batch_size=args.batch_size, steps=args.steps, epsilon=args.epsilon,
                  accountant="pld")
    print(f"toy regression N={n} d={d} B={args.batch_size:g} T={args.steps} epsilon={args.epsilon:g} (PLD), "
          f"SGD lr {args.learning_rate} momentum 0.9, C=1, {args.seeds} seeds; loss of w=0: "
          f"{full_loss({'w': np.zeros(d), 'b': 0.0}):.4f}, of w*: {full_loss({'w': w_true, 'b': 0.0}):.4f}")
    results = {}
    for label, kw in [("DP-SGD", {})] + [(f"BandMF b={b}", {"mechanism": "bandmf", "bands": b}) for b in args.bands]:
        plan = plan_privacy(**common, **kw)
        losses = []
        for seed in range(args.seeds):
            mech = build_run_mechanism(plan, clip_norm=1.0, microbatch_size=128, seed=1000 + seed, num_rows=n)
            fns = core.make_train_functions(loss_fn, optax.sgd(args.learning_rate, momentum=0.9), mech.strategy)
            state = fns.init_state({"w": jnp.zeros(d), "b": jnp.zeros(())}, {}, rng=seed)
            for step in range(plan.steps):
                state, _ = fns.accumulated_step(state, mech.microbatches(data, step))
            losses.append(full_loss(jax.device_get(state.params)))
        results[label] = float(np.mean(losses))
        print(f"{label:14s} sigma {plan.noise_multiplier:.4f}  final loss {results[label]:.4f} "
              f"(seeds: {', '.join(f'{v:.4f}' for v in losses)})  ratio to DP-SGD {results[label] / results['DP-SGD']:.3f}")


if __name__ == "__main__":
    main()
