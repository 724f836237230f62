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
    args = p.parse_args(argv)
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


if __name__ == "__main__":
    main()
