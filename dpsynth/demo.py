"""`make demo`: the whole pipeline on the embedded default, as one small cached experiment.

    python -m dpsynth.demo [--data-dir data/embedded] [--out runs/demo] [--config FILE]

Public corpus: Jane Austen's six novels, into which the demo plants a few sensitive training
reviews ON PURPOSE (and says so), so the dedup stage can be seen finding and cutting them; the released tokenizer is trained
after the dedup, on the cleaned corpus only, so no planted review shapes its pieces.
Sensitive data: the Amazon fine-food reviews (train 3,600 / valid 400 / test 1,000). The
stages run through the experiment runner (`dpsynth.experiment`), so a second `make demo`
reuses every finished stage, and an interrupted one resumes. Printed per stage: the
contamination report, pretraining's validation perplexity, the privacy report of DP LoRA at
epsilon = 3, generated examples per label with the generation report, and the evaluation
summary table (accuracy, balanced accuracy, macro-F1) with the report's path. It ends with the
plain summary and its verdict: does the synthetic data beat DP-on-real at its epsilon?

The demo's config is `DEMO_CONFIG` below (the same as `configs/demo.yaml`, checked by a test);
about 11 minutes on 2 quiet CPU cores. It never fakes a stage: if a stage's library is missing it
stops there with a message naming it and exits non-zero.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from dpsynth import errors, logs
from dpsynth.dedup import DEFAULT_MIN_TOKENS

# The demo experiment (mirrored in configs/demo.yaml).
DEMO_CONFIG: dict[str, Any] = {
    "name": "demo",
    "out": "runs/demo",
    "seed": 0,
    "public": {"embedded": True, "plant": 5},
    "sensitive": {"embedded": True},
    "tokenizer": {"vocab_size": 4000},
    "dedup": {"min_tokens": DEFAULT_MIN_TOKENS},
    "pretrain": {"preset": "tiny", "steps": 2000, "seq_len": 128, "batch_size": 16, "learning_rate": 0.003},
    "dp_tune": {
        "modes": ["lora"],
        "epsilons": [3],
        "clip_norms": [1.0],
        # The automatic recipe (dpsynth.train.recipe) at the demo's compute: 4 passes over the
        # 3,600 training reviews of 128 tokens; it chooses 100 steps at expected batch 148, and the
        # label contrast (two labels), so that the generator's own samples carry the label.
        "recipe": "auto",
        "token_budget": 1_900_000,
        "max_tokens": 128,
    },
    # Plain sampling: no setting chosen on a test set (a guidance weight is chosen among candidate
    # corpora with DP on D_valid by `dpsynth select`, README step 5, which the demo leaves out to
    # stay short); post-processing as in bench/paper.py's cpu study: drop empty and duplicate
    # samples (no privacy cost; counted in the generation report), drawing 1.2x to keep the size.
    "generate": {"samplings": [{"temperature": 1.0, "top_k": 0, "num_decodes": 1}],
                 "multiples": [1], "max_tokens": 128,
                 "options": {"postprocess": {"drop": ["empty", "duplicate"], "oversample": 1.2}}},
    # CPU-sized evaluation (the evaluate library's demo sizes): a small WordCNN, 1 repeat,
    # 3 epochs, 2 MAUVE seeds; DP-on-real with one clipping norm, expected batch 128, 2 epochs.
    "evaluate": {
        "classifiers": ["wordcnn"],
        "baselines": True,
        "options": {
            "wordcnn": {"vocab_words": 10000, "embed_dim": 64, "filters": 64, "hidden": 64, "max_len": 128},
            "sweep": {"repeats": 1, "clip_norms": [1.0], "train": {"max_epochs": 3}},
            "mauve_seeds": [0, 1],
            "dp_expected_batch_size": 128,
            "dp_epochs": 2.0,
        },
    },
}

BANNERS = {
    "sensitive": "sensitive data: the embedded fine-food reviews",
    "public": "public corpus: Jane Austen's novels (with planted reviews)",
    "dedup": "dedup: cut >= {min_tokens}-token overlaps with the sensitive data (contamination report; "
             "its temporary tokenizer stays private)",
    "tokenizer": "tokenizer: SentencePiece on the DEDUPLICATED public corpus only (the released one), re-tokenizing it",
    "pretrain": "pretraining the '{preset}' LM on the cleaned corpus (validation perplexity)",
    "dp_tune": "DP fine-tuning: {mode} at epsilon = {epsilon:g} (privacy report)",
    "labels": "DP label histogram of D_train (one draw per DP-tuned model)",
    "generate": "generating synthetic train/valid data (examples per label, generation report)",
    "evaluate": "evaluation: synthetic vs real vs DP-on-real (summary table, report)",
}


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def demo_config(overrides: Mapping[str, Any] | None = None):
    """The demo's `ExperimentConfig`, with optional nested overrides (tests shrink it)."""
    from dpsynth.experiment.config import from_dict

    return from_dict(_merge(DEMO_CONFIG, overrides or {}))


