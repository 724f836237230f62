"""`dpsynth probe`: does a base model already know the sensitive dataset? (owner-only, NOT DP)

    dpsynth probe --model MODEL_DIR --data D_FILE --control CONTROL_FILE --out PROBE_DIR \
        [--records 128] [--prefix-tokens 32] [--match-tokens 32] [--significance 0.05] [--seed 0]

Samples records of D and of a control set (text the model cannot have seen, matched to D in
domain and length) and compares them: greedy verbatim continuations (Fisher's exact test) and
per-record likelihoods (Mann-Whitney U, AUROC); see `dpsynth.evaluate.contamination`. Run it on an
imported base (`dpsynth import-model`) before DP tuning: DP covers the fine-tuning data only, and
nobody deduplicated the base's pretraining data against D. Pass `--out` to `dp-tune
--contamination-probe` so the tuned model's private state keeps the verdict.

The output reads D and is NOT differentially private: `--out` is created 0700 (files 0600), must
lie outside the model directory, and is never to be published. Prints the headline figures as one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys

from dpsynth import binding, errors, logs
from dpsynth.data import dead_letters, read_config


def build_parser() -> argparse.ArgumentParser:
    from dpsynth.evaluate.contamination import ProbeConfig

    p = argparse.ArgumentParser(prog="dpsynth probe", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="the model directory to probe (e.g. `dpsynth import-model`'s --out)")
    p.add_argument("--data", required=True, nargs="+", help="the sensitive dataset D (file(s))")
    p.add_argument("--control", required=True, nargs="+",
                   help="control text the model cannot have seen, matched to D in domain and length (file(s))")
    p.add_argument("--out", required=True, help="owner-only output directory (0700), outside the model directory")
    binding.add_flags(p, ProbeConfig)
    read_config.add_flags(p, "text_column", "encoding", "max_dead_letters",
                          notes={"encoding": "of --data and --control",
                                 "max_dead_letters": "here: OUT/dead_letters.jsonl"})
    logs.add_flags(p)
    return p


@errors.command("probe", also=(ValueError, FileNotFoundError))
def main(argv: list[str] | None = None) -> int:
    """`dpsynth probe --model MODEL_DIR --data FILE --control FILE --out DIR [...]`."""
    import os

    from dpsynth import outdir
    from dpsynth.evaluate import contamination
    from dpsynth.owner_only import make_private_dir, restrict_tree

    ap = build_parser()
    args = ap.parse_args(argv)
    logs.configure(fmt="%(message)s", verbose=args.verbose)
    config = binding.from_args(contamination.ProbeConfig, args)
    contamination.check_location(args.out, args.model)  # before any read or compute
    if not os.path.exists(args.out):
        make_private_dir(args.out)  # 0700 before the claim writes its run record there
    with outdir.claim(args.out, kind=outdir.PROBE, command="probe", config=vars(args), parser=ap):
        if not os.path.isdir(args.model):
            raise contamination.ProbeError(f"--model {args.model}: model directory not found")
        contamination.check_out(args.out, args.model)
        policy = dead_letters.Policy.of(args.max_dead_letters, os.path.join(os.path.abspath(args.out),
                                                                            dead_letters.FILE),
                                        prefix="dpsynth probe: ")
        data, control = dead_letters.read_checked([("D (--data)", args.data), ("control (--control)", args.control)],
                                                  policy, text_column=args.text_column, label_column=None,
                                                  encoding=args.encoding)
        report = contamination.run_probe(args.model, data.records, control.records, args.out, config,
                                         data_files=data.files, control_files=control.files)
        restrict_tree(args.out)  # (the run record too: every file 0600)
        print(json.dumps(contamination.headline(report), sort_keys=True))
        print(f"dpsynth probe: owner-only report (NOT DP, never publish) -> "
              f"{os.path.join(args.out, contamination.REPORT_MD)}; pass --contamination-probe {args.out} to dp-tune",
              file=sys.stderr)
        return 0


if __name__ == "__main__":
    sys.exit(main())
