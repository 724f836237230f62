"""`dpsynth pretrain`: pretrain the decoder-only LM on a cleaned (deduplicated) token corpus.

    dpsynth pretrain --corpus runs/clean --tokenizer runs/tok.model --preset small --out runs/base \\
        --seq-len 512 --batch-size 16 --steps 2000

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
import json
import sys

from dpsynth import errors, logs
from dpsynth.models.config import PRESETS
from dpsynth.train import pretrain
from trainers import distributed


def _override(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def build_parser() -> argparse.ArgumentParser:
    d = pretrain.PretrainConfig()
    p = argparse.ArgumentParser(prog="dpsynth pretrain", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True, metavar="DIR", help="cleaned token corpus (dpsynth.tokens directory)")
    p.add_argument("--tokenizer", required=True, metavar="MODEL", help="SentencePiece model the corpus was made with")
    p.add_argument("--out", required=True, metavar="DIR", help="run + model directory")
    p.add_argument("--preset", choices=sorted(PRESETS), default=d.preset)
    p.add_argument("--set", dest="overrides", type=_override, action="append", default=[], metavar="FIELD=VALUE",
                   help="override a ModelConfig field of the preset, e.g. --set d_model=128 (repeatable)")
    p.add_argument("--seq-len", type=int, default=d.seq_len, help="packed sequence length L")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="sequences per microbatch")
    p.add_argument("--grad-accum", type=int, default=d.grad_accum, help="microbatches per optimizer step")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--optimizer", choices=("auto", "adafactor", "adam"), default=d.optimizer,
                   help="auto: Adam for tiny/small, Adafactor with min(0.01, 1/sqrt(step)) otherwise")
    p.add_argument("--learning-rate", type=float, default=None)
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--z-loss", type=float, default=d.z_loss)
    p.add_argument("--valid-fraction", type=float, default=d.valid_fraction)
    p.add_argument("--valid-unit", choices=pretrain.VALID_UNITS, default=d.valid_unit,
                   help="hold out blocks, or whole documents (e.g. a fixed set of held-out reviews)")
    p.add_argument("--valid-group", dest="valid_groups", action="append", default=[], metavar="ID_PREFIX",
                   help="also report the validation perplexity of documents whose id starts so (repeatable: "
                        "--valid-group hotels/ --valid-group enwiki:)")
    p.add_argument("--eval-every", type=int, default=d.eval_every)
    p.add_argument("--eval-batches", type=int, default=d.eval_batches)
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    p.add_argument("--log-every", type=int, default=d.log_every)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--mesh-data", type=int, default=d.mesh_data, help="devices on the data axis")
    p.add_argument("--mesh-model", type=int, default=d.mesh_model, help="devices on the model axis")
    p.add_argument("--peak-tflops", type=float, default=None, help="per-device peak for MFU (default: by device kind)")
    p.add_argument("--no-tensorboard", action="store_true")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in OUT")
    p.add_argument("--stop-after", type=int, default=None, metavar="STEP",
                   help="checkpoint and stop at this step (time-sliced jobs); resume later with --resume")
    distributed.add_flags(p)
    logs.add_flags(p)
    return p


# also: the library's plain ValueErrors and a missing file, as one line too
@errors.command("pretrain", also=(ValueError, FileNotFoundError))
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(fmt="%(message)s", verbose=args.verbose)
    distributed.start(args)
    config = pretrain.PretrainConfig(
        preset=args.preset, model_overrides=dict(args.overrides), seq_len=args.seq_len,
        batch_size=args.batch_size, grad_accum=args.grad_accum, steps=args.steps, optimizer=args.optimizer,
        learning_rate=args.learning_rate, warmup_steps=args.warmup_steps, weight_decay=args.weight_decay,
        z_loss=args.z_loss, valid_fraction=args.valid_fraction, valid_unit=args.valid_unit,
        valid_groups=tuple(args.valid_groups), eval_every=args.eval_every,
        eval_batches=args.eval_batches, checkpoint_every=args.checkpoint_every, log_every=args.log_every,
        seed=args.seed, mesh_data=args.mesh_data, mesh_model=args.mesh_model, peak_tflops=args.peak_tflops,
        tensorboard=not args.no_tensorboard)
    summary = pretrain.run_pretrain(args.corpus, args.tokenizer, args.out, config, resume=args.resume,
                                    stop_after=args.stop_after)
    print(json.dumps(summary, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
