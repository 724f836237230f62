"""`dpsynth import-model`: a local Hugging Face checkpoint as a dpsynth base model.

    dpsynth import-model --hf path/to/hf_model --out runs/base [--dtype bfloat16]

Binds the flags and calls `dpsynth.models.hf_import.import_model` (docs/hf.md).
"""

from __future__ import annotations

import argparse
import sys

from dpsynth import errors, logs, outdir
from dpsynth.models import hf_import


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpsynth import-model", description=hf_import.__doc__.splitlines()[0])
    parser.add_argument("--hf", required=True, help="local Hugging Face model directory (config.json, safetensors)")
    parser.add_argument("--out", required=True, help="dpsynth model directory to write")
    parser.add_argument("--dtype", choices=sorted(hf_import.PARAM_DTYPES), default="float32",
                        help="parameter and compute dtype (bfloat16 halves memory; float32 for exact parity; "
                             "default: %(default)s)")
    logs.add_flags(parser)
    return parser


@errors.command("import-model", also=(OSError,))  # every failure we foresee: one line, no traceback
def main(argv: list[str] | None = None) -> int:
    """`dpsynth import-model --hf DIR --out MODEL_DIR [--dtype bfloat16]`."""
    ap = build_parser()
    args = ap.parse_args(argv)
    logs.configure(fmt="%(message)s", verbose=args.verbose)
    with outdir.claim(args.out, kind=outdir.MODEL, command="import-model", config=vars(args), parser=ap):
        manifest = hf_import.import_model(args.hf, args.out, dtype=args.dtype)
    src = manifest["source"]
    print(f"imported {src['family']} ({manifest['num_params']:,} parameters, {args.dtype}) from {args.hf} into "
          f"{args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
