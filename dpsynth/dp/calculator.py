"""`dpsynth privacy`: a privacy calculator for DP-SGD with Poisson sampling.

Examples:
    dpsynth privacy --dataset-size 3600 --batch-size 1024 --steps 50 --noise-multiplier 2.7 --delta 2.8e-4
    dpsynth privacy --dataset-size 3600 --batch-size 1024 --epochs 10 --epsilon 3 --json

With `--noise-multiplier` it prints epsilon from the RDP and PLD accountants; with
`--epsilon` it prints the calibrated noise multiplier (for `--accountant`, default RDP) and
the epsilon both accountants give for it. Delta defaults to 1 / dataset size (the paper's
choice, weak: see docs/dp.md); the output says which delta was used and where it came from.
Every number comes from the privacy plan (`dpsynth.dp.plan.plan_privacy`), as in the tuner.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from dpsynth.dp import accounting
from dpsynth.dp.plan import plan_privacy

DEFAULT_DELTA_SOURCE = "default 1/N (the paper's choice; weak, see docs/dp.md: prefer --delta well below 1/N)"


def compute(
    *,
    dataset_size: int,
    batch_size: float,
    delta: float | None = None,
    steps: int | None = None,
    epochs: float | None = None,
    noise_multiplier: float | None = None,
    epsilon: float | None = None,
    accountant: str = accounting.DEFAULT_ACCOUNTANT,
) -> dict:
    """Every input and result of one calculation, as a JSON-ready dict.

    Exactly one of `steps`/`epochs` and one of `noise_multiplier`/`epsilon` must be given.

    Raises:
        accounting.PrivacyConfigError: invalid or unreachable parameters.
    """
    if (steps is None) == (epochs is None):
        raise accounting.PrivacyConfigError("give exactly one of --steps and --epochs")
    if (noise_multiplier is None) == (epsilon is None):
        raise accounting.PrivacyConfigError("give exactly one of --noise-multiplier and --epsilon")
    if epsilon is not None:
        accounting.check_epsilon(epsilon)
    plan = plan_privacy(dataset_size=dataset_size, expected_batch_size=batch_size, steps=steps, epochs=epochs,
                        epsilon=epsilon, noise_multiplier=noise_multiplier, delta=delta, accountant=accountant)
    result = {
        "dataset_size": plan.dataset_size,
        "batch_size": float(batch_size),
        "sampling_probability": plan.sampling_probability,
        "steps": plan.steps,
        "epochs": float(epochs) if epochs is not None else plan.epochs,
        "delta": plan.delta,
        "delta_source": "given" if delta is not None else DEFAULT_DELTA_SOURCE,
        "adjacency": "add-or-remove one example",
        "sampling": "Poisson",
    }
    if epsilon is not None:
        result.update(target_epsilon=plan.target_epsilon, calibrated_with=accountant)
    eps = plan.epsilons()
    result.update(noise_multiplier=plan.noise_multiplier, epsilon_rdp=eps["rdp"], epsilon_pld=eps["pld"])
    return result


def _format(result: dict) -> str:
    lines = [
        f"dataset size N      {result['dataset_size']}",
        f"expected batch B    {result['batch_size']:g}  (Poisson sampling, q = B/N = {result['sampling_probability']:.6g})",
        f"steps T             {result['steps']}  ({result['epochs']:.4g} epochs)",
        f"delta               {result['delta']:.4g}  ({result['delta_source']})",
    ]
    if "target_epsilon" in result:
        lines.append(f"target epsilon      {result['target_epsilon']:g}  (calibrated with {result['calibrated_with'].upper()})")
    lines += [
        f"noise multiplier    {result['noise_multiplier']:.6g}",
        f"epsilon (RDP)       {result['epsilon_rdp']:.6g}",
        f"epsilon (PLD)       {result['epsilon_pld']:.6g}",
        "adjacency           add-or-remove one example",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dpsynth privacy", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset-size", type=int, required=True, help="number of training examples N")
    p.add_argument("--batch-size", type=float, required=True, help="expected (Poisson) batch size B; q = B / N")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--steps", type=int, help="number of DP-SGD steps T")
    g.add_argument("--epochs", type=float, help="epochs; T = ceil(epochs / q)")
    h = p.add_mutually_exclusive_group(required=True)
    h.add_argument("--noise-multiplier", type=float, help="sigma: noise std / clipping norm")
    h.add_argument("--epsilon", type=float, help="target epsilon: print the calibrated noise multiplier")
    p.add_argument("--delta", type=float, default=None, help="delta (default 1 / dataset size)")
    p.add_argument("--accountant", choices=accounting.ACCOUNTANTS, default=accounting.DEFAULT_ACCOUNTANT,
                   help="accountant used to calibrate with --epsilon (both are always reported)")
    p.add_argument("--json", action="store_true", help="print one JSON object with every input and result")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = compute(
            dataset_size=args.dataset_size, batch_size=args.batch_size, delta=args.delta, steps=args.steps,
            epochs=args.epochs, noise_multiplier=args.noise_multiplier, epsilon=args.epsilon,
            accountant=args.accountant,
        )
    except accounting.PrivacyConfigError as e:
        print(f"dpsynth privacy: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, sort_keys=True) if args.json else _format(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
