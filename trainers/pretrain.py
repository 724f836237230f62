"""`dpsynth pretrain`: pretrain the decoder-only LM on a cleaned (deduplicated) token corpus.

    dpsynth pretrain --corpus runs/clean --tokenizer runs/tok.model --preset small --out runs/base \\
        --seq-len 512 --batch-size 16 --steps 2000

`--microbatch-size auto` keeps the step's batch (--batch-size x --grad-accum sequences) and splits
it into the largest equal microbatches whose compiled step fits the device memory less
--memory-headroom (on CPU the host's available memory); the choice is logged and recorded.

Kill it at any time and re-run with `--resume`: it continues exactly from the last checkpoint
(at most `--checkpoint-every` steps are lost). OUT becomes the model directory that
`dpsynth dp-tune --base OUT` and `dpsynth generate` load.

Multi-host (docs/models.md): run the same command in every process with `--distributed` and a
mesh over all processes' devices (--mesh-data x --mesh-model = the global device count).
On Cloud TPU VMs (and SLURM / Open MPI) that is all; elsewhere also pass
`--coordinator-address HOST:PORT` (process 0's host), `--num-processes N` and a distinct
`--process-id I` to each. OUT must be a directory every process sees (GCS, NFS).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from dpsynth import binding, errors, logs, outdir
from dpsynth.models.config import PRESETS
from dpsynth.train.optim import OPTIMIZERS
from dpsynth.train import pretrain, resources
from trainers import distributed


def _override(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


# PretrainConfig fields without a flag (library callers and tests set them).
_NOT_FLAGS = ("progress_interval", "eval_at_start")


class _SetField(argparse.Action):
    """`--set FIELD=VALUE` (repeatable): collects the pairs into the `model_overrides` dict."""

    def __call__(self, parser, namespace, values, option_string=None):
        key, value = values
        setattr(namespace, self.dest, {**getattr(namespace, self.dest), key: value})


class _AppendTuple(argparse.Action):
    """A repeatable flag whose values collect into a tuple (the config field's type)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, (*getattr(namespace, self.dest), values))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dpsynth pretrain", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True, metavar="DIR", help="cleaned token corpus (dpsynth.tokens directory)")
    p.add_argument("--tokenizer", required=True, metavar="MODEL", help="SentencePiece model the corpus was made with")
    p.add_argument("--out", required=True, metavar="DIR", help="run + model directory")
    binding.add_flags(p, pretrain.PretrainConfig, skip=_NOT_FLAGS, overrides={
        "preset": {"choices": sorted(PRESETS)},
        "model_overrides": {"flags": ("--set",), "type": _override, "action": _SetField, "metavar": "FIELD=VALUE",
                            "help": "override a ModelConfig field of the preset, e.g. --set d_model=128 (repeatable)"},
        "seq_len": {"help": "packed sequence length L"},
        "batch_size": {"help": "sequences per microbatch (an optimizer step sees --batch-size x --grad-accum)"},
        "grad_accum": {"help": "microbatches per optimizer step"},
        "microbatch_size": {"type": binding.int_or_auto, "metavar": "N|auto"},
        "memory_limit": {"type": resources.bytes_flag, "metavar": "BYTES"},
        "optimizer": {"choices": ("auto",) + OPTIMIZERS,
                      "help": "auto: Adam for tiny/small, Adafactor with min(0.01, 1/sqrt(step)) otherwise"},
        "valid_unit": {"choices": pretrain.VALID_UNITS,
                       "help": "hold out blocks, or whole documents (e.g. a fixed set of held-out reviews)"},
        "valid_groups": {"flags": ("--valid-group",), "action": _AppendTuple, "metavar": "ID_PREFIX",
                         "help": "also report the validation perplexity of documents whose id starts so (repeatable: "
                                 "--valid-group hotels/ --valid-group enwiki:)"},
        "mesh_data": {"help": "devices on the data axis"},
        "mesh_model": {"help": "devices on the model axis"},
        "peak_tflops": {"help": "per-device peak for MFU (default: by device kind)"},
        "tensorboard": {"flags": ("--no-tensorboard",), "action": "store_false"},
    })
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in OUT")
    p.add_argument("--stop-after", type=int, default=None, metavar="STEP",
                   help="checkpoint and stop at this step (time-sliced jobs); resume later with --resume")
    distributed.add_flags(p)
    logs.add_flags(p)
    return p


# also: the library's plain ValueErrors and a missing file, as one line too
@errors.command("pretrain", also=(ValueError, FileNotFoundError))
def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    logs.configure(fmt="%(message)s", verbose=args.verbose)
    distributed.start(args)
    config = binding.from_args(pretrain.PretrainConfig, args, [f.name for f in dataclasses.fields(pretrain.PretrainConfig)
                                                                if f.name not in _NOT_FLAGS])
    with outdir.claim(args.out, kind=outdir.MODEL, command="pretrain", config=vars(args), parser=ap,
                      ignore=("eval_every", "eval_batches", "checkpoint_every", "memory_limit", "memory_headroom"),
                      primary=distributed.is_primary(args)):
        summary = pretrain.run_pretrain(args.corpus, args.tokenizer, args.out, config, resume=args.resume,
                                        stop_after=args.stop_after)
    print(json.dumps(summary, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
