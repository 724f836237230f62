"""`dpsynth dp-tune`: DP fine-tuning (full | prompt | lora) of a pretrained model on sensitive data.

Example:
    dpsynth dp-tune --base runs/pretrain/model --train train.jsonl --valid valid.jsonl \\
        --mode lora --epsilon 3 --out runs/dp_lora

Binds flags to `dpsynth.train.tune_config.TuneConfig` and calls `dpsynth.train.finetune.dp_tune` (or
`dpsynth.train.sweep.sweep` with --sweep-lr/--sweep-clip). Input files are read with `dpsynth.data.readers.read_sensitive`
(CSV, JSONL, Parquet; columns --text-column/--label-column); every rejected record (dead letter) is
counted and explained on stderr and listed in the private state, and past --max-dead-letters the
run is refused before any compute (`dpsynth.data.dead_letters`).

Multi-host: run the same command in every process with `--distributed` (plus
`--coordinator-address/--num-processes/--process-id` where not auto-detected) and
`--mesh-data D --mesh-model M` over all processes' devices (docs/models.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from dpsynth import binding, errors, logs, outdir
from dpsynth.data import dead_letters, read_config
from trainers import distributed


def _float_or_inf(text: str) -> float:
    try:
        return math.inf if text.lower() in ("inf", "infinity") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'inf', got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    from dpsynth.dp import accounting, histogram, mechanisms, selection
    from dpsynth.dp.users import PRIVACY_UNITS
    from dpsynth.models.config import LORA_TARGETS
    from dpsynth.train import tune_config as tune
    from dpsynth.train import recipe as recipe_lib

    p = argparse.ArgumentParser(prog="dpsynth dp-tune", description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="pretrained model directory (dpsynth pretrain output)")
    p.add_argument("--train", required=True, nargs="+", help="sensitive training file(s)")
    p.add_argument("--valid", nargs="*", default=[], help="sensitive validation file(s) (loss; sweep selection)")
    p.add_argument("--out", required=True, help="the releasable model directory (config, tokenizer, weights or "
                   "adapters, privacy report, manifest; nothing else)")
    p.add_argument("--state-dir", default=None,
                   help="the private state directory (checkpoints with the secret seed, non-DP losses, sweep trials; "
                        "created 0700, never publish it); default: OUT.private next to --out")
    g = p.add_mutually_exclusive_group()
    binding.add_flags(p, tune.TuneConfig, defaults=tune.TuneConfig(), overrides={
        "mode": {"choices": tune.MODES},
        "epsilon": {"type": _float_or_inf, "help": "target epsilon; 'inf' = non-private"},
        "delta": {"help": "target delta (default 1/|train|; above 1/N refused without --allow-large-delta)"},
        "allow_large_delta": {"help": "accept a delta above 1/N (N = |train|, or users), which protects nobody; the "
                                      "privacy report's headline then says the delta is weak"},
        "accountant": {"choices": accounting.ACCOUNTANTS},
        "batch_size": {"help": "expected Poisson batch size"},
        "microbatch_size": {"type": binding.int_or_auto, "metavar": "N|auto",
                            "help": "examples per compiled microbatch; auto: the largest whose compiled step fits the "
                                    "device memory less --memory-headroom (printed with its figures; CPU: the host's available memory)"},
        "steps": {"container": g},
        "epochs": {"container": g},
        "optimizer": {"choices": tune.OPTIMIZERS},
        "lora_targets": {"choices": LORA_TARGETS},
        "prompt_init": {"choices": tune.PROMPT_INITS},
        "template": {"help": "label prompt; {label} is replaced by the label"},
        "max_tokens": {"type": binding.int_or_auto, "metavar": "N|auto",
                       "help": "tokens per example (BOS + prompt + text + EOS; longer are truncated); auto (with "
                               "--recipe auto): the candidate length nearest the 90%% quantile of D_train's, chosen "
                               f"with {100 * recipe_lib.LENGTH_EPSILON_SHARE:.0f}%% of --epsilon (composed into the ledger)"},
        "full_lm": {"help": "train on the label prompt too (ablation)"},
        "label_dropout": {"help": "probability that a sampled example trains under the null prompt at a step, so "
                                  "`generate --guidance-contrast null` can contrast with it (0 = off; no privacy cost)"},
        "label_contrast": {"metavar": "LAMBDA|auto", "type": binding.float_or_auto,
                           "help": "add LAMBDA x the label's cross-entropy under the model's own likelihoods of the "
                                   "text after every label prompt, so that unguided samples carry the label (0 = off; "
                                   "no privacy cost; K or 2 passes per example for K labels, by --label-contrast-form); "
                                   f"auto (default): {recipe_lib.LABEL_CONTRAST:g} with --recipe auto, where the run "
                                   "allows it; 0 otherwise"},
        "label_contrast_form": {"choices": recipe_lib.CONTRAST_FORMS,
                                "help": "full: the text's likelihood under every label prompt (K passes per example); "
                                        "sampled: its own label against one other drawn at random per step (2 passes "
                                        "for any K; the same privacy); auto: full for at most "
                                        f"{recipe_lib.CONTRAST_MAX_LABELS} labels, sampled above (a resume keeps its "
                                        "checkpoint's form)"},
        "z_loss": {"help": "z-loss coefficient of the LM loss"},
        "max_batch_size": {"help": "cap on the Poisson batch (needs --accountant pld)"},
        "seed": {"help": "fix the sampling/noise seed (tests only: anyone who knows it can regenerate the noise); "
                         "default: a secret seed from the OS entropy pool, kept in the private checkpoint"},
        "privacy_unit": {"choices": PRIVACY_UNITS,
                         "help": "unit of privacy: one example (default) or one user (needs --user-column and "
                                 "--max-examples-per-user; delta then defaults to 1/|users|, --batch-size counts users)"},
        "max_examples_per_user": {"help": "K: at most K rows per user are kept (chosen with the secret seed)"},
        "mechanism": {"choices": mechanisms.names(),
                      "help": "dpsgd (iid noise, default) or bandmf (banded correlated noise, cyclic Poisson sampling)"},
        "bands": {"help": "BandMF bands (= sampling cycle length)"},
        "recipe": {"choices": recipe_lib.RECIPES,
                   "help": "manual: --batch-size, --steps/--epochs and --learning-rate as given; auto: chosen from "
                           "|D_train|, the mode, --max-tokens and --token-budget (printed, and recorded in the report); "
                           "with --max-tokens auto it also chooses the example length; with --label-contrast auto "
                           "(the default), the label contrast"},
        "clipping": {"help": "per-example clipping: auto (ghost where it applies, else vmap), vmap (per-example "
                             "gradients) or ghost (full and lora modes at example level, also with the label "
                             "contrast: norms from activations and output gradients, one batched backward, no "
                             "per-example gradient copies); the same privacy either way"},
        "reserve_selection_epsilon": {"metavar": "EPSILON",
                                      "help": "the epsilon of a later `dpsynth select` on a D_valid split from D "
                                              "positionally (it composes sequentially, at twice this epsilon): "
                                              "--epsilon then covers both (more noise here); 0: none (own files or "
                                              "a hash split compose in parallel and need none)"},
        "reserve_label_noise_multiplier": {
            "metavar": "SIGMA",
            "help": "sigma of the DP label histogram of D_train that `dpsynth select --label-source` will draw (e.g. "
                    f"{histogram.DEFAULT_NOISE_MULTIPLIER:g}): --epsilon then covers it too (a little more noise "
                    "here); 0: none (select then refuses a histogram that would exceed --epsilon)"},
        "token_budget": {"help": "example-tokens an automatic recipe may process (default "
                                 f"{recipe_lib.DEFAULT_TOKEN_BUDGET:,})"},
        "time_budget": {"metavar": "SECONDS",
                        "help": "instead of --token-budget: seconds of DP-SGD steps the automatic recipe may spend; "
                                "the token budget is then this machine's measured speed on the run's compiled step "
                                "times it (printed, and recorded in the report)"},
    })
    p.add_argument("--labels", nargs="*", default=None, help="label set (default: read from --train, a side channel)")
    p.add_argument("--contamination-sha256", default=None, help="hash of the pretraining contamination report")
    p.add_argument("--contamination-probe", default=None, metavar="PROBE_DIR",
                   help="the --out of `dpsynth probe` run on --base (an imported base): its verdict (NOT DP) is kept in "
                        "the private state; the privacy report says only that a probe ran")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out (refused when "
                   "the privacy plan, clipping norm or mode differs from the checkpoint's)")
    p.add_argument("--stop-after", type=int, default=None, metavar="STEP",
                   help="checkpoint and stop at this step (time-sliced runs on preemptible hosts); continue later "
                        "with the same flags and --resume")
    p.add_argument("--sweep-lr", type=float, nargs="*", default=None, help="learning-rate grid (sweep)")
    p.add_argument("--sweep-clip", type=float, nargs="*", default=None, help="clipping-norm grid (sweep)")
    p.add_argument("--sweep-select-epsilon", type=float, default=None, metavar="EPS",
                   help="select the sweep's trial on D_valid with DP (exponential mechanism on the clipped validation "
                        "loss, epsilon EPS on D_valid, in the ledger) instead of the non-DP lowest loss")
    p.add_argument("--valid-split", choices=("files", "hash", "positional"), default="files",
                   help="with --sweep-select-epsilon: how D_valid was split from D (files/hash: data-independent, the "
                        "selection composes in parallel with the tuning; positional: sequentially; "
                        "default: %(default)s)")
    p.add_argument("--user-column", default=None, help="the column/field holding the user id (--privacy-unit user)")
    p.add_argument("--memory-limit", default=None, metavar="BYTES",
                   help="--microbatch-size auto: device memory to fit in (e.g. 80GB, 16GiB; default: the device's)")
    p.add_argument("--memory-headroom", type=float, default=0.10,
                   help="--microbatch-size auto: fraction of the memory left free (default: %(default)s)")
    p.add_argument("--mesh-data", type=int, default=1,
                   help="devices on the data axis (1 x 1 = one device; default: %(default)s)")
    p.add_argument("--mesh-model", type=int, default=1, help="devices on the model axis (default: %(default)s)")
    p.add_argument("--fsdp", action="store_true",
                   help="also shard the parameters and optimizer state over the data axis (FSDP; needs --mesh-data "
                        ">= 2): the layout `dpsynth plan --fsdp` plans")
    distributed.add_flags(p)
    p.add_argument("--sweep-accounting", choices=selection.SWEEP_ACCOUNTINGS, default="composed",
                   help="composed (default): the k trials together meet --epsilon, the report covers all of them; "
                        "selected-only: the paper's way, only the selected trial is accounted (said in the report)")
    read_config.add_flags(p, "text_column", "label_column", "encoding", "max_dead_letters",
                          notes={"max_dead_letters": "here: the private state directory's dead_letters.jsonl"})
    logs.add_flags(p)
    return p


@errors.command("dp-tune")
def main(argv: list[str] | None = None) -> int:
    from dpsynth.train import resources
    from dpsynth.train import tune_config as tune
    from dpsynth.train.tune_resume import resolve_state_dir

    ap = build_parser()
    args = ap.parse_args(argv)
    logs.configure(fmt="%(message)s", verbose=args.verbose)
    distributed.start(args)  # multi-host: before any other JAX call
    config = binding.from_args(tune.TuneConfig, args)
    if args.memory_limit:
        resources.parse_bytes(args.memory_limit)  # a bad --memory-limit is refused before --out is claimed
    if args.privacy_unit == "user" and not args.user_column:
        raise tune.TuneError("--privacy-unit user needs --user-column COL (the field holding the user id)")
    if args.user_column and args.privacy_unit != "user":
        raise tune.TuneError("--user-column is used with --privacy-unit user")
    state_dir = resolve_state_dir(args.out, args.state_dir)
    with outdir.claim(args.out, kind=outdir.MODEL, command="dp-tune", config=vars(args), parser=ap,
                      siblings=(("--state-dir", state_dir),), primary=distributed.is_primary(args),
                      secret=("seed",)):  # the release withholds the seed
        return _tune(args, config, state_dir)


def _probe(probe_dir: str | None, train_files: list[str] = ()) -> dict | None:
    """The report of `dpsynth probe --out probe_dir` (NOT DP: it stays in the private state), or None;
    says on the owner's terminal when it found evidence that the base has seen D. Refused (`ProbeError`)
    when it did not read every --train file (`train_files`: the files read, a directory or glob
    resolved, as the probe records its own; by SHA-256): a probe of other data says nothing of
    whether the base has seen D_train. (Its model is checked against --base by
    `tune_report.check_contamination_probe`.)"""
    if probe_dir is None:
        return None
    from dpsynth import fileio
    from dpsynth.evaluate import contamination

    probe = {**contamination.read_probe(probe_dir), "probe_dir": os.path.abspath(probe_dir)}
    probed = {f.get("sha256") for f in probe.get("data_files") or ()}
    for path in train_files:
        if fileio.sha256_file(path) not in probed:
            raise contamination.ProbeError(
                f"--contamination-probe {probe_dir}: the probe did not read --train {path} (its --data was "
                f"{', '.join(f.get('path', '?') for f in probe.get('data_files') or ()) or 'not recorded'}; compared by "
                f"SHA-256), so it says nothing of D_train: rerun `dpsynth probe --data {path} ...`")
    if probe.get("verdict") == contamination.SEEN:
        print(f"dpsynth dp-tune: the contamination probe ({probe_dir}) found evidence that the base model has seen D: "
              "DP covers the fine-tuning data only, not what the base learned of D in pretraining", file=sys.stderr)
    return probe


def _tune(args: argparse.Namespace, config, state_dir: str) -> int:
    """The run of `main`, once --out is held (`dpsynth.outdir.claim`)."""
    from dpsynth.dp import accounting
    from dpsynth.train import finetune as tune
    from dpsynth.train import resources
    from dpsynth.train import sweep as sweep_lib
    from dpsynth.train.tune_config import TuneError

    memory_limit = resources.parse_bytes(args.memory_limit) if args.memory_limit else None

    # Every rejected record is counted, explained and listed in the private state; past
    # --max-dead-letters the run is refused before any compute.
    policy = dead_letters.Policy.of(args.max_dead_letters, os.path.join(state_dir, dead_letters.FILE),
                                    prefix="dpsynth dp-tune: ")
    inputs = [("D_train (--train)", args.train, {"user_column": args.user_column})]
    inputs += [("D_valid (--valid)", args.valid)] if args.valid else []
    train, *rest = dead_letters.read_checked(inputs, policy, text_column=args.text_column,
                                             label_column=args.label_column, encoding=args.encoding)
    valid = rest[0].records if rest else []
    kwargs = dict(labels=args.labels, contamination_sha256=args.contamination_sha256, state_dir=args.state_dir,
                  contamination_probe=_probe(args.contamination_probe, train.files),
                  memory_limit=memory_limit,
                  memory_headroom=args.memory_headroom, fsdp=args.fsdp,
                  mesh=(args.mesh_data, args.mesh_model) if args.mesh_data * args.mesh_model > 1 else None)
    if args.stop_after is not None and args.stop_after < 1:
        raise TuneError(f"--stop-after must be >= 1, got {args.stop_after}")
    if args.sweep_select_epsilon is not None and not (args.sweep_lr or args.sweep_clip):
        raise TuneError("--sweep-select-epsilon selects among a sweep's trials: give --sweep-lr and/or --sweep-clip")
    if (args.sweep_lr or args.sweep_clip) and (args.resume or args.stop_after is not None):
        raise TuneError("--resume/--stop-after apply to a single run, not to a sweep")
    if args.sweep_lr or args.sweep_clip:
        result, _ = sweep_lib.sweep(args.base, train.records, valid, args.out, config,
                                    learning_rates=args.sweep_lr or [config.learning_rate],
                                    clip_norms=args.sweep_clip or [config.clip_norm],
                                    sweep_accounting=args.sweep_accounting, select_epsilon=args.sweep_select_epsilon,
                                    valid_split=args.valid_split, **kwargs)
    else:
        result = tune.dp_tune(args.base, train.records, valid, args.out, config, resume=args.resume,
                              stop_after=args.stop_after, **kwargs)
    units = result.report.get("training", {}).get("dataset_size")
    if units and accounting.weak_delta(result.delta, units) and not math.isinf(config.epsilon):
        print(f"dpsynth dp-tune: {accounting.weak_delta_note(result.delta, units, config.privacy_unit + 's')}",
              file=sys.stderr)
    chosen = result.report.get("training", {}).get("recipe")
    if chosen:  # what the automatic recipe chose, and why (public settings and |D_train| only)
        print("dpsynth dp-tune: recipe auto: " + "; ".join(chosen["why"]), file=sys.stderr)
    print(json.dumps({"out": result.out_dir, "steps": result.steps, "noise_multiplier": result.noise_multiplier,
                      "epsilon": {k: (str(v) if v is not None and math.isinf(v) else v) for k, v in result.epsilon.items()},
                      "delta": result.delta, "state_dir": result.state_dir}, sort_keys=True))
    print(f"dpsynth dp-tune: the train/valid losses (NOT DP) and the checkpoints are in the owner-only "
          f"{result.state_dir}; publish only {result.out_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
