"""`dpsynth import-model`: a local Hugging Face checkpoint or GGUF file as a dpsynth base model.

    dpsynth import-model --hf path/to/hf_model --out runs/base [--dtype bfloat16]
    dpsynth import-model --gguf path/to/model.gguf --out runs/base [--dtype bfloat16]

Binds the flags and calls `dpsynth.models.hf_import.import_model` or
`dpsynth.models.gguf_import.import_model` (docs/hf.md).
"""

from __future__ import annotations

import argparse
import sys

from dpsynth import errors, logs, outdir
from dpsynth.models import gguf_import, hf_import


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpsynth import-model", description=hf_import.__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--hf", help="local Hugging Face model directory (config.json, safetensors)")
    source.add_argument("--gguf", help="local GGUF file (llama.cpp format; architecture gemma3; F32/F16/BF16 and "
                                       "Q4_0..Q8_0, Q2_K..Q6_K tensors are dequantized)")
    parser.add_argument("--out", required=True, help="dpsynth model directory to write")
    parser.add_argument("--dtype", choices=sorted(hf_import.PARAM_DTYPES), default="float32",
                        help="parameter and compute dtype (bfloat16 halves memory; float32 for exact parity; "
                             "default: %(default)s)")
    logs.add_flags(parser)
    return parser


@errors.command("import-model", also=(OSError,))  # every failure we foresee: one line, no traceback
def main(argv: list[str] | None = None) -> int:
    """`dpsynth import-model (--hf DIR | --gguf FILE) --out MODEL_DIR [--dtype bfloat16]`."""
    ap = build_parser()
    args = ap.parse_args(argv)
    logs.configure(fmt="%(message)s", verbose=args.verbose)
    with outdir.claim(args.out, kind=outdir.MODEL, command="import-model", config=vars(args), parser=ap):
        if args.gguf is not None:
            manifest = gguf_import.import_model(args.gguf, args.out, dtype=args.dtype)
        else:
            manifest = hf_import.import_model(args.hf, args.out, dtype=args.dtype)
    src = manifest["source"]
    print(f"imported {src['family']} ({manifest['num_params']:,} parameters, {args.dtype}) from "
          f"{args.gguf if args.gguf is not None else args.hf} into {args.out}")
    print(f"dpsynth import-model: nobody deduplicated this model's pretraining data against your data: before dp-tune, "
          f"run `dpsynth probe --model {args.out} --data D --control CONTROL --out PROBE_DIR` (docs/hf.md)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
