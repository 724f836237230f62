"""The `dpsynth` command: one subcommand per stage.

This module only dispatches: each subcommand is a thin entry point (in `beam_jobs/`,
`trainers/` or the library) exposing `main(argv) -> int` with its own argparse parser,
so `dpsynth STAGE --help` shows that stage's flags. A `dpsynth.errors.DpsynthError` escaping
a command is printed as one line, `dpsynth COMMAND: error: MESSAGE`, with exit status 2.
"""

from __future__ import annotations

import importlib
import sys

from dpsynth import errors

# name -> ("module:function", one-line description). Imports are lazy so `--help` is fast.
COMMANDS: dict[str, tuple[str, str]] = {
    "tokenizer": ("trainers.tokenizer:main", "train a SentencePiece tokenizer on PUBLIC text only"),
    "tokenize": ("beam_jobs.tokenize:main", "tokenize corpora into sharded token files (Beam)"),
    "dedup": ("beam_jobs.dedup:main", "cut >= k-token overlaps with sensitive data from the public corpus (Beam)"),
    "pretrain": ("trainers.pretrain:main", "pretrain the decoder-only LM on the cleaned corpus"),
    "import-model": ("trainers.import_model:main",
                     "import a local Hugging Face checkpoint (Llama, Mistral, Qwen2, Gemma 1/2/3, GPT-2) or a gemma3 GGUF "
                     "file as a base model"),
    "export-model": ("trainers.export_model:main",
                     "export an imported (DP-tuned) model as a Hugging Face directory (merged, or a PEFT LoRA adapter)"),
    "probe": ("trainers.probe:main", "owner-only probe: does a base model already know the sensitive data? (NOT DP)"),
    "dp-tune": ("trainers.dp_tune:main", "DP fine-tune (full | prompt | lora) on the sensitive training set"),
    "plan": ("trainers.plan:main", "per-device memory, FLOPs and time of a DP tuning run, compiled without weights"),
    "privacy": ("dpsynth.dp.calculator:main", "privacy calculator: epsilon or noise multiplier (RDP and PLD)"),
    "generate": ("beam_jobs.generate:main", "generate synthetic train/valid splits (Beam fan-out)"),
    "classify": ("trainers.classify:main", "train a downstream classifier and test it on real data"),
    "select": ("trainers.select:main", "the best synthetic corpus, chosen with DP on the real D_valid"),
    "evaluate": ("beam_jobs.metrics:main", "metrics and HTML report over one or many synthetic corpora"),
    "audit": ("trainers.audit:main", "owner-only audit of a synthetic corpus: copying of D_train, canaries (NOT DP)"),
    "experiment": ("dpsynth.experiment.runner:main", "run a cached grid of pipeline runs from a YAML config"),
    "demo": ("dpsynth.demo:main", "the whole pipeline on the embedded default dataset"),
}


def _usage() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = ["usage: dpsynth COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {desc}" for name, (_, desc) in COMMANDS.items()]
    lines += ["", "Run `dpsynth COMMAND --help` for the flags of one command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatches `dpsynth COMMAND ...` to the command's entry point."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"dpsynth: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, func_name = COMMANDS[name][0].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    try:
        return int(func(rest) or 0)
    except errors.DpsynthError as e:  # (the entry points' `errors.command` already reports their own)
        return errors.report(name, e)
    except Exception as e:  # a full disk, however wrapped (`errors.disk_full_in`)
        full = errors.disk_full_in(e)
        if full is None:
            raise
        return errors.report(name, full)


if __name__ == "__main__":
    sys.exit(main())
