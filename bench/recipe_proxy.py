"""Calibrating the automatic DP-tuning recipe on a public proxy task (no sensitive data, no privacy spent).

    .venv/bin/python bench/recipe_proxy.py --base runs/paper-cpu/stages/pretrain/<hash>/model \
        [--data ../shared/data] [--train 4000] [--max-tokens 64] [--epsilon 3] [--out runs/recipe-proxy]

The proxy task (`dpsynth.data.proxy`): OpinRank hotel reviews of four cities (London, New York,
Las Vegas, Chicago) labelled by their city, balanced, N training examples. Each candidate recipe
DP-tunes LoRA on it at the given epsilon; the measure is how well the tuned model learned the
label conditioning that synthetic data needs, read off the model itself on held-out proxy
reviews: the generative classifier argmax_y log p(x | prompt(y)) (balanced accuracy; chance =
1/4) and the mean label margin log p(x | own) - max_other log p(x | other) in nats
(`dpsynth.generate.label_scores`). Named peer: the hand-picked recipe of the first cpu study
(expected batch 512, 3 epochs, lr 0.02); the script prints each candidate's ratio to it.

Candidates are `name=B:E:LR[:RANK[:TARGETS]]` (expected batch, epochs, learning rate, LoRA rank
and targets), `name=auto[:LR[:RANK[:TARGETS]]]` (the recipe's batch and steps) or `auto` (the
recipe itself); each run is cached under --out, so a rerun only adds what is new.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from types import SimpleNamespace

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

DEFAULT_DATA = os.path.join(os.path.dirname(REPO), "shared", "data")
CITIES = {"london": "hotels/london/", "new york": "hotels/new-york-city/", "las vegas": "hotels/las-vegas/",
          "chicago": "hotels/chicago/"}
PEER = "first-study=512:3:0.02"
DEFAULT_CANDIDATES = [PEER, "auto", "auto-lr0.005=auto:0.005", "auto-lr0.02=auto:0.02", "t30=1333:10:0.018"]


def parse_candidate(text: str) -> tuple[str, str, float | None, float | None, dict]:
    """'name=B:E:LR[:RANK[:TARGETS]]' | 'name=auto[:LR[:RANK[:TARGETS]]]' | 'auto' -> (name, B or 'auto', E, LR, lora)."""
    if text == "auto":
        return "auto", "auto", None, None, {}
    name, _, spec = text.partition("=")
    parts = spec.split(":")
    if parts[0] == "auto":
        parts = ["auto", None] + parts[1:]
    b, e, lr, *rest = parts + [None] * (3 - len(parts))
    lora = {}
    if rest and rest[0]:
        lora["lora_rank"] = int(rest[0])
    if len(rest) > 1 and rest[1]:
        lora["lora_targets"] = rest[1]
    return name, b, None if e is None else float(e), None if lr in (None, "") else float(lr), lora


def run(args) -> int:
    import numpy as np

    from dpsynth.data.proxy import build_proxy_task
    from dpsynth.evaluate.scores import classification_scores
    from dpsynth.generate.label_scores import label_margins, record_log_likelihoods
    from dpsynth.generate.model_info import load_bundle
    from dpsynth.train import finetune, prompts, tune_config

    task = build_proxy_task([os.path.join(args.data, "public", "opinrank", "opinrank-*.jsonl.gz")], CITIES,
                            num_train=args.train, num_valid=0, num_test=args.test, seed=args.seed)
    print(f"proxy task: {len(task.train)} train / {len(task.test)} test OpinRank hotel reviews, labels "
          f"{list(task.labels)} ({task.documents_read} documents read)", flush=True)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for text in args.candidates:
        name, b, e, lr, lora = parse_candidate(text)
        base_cfg = dict(mode="lora", epsilon=args.epsilon, max_tokens=args.max_tokens, microbatch_size=32,
                        checkpoint_every=10_000, **lora)
        if b == "auto":
            cfg = tune_config.TuneConfig(**base_cfg, recipe="auto", token_budget=args.token_budget)
            cfg, chosen = tune_config.resolve_recipe(cfg, len(task.train))
            cfg = tune_config.TuneConfig(**base_cfg, batch_size=cfg.batch_size, steps=cfg.steps,
                                         learning_rate=lr if lr is not None else cfg.learning_rate)
        else:
            cfg = tune_config.TuneConfig(**base_cfg, batch_size=float(b), epochs=e, learning_rate=lr)
        out = os.path.join(args.out, f"{name}-eps{args.epsilon:g}-n{args.train}")
        result_file = os.path.join(out + ".private", "proxy_result.json")
        if os.path.exists(result_file):
            with open(result_file) as f:
                rows.append(json.load(f))
            print(f"{name}: cached", flush=True)
            continue
        t0 = time.monotonic()
        if os.path.exists(os.path.join(out, "manifest.json")):  # tuned by an earlier, interrupted call
            from dpsynth.dp.report import load_report

            rep = load_report(out)
            res = SimpleNamespace(report=rep, steps=rep["training"]["steps"],
                                  noise_multiplier=rep["training"]["noise_multiplier"], epsilon=rep["epsilon"])
            tune_s = float("nan")
        else:
            res = finetune.dp_tune(args.base, task.train, [], out, cfg, labels=list(task.labels), progress_interval=60.0)
            tune_s = time.monotonic() - t0
        bundle = load_bundle(out)
        ll, own = record_log_likelihoods(bundle.decoder, bundle.params, bundle.tokenizer, prompts.DEFAULT_TEMPLATE,
                                         task.labels, task.test, args.max_tokens)
        row = {"name": name, **lora, "batch": res.report["training"]["expected_batch_size"], "steps": res.steps,
               "epochs": res.report["training"]["epochs"], "learning_rate": cfg.learning_rate,
               "sigma": res.noise_multiplier, "epsilon": res.epsilon.get("rdp"),
               "balanced_accuracy": classification_scores(own, np.argmax(ll, axis=1)).balanced_accuracy,
               "mean_margin": float(np.mean(label_margins(ll, own))), "tune_seconds": tune_s}
        with open(result_file, "w") as f:
            json.dump(row, f, indent=1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    peer = next((r for r in rows if r["name"] == parse_candidate(PEER)[0]), None)
    print(f"\nproxy: N {args.train}, {args.max_tokens} tokens, epsilon {args.epsilon:g}, LoRA; chance 0.25")
    print("| recipe | B | steps | epochs | lr | sigma | balanced acc | vs peer | mean margin | tune s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = r["balanced_accuracy"] / peer["balanced_accuracy"] if peer and peer["balanced_accuracy"] else math.nan
        print(f"| {r['name']} | {r['batch']:.0f} | {r['steps']} | {r['epochs']:.2f} | {r['learning_rate']:g} | "
              f"{r['sigma']:.3f} | {r['balanced_accuracy']:.3f} | {ratio:.2f}x | {r['mean_margin']:.3f} | "
              f"{r['tune_seconds']:.0f} |")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="a pretrained model directory")
    p.add_argument("--data", default=DEFAULT_DATA)
    p.add_argument("--train", type=int, default=4000)
    p.add_argument("--test", type=int, default=800)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--epsilon", type=float, default=3.0)
    p.add_argument("--token-budget", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join("runs", "recipe-proxy"))
    p.add_argument("candidates", nargs="*", default=DEFAULT_CANDIDATES)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
