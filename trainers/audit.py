"""`dpsynth audit`: the owner-only audit of a released synthetic corpus against its data.

    dpsynth audit --corpus SYNTH_DIR --train D_TRAIN --test D_TEST --out AUDIT_DIR \
        [--tokenizer MODEL_DIR] [--thresholds 50,20] [--seed 0] [--significance 0.05] \
        [--canaries K --base BASE_DIR [--valid D_VALID] [--canary-repeats R] [--canary-examples N]]

Copying (always): for each synthetic example the longest token sequence it shares with any
D_train record, the counts at each threshold, and the distance-to-closest-record comparison
with D_test (a corpus closer to D_train than to D_test is memorising). With `--canaries K`:
K canaries are planted in D_train (K more held out), the corpus's own dp-tune and generation
configs (its model's manifest, its generation_config.json) are rerun from `--base`, and an
n-gram LM fit on the new corpus only scores the canaries: AUROC, exposure and the epsilon
lower bounds beside the accounted epsilon (`dpsynth.release_audit`).

The output reads D_train and is NOT differentially private: `--out` is created 0700 (files
0600), must lie outside the corpus, and is never to be published. Prints the headline figures
as one JSON line.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys

from dpsynth import errors, logs
from dpsynth.data import dead_letters, read_config


def _ints(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.split(",") if x.strip())


def build_parser() -> argparse.ArgumentParser:
    from dpsynth.release_audit import canaries, copying

    p = argparse.ArgumentParser(prog="dpsynth audit", description=__doc__.split("\n")[0])
    p.add_argument("--corpus", required=True, help="the synthetic corpus directory (output of dpsynth generate)")
    p.add_argument("--train", required=True, help="D_train, the sensitive training set the corpus came from")
    p.add_argument("--test", required=True, help="D_test, held-out real records (never trained on)")
    p.add_argument("--out", required=True, help="owner-only output directory (0700), outside the corpus")
    p.add_argument("--tokenizer", default=None, help="model directory whose tokenizer measures shared tokens "
                                                     "(default: the corpus's generator model)")
    p.add_argument("--thresholds", type=_ints, default=copying.DEFAULT_THRESHOLDS,
                   help="count synthetic examples sharing >= each of these many tokens with D_train "
                        f"(comma-separated; default: {','.join(map(str, copying.DEFAULT_THRESHOLDS))})")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the size-matched D_train subsample and the canaries (default: %(default)s)")
    p.add_argument("--significance", type=float, default=copying.DEFAULT_SIGNIFICANCE,
                   help="level of the copying and canary verdicts; the canaries' epsilon lower bounds hold "
                        "with probability 1 - level (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="native threads (default: %(default)s)")
    g = p.add_argument_group("canaries through the release (reruns dp-tune and generate)")
    cc = canaries.CanaryConfig()  # the defaults are the library's (flags named for the command line)
    g.add_argument("--canaries", type=int, default=0, metavar="K",
                   help="plant K canaries, hold K out (0 = off; default: %(default)s)")
    g.add_argument("--base", default=None, help="base model directory of the rerun (default: the model's base)")
    g.add_argument("--valid", default=None, help="D_valid of the rerun's dp-tune")
    g.add_argument("--canary-repeats", type=int, default=cc.repeats,
                   help="copies of each planted canary (default: %(default)s)")
    g.add_argument("--canary-length", type=int, default=cc.length, help="tokens per canary (default: %(default)s)")
    g.add_argument("--canary-examples", type=int, default=None,
                   help="synthetic examples of the rerun (default: the corpus's own count)")
    g.add_argument("--ngram-order", type=int, default=cc.order, help="n of the attacker's n-gram LM (default: %(default)s)")
    read_config.add_flags(p, "text_column", "label_column", "encoding", "max_dead_letters",
                          notes={"encoding": "of --train, --test and --valid",
                                 "max_dead_letters": "here: OUT/dead_letters.jsonl"})
    logs.add_flags(p)
    return p


@errors.command("audit", also=(ValueError, FileNotFoundError))
def main(argv: list[str] | None = None) -> int:
    import os

    from dpsynth import outdir
    from dpsynth.owner_only import make_private_dir
    from dpsynth.release_audit import canaries, run

    ap = build_parser()
    args = ap.parse_args(argv)
    logs.configure(fmt="%(message)s", verbose=args.verbose)
    run.check_location(args.out, args.corpus)  # before any read or compute
    if not os.path.exists(args.out):
        make_private_dir(args.out)  # 0700 before the claim writes its run record there
    with outdir.claim(args.out, kind=outdir.AUDIT, command="audit", config=vars(args), parser=ap):
        run.check_out(args.out, args.corpus)
        canary_run = None
        if args.canaries:
            replay = canaries.replay_of(args.corpus)
            base = args.base or replay.base_dir
            if not base:
                raise run.AuditError("--canaries needs --base BASE_DIR (the model the corpus's generator was "
                                     "tuned from)")
        dead_path = os.path.join(os.path.abspath(args.out), dead_letters.FILE)
        policy = dead_letters.Policy.of(args.max_dead_letters, dead_path, prefix="dpsynth audit: ")
        inputs = [("D_train (--train)", args.train), ("D_test (--test)", args.test)]
        inputs += [("D_valid (--valid)", args.valid)] if args.valid else []
        train, test, *rest = dead_letters.read_checked(inputs, policy, text_column=args.text_column,
                                                       label_column=args.label_column,
                                                       encoding=args.encoding)
        if args.canaries:
            canary_run = functools.partial(
                canaries.release_canary_audit, base, train.records, rest[0].records if rest else [],
                tune_config=replay.tune_config, labels=replay.labels,
                num_examples=args.canary_examples or replay.num_examples,
                valid_examples=0 if args.canary_examples else replay.valid_examples,
                canaries=canaries.CanaryConfig(num_canaries=args.canaries, repeats=args.canary_repeats,
                                               length=args.canary_length, seed=args.seed, order=args.ngram_order),
                generate_options=replay.generate_options, significance=args.significance)
        tokenizer = None
        if args.tokenizer:
            from dpsynth.data.tokenizers import load_tokenizer

            tokenizer = load_tokenizer(args.tokenizer)
        report = run.audit_release(args.corpus, train.records, test.records, args.out, tokenizer=tokenizer,
                                   thresholds=args.thresholds, seed=args.seed, significance=args.significance,
                                   threads=args.threads, canary_run=canary_run)
        print(json.dumps(run.headline(report), sort_keys=True))
        print(f"dpsynth audit: owner-only report (NOT DP, never publish) -> {os.path.join(args.out, run.REPORT_MD)}",
              file=sys.stderr)
        return 0


if __name__ == "__main__":
    sys.exit(main())
