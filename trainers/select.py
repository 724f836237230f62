"""`dpsynth select`: the best synthetic corpus for the budget, chosen with DP on the real D_valid.

    dpsynth select --model runs/lora --valid data/valid.csv --epsilon 1 --out runs/synth \
        [--guidance 0,1.5,3,6] [--temperatures 1,1.2] [--multiples 1,3] \
        [--label-source data/train.csv --label-noise-multiplier 30] [Beam flags...]
    dpsynth select --candidates runs/synth_a runs/synth_b ... --valid data/valid.csv --epsilon 1 --out runs/synth

With `--model`, the candidates are generated first (each sampling setting once, at its
largest multiple of |D_train|; smaller multiples are its prefixes) under `OUT.candidates/`;
with `--candidates`, they are corpus directories that exist. A classifier is trained on each
candidate's synthetic splits and its correct predictions on the real `--valid` are counted; only
the winner is released, by the exponential mechanism (or `--mechanism gaussian`) at
`--epsilon`, into `--out` (a corpus directory: splits, composed `privacy_report.json`,
`selection.json`). The counts stay in the owner-only `OUT.private/`. See
`dpsynth.evaluate.dp_select` and docs/dp.md, "DP selection on D_valid".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from dpsynth import binding, errors, logs, outdir
from dpsynth.data import dead_letters, read_config


# `GenerateConfig` fields that are flags here (with --model; the grid sets the sampling and sizes).
_GENERATE_BOUND = ("max_len", "batch_size", "seed", "memory_limit", "memory_headroom")


def _floats(s: str) -> tuple[float, ...]:
    return tuple(float(x) for x in s.split(",") if x.strip())


def parser() -> argparse.ArgumentParser:
    from dpsynth.dp import private_selection as ps
    from dpsynth.evaluate import dp_select, registry
    from dpsynth.evaluate import train_classifier as tc
    from dpsynth.generate.plan import GenerateConfig
    from dpsynth.train import resources

    ap = argparse.ArgumentParser(prog="dpsynth select", description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="DP-tuned model directory: generate the candidate grid from it")
    src.add_argument("--candidates", nargs="+", help="existing synthetic corpus directories to choose among")
    ap.add_argument("--valid", required=True, help="the real D_valid (disjoint from D_train)")
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
    g.add_argument("--guidance", type=_floats, default=dp_select.DEFAULT_GUIDANCES, help="guidance weights w")
    g.add_argument("--temperatures", type=_floats, default=dp_select.DEFAULT_TEMPERATURES)
    g.add_argument("--multiples", type=_floats, default=dp_select.DEFAULT_MULTIPLES,
                   help="synthetic train sizes as multiples of |D_train| (the model's report's dataset size)")
    g.add_argument("--valid-fraction", type=float, default=0.1, help="synthetic valid = this x synthetic train")
    # The generation job's own settings (declared by `GenerateConfig`): --max-len, --gen-batch-size, --gen-seed, ...
    binding.add_flags(g, GenerateConfig, prefix="gen", skip=tuple(f.name for f in dataclasses.fields(GenerateConfig)
                                                                  if f.name not in _GENERATE_BOUND), overrides={
        "max_len": {"flags": ("--max-len",), "metavar": "N"},
        "batch_size": {"type": binding.int_or_auto, "metavar": "N|auto"},
        "memory_limit": {"flags": ("--memory-limit",), "type": resources.bytes_flag, "metavar": "BYTES"},
        "memory_headroom": {"flags": ("--memory-headroom",), "metavar": "FRACTION"},
        "seed": {"help": "generation job seed (shard seeds derive from it)"},
    })
    g.add_argument("--label-source", default=None, help="D_train file(s): ONE DP label histogram shared by all candidates")
    g.add_argument("--label-noise-multiplier", type=float, default=None, help="sigma of that histogram")
    read_config.add_flags(ap, "encoding", "max_dead_letters",
                          notes={"max_dead_letters": "here: --valid; OUT.private/dead_letters.jsonl"})
    logs.add_flags(ap)
    return ap


@errors.command("select", also=(ValueError, FileNotFoundError))
def main(argv=None) -> int:
    from dpsynth.dp import report as report_lib
    from dpsynth.evaluate import corpora, dp_select

    ap = parser()
    args, beam_args = ap.parse_known_args(argv)
    logs.configure(fmt="%(levelname)s %(name)s: %(message)s", verbose=args.verbose)
    config = binding.from_args(dp_select.SelectConfig, args)
    # --out is one run's corpus (kind, lock, writable before any compute: `dpsynth.outdir`).
    with outdir.claim(args.out, kind=outdir.CORPUS, command="select", config=vars(args), parser=ap,
                      siblings=(("private state", dead_letters.private_dir(args.out)),
                                ("candidates", os.path.normpath(args.out) + ".candidates" if args.model else None)),
                      secret=("seed",)):
        policy = dead_letters.Policy.of(args.max_dead_letters, dead_letters.default_path(args.out),
                                        prefix="dpsynth select: ")
        dead_letters.read_checked([("valid (--valid)", args.valid)], policy, encoding=args.encoding)
        valid = corpora.read_real(args.valid, "real valid", max_dead_letters=policy.limit, encoding=args.encoding)
        if args.model:
            report = report_lib.load_report(args.model)
            distribution = None
            if args.label_source:
                from dpsynth.generate import job

                distribution = job.dp_label_distribution(args.model, args.label_source,
                                                         noise_multiplier=args.label_noise_multiplier)
            paths = dp_select.generate_candidates(
                args.model, os.path.normpath(args.out) + ".candidates",
                dp_select.candidate_grid(args.guidance, args.temperatures, args.multiples),
                dataset_size=int(report["training"]["dataset_size"]), valid_fraction=args.valid_fraction,
                label_distribution=distribution, beam_args=beam_args,
                **{name: getattr(args, f"gen_{name}") for name in _GENERATE_BOUND})
        else:
            if beam_args:
                raise errors.DpsynthError(f"unknown flags {beam_args} (Beam flags only apply with --model)")
            paths = {}
            for d in args.candidates:
                name = os.path.basename(os.path.normpath(d))
                if name in paths:
                    raise errors.DpsynthError(f"two candidates are named {name!r}: give directories with distinct names")
                paths[name] = d
        selection = dp_select.select_corpora(paths, valid, config)
        dp_select.write_selection(args.out, selection, paths)
        sel = selection.report["selection"]
        if not sel["within_target"]:
            acc = selection.report.get("accountant", "rdp")
            print(f"dpsynth select: note: the release's epsilon {selection.report['epsilon'].get(acc)} ({acc.upper()}, "
                  f"{sel['composition']} composition) exceeds the tuning's target "
                  f"{selection.report['ledger']['target_epsilon']}"
                  + ("; a sequential selection can be reserved in dp-tune (--reserve-selection-epsilon "
                     f"{config.epsilon:g})" if sel["composition"] == "sequential" and not sel["reserved_by_tuning"]
                     else ""), file=sys.stderr)
        print(json.dumps({"selected": selection.winner_name, "candidates": len(paths),
                          "epsilon": selection.report["epsilon"],
                          "composition": selection.report["selection"]["composition"],
                          "within_target": selection.report["selection"]["within_target"], "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