def run_demo(
    *,
    out: str = "runs/demo",
    data_dir: str | None = None,
    config=None,
    jobs: int = 1,
    registry=None,
) -> int:
    """Runs the demo experiment, printing each stage's report; returns the exit code.

    Raises `dpsynth.errors.DpsynthError` on what the user can fix (e.g. `EmbeddedDataMissing`:
    run `make data`).

    Args:
        out: output root (stages are cached under it; rerunning reuses them).
        data_dir: the embedded default's directory (default `$DPSYNTH_EMBEDDED_DIR` or
            `data/embedded`).
        config: an `ExperimentConfig` to run instead of the demo's (tests pass a shrunken one).
        jobs: worker processes for independent trials.
        registry: stage functions (default: the real stages; tests pass fakes).
    """
    from dpsynth.experiment import runner
    from dpsynth.experiment.plan import build_plan

    config = config or demo_config()
    plan = build_plan(config, out, data_dir=data_dir)
    runner.write_experiment_files(plan, config)
    total = len(plan.nodes)
    counter = {"n": 0}

    def banner(node) -> None:
        counter["n"] += 1
        fields = {**node.config}
        text = BANNERS[node.stage].format(**fields) if node.stage in BANNERS else node.stage
        print(f"\n=== [{counter['n']}/{total}] {text}", flush=True)

    print(f"dpsynth demo: {len(plan.trials)} trial(s), {total} stages, output {plan.root}")
    print("(finished stages are cached: rerunning `make demo` reuses them)")
    t0 = time.monotonic()
    result = runner.run_plan(plan, jobs=jobs, on_stage=banner, registry=registry)
    if result.missing is not None:
        done = ", ".join(result.outputs) or "none"
        print(
            f"\ndemo stopped: {result.missing}.\nStages finished (cached for the next run): {done}.\n"
            f"The pipeline is not complete yet; nothing after '{result.missing.stage}' was run or faked.",
            file=sys.stderr,
        )
        return runner.EXIT_UNAVAILABLE
    if result.failed is not None:
        return runner.report_result(result)
    report_dir = result.report_dir
    print(f"\n=== demo finished in {time.monotonic() - t0:.0f}s")
    if report_dir:
        evaluated = result.outputs["evaluate"]
        if not evaluated.cached:  # (a cached stage's stored report, table included, was shown above)
            print("evaluation summary (accuracy, balanced accuracy and macro-F1 on the real test set):")
            print(evaluated.summary.get("table", ""))
        print("\n" + _plain_summary(report_dir, result.outputs["sensitive"].path("data", "test.jsonl")))
        # The last line: the report where it stays (the root's `report` link to the completed evaluate stage).
        print(f"\nreport: {final_report_path(plan.root)}")
    return 0


def final_report_path(root: str) -> str:
    """The HTML report of a finished experiment root, through its stable `ROOT/report` link."""
    return os.path.join(os.path.abspath(root), "report", "report.html")


def _plain_summary(report_dir: str, test_path: str) -> str:
    """The report's plain summary (`tables.report_summary`), ending with the verdict per corpus."""
    import json

    from dpsynth.evaluate.tables import report_summary

    if not os.path.exists(os.path.join(report_dir, "metrics.json")):  # say so without reading the labels
        return report_summary(report_dir, [])
    with open(test_path, encoding="utf-8") as f:
        labels = [json.loads(line)["label"] for line in f if line.strip()]
    return report_summary(report_dir, labels)


@errors.command("demo")
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dpsynth demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None, help="embedded default data (default $DPSYNTH_EMBEDDED_DIR or data/embedded)")
    p.add_argument("--out", default="runs/demo", help="output root (default runs/demo)")
    p.add_argument("--config", default=None, help="run this experiment YAML instead of the demo's")
    p.add_argument("--jobs", type=int, default=1, help="worker processes for independent trials (default: %(default)s)")
    logs.add_flags(p)
    args = p.parse_args(argv)
    logs.configure(fmt="%(message)s", verbose=args.verbose)
    config = None
    if args.config:
        from dpsynth.experiment.config import load_config

        config = load_config(args.config)
    return run_demo(out=args.out, data_dir=args.data_dir, config=config, jobs=args.jobs)


if __name__ == "__main__":
    sys.exit(main())
