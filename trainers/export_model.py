"""`dpsynth export-model`: an imported (DP-tuned) model back to the Hugging Face layout.

    dpsynth export-model --model runs/tuned --format hf --out runs/hf [--adapter-only]

Binds the flags and calls `dpsynth.models.hf_export.export_model` (docs/hf.md).
"""

from __future__ import annotations

import argparse
import sys

from dpsynth import errors, logs, outdir
from dpsynth.models import hf_export


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpsynth export-model", description=hf_export.__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="dpsynth model directory (imported, possibly DP-tuned)")
    parser.add_argument("--format", choices=["hf"], default="hf",
                        help="output layout (Hugging Face safetensors; default: %(default)s)")
    parser.add_argument("--out", required=True, help="directory to write")
    parser.add_argument("--adapter-only", action="store_true",
                        help="LoRA models: write a PEFT adapter (adapter_config.json + adapter_model.safetensors)")
    logs.add_flags(parser)
    return parser


@errors.command("export-model", also=(OSError,))  # every failure we foresee: one line, no traceback
def main(argv: list[str] | None = None) -> int:
    """`dpsynth export-model --model MODEL_DIR --format hf --out DIR [--adapter-only]`."""
    ap = build_parser()
    args = ap.parse_args(argv)
    logs.configure(fmt="%(message)s", verbose=args.verbose)
    with outdir.claim(args.out, kind=outdir.HF_MODEL, command="export-model", config=vars(args), parser=ap):
        record = hf_export.export_model(args.model, args.out, adapter_only=args.adapter_only)
    print(f"exported {args.model} ({record['mode']}, {record['family']}) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
