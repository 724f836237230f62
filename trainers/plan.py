"""`dpsynth plan`: per-device memory, FLOPs and time of a DP tuning run, compiled, before any weight is loaded.

    dpsynth plan --model tests/train/fixtures/llama3_8b/config.json --dtype bfloat16 --mode lora \\
        --batch-size 1024 --microbatch-size 8 --max-tokens 512 --epochs 10 --dataset-size 25000 \\
        --mesh-data 8 --fsdp --virtual-cpu

--model is a preset, a dpsynth model directory or a Hugging Face config.json (or its directory);
no weights are read. The step `dpsynth dp-tune` would run with the same flags is compiled on
abstract arrays (`dpsynth.train.resources`): on this host's devices, or with --virtual-cpu on
mesh-size virtual CPU devices. Prints parameters, optimizer state, trainable parameters, the
step's temporaries and total per device, FLOPs per example-token, and per named accelerator
whether it fits, a suggested microbatch and the roofline time per step, epoch and run
(docs/scaling.md). --json prints the plan as one JSON object instead.
"""

from __future__ import annotations

import argparse
import json
import sys

from dpsynth import binding, errors, logs

# TuneConfig fields that do not change the compiled step (or that need the data): no flag here.
_NOT_FLAGS = ("template", "full_lm", "label_dropout", "seed", "checkpoint_every", "privacy_unit",
              "max_examples_per_user", "recipe", "token_budget", "time_budget", "max_batch_size",
              "reserve_selection_epsilon", "reserve_label_noise_multiplier")


def build_parser() -> argparse.ArgumentParser:
    from dpsynth.dp import accounting, mechanisms
    from dpsynth.models.config import LORA_TARGETS
    from dpsynth.train import tune_config as tune
    from dpsynth.train import recipe as recipe_lib, resources

    p = argparse.ArgumentParser(prog="dpsynth plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a preset, a dpsynth model directory, or a Hugging Face config.json")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                   help="config.json: parameter and compute dtype (as import-model --dtype; default float32); preset: "
                        "parameter dtype; model directory: its stored dtype unless given")
    g = p.add_mutually_exclusive_group()
    binding.add_flags(p, tune.TuneConfig, defaults=tune.TuneConfig(), skip=_NOT_FLAGS, overrides={
        "mode": {"choices": tune.MODES},
        "epsilon": {"type": lambda t: float("inf") if t.lower() in ("inf", "infinity") else float(t)},
        "accountant": {"choices": accounting.ACCOUNTANTS},
        "batch_size": {"help": "expected Poisson batch size"},
        "microbatch_size": {"type": int, "help": "examples per compiled microbatch"},
        "steps": {"container": g},
        "epochs": {"container": g},
        "optimizer": {"choices": tune.OPTIMIZERS},
        "lora_targets": {"choices": LORA_TARGETS},
        "prompt_init": {"choices": tune.PROMPT_INITS},
        "max_tokens": {"type": int, "help": "tokens per example; rows are max_tokens - 1 long (the longest dp-tune pads to)"},
        "mechanism": {"choices": mechanisms.names()},
        "label_contrast": {"metavar": "LAMBDA", "type": binding.float_or_auto,
                           "help": "the label contrast's weight (K rows per example, or 2 sampled: give --labels K); "
                                   "auto, the default, is the automatic recipe's choice, off here (`dpsynth plan` has no "
                                   "automatic recipe)"},
        "label_contrast_form": {"choices": recipe_lib.CONTRAST_FORMS,
                                "help": "the label contrast's form: full (K rows per example), sampled (2 rows for "
                                        f"any K), auto (full for at most {recipe_lib.CONTRAST_MAX_LABELS} labels)"},
    })
    p.add_argument("--dataset-size", type=int, required=True, help="N, training examples (steps and epoch length)")
    p.add_argument("--labels", type=int, default=None, metavar="K",
                   help="the label set's size (with --label-contrast: every example is fed under each label's prompt, "
                        "or under its own and one other with the sampled form)")
    p.add_argument("--mesh-data", type=int, default=1, help="devices on the data axis (default: %(default)s)")
    p.add_argument("--mesh-model", type=int, default=1, help="devices on the model (tensor) axis (default: %(default)s)")
    p.add_argument("--fsdp", action="store_true", help="also shard the parameters over the data axis (FSDP)")
    p.add_argument("--virtual-cpu", action="store_true",
                   help="compile on mesh-data x mesh-model virtual CPU devices (no accelerator needed)")
    p.add_argument("--generation-batch", type=int, default=None,
                   help="also compile the sampler's call at this batch (16-token prompts, rows of --max-tokens)")
    p.add_argument("--headroom", type=float, default=resources.DEFAULT_HEADROOM,
                   help="fraction of device memory a fit leaves free (default: %(default)s)")
    p.add_argument("--no-suggest", dest="suggest", action="store_false",
                   help="skip the second compilation (at twice the microbatch) behind the suggested microbatches")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    logs.add_flags(p)
    return p


@errors.command("plan")
def main(argv: list[str] | None = None) -> int:
    import jax

    from dpsynth.train import resources, tune_config, tune_model, tune_plan

    args = build_parser().parse_args(argv)
    logs.configure(fmt="%(message)s", verbose=args.verbose)
    devices = args.mesh_data * args.mesh_model
    if args.virtual_cpu:  # before any backend starts
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", devices)
    if len(jax.devices()) < devices:
        raise resources.PlanError(f"mesh {args.mesh_data}x{args.mesh_model} needs {devices} devices, this host has "
                                  f"{len(jax.devices())}; pass --virtual-cpu to compile on virtual CPU devices")
    names = [n for n in binding.add_flags(argparse.ArgumentParser(), tune_config.TuneConfig, skip=_NOT_FLAGS)]
    config = binding.from_args(tune_config.TuneConfig, args, names)
    source = resources.resolve_model(args.model, dtype=args.dtype)
    plan = tune_plan.plan_tuning(source, config, dataset_size=args.dataset_size, mesh=(args.mesh_data, args.mesh_model),
                                 fsdp=args.fsdp, headroom=args.headroom, suggest=args.suggest, labels=args.labels)
    if args.generation_batch:  # the sampler's call (prefill + KV-cache decode loop), on one device
        from dpsynth.generate.sampler import Sampler, SamplerConfig, TransformerDecodeModel

        model_config = tune_model.tuned_model_config(source.config, config)
        sampler = Sampler(TransformerDecodeModel(model_config),
                          SamplerConfig(max_len=config.max_tokens, batch_size=args.generation_batch))
        lowered = sampler.lower(resources.abstract_variables(model_config, source.param_dtype), 16)
        tune_plan.add_program(plan, resources.program_cost("sample", lowered))
    print(json.dumps(plan, indent=2, sort_keys=True) if args.json else tune_plan.format_plan(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
