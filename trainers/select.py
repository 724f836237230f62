"""`dpsynth select`: the best synthetic corpus for the budget, chosen with DP on the real D_valid.

    dpsynth select --model runs/lora --valid data/valid.csv --epsilon 1 --out runs/synth \
        [--guidance 0,1.5,3,6] [--temperatures 1,1.2] [--multiples 1,3] \
        [--screen-size 2000] [--time-budget 3600] [--dry-run]
        [--label-source data/train.csv [--label-noise-multiplier SIGMA]] [Beam flags...]
    dpsynth select --candidates runs/synth_a runs/synth_b ... --valid data/valid.csv --epsilon 1 --out runs/synth

With `--model`, the candidates are generated first under `OUT.candidates/`: by default each
sampling setting once as a small candidate (`--screen-size` train examples), and only the
winner's setting is then generated at the size asked for (the largest `--multiples` x |D_train|
that fits `--time-budget`, re-planned after the selection at the winner's sampling rate: it only
grows) and released (post-processing of the model and the DP choice: no further privacy cost;
`dpsynth.evaluate.screening`); with `--screen-size 0`, each setting at its largest multiple
(smaller multiples are its prefixes), every one a candidate. Before any generation the plan is
printed (examples, tokens, classifier trainings, an ETA from a timed probe of the real model);
`--time-budget` (default one hour, the probe's time included; 0: no limit) shrinks the plan to fit
(`screening.SHRINK_ORDER`: the released size within `--multiples`, the screening size, the
sampling settings, the released size below `--multiples`), refusing only when even the smallest
does not fit; `--dry-run` stops after the plan. The plan is fixed before `--valid` is read.
With `--candidates`, they are corpus directories that exist. A classifier is trained on each
candidate's synthetic splits and its correct predictions on the real `--valid` are counted; only
the winner is released, by the exponential mechanism (or `--mechanism gaussian`) at
`--epsilon`, into `--out` (a corpus directory: splits, composed `privacy_report.json`,
`selection.json`). The counts stay in the owner-only `OUT.private/`. Before any generation,
`--valid` is checked disjoint from D_train (`--label-source`, or the record hashes dp-tune kept
in the model's private state), and a DP label histogram is checked against the tuning's target
(drawn at the sigma the tuning reserved). See `dpsynth.evaluate.dp_select` and docs/dp.md,
"DP selection on D_valid".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from dpsynth import binding, errors, logs, outdir
from dpsynth.data import dead_letters, read_config, readers


# `GenerateConfig` fields that are flags here (with --model; the grid sets the sampling and sizes).
_GENERATE_BOUND = ("max_len", "batch_size", "seed", "memory_limit", "memory_headroom")


def _floats(s: str) -> tuple[float, ...]:
    return tuple(float(x) for x in s.split(",") if x.strip())


def parser() -> argparse.ArgumentParser:
    from dpsynth.dp import private_selection as ps
    from dpsynth.evaluate import dp_select, registry, screening
    from dpsynth.evaluate import train_classifier as tc
    from dpsynth.generate.plan import GenerateConfig
    from dpsynth.train import resources

    ap = argparse.ArgumentParser(prog="dpsynth select", description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="DP-tuned model directory: generate the candidate grid from it")
    src.add_argument("--candidates", nargs="+", help="existing synthetic corpus directories to choose among")
    ap.add_argument("--valid", required=True, help="the real D_valid (disjoint from D_train: checked against "
                                                   "--label-source or the model's D_train record hashes)")
    ap.add_argument("--out", required=True, help="the selected corpus directory")
    binding.add_flags(ap, dp_select.SelectConfig, overrides={
        "epsilon": {"help": "epsilon of the selection on D_valid"},
        "mechanism": {"choices": ps.MECHANISMS},
        "delta": {"help": "the Gaussian selection's delta (default: the candidates')"},
        "split": {"choices": ps.SPLITS, "help": "how D_valid was split from D: files / hash (data-independent: "
                                                "parallel composition with the tuning) or positional (sequential)"},
        "classifier": {"choices": registry.names()},
        "cnn": {"choices": tc.CNN_SIZES},
        "seed": {"help": "fix the selection's randomness (tests only: voids the guarantee for whoever knows it)"},
    })
    g = ap.add_argument_group("the candidate grid (with --model)")
    g.add_argument("--guidance", type=_floats, default=dp_select.DEFAULT_GUIDANCES,
                   help=f"guidance weights w (comma-separated; default: {','.join(map(str, dp_select.DEFAULT_GUIDANCES))})")
    g.add_argument("--temperatures", type=_floats, default=dp_select.DEFAULT_TEMPERATURES,
                   help=f"sampling temperatures (comma-separated; default: {','.join(map(str, dp_select.DEFAULT_TEMPERATURES))})")
    g.add_argument("--multiples", type=_floats, default=dp_select.DEFAULT_MULTIPLES,
                   help="synthetic train sizes as multiples of |D_train| (the model's report's dataset size; "
                        f"comma-separated; default: {','.join(map(str, dp_select.DEFAULT_MULTIPLES))})")
    g.add_argument("--valid-fraction", type=float, default=0.1,
                   help="synthetic valid = this x synthetic train (default: %(default)s)")
    g.add_argument("--screen-size", type=int, default=None, metavar="N",
                   help=f"synthetic train examples per sampling setting when screening (default "
                        f"{screening.DEFAULT_SCREEN_SIZE}): the DP choice is made among these small candidates and only "
                        "the winner's setting is generated at the largest --multiples x |D_train| that fits --time-budget "
                        "and released (no further privacy cost); the multiple is not chosen on D_valid. 0: every candidate of the grid at full "
                        "size, the multiples chosen too (the pre-screening behaviour)")
    g.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="seconds the whole run (the probe, generation and classifiers) may take, by the ETA measured "
                        "on this machine (a timed probe of the model's sampler and of one classifier training, its "
                        f"own time included; default {screening.DEFAULT_TIME_BUDGET} = one hour; 0: no limit): a plan "
                        f"that does not fit shrinks {screening.shrink_order_text()}; the run is refused only when "
                        "even that does not fit. The plan says what shrank; the choice reads no private data (no "
                        "privacy cost; one DP selection among the settings kept). The plan times the final at the "
                        "slowest setting's rate; after the DP choice it is re-planned at the winner's (it only grows, "
                        "up to the size asked: post-processing)")
    g.add_argument("--dry-run", action="store_true", help="print the plan (counts and the measured ETA) and stop: "
                   "nothing is written and D_valid is not read")
    # The generation job's own settings (declared by `GenerateConfig`): --max-len, --gen-batch-size, --gen-seed, ...
    binding.add_flags(g, GenerateConfig, prefix="gen", skip=tuple(f.name for f in dataclasses.fields(GenerateConfig)
                                                                  if f.name not in _GENERATE_BOUND), overrides={
        "max_len": {"flags": ("--max-len",), "metavar": "N"},
        "batch_size": {"type": binding.int_or_auto, "metavar": "N|auto"},
        "memory_limit": {"flags": ("--memory-limit",), "type": resources.bytes_flag, "metavar": "BYTES"},
        "memory_headroom": {"flags": ("--memory-headroom",), "metavar": "FRACTION"},
        "seed": {"help": "generation job seed (shard seeds derive from it)"},
    })
    g.add_argument("--label-source", default=None, help="D_train file(s): ONE DP label histogram shared by all candidates "
                                                        "(with --model); --valid is checked disjoint from it")
    g.add_argument("--label-noise-multiplier", type=float, default=None,
                   help="sigma of that histogram (default: the one the model's tuning reserved, "
                        "`dp-tune --reserve-label-noise-multiplier`; refused when it would exceed the tuning's target)")
    read_config.add_flags(ap, "encoding", "max_dead_letters",
                          notes={"max_dead_letters": "here: --valid; OUT.private/dead_letters.jsonl"})
    logs.add_flags(ap)
    return ap


@errors.command("select", also=(ValueError, FileNotFoundError))
def main(argv=None) -> int:
    from dpsynth.dp import report as report_lib
    from dpsynth.evaluate import corpora, dp_select, screening

    ap = parser()
    args, beam_args = ap.parse_known_args(argv)
    logs.configure(fmt="%(levelname)s %(name)s: %(message)s", verbose=args.verbose)
    config = binding.from_args(dp_select.SelectConfig, args)
    if args.candidates and (args.screen_size is not None or args.time_budget is not None or args.dry_run):
        raise errors.DpsynthError("--screen-size, --time-budget and --dry-run apply with --model (generated candidates)")
    if args.dry_run:  # before --out is claimed: nothing is written, D_valid is not read
        plan, speed, _, _ = _plan(args, config)
        for line in plan.lines(speed):
            print(f"dpsynth select: {line}", file=sys.stderr)
        return 0
    # --out is one run's corpus (kind, lock, writable before any compute: `dpsynth.outdir`).
    with outdir.claim(args.out, kind=outdir.CORPUS, command="select", config=vars(args), parser=ap,
                      siblings=(("private state", dead_letters.private_dir(args.out)),
                                ("candidates", os.path.normpath(args.out) + ".candidates" if args.model else None)),
                      secret=("seed",)):
        policy = dead_letters.Policy.of(args.max_dead_letters, dead_letters.default_path(args.out),
                                        prefix="dpsynth select: ")
        if args.model:
            # the histogram's sigma, refused before any compute if the tuning's target does not cover it
            sigma = (dp_select.label_noise_multiplier(report_lib.load_report(args.model), args.label_noise_multiplier)
                     if args.label_source else None)
            # The plan (sizes, kept settings: the number of candidates the selection is calibrated on) is
            # fixed before D_valid or D_train is read: a data-independent choice (`dpsynth.evaluate.screening`).
            # A wrong path is said now, not after the probe's minutes: the files are found (their
            # existence only: nothing is read, nor used by the plan).
            for paths in (args.valid, args.label_source):
                if paths:
                    readers.resolve_inputs(paths, encoding=args.encoding)
            plan, speed, grid, dataset_size = _plan(args, config)
            for line in plan.lines(speed):
                print(f"dpsynth select: {line}", file=sys.stderr)
        dead_letters.read_checked([("valid (--valid)", args.valid)], policy, encoding=args.encoding)
        valid = corpora.read_real(args.valid, "real valid", max_dead_letters=policy.limit, encoding=args.encoding)
        release_dir = screened = None
        # D_valid disjoint from D_train (the parallel composition's premise), before any generation
        # (`dpsynth.dp.disjoint`; with --model after the probe, which reads neither)
        disjointness, overlaps = dp_select.check_disjoint(valid, dp_select.train_hash_sources(
            model=args.model, candidates=args.candidates or (), label_source=args.label_source, encoding=args.encoding,
            max_dead_letters=policy.limit))
        if not disjointness["checked"]:
            print(f"dpsynth select: note: D_valid was not checked disjoint from D_train ({disjointness['detail']}; "
                  "pass --label-source D_TRAIN to check it); selection.json says so", file=sys.stderr)
        if args.model:
            distribution = None
            if args.label_source:
                from dpsynth.generate import job

                distribution = job.dp_label_distribution(args.model, args.label_source, noise_multiplier=sigma)
            root = os.path.normpath(args.out) + ".candidates"
            gen = {name: getattr(args, f"gen_{name}") for name in _GENERATE_BOUND}
            if plan.screen_size:
                paths = screening.generate_screened(args.model, root, plan, label_distribution=distribution,
                                                    beam_args=beam_args, **gen)
                screened = plan
            else:
                paths = dp_select.generate_candidates(
                    args.model, root, grid, dataset_size=dataset_size, valid_fraction=args.valid_fraction,
                    label_distribution=distribution, beam_args=beam_args, **gen)
        else:
            if beam_args:
                raise errors.DpsynthError(f"unknown flags {beam_args} (Beam flags only apply with --model)")
            paths = {}
            for d in args.candidates:
                name = os.path.basename(os.path.normpath(d))
                if name in paths:
                    raise errors.DpsynthError(f"two candidates are named {name!r}: give directories with distinct names")
                paths[name] = d
        selection = dp_select.select_corpora(paths, valid, config, disjointness=disjointness, overlaps=overlaps)
        record = None
        if screened is not None:  # the winner's setting at full size: post-processing, no privacy cost
            # re-planned at the winner's rate: the release grows into the time the plan's slowest rate kept
            screened = screening.replan_final(screened, speed, selection.winner_name,
                                              valid_fraction=args.valid_fraction)
            if screened.final_grown:
                print(f"dpsynth select: {screening.replan_line(screened, speed)}", file=sys.stderr)
            release_dir = screening.generate_final(args.model, root, screened, selection.winner_name,
                                                   label_distribution=distribution, beam_args=beam_args, **gen)
            record = screening.screening_record(screened, selection.winner_name, release_dir, speed)
        dp_select.write_selection(args.out, selection, paths, release_dir=release_dir, screening=record)
        sel = selection.report["selection"]
        if not sel["within_target"]:
            acc = selection.report.get("accountant", "rdp")
            print(f"dpsynth select: note: the release's epsilon {selection.report['epsilon'].get(acc)} ({acc.upper()}, "
                  f"{sel['composition']} composition) exceeds the {report_lib.describe_targets(sel['target_epsilons'])}"
                  + ("; a sequential selection can be reserved in dp-tune (--reserve-selection-epsilon "
                     f"{config.epsilon:g})" if sel["composition"] == "sequential" and not sel["reserved_by_tuning"]
                     else ""), file=sys.stderr)
        print(json.dumps({"selected": selection.winner_name, "candidates": len(paths),
                          "epsilon": selection.report["epsilon"],
                          "composition": selection.report["selection"]["composition"],
                          "within_target": selection.report["selection"]["within_target"], "out": args.out}))
    return 0


def _plan(args, config):
    """The run's `screening.SelectPlan` over the grid of the flags, timed by a probe of the model and
    fitted to --time-budget (`screening.fit_time_budget`). Returns (plan, the probe's `Speed`, grid, |D_train|)."""
    from dpsynth.dp import report as report_lib
    from dpsynth.evaluate import dp_select, screening

    report = report_lib.load_report(args.model)
    dataset_size = int(report["training"]["dataset_size"])
    grid = dp_select.candidate_grid(args.guidance, args.temperatures, args.multiples)
    size = screening.DEFAULT_SCREEN_SIZE if args.screen_size is None else args.screen_size
    if size < 0:
        raise errors.DpsynthError(f"--screen-size must be >= 0 (0: no screening), got {size}")
    budget = screening.DEFAULT_TIME_BUDGET if args.time_budget is None else args.time_budget
    if not budget >= 0:  # (before the probe)
        raise errors.DpsynthError(f"--time-budget must be >= 0 seconds (0: no limit), got {budget:g}")
    gen = {name: getattr(args, f"gen_{name}") for name in _GENERATE_BOUND}
    speed, max_len = screening.probe(args.model, screening.settings_of(grid), config=config, **gen)
    plan = screening.make_plan(grid, dataset_size=dataset_size, valid_fraction=args.valid_fraction, screen_size=size,
                               trainings_per_candidate=screening.trainings_per_candidate(config), max_len=max_len)
    try:
        fitted = screening.fit_time_budget(plan, speed, budget, valid_fraction=args.valid_fraction)
    except screening.BudgetError:
        if args.dry_run:  # the plan asked for, with its ETA, before the one-line refusal
            for line in plan.lines(speed):
                print(f"dpsynth select: {line}", file=sys.stderr)
        raise
    return fitted, speed, grid, dataset_size


if __name__ == "__main__":
    sys.exit(main())
