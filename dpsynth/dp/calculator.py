"""`dpsynth privacy`: a privacy calculator for DP-SGD with Poisson sampling.

Examples:
    dpsynth privacy --dataset-size 3600 --batch-size 1024 --steps 50 --noise-multiplier 2.7 --delta 2.8e-4
    dpsynth privacy --dataset-size 3600 --batch-size 1024 --epochs 10 --epsilon 3 --json

With `--noise-multiplier` it prints epsilon from the RDP and PLD accountants; with
`--epsilon` it prints the calibrated noise multiplier (for `--accountant`, default RDP) and
the epsilon both accountants give for it. Delta defaults to 1 / dataset size.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from dpsynth.dp import accounting


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
    q = accounting.sampling_probability(dataset_size, batch_size)
    if delta is None:
        delta = 1.0 / dataset_size
    delta = accounting.check_delta(delta)
    if steps is None:
        steps = accounting.steps_for_epochs(epochs, q)
    else:
        accounting.check_sampling(q, steps)
        epochs = steps * q
    result = {
        "dataset_size": int(dataset_size),
        "batch_size": float(batch_size),
        "sampling_probability": q,
        "steps": int(steps),
        "epochs": float(epochs),
        "delta": delta,
        "adjacency": "add-or-remove one example",
        "sampling": "Poisson",
    }
    if epsilon is not None:
        target = accounting.check_epsilon(epsilon)
        noise_multiplier = accounting.calibrate_noise_multiplier(target, delta, q, steps, accountant)
        result.update(target_epsilon=target, calibrated_with=accountant)
    elif noise_multiplier < 0 or math.isnan(noise_multiplier):
        raise accounting.PrivacyConfigError(f"noise multiplier must be >= 0, got {noise_multiplier}")
    eps = accounting.epsilons(q, steps, noise_multiplier, delta)
    result.update(noise_multiplier=float(noise_multiplier), epsilon_rdp=eps["rdp"], epsilon_pld=eps["pld"])
    return result


def _format(result: dict) -> str:
    lines = [
        f"dataset size N      {result['dataset_size']}",
        f"expected batch B    {result['batch_size']:g}  (Poisson sampling, q = B/N = {result['sampling_probability']:.6g})",
        f"steps T             {result['steps']}  ({result['epochs']:.4g} epochs)",
        f"delta               {result['delta']:.4g}",
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
