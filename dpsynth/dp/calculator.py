"""`dpsynth privacy`: a privacy calculator for DP-SGD (and BandMF) with Poisson sampling.

Examples:
    dpsynth privacy --dataset-size 3600 --batch-size 1024 --steps 50 --noise-multiplier 2.7 --delta 2.8e-4
    dpsynth privacy --dataset-size 3600 --batch-size 1024 --epochs 10 --epsilon 3 --json
    dpsynth privacy --privacy-unit user --num-users 600 --batch-size 128 --steps 50 --noise-multiplier 1.0
    dpsynth privacy --dataset-size 3600 --batch-size 64 --steps 1000 --epsilon 3 --mechanism bandmf --bands 8
    dpsynth privacy --dataset-size 3600 --batch-size 128 --steps 50 --noise-multiplier 1.0 --max-examples-per-user 6

With `--noise-multiplier` it prints epsilon from the RDP and PLD accountants; with
`--epsilon` it prints the calibrated noise multiplier (for `--accountant`, default RDP) and
the epsilon both accountants give for it. Delta defaults to 1 / (number of units: examples, or
users) (the paper's choice, weak: see docs/dp.md); the output says which delta was used and
where it came from. Every number comes from the privacy plan (`dpsynth.dp.plan.plan_privacy`),
as in the tuner.

`--privacy-unit user --num-users U`: user-level DP (`dpsynth.dp.users`): Poisson sampling over
U users, B expected users per step, adjacency add-or-remove one user. `--mechanism bandmf
--bands b`: BandMF with cyclic Poisson sampling (`dpsynth.dp.bandmf`). At example level,
`--max-examples-per-user K` also prints what the example-level run guarantees a person with
up to K rows (jax-privacy's `DpsgdTrainingUserLevelAccountant`, PLD; integer batch only).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from dpsynth import errors, logs
from dpsynth.dp import accounting
from dpsynth.dp import histogram, mechanisms, private_selection
from dpsynth.dp.plan import plan_privacy
from dpsynth.dp.users import PRIVACY_UNITS

DEFAULT_DELTA_SOURCE = "default 1/N (the paper's choice; weak, see docs/dp.md: prefer --delta well below 1/N)"
USER_DELTA_SOURCE = "default 1/|users| (weak, see docs/dp.md: prefer --delta well below 1/|users|)"


def example_dpsgd_epsilon_per_user(*, dataset_size: int, batch_size: int, steps: int, noise_multiplier: float,
                                   delta: float, max_examples_per_user: int) -> float:
    """Epsilon of example-level DP-SGD for a person with up to K rows (jax-privacy, PLD).

    Each of the person's K rows is sampled independently with q = B / N, each contributes a
    clipped term: jax-privacy's `DpsgdTrainingUserLevelAccountant` (arXiv:2401.10294).
    """
    if int(batch_size) != batch_size:
        raise accounting.PrivacyConfigError("the per-user view of example-level DP-SGD needs an integer batch size")
    if int(max_examples_per_user) != max_examples_per_user or max_examples_per_user < 1:
        raise accounting.PrivacyConfigError(f"--max-examples-per-user must be >= 1, got {max_examples_per_user}")
    from jax_privacy import accounting as jp_accounting

    config = jp_accounting.PldAccountantConfig(value_discretization_interval=accounting.PLD_DISCRETIZATION)
    params = jp_accounting.DpParams(noise_multipliers=float(noise_multiplier), num_samples=int(dataset_size),
                                    delta=float(delta), batch_size=int(batch_size),
                                    examples_per_user=int(max_examples_per_user))
    return float(jp_accounting.DpsgdTrainingUserLevelAccountant(config).compute_epsilon(int(steps), params))


def compute(
    *,
    dataset_size: int | None = None,
    batch_size: float,
    delta: float | None = None,
    steps: int | None = None,
    epochs: float | None = None,
    noise_multiplier: float | None = None,
    epsilon: float | None = None,
    accountant: str = accounting.DEFAULT_ACCOUNTANT,
    privacy_unit: str = "example",
    num_users: int | None = None,
    mechanism: str = mechanisms.DEFAULT,
    bands: int | None = None,
    max_examples_per_user: int | None = None,
    allow_large_delta: bool = False,
    reserve_selection_epsilon: float = 0.0,
    reserve_label_noise_multiplier: float = 0.0,
) -> dict:
    """Every input and result of one calculation, as a JSON-ready dict.

    Exactly one of `steps`/`epochs` and one of `noise_multiplier`/`epsilon` must be given;
    `dataset_size` at example level, `num_users` at user level. A delta above 1/N is refused
    unless `allow_large_delta` (the result then carries a `delta_warning`).
    `reserve_selection_epsilon`: the epsilon of a later DP selection on a positionally split D_valid
    that the target covers too (`dpsynth.dp.private_selection.reserved_entry`; RDP only).
    `reserve_label_noise_multiplier`: sigma of a later DP label histogram of D_train that the target
    covers too (`dpsynth.dp.histogram.reserved_entry`), as `dp-tune --reserve-label-noise-multiplier`.

    Raises:
        accounting.PrivacyConfigError: invalid or unreachable parameters.
    """
    if (steps is None) == (epochs is None):
        raise accounting.PrivacyConfigError("give exactly one of --steps and --epochs")
    if (noise_multiplier is None) == (epsilon is None):
        raise accounting.PrivacyConfigError("give exactly one of --noise-multiplier and --epsilon")
    if privacy_unit == "user":
        if num_users is None:
            raise accounting.PrivacyConfigError("--privacy-unit user needs --num-users")
        units = num_users
    else:
        if num_users is not None:
            raise accounting.PrivacyConfigError("--num-users needs --privacy-unit user")
        if dataset_size is None:
            raise accounting.PrivacyConfigError("give --dataset-size (or --privacy-unit user --num-users)")
        units = dataset_size
    if epsilon is not None:
        accounting.check_epsilon(epsilon)
    reserve = float(reserve_selection_epsilon or 0.0)
    if reserve < 0 or not math.isfinite(reserve):
        raise accounting.PrivacyConfigError(f"--reserve-selection-epsilon must be a finite number >= 0, got {reserve}")
    sigma_h = float(reserve_label_noise_multiplier or 0.0)
    if sigma_h < 0 or not math.isfinite(sigma_h):
        raise accounting.PrivacyConfigError(
            f"--reserve-label-noise-multiplier must be a finite number >= 0, got {sigma_h}")
    if sigma_h and privacy_unit != "example":
        raise accounting.PrivacyConfigError("--reserve-label-noise-multiplier: a DP label histogram does not compose "
                                            "into a user-level run")
    # (in the order `dpsynth.train.tune_config.reserved_entries` reserves them)
    reserved = (((histogram.reserved_entry(sigma_h),) if sigma_h else ())
                + ((private_selection.reserved_entry(reserve),) if reserve else ()))
    plan = plan_privacy(dataset_size=units, expected_batch_size=batch_size, steps=steps, epochs=epochs,
                        epsilon=epsilon, noise_multiplier=noise_multiplier, delta=delta, accountant=accountant,
                        mechanism=mechanism, bands=bands, privacy_unit=privacy_unit,
                        allow_large_delta=allow_large_delta, reserved=reserved)
    user = privacy_unit == "user"
    result = {
        "privacy_unit": privacy_unit,
        "dataset_size": int(units),
        "batch_size": float(batch_size),
        "sampling_probability": plan.sampling_probability,
        "steps": plan.steps,
        "epochs": float(epochs) if epochs is not None else plan.epochs,
        "delta": plan.delta,
        "delta_source": "given" if delta is not None else (USER_DELTA_SOURCE if privacy_unit == "user"
                                                           else DEFAULT_DELTA_SOURCE),
        "adjacency": "add-or-remove one user (all of their examples)" if user else "add-or-remove one example",
        "sampling": ("cyclic Poisson sampling" if plan.bands > 1 else "Poisson sampling") + (" over users" if user else ""),
        "mechanism": plan.mechanism,
        "bands": plan.bands,
    }
    if accounting.weak_delta(plan.delta, units):
        result["delta_warning"] = accounting.weak_delta_note(plan.delta, units, "users" if user else "examples")
    if user:
        result["num_users"] = int(num_users)
        if max_examples_per_user is not None:
            result["max_examples_per_user"] = int(max_examples_per_user)
    if epsilon is not None:
        result.update(target_epsilon=plan.target_epsilon, calibrated_with=accountant)
    eps = plan.epsilons()
    result.update(noise_multiplier=plan.noise_multiplier, epsilon_rdp=eps["rdp"], epsilon_pld=eps["pld"])
    if reserve:
        result.update(reserve_selection_epsilon=reserve, reserved_entry=dict(plan.reserved[-1]))
    if sigma_h:
        result.update(reserve_label_noise_multiplier=sigma_h)
    if reserved:
        result.update(epsilon_with_reserved_rdp=plan.epsilon_with_reserved("rdp"))
    if not user and max_examples_per_user is not None:
        if plan.mechanism != mechanisms.DEFAULT:
            raise accounting.PrivacyConfigError(f"--max-examples-per-user at example level is only analysed for "
                                                f"{mechanisms.DEFAULT}")
        result["max_examples_per_user"] = int(max_examples_per_user)
        result["epsilon_per_user_pld"] = (math.inf if plan.noise_multiplier == 0 else example_dpsgd_epsilon_per_user(
            dataset_size=units, batch_size=batch_size, steps=plan.steps, noise_multiplier=plan.noise_multiplier,
            delta=plan.delta, max_examples_per_user=max_examples_per_user))
    return result


def _format(result: dict) -> str:
    user = result["privacy_unit"] == "user"
    what = "users" if user else "examples"
    q_of = "B/floor(N/b)" if result["bands"] > 1 else "B/N"
    lines = [f"{result['delta_warning']}"] if "delta_warning" in result else []
    lines += [
        f"dataset size N      {result['dataset_size']} {what}",
        f"expected batch B    {result['batch_size']:g} {what}  ({result['sampling']}, q = {q_of} = "
        f"{result['sampling_probability']:.6g})",
        f"steps T             {result['steps']}  ({result['epochs']:.4g} epochs)",
        f"delta               {result['delta']:.4g}  ({result['delta_source']})",
    ]
    if "target_epsilon" in result:
        lines.append(f"target epsilon      {result['target_epsilon']:g}  (calibrated with {result['calibrated_with'].upper()})")
    lines += [
        f"noise multiplier    {result['noise_multiplier']:.6g}",
        f"epsilon (RDP)       {result['epsilon_rdp']:.6g}",
        f"epsilon (PLD)       {result['epsilon_pld']:.6g}",
        f"adjacency           {result['adjacency']}",
    ]
    if "reserve_label_noise_multiplier" in result:
        lines.append(f"reserved histogram  a DP label histogram of D_train at noise multiplier "
                     f"{result['reserve_label_noise_multiplier']:g}")
    if "reserve_selection_epsilon" in result:
        lines.append(f"reserved selection  epsilon {result['reserve_selection_epsilon']:g} on D_valid (accounted at "
                     f"{result['reserved_entry']['epsilon']:g}: positional split)")
    if "epsilon_with_reserved_rdp" in result:
        lines.append(f"with the reserved   epsilon (RDP) {result['epsilon_with_reserved_rdp']:.6g}")
    mechanism = mechanisms.get(result["mechanism"]).plan_line(result["bands"])
    if mechanism:
        lines.append(f"mechanism           {mechanism}")
    if "epsilon_per_user_pld" in result:
        lines.append(f"per user (<= {result['max_examples_per_user']} rows) {result['epsilon_per_user_pld']:.6g}  "
                     "(PLD: what this example-level run guarantees a person with that many rows)")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dpsynth privacy", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset-size", type=int, help="number of training examples N (example level)")
    p.add_argument("--batch-size", type=float, required=True,
                   help="expected (Poisson) batch size B (users per step at user level); q = B / N")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--steps", type=int, help="number of DP-SGD steps T")
    g.add_argument("--epochs", type=float, help="epochs; T = ceil(epochs / q)")
    h = p.add_mutually_exclusive_group(required=True)
    h.add_argument("--noise-multiplier", type=float, help="sigma: noise std / clipping norm")
    h.add_argument("--epsilon", type=float, help="target epsilon: print the calibrated noise multiplier")
    p.add_argument("--delta", type=float, default=None, help="delta (default 1 / dataset size)")
    p.add_argument("--allow-large-delta", action="store_true",
                   help="accept a delta above 1/N, which protects nobody (refused by default; the output says it)")
    p.add_argument("--accountant", choices=accounting.ACCOUNTANTS, default=accounting.DEFAULT_ACCOUNTANT,
                   help="accountant used to calibrate with --epsilon (both are always reported; default: %(default)s)")
    p.add_argument("--privacy-unit", choices=PRIVACY_UNITS, default="example",
                   help="unit of privacy: one example (default) or one user (with --num-users)")
    p.add_argument("--num-users", type=int, default=None, help="number of users U (--privacy-unit user)")
    p.add_argument("--max-examples-per-user", type=int, default=None,
                   help="K: at user level the contribution bound (recorded); at example level, also print the "
                        "guarantee of the example-level run for a person with up to K rows")
    p.add_argument("--mechanism", choices=mechanisms.names(), default=mechanisms.DEFAULT,
                   help="dpsgd (iid noise, default) or bandmf (banded correlated noise, cyclic Poisson sampling)")
    p.add_argument("--bands", type=int, default=None, help="BandMF bands b (= the sampling cycle length)")
    p.add_argument("--reserve-selection-epsilon", type=float, default=0.0, metavar="EPSILON",
                   help="the epsilon of a later `dpsynth select` on a positionally split D_valid (sequential, at "
                        "twice this epsilon) that --epsilon covers too, as `dp-tune --reserve-selection-epsilon` "
                        "(default: %(default)s)")
    p.add_argument("--reserve-label-noise-multiplier", type=float, default=0.0, metavar="SIGMA",
                   help="sigma of a later DP label histogram of D_train (`dpsynth select --label-source`) that "
                        "--epsilon covers too, as `dp-tune --reserve-label-noise-multiplier` "
                        "(default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object with every input and result")
    logs.add_flags(p)
    return p


@errors.command("privacy")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(fmt="%(message)s", verbose=args.verbose)
    result = compute(
        dataset_size=args.dataset_size, batch_size=args.batch_size, delta=args.delta, steps=args.steps,
        epochs=args.epochs, noise_multiplier=args.noise_multiplier, epsilon=args.epsilon,
        accountant=args.accountant, privacy_unit=args.privacy_unit, num_users=args.num_users,
        mechanism=args.mechanism, bands=args.bands,
        max_examples_per_user=args.max_examples_per_user, allow_large_delta=args.allow_large_delta,
        reserve_selection_epsilon=args.reserve_selection_epsilon,
        reserve_label_noise_multiplier=args.reserve_label_noise_multiplier,
    )
    print(json.dumps(result, sort_keys=True) if args.json else _format(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
