"""Small-scale reproduction of Kurakin et al. 2023's claims, through the experiment runner.

    .venv/bin/python bench/paper.py --quick                       # the cpu study at smoke size: minutes
    .venv/bin/python bench/paper.py --scale cpu --jobs 1        # the cpu study (docs/paper_cpu.md): ~2.5 h on 2 quiet cores
    .venv/bin/python bench/paper.py --scale small --jobs 2        # the measured study: ~1.5 h on 2 cores
    .venv/bin/python bench/paper.py --scale full --jobs 2         # the `small` LM preset: many hours

The `small`/`full` scales (below); the `cpu` scale and `--quick` are described at `cpu_experiments` and in
docs/paper_cpu.md. Sensitive data of `small`: Yelp polarity reviews from `../shared/data/yelp` (dev_polarity.csv as D_train
with its last 10% as D_valid, test_polarity.csv as D_test). Public corpus: `../shared/data/public/kjv` plus the embedded Austen novels;
the dedup stage cuts any >= 50-token overlap with the sensitive data before pretraining.

Several experiment configs run into ONE cache root, so they share the data, tokenizer, dedup
and pretraining stages (and any identical trial):

1. `main`: LoRA, prompt and full DP tuning at epsilon in {1, 3, 10, inf}, 1x synthetic data,
   with the real-data and DP-on-real baselines at the same epsilons (WordCNN + backbone).
2. `full_lm`: LoRA at epsilon 3 with the full-LM loss (the Prefix-LM run is in `main`).
3. `x3`: LoRA at epsilon 3 with 3x synthetic data (1x is in `main`).
4. `prior`: LoRA at epsilon 3 with labels drawn from a DP histogram of D_train (Gaussian,
   sigma 10) instead of uniformly: the real class prior, at a small extra privacy cost
   (composed into the corpus's privacy report and shown in the table).
5. `prompt_lr`: prompt tuning at epsilon 3 with a 10x larger learning rate than `main`'s (is
   a weak soft prompt a matter of step size?).

The peers measured in the same run are the real-data classifier and DP-on-real (DP-Adam on
the real training set at the same epsilon): the script prints and writes the ratio of the
synthetic-data accuracy to each, plus the Markdown tables (`--out`): accuracy per mode and
epsilon, Prefix-LM vs full-LM, 1x vs 3x, the hyperparameter-ranking correlations (Spearman,
Kendall, RBO) at epsilon 1 and 3, MAUVE and the n-gram metrics with their rank agreement with
accuracy, and which of the paper's directions this run reproduces.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

DEFAULT_DATA = os.path.join(os.path.dirname(REPO), "shared", "data")

# Scale presets. "small" (the tiny LM preset, all of Yelp's dev_polarity) is what the README
# reports, about 1.5 hours on 2 CPU cores; "full" swaps in the `small` LM preset (5.5M
# parameters) and takes many hours there; "quick" is a smoke test (minutes) that exercises
# every stage and table but whose numbers mean nothing. One learning rate per mode, chosen
# a priori (full fine-tuning wants a smaller step than LoRA, the soft prompt a larger one).
_SMALL_EVAL = {
    "classifiers": ["wordcnn", "backbone"],
    "options": {
        "mauve_seeds": [0, 1],
        "wordcnn": {"vocab_words": 10000, "embed_dim": 64, "filters": 64, "hidden": 64, "max_len": 128},
        "backbone_max_len": 128,
        # 4 x 2 WordCNN grid: the hyperparameter-ranking correlation needs more than two settings.
        "sweep": {"learning_rates": [0.001, 0.003, 0.01, 0.03], "weight_decays": [0.0001, 0.01], "clip_norms": [1.0],
                  "repeats": 1, "train": {"max_epochs": 3}},
        # Fine-tuning the LM backbone costs ~50x a WordCNN run on CPU: 3 learning rates, 2 epochs.
        "backbone_sweep": {"learning_rates": [0.0003, 0.001, 0.003], "weight_decays": [0.0001], "clip_norms": [1.0],
                           "repeats": 1, "train": {"max_epochs": 2}},
        "dp_expected_batch_size": 128,
        "dp_epochs": 2.0,
    },
}
SCALES: dict[str, dict[str, Any]] = {
    "small": {
        "sensitive": {"max_train": None, "max_valid": None, "max_test": 2000},
        "tokenizer": {"vocab_size": 4000},
        "pretrain": {"preset": "tiny", "steps": 3000, "seq_len": 128, "batch_size": 16, "learning_rate": 0.003,
                     "options": {"eval_every": 500, "checkpoint_every": 500}},
        "dp_tune": {"batch_size": 256, "epochs": 4, "max_tokens": 128, "learning_rates": [0.01],
                    "mode_learning_rates": {"full": [0.003], "prompt": [0.03]}, "clip_norms": [1.0]},
        "generate": {"max_tokens": 128, "batch_size": 64},
        "evaluate": _SMALL_EVAL,
        "modes": ["lora", "prompt", "full"],
        "epsilons": [1, 3, 10, "inf"],
    },
    "full": {
        "sensitive": {"max_train": None, "max_valid": None, "max_test": 2000},
        "tokenizer": {"vocab_size": 8000},
        "pretrain": {"preset": "small", "steps": 2000, "seq_len": 256, "batch_size": 16, "learning_rate": 0.003,
                     "options": {"eval_every": 500, "checkpoint_every": 250}},
        "dp_tune": {"batch_size": 512, "epochs": 10, "max_tokens": 256, "learning_rates": [0.003],
                    "mode_learning_rates": {"full": [0.001], "prompt": [0.03]}, "clip_norms": [1.0]},
        "generate": {"max_tokens": 256, "batch_size": 64},
        "evaluate": {"classifiers": ["wordcnn", "backbone"], "options": {"dp_epochs": 5.0}},
        "modes": ["lora", "prompt", "full"],
        "epsilons": [1, 3, 10, "inf"],
    },
    "small-quick": {
        "sensitive": {"max_train": 400, "max_valid": 100, "max_test": 300},
        "tokenizer": {"vocab_size": 2000, "max_sentences": 50000},
        "pretrain": {"preset": "tiny", "steps": 40, "seq_len": 64, "batch_size": 8, "learning_rate": 0.003,
                     "options": {"eval_every": 20}},
        "dp_tune": {"batch_size": 100, "epochs": 1, "max_tokens": 64, "learning_rates": [0.003], "clip_norms": [1.0]},
        "generate": {"max_tokens": 48, "batch_size": 32},
        "evaluate": {"classifiers": ["wordcnn"],
                     "options": {"dp_epochs": 1.0, "mauve_seeds": [0],
                                 "wordcnn": {"vocab_words": 5000, "embed_dim": 32, "filters": 32, "hidden": 32, "max_len": 64},
                                 "sweep": {"learning_rates": [0.001, 0.003], "weight_decays": [0.0001], "clip_norms": [1.0],
                                           "repeats": 1, "train": {"max_epochs": 2}}}},
        "modes": ["lora", "prompt"],
        "epsilons": [3, "inf"],
    },
}


# A DP-tuned model's D_valid loss is computed without DP and read from the owner-only private state: every
# table that shows it says so (tests/test_nondp_figures.py checks the rendered tables and the committed docs).
NON_DP_FIGURE = "non-DP study-author figure"
VALID_LOSS_COLUMN = f"D_valid loss ({NON_DP_FIGURE})"
VALID_LOSS_NOTE = (f"(D_valid loss, a {NON_DP_FIGURE}: the DP-tuned model's loss on D_valid computed without DP, read "
                   "from the owner-only private state; it is not covered by any epsilon.)")


def _private_valid_loss(plan, key: str) -> float | None:
    """A DP-tuned model's D_valid loss (NOT DP): from the stage's owner-only private state (see NON_DP_FIGURE)."""
    from dpsynth.experiment.plan import private_dir
    from dpsynth.experiment.stages import LOSSES_FILE

    path = os.path.join(private_dir(plan.root, plan.node(key)), LOSSES_FILE)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f).get("valid_loss")


# ----------------------------------------------------------------------------- the cpu scale
#
# The measured study of issue 12 (docs/paper_cpu.md): a generator pretrained on in-domain public
# reviews (OpinRank) plus Wikipedia, the `cpu` LM preset, and four sensitive sets. Sizes are
# chosen to fit about 2.5 hours on 2 quiet cores (the estimate and how it was made are in
# docs/paper_cpu.md); `--pretrain-steps` rescales pretraining after a quiet calibration run.
# `quick` is the same study at smoke size (minutes; its numbers mean nothing).

CPU_LABELS = {
    "yelp_sentences": {0: "negative", 1: "positive"},
    "yelp_polarity": {0: "negative", 1: "positive"},
    "sst2": {0: "negative", 1: "positive"},
    "ag_news": {0: "world", 1: "sports", 2: "business", 3: "science"},
}


def cpu_datasets(data: str) -> dict[str, dict[str, Any]]:
    """name -> the `sensitive:` section of each sensitive set (fixed splits; see dpsynth.data.splits)."""
    ys = os.path.join(data, "yelp_sentences", "yelp_sentences_dev_test.csv")
    sst = os.path.join(data, "sst")
    return {
        # Yelp sentences: the file's `test` split (126k) is D_train + D_valid (10% by a seeded hash),
        # its `dev` split D_test; fixed hash subsamples (the file is sorted by label).
        "yelp_sentences": {"embedded": False, "train": ys, "test": ys, "label_names": CPU_LABELS["yelp_sentences"],
                           "split": {"split_column": "split", "split_values": {"train": "test", "test": "dev"},
                                     "holdout": "hash", "subsample": "hash"}},
        # Yelp polarity reviews: dev_polarity = D_train (last 10% = D_valid, the paper's split), test_polarity = D_test.
        "yelp_polarity": {"embedded": False, "train": os.path.join(data, "yelp", "dev_polarity.csv"),
                          "test": os.path.join(data, "yelp", "test_polarity.csv"),
                          "label_names": CPU_LABELS["yelp_polarity"], "split": {"subsample": "hash"}},
        # SST-2: its own train / dev / test files, `<label> <sentence>` lines.
        "sst2": {"embedded": False, "train": os.path.join(sst, "stsa.binary.train"),
                 "valid": os.path.join(sst, "stsa.binary.dev"), "test": os.path.join(sst, "stsa.binary.test"),
                 "format": "label_text", "label_names": CPU_LABELS["sst2"], "split": {"subsample": "hash"}},
        # AG News: the official test.csv (7,600) cut 70/10/20 by a seeded hash of the row id.
        "ag_news": {"embedded": False, "train": os.path.join(data, "ag_news", "test.csv"),
                    "label_names": CPU_LABELS["ag_news"],
                    "split": {"holdout": "hash", "valid_fraction": 0.1, "test_fraction": 0.2, "subsample": "hash"}},
    }


def _cpu_eval(max_len: int, quick: bool) -> dict[str, Any]:
    sweep = {"learning_rates": [0.001, 0.003, 0.01, 0.03], "weight_decays": [0.0001, 0.01], "clip_norms": [1.0],
             "repeats": 1, "train": {"max_epochs": 3}}
    if quick:
        sweep = {"learning_rates": [0.003, 0.01], "weight_decays": [0.0001], "clip_norms": [1.0], "repeats": 1,
                 "train": {"max_epochs": 2}}
    return {"classifiers": ["wordcnn"], "options": {
        "mauve_seeds": [0],
        "wordcnn": {"vocab_words": 10000 if not quick else 3000, "embed_dim": 64 if not quick else 32,
                    "filters": 64 if not quick else 32, "hidden": 64 if not quick else 32, "max_len": max_len},
        # The same grid for every classifier: synthetic-data WordCNN (selected on synthetic valid),
        # real-data WordCNN and DP-on-real (selected on real valid: a declared side channel).
        "sweep": sweep,
        "backbone_sweep": {"learning_rates": [0.001, 0.003], "weight_decays": [0.0001], "clip_norms": [1.0],
                           "repeats": 1, "train": {"max_epochs": 2}},
        "backbone_max_len": max_len,
        "dp_expected_batch_size": 512 if not quick else 64,
        "dp_epochs": 3.0 if not quick else 1.0,  # as many passes as the generator's DP tuning
    }}


# Per-scale sizes of the cpu study. `tokens` = max_tokens of DP tuning and generation (every
# example is padded to it, so it sets the DP cost); `batch`/`epochs`: expected Poisson batch and
# passes over D_train (large batches amortise the noise).
CPU_SCALES: dict[str, dict[str, Any]] = {
    "cpu": {
        "tokenizer": {"vocab_size": 8192, "max_sentences": 300000},
        "pretrain": {"preset": "cpu", "steps": 2700, "seq_len": 128, "batch_size": 32, "learning_rate": 0.003,
                     "options": {"warmup_steps": 100, "valid_fraction": 0.01, "valid_unit": "document",
                                 "valid_groups": ["hotels/", "cars/", "enwiki:"], "eval_every": 500, "eval_batches": 16,
                                 "checkpoint_every": 250, "log_every": 50}},
        "sets": {
            "yelp_sentences": {"max_train": 5000, "max_valid": 500, "max_test": 2000, "tokens": 32, "batch": 512, "epochs": 3},
            "yelp_polarity": {"max_train": None, "max_valid": None, "max_test": 2000, "tokens": 96, "batch": 512, "epochs": 3},
            "sst2": {"max_train": None, "max_valid": None, "max_test": None, "tokens": 48, "batch": 512, "epochs": 3},
            "ag_news": {"max_train": None, "max_valid": None, "max_test": None, "tokens": 64, "batch": 512, "epochs": 3},
        },
        # One learning rate per mode, chosen a priori (no time for a DP lr sweep on 2 cores):
        # LoRA and the soft prompt take larger steps than full fine-tuning.
        "mode_lr": {"lora": 0.02, "prompt": 0.1, "full": 0.005},
        "modes": ["lora", "prompt", "full"],
        "epsilons": [1, 3, 10, "inf"],
        "generate_batch": 64,
    },
    "quick": {
        "tokenizer": {"vocab_size": 2000, "max_sentences": 20000},
        "public_max_documents": 3000,
        "pretrain": {"preset": "cpu", "steps": 30, "seq_len": 64, "batch_size": 8, "learning_rate": 0.003,
                     "options": {"model_overrides": {"d_model": 64, "num_layers": 2, "num_heads": 2, "d_ff": 128},
                                 "valid_fraction": 0.05, "valid_unit": "document", "valid_groups": ["hotels/", "enwiki:"],
                                 "eval_every": 15, "eval_batches": 2, "checkpoint_every": 15, "log_every": 10}},
        "sets": {
            "yelp_sentences": {"max_train": 300, "max_valid": 60, "max_test": 200, "tokens": 24, "batch": 100, "epochs": 1},
            "yelp_polarity": {"max_train": 200, "max_valid": 50, "max_test": 100, "tokens": 32, "batch": 100, "epochs": 1},
            "sst2": {"max_train": 200, "max_valid": 50, "max_test": 100, "tokens": 24, "batch": 100, "epochs": 1},
            "ag_news": {"max_train": 200, "max_valid": 50, "max_test": 100, "tokens": 32, "batch": 100, "epochs": 1},
        },
        "mode_lr": {"lora": 0.02, "prompt": 0.1, "full": 0.005},
        "modes": ["lora", "prompt"],
        "epsilons": [3, "inf"],
        "generate_batch": 32,
    },
}
CPU_EXPERIMENTS = ("main", "yelp_polarity", "sst2", "ag_news", "yelp_polarity_prior", "yelp_polarity_inf",
                   "yelp_polarity_inf_uniform", "yelp_polarity_filter", "post", "filter", "x3", "full_lm", "yelp_polarity_long",
                   "yelp_polarity_long1024", "bandmf",
                   "dpsgd_many", "bandmf_many")
# Levers on Yelp polarity (where LoRA at epsilon 3 with the main recipe fell below the majority rate):
# sigma of the DP label histogram (on 4,036 counts sigma 10 moves each count by ~10; composed into the
# privacy report), and the longer DP run's batch / passes: B 512, 10 epochs = 79 steps at sigma 1.70
# vs 24 steps at sigma 1.20 for 3 epochs (the epsilon-inf run of the 3-epoch recipe stayed at the
# majority rate, so the recipe needs more steps, not less noise); B 1024, 10 epochs = 39 steps at 2.26.
# At lr 0.02 the 79-step run's batch loss rose (4.72 at step 1, 4.82 at step 45: Adam's steps follow the
# noise), so the long run takes lr 0.005 (about the same total movement, 79 x 0.005 vs 24 x 0.02).
CPU_LABEL_SIGMA = 10.0
CPU_LONG = {"batch_size": 512, "epochs": 10, "learning_rates": [0.005]}
# The label-consistency lever (`off_label`, dpsynth.generate.postprocess): keep a sample only when
# the DP model finds it likelier under its own label prompt than under the other labels' (free:
# post-processing); 3x drawn, as about half survive when the conditioning is weak.
CPU_FILTER = {"options": {"postprocess": {"drop": ["empty", "off_label"], "oversample": 3.0}}}
# BandMF's bands in the `bandmf` experiment: with ~27 steps, more bands cost more than they save
# (`bench/bandmf_noise.py --dataset-size 4500 --batch-size 512 --steps 27`: prefix-sum noise vs
# DP-SGD 1.04 / 1.08 / 1.15 at epsilon 1 and 0.95 / 0.95 / 0.97 at epsilon 3 for b = 2 / 3 / 4).
CPU_BANDMF_BANDS = 2
# The many-step pair (issue 16: "enough steps for correlation to matter"): expected batch 64, 3 epochs
# of the 5,000 Yelp-sentence training examples = 235 steps, where 4 bands cut the prefix-sum noise
# to 0.695x (epsilon 3) and 0.833x (epsilon 1) of DP-SGD's (`bench/bandmf_noise.py --dataset-size 5000
# --batch-size 64 --steps 235 --bands 4 --epsilon 3`; at N 4,500 / 211 steps, b = 2 / 4 / 8 gave
# 0.82 / 0.70 / 0.65 at epsilon 3 and 0.89 / 0.85 / 0.87 at epsilon 1).
CPU_MANY = {"batch_size": 64, "epochs": 3, "bands": 4}


def cpu_experiments(scale: str, data: str, *, pretrain_steps: int | None = None, backbone: bool = False
                    ) -> dict[str, dict[str, Any]]:
    """name -> experiment config of the cpu study (one cache root: one public corpus, tokenizer,
    dedup (against all four sensitive sets at once: `dedup.also_against`) and pretraining)."""
    s = copy.deepcopy(CPU_SCALES[scale])
    quick = scale == "quick"
    datasets = cpu_datasets(data)
    sections = {}
    for name, sizes in s["sets"].items():
        sec = dict(datasets[name])
        sec.update({k: sizes[k] for k in ("max_train", "max_valid", "max_test") if sizes[k] is not None})
        sections[name] = sec
    pretrain = s["pretrain"]
    if pretrain_steps:
        pretrain["steps"] = int(pretrain_steps)
    public = {"embedded": False, "paths": [os.path.join(data, "public", "opinrank", "opinrank-*.jsonl.gz"),
                                           os.path.join(data, "public", "enwiki", "enwiki-*.jsonl.gz")]}
    if s.get("public_max_documents"):
        public["max_documents"] = s["public_max_documents"]

    def experiment(name: str, dataset: str, modes: list[str], epsilons: list, gen: dict | None = None,
                   baselines: bool = True, classifiers: list[str] | None = None, dp: dict | None = None,
                   eval_options: dict | None = None) -> dict[str, Any]:
        sizes = s["sets"][dataset]
        ev = _cpu_eval(max(32, sizes["tokens"]), quick)
        ev["options"].update(eval_options or {})
        if classifiers:
            ev["classifiers"] = classifiers
        generate = {"max_tokens": sizes["tokens"], "batch_size": s["generate_batch"], "multiples": [1]}
        generate.update(gen or {})
        return {
            "name": f"paper-{scale}-{name}", "seed": 0, "public": public, "sensitive": sections[dataset],
            "tokenizer": s["tokenizer"], "dedup": {"min_tokens": 50, "also_against": sections},
            "pretrain": pretrain,
            "dp_tune": {"modes": modes, "epsilons": epsilons, "learning_rates": [s["mode_lr"]["lora"]],
                        "mode_learning_rates": {m: [s["mode_lr"][m]] for m in modes if m != "lora"},
                        "clip_norms": [1.0], "batch_size": sizes["batch"], "epochs": sizes["epochs"],
                        "max_tokens": sizes["tokens"], **(dp or {})},
            "generate": generate,
            "evaluate": {**ev, "baselines": baselines},
        }

    main_cls = ["wordcnn", "backbone"] if backbone else None
    # 16 more tokens of room than DP tuning saw, so that fewer samples are cut before their EOS
    # (the smoke run cut most of its samples at max_tokens; dropped ones are counted, and kept < N
    # shows in the generation report).
    prior = {"label_distribution": "dp_histogram", "label_noise_multiplier": CPU_LABEL_SIGMA}
    post = {"max_tokens": s["sets"]["yelp_sentences"]["tokens"] + 16,
            "options": {"postprocess": {"drop": ["empty", "truncated", "duplicate"], "oversample": 1.5}}}
    return {
        # The main grid on Yelp sentences (the large-N regime): every mode at every epsilon.
        "main": experiment("main", "yelp_sentences", s["modes"], s["epsilons"], classifiers=main_cls),
        # LoRA at epsilon 3 on each other sensitive set, with its own real-data and DP-on-real peers.
        "yelp_polarity": experiment("yelp_polarity", "yelp_polarity", ["lora"], [3]),
        "sst2": experiment("sst2", "sst2", ["lora"], [3]),
        "ag_news": experiment("ag_news", "ag_news", ["lora"], [3]),
        # Levers on Yelp polarity, LoRA at epsilon 3: (1) the label distribution as a DP histogram
        # instead of uniform (the real data is 73% positive; reuses yelp_polarity's DP model);
        # (2) the non-private upper bound (epsilon inf) of the same recipe; (3) a longer DP run,
        # with DP-on-real given the same number of passes (a fair peer).
        "yelp_polarity_prior": experiment("yelp_polarity_prior", "yelp_polarity", ["lora"], [3], prior, baselines=False),
        "yelp_polarity_inf": experiment("yelp_polarity_inf", "yelp_polarity", ["lora"], ["inf"], prior, baselines=False),
        "yelp_polarity_inf_uniform": experiment("yelp_polarity_inf_uniform", "yelp_polarity", ["lora"], ["inf"],
                                                baselines=False),
        "yelp_polarity_filter": experiment("yelp_polarity_filter", "yelp_polarity", ["lora"], [3],
                                           {**prior, **copy.deepcopy(CPU_FILTER)}, baselines=False),
        "yelp_polarity_long": experiment("yelp_polarity_long", "yelp_polarity", ["lora"], [3], prior,
                                         dp=dict(CPU_LONG), eval_options={"dp_epochs": float(CPU_LONG["epochs"]),
                                                                          "dp_expected_batch_size": CPU_LONG["batch_size"]}),
        "yelp_polarity_long1024": experiment("yelp_polarity_long1024", "yelp_polarity", ["lora"], [3], prior,
                                             dp={"batch_size": 1024, "epochs": CPU_LONG["epochs"]}, baselines=False),
        # Levers on the main set that reuse main's LoRA epsilon-3 model (only generation + evaluation run):
        # post-processing (drop empty / truncated / duplicate samples, no privacy cost) and 3x data.
        "post": experiment("post", "yelp_sentences", ["lora"], [3], post, baselines=False),
        "x3": experiment("x3", "yelp_sentences", ["lora"], [3], {"multiples": [3]}, baselines=False),
        "filter": experiment("filter", "yelp_sentences", ["lora"], [3], copy.deepcopy(CPU_FILTER), baselines=False),
        # The paper's Prefix-LM loss (main) against the full-LM loss: one more DP run.
        "full_lm": experiment("full_lm", "yelp_sentences", ["lora"], [3], baselines=False, dp={"loss": "full"}),
        # DP-SGD (main) against BandMF correlated noise at the same epsilon (issue 16): two more DP runs.
        "bandmf": experiment("bandmf", "yelp_sentences", ["lora"], [1, 3], baselines=False,
                             dp={"mechanism": "bandmf", "bands": CPU_BANDMF_BANDS}),
        # The same comparison where correlation matters: 211 steps at expected batch 64, both mechanisms.
        "dpsgd_many": experiment("dpsgd_many", "yelp_sentences", ["lora"], [1, 3], baselines=False,
                                 dp={"batch_size": CPU_MANY["batch_size"], "epochs": CPU_MANY["epochs"]}),
        "bandmf_many": experiment("bandmf_many", "yelp_sentences", ["lora"], [1, 3], baselines=False,
                                  dp={"batch_size": CPU_MANY["batch_size"], "epochs": CPU_MANY["epochs"],
                                      "mechanism": "bandmf", "bands": CPU_MANY["bands"]}),
    }


def _majority(labels: list[str]) -> tuple[str, float]:
    counts = {l: labels.count(l) for l in set(labels)}
    top = max(sorted(counts), key=counts.get)
    return top, counts[top] / max(len(labels), 1)


def render_cpu_targets(results: dict[str, dict[str, Any]]) -> list[str]:
    """The issue's target comparison at epsilon 3, one row per dataset (WordCNN)."""
    md = ["## 0. Targets at epsilon 3 (WordCNN, real test set)", "",
          "| dataset | synthetic (LoRA) | DP-on-real | real data | majority class | synthetic - majority | beats DP-on-real |",
          "|---|---|---|---|---|---|---|"]
    for name, dataset in (("main", "Yelp sentences"), ("yelp_polarity", "Yelp polarity"), ("sst2", "SST-2"),
                          ("ag_news", "AG News")):
        res = results.get(name)
        if not res:
            md.append(f"| {dataset} | not run | | | | | |")
            continue
        row = next((r for r in res["rows"] if r["mode"] == "lora" and r["epsilon"] == 3), {})
        syn = row.get("wordcnn_accuracy")
        bl = res["metrics"].get("baselines", [])
        dp = next((float(b["accuracy"]) for b in bl if b.get("baseline") == "dp_on_real" and b.get("classifier") == "wordcnn"
                   and _eps(b.get("epsilon")) == 3), None)
        real = next((float(b["accuracy"]) for b in bl if b.get("baseline") == "real" and b.get("classifier") == "wordcnn"), None)
        _, maj = _majority(res.get("test_labels") or [])
        syn = None if syn is None else float(syn)
        md.append(f"| {dataset} | {_f(syn)} | {_f(dp)} | {_f(real)} | {maj:.3f} | "
                  + (f"{100 * (syn - maj):+.1f} points" if syn is not None else "-") + " | "
                  + ("-" if syn is None or dp is None else ("yes" if syn > dp else "NO")) + " |")
    md += ["", "Targets (issue 12): synthetic beats DP-on-real and the majority rate by >= 10 points on Yelp polarity"
           " and Yelp sentences; moonshot: within 5 points of the real-data WordCNN on Yelp sentences.", ""]
    md += render_polarity_levers(results)
    for name, extra in (("post", "post-processed (empty/truncated/duplicate dropped, 1.5x drawn)"), ("x3", "3x synthetic data"),
                        ("filter", "off-label samples dropped (3x drawn)")):
        res = results.get(name)
        if res:
            row = next((r for r in res["rows"] if r["mode"] == "lora"), {})
            md.append(f"- Lever, LoRA eps 3 on Yelp sentences, {extra}: WordCNN {_f(row.get('wordcnn_accuracy'))}, "
                      f"MAUVE {_f(row.get('mauve'))}")
    return md + [""]


def _baseline(res: dict[str, Any], kind: str, epsilon: float | None = None) -> float | None:
    return next((float(b["accuracy"]) for b in res["metrics"].get("baselines", [])
                 if b.get("baseline") == kind and b.get("classifier") == "wordcnn"
                 and (epsilon is None or _eps(b.get("epsilon")) == epsilon)), None)


def render_polarity_levers(results: dict[str, dict[str, Any]]) -> list[str]:
    """The Yelp polarity levers (LoRA, WordCNN on the real test set), one row per experiment."""
    rows = [("yelp_polarity", "main recipe (B 512, 3 epochs), uniform labels", "yelp_polarity"),
            ("yelp_polarity_prior", f"main recipe, DP label histogram (sigma {CPU_LABEL_SIGMA:g})", "yelp_polarity"),
            ("yelp_polarity_long", f"B {CPU_LONG['batch_size']}, {CPU_LONG['epochs']} epochs, lr "
                                   f"{CPU_LONG['learning_rates'][0]:g}, DP label histogram "
                                   "(DP-on-real given the same batch and passes)", "yelp_polarity_long"),
            ("yelp_polarity_long1024", f"B 1024, {CPU_LONG['epochs']} epochs, DP label histogram", "yelp_polarity_long"),
            ("yelp_polarity_filter", "main recipe, DP label histogram, off-label samples dropped (3x drawn)",
             "yelp_polarity"),
            ("yelp_polarity_inf", "main recipe at epsilon inf (non-private upper bound), DP label histogram", None),
            ("yelp_polarity_inf_uniform", "main recipe at epsilon inf, uniform labels", None)]
    if not any(results.get(name) for name, _, _ in rows[1:]):
        return []
    md = ["", "### Levers on Yelp polarity (LoRA; WordCNN on the real test set)", "",
          "| experiment | DP steps | epsilon of the corpus (RDP, model + label histogram) | synthetic | MAUVE | DP-on-real | majority |",
          "|---|---|---|---|---|---|---|"]
    for name, what, peer in rows:
        res = results.get(name)
        if not res:
            md.append(f"| {what} | not run | | | | | |")
            continue
        row = next((r for r in res["rows"] if r["mode"] == "lora"), {})
        eps = row.get("epsilon")
        peer_res = results.get(peer) if peer else None
        dp = _baseline(peer_res, "dp_on_real", 3) if peer_res else None
        _, maj = _majority(res.get("test_labels") or [])
        md.append(f"| {what} | {_f(row.get('steps'), 0)} | "
                  f"{'inf' if eps == math.inf else _f(row.get('reported_epsilon'))} | "
                  f"{_f(None if row.get('wordcnn_accuracy') is None else float(row['wordcnn_accuracy']))} | "
                  f"{_f(row.get('mauve'))} | {_f(dp)} | {maj:.3f} |")
    return md + [""]


def dataset_config(data: str) -> dict[str, Any]:
    """The `sensitive:` section: Yelp polarity from ../shared/data/yelp."""
    return {"embedded": False, "train": os.path.join(data, "yelp", "dev_polarity.csv"),
            "test": os.path.join(data, "yelp", "test_polarity.csv"), "label_column": "label",
            "label_names": {0: "negative", 1: "positive"}}


def experiments(scale: str, data: str) -> dict[str, dict[str, Any]]:
    """name -> experiment config dict (all share one root, so shared stages run once)."""
    s = copy.deepcopy(SCALES[scale])
    sensitive = {**dataset_config(data), **{k: v for k, v in s["sensitive"].items() if v is not None}}
    base = {
        "seed": 0,
        "public": {"embedded": True, "paths": [os.path.join(data, "public", "kjv")]},
        "sensitive": sensitive,
        "tokenizer": s["tokenizer"],
        "dedup": {"min_tokens": 50},
        "pretrain": s["pretrain"],
        "dp_tune": {**s["dp_tune"]},
        "generate": {**s["generate"], "multiples": [1]},
        "evaluate": s["evaluate"],
    }

    def variant(name: str, dp: dict, gen: dict | None = None, baselines: bool = True) -> dict:
        cfg = copy.deepcopy(base)
        cfg["name"] = f"paper-{scale}-{name}"
        cfg["dp_tune"].update(dp)
        cfg["dp_tune"]["mode_learning_rates"] = {m: lr for m, lr in cfg["dp_tune"].get("mode_learning_rates", {}).items()
                                                 if m in cfg["dp_tune"]["modes"]}
        cfg["generate"].update(gen or {})
        cfg["evaluate"] = {**cfg["evaluate"], "baselines": baselines}
        return cfg

    return {
        "main": variant("main", {"modes": s["modes"], "epsilons": s["epsilons"]}),
        "full_lm": variant("full_lm", {"modes": ["lora"], "epsilons": [3], "loss": "full"}, baselines=False),
        "x3": variant("x3", {"modes": ["lora"], "epsilons": [3]}, {"multiples": [3]}, baselines=False),
        "prior": variant("prior", {"modes": ["lora"], "epsilons": [3]},
                         {"label_distribution": "dp_histogram", "label_noise_multiplier": 10.0}, baselines=False),
        "prompt_lr": variant("prompt_lr", {"modes": ["prompt"], "epsilons": [3],
                                           "mode_learning_rates": {"prompt": [10 * s["dp_tune"].get("mode_learning_rates", {}).get(
                                               "prompt", s["dp_tune"]["learning_rates"])[0]]}}, baselines=False),
    }


# ----------------------------------------------------------------------------- tables


def _f(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, (int, float)):
        return "inf" if v == math.inf else f"{v:.{digits}f}"
    return str(v)


def _eps(v: Any) -> float:
    if v in ("inf", None):
        return math.inf
    return float(v)


def load_metrics(report_dir: str) -> dict[str, Any]:
    with open(os.path.join(report_dir, "metrics.json"), encoding="utf-8") as f:
        return json.load(f)


def _privacy_report(generate_dir: str) -> dict[str, Any]:
    path = os.path.join(generate_dir, "privacy_report.json")
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _reported_epsilon(generate_dir: str) -> float | None:
    """The epsilon (RDP accountant) of a synthetic corpus's own privacy report."""
    eps = _privacy_report(generate_dir).get("epsilon")
    return float(eps["rdp"]) if isinstance(eps, dict) and eps.get("rdp") is not None else None


def _dp_steps(generate_dir: str) -> int | None:
    """The DP training steps of a synthetic corpus's model, from its privacy report."""
    steps = (_privacy_report(generate_dir).get("training") or {}).get("steps")
    return None if steps is None else int(steps)


def _rows_by_trial(metrics: dict[str, Any], trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_name = {r["corpus"]: r for r in metrics.get("corpora", [])}
    out = []
    for t in trials:
        row = dict(by_name.get(t["id"], {"status": "missing"}))
        row.update(trial=t["id"], mode=t["mode"], epsilon=_eps(t["epsilon"]), multiple=t["multiple"],
                   learning_rate=t["learning_rate"],
                   reported_epsilon=t.get("reported_epsilon"), steps=t.get("steps"))
        out.append(row)
    return out


def _labels(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["label"] for line in f if line.strip()]


def _spearman(a: list[float], b: list[float]) -> float | None:
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None and not math.isnan(x) and not math.isnan(y)]
    if len(pairs) < 3:
        return None
    from scipy.stats import spearmanr

    return float(spearmanr([p[0] for p in pairs], [p[1] for p in pairs]).statistic)


def render(results: dict[str, dict[str, Any]], classifiers: list[str], scale: str, command: str) -> tuple[str, list[str]]:
    """The Markdown results and the printed ratio lines."""
    main = results["main"]
    rows, baselines = main["rows"], main["metrics"].get("baselines", [])
    md = [f"# Reproduction at the {scale} scale", "", f"Command: `{command}`", ""]
    if scale in ("quick", "small-quick"):
        md += ["**Smoke scale**: tiny model, a few steps, a few hundred examples. These numbers only show that",
               "every stage and table works end to end; they say nothing about the paper's claims.", ""]
    ratios: list[str] = []
    labels = main.get("test_labels") or []
    if labels:
        counts = {l: labels.count(l) for l in sorted(set(labels))}
        top = max(counts, key=counts.get)
        md += [f"Real test set: {len(labels)} examples, " + ", ".join(f"{l} {c}" for l, c in counts.items())
               + f". Always answering '{top}' scores **{counts[top] / len(labels):.3f}** (the majority-class rate). The"
               " main grid's synthetic data is generated with uniform labels (no privacy cost), so its classifiers do not inherit"
               " the real class prior, while the real-data and DP-on-real classifiers do (the lever tables say which"
               " runs draw their labels from a DP histogram instead).", ""]

    def acc(row, k):
        v = row.get(f"{k}_accuracy")
        return None if v is None else float(v)

    def base(kind, which, eps):
        for b in baselines:
            if b.get("baseline") == which and b.get("classifier") == kind and _eps(b.get("epsilon")) == eps:
                return float(b["accuracy"])
        return None

    # 1. Accuracy per mode and epsilon, beside real data and DP-on-real.
    epsilons = sorted({r["epsilon"] for r in rows})
    modes = sorted({r["mode"] for r in rows}, key=["lora", "prompt", "full"].index)
    md += ["## 1. Downstream accuracy on the real test set", ""]
    for k in classifiers:
        md += [f"**{k}**", "", "| data | " + " | ".join(f"eps={_f(e, 0)}" for e in epsilons) + " |",
               "|---|" + "---|" * len(epsilons)]
        for m in modes:
            cells = []
            for e in epsilons:
                r = next((r for r in rows if r["mode"] == m and r["epsilon"] == e), None)
                cells.append(_f(acc(r, k)) if r else "-")
            md.append(f"| synthetic, {m} | " + " | ".join(cells) + " |")
        md.append("| DP-on-real | " + " | ".join(_f(base(k, "dp_on_real", e)) if e != math.inf else "-" for e in epsilons) + " |")
        md.append("| real data | " + " | ".join(_f(base(k, "real", math.inf)) if e == math.inf else "-" for e in epsilons) + " |")
        md.append("")
        for e in epsilons:
            dp = base(k, "dp_on_real", e) if e != math.inf else base(k, "real", math.inf)
            for m in modes:
                r = next((r for r in rows if r["mode"] == m and r["epsilon"] == e), None)
                a = acc(r, k) if r else None
                if a is not None and dp:
                    peer = "DP-on-real" if e != math.inf else "real data"
                    ratios.append(f"{k} eps={_f(e, 0)} {m}: synthetic {a:.3f} vs {peer} {dp:.3f} -> ratio {a / dp:.3f}")

    # 2. Prefix-LM vs full-LM; 3. 1x vs 3x.
    def lora3(rs, multiple=1):
        return next((r for r in rs if r["mode"] == "lora" and r["epsilon"] == 3 and float(r["multiple"]) == multiple), None)

    md += ["## 2. Prefix-LM against full-LM loss (LoRA, epsilon 3)", "", "| loss | " + " | ".join(f"{k} acc" for k in classifiers) + " | MAUVE | " + VALID_LOSS_COLUMN + " |", "|---|" + "---|" * (len(classifiers) + 2)]
    for label, res in (("Prefix-LM", main), ("full-LM", results.get("full_lm"))):
        r = lora3(res["rows"]) if res else None
        vl = res["valid_loss"].get(r["trial"]) if (res and r) else None
        md.append(f"| {label} | " + " | ".join(_f(acc(r, k)) if r else "-" for k in classifiers) + f" | {_f(r.get('mauve')) if r else '-'} | {_f(vl)} |")
    md += ["", "## 3. 1x against 3x synthetic data (LoRA, epsilon 3)", "", "| size | " + " | ".join(f"{k} acc" for k in classifiers) + " | MAUVE |", "|---|" + "---|" * (len(classifiers) + 1)]
    for label, res, mult in (("1x", main, 1), ("3x", results.get("x3"), 3)):
        r = lora3(res["rows"], mult) if res else None
        md.append(f"| {label} | " + " | ".join(_f(acc(r, k)) if r else "-" for k in classifiers) + f" | {_f(r.get('mauve')) if r else '-'} |")

    if scale in CPU_SCALES:
        md += ["", "## 3a. DP-SGD against BandMF at the same epsilon, LoRA on Yelp sentences", "",
               "| epsilon | mechanism | " + " | ".join(f"{k} acc" for k in classifiers) + " | MAUVE | " + VALID_LOSS_COLUMN + " |",
               "|---|---|" + "---|" * (len(classifiers) + 2)]
        md[-2] = md[-2].replace("| epsilon |", "| epsilon | DP steps |")
        md[-1] = md[-1] + "---|"
        pairs = ((f"DP-SGD, B {512}", main), (f"BandMF b={CPU_BANDMF_BANDS}, B 512", results.get("bandmf")),
                 (f"DP-SGD, B {CPU_MANY['batch_size']}", results.get("dpsgd_many")),
                 (f"BandMF b={CPU_MANY['bands']}, B {CPU_MANY['batch_size']}", results.get("bandmf_many")))
        for e in (1.0, 3.0):
            for label, res in pairs:
                r = next((r for r in res["rows"] if r["mode"] == "lora" and r["epsilon"] == e
                          and float(r["multiple"]) == 1), None) if res else None
                md.append(f"| {_f(e, 0)} | {_f(r.get('steps'), 0) if r else '-'} | {label} | "
                          + " | ".join(_f(acc(r, k)) if r else "-" for k in classifiers)
                          + f" | {_f(r.get('mauve')) if r else '-'} | {_f(res['valid_loss'].get(r['trial'])) if r else '-'} |")
        md += ["", VALID_LOSS_NOTE]

    small_only = scale not in CPU_SCALES  # the cpu study runs neither the label-histogram nor the prompt-lr variant
    if small_only:
        md += ["", "## 3b. Uniform labels against a DP label histogram (LoRA, epsilon 3 for the tuning)", "",
               "| labels | " + " | ".join(f"{k} acc" for k in classifiers) + " | MAUVE | epsilon of the corpus (RDP) |",
               "|---|" + "---|" * (len(classifiers) + 2)]
        for label, res in (("uniform", main), ("DP histogram (sigma 10)", results.get("prior"))):
            r = lora3(res["rows"]) if res else None
            md.append(f"| {label} | " + " | ".join(_f(acc(r, k)) if r else "-" for k in classifiers)
                      + f" | {_f(r.get('mauve')) if r else '-'} | {_f(r.get('reported_epsilon')) if r else '-'} |")

        md += ["", "## 3c. Prompt-tuning learning rate (epsilon 3)", "",
               "| learning rate | " + " | ".join(f"{k} acc" for k in classifiers) + " | MAUVE | " + VALID_LOSS_COLUMN + " |",
               "|---|" + "---|" * (len(classifiers) + 2)]
        for res in (main, results.get("prompt_lr")):
            r = next((r for r in res["rows"] if r["mode"] == "prompt" and r["epsilon"] == 3), None) if res else None
            if r is None:
                md.append("| - | " + " | ".join("-" for _ in classifiers) + " | - | - |")
                continue
            md.append(f"| {r['learning_rate']:g} | " + " | ".join(_f(acc(r, k)) for k in classifiers)
                      + f" | {_f(r.get('mauve'))} | {_f(res['valid_loss'].get(r['trial']))} |")

    # 4. Ranking correlation.
    md += ["", "## 4. Hyperparameter-ranking correlation (synthetic valid -> real test)", "",
           "| trial | classifier | Spearman | Kendall | RBO | upper bound Spearman (real valid) |", "|---|---|---|---|---|---|"]
    for r in rows:
        if r["epsilon"] not in (1.0, 3.0):
            continue
        for k in classifiers:
            md.append(f"| {r['trial']} | {k} | {_f(r.get(f'{k}_rank_spearman'))} | {_f(r.get(f'{k}_rank_kendall'))} | "
                      f"{_f(r.get(f'{k}_rank_rbo'))} | {_f(r.get(f'{k}_rank_upper_spearman'))} |")

    # 5. Proxy metrics and whether they rank runs as accuracy does.
    proxies = ["mauve", "mauve_star", "unigram_mauve", "bigram_mauve", "length_mauve", "perplexity"]
    md += ["", "## 5. Proxy metrics", "", "| trial | " + " | ".join(proxies) + " |", "|---|" + "---|" * len(proxies)]
    for r in rows:
        md.append(f"| {r['trial']} | " + " | ".join(_f(r.get(p)) for p in proxies) + " |")
    md += ["", "Spearman correlation of each proxy with accuracy across the runs (higher = ranks runs as accuracy does;"
           " for perplexity lower is better, so a good proxy correlates negatively):", ""]
    for k in classifiers:
        accs = [acc(r, k) for r in rows]
        cells = [f"{p} {_f(_spearman([r.get(p) for r in rows], accs))}" for p in proxies]
        md.append(f"- {k}: " + ", ".join(cells))

    # Directions.
    md += ["", "## Does the small scale reproduce the paper's direction?", ""]
    for k in classifiers:
        for e in epsilons:
            if e == math.inf:
                continue
            by_mode = {m: acc(next((r for r in rows if r["mode"] == m and r["epsilon"] == e), {}), k) for m in modes}
            if all(by_mode.get(m) is not None for m in ("lora", "prompt", "full")):
                holds = by_mode["lora"] >= by_mode["prompt"] > by_mode["full"]
                md.append(f"- {k}, eps={_f(e, 0)}: LoRA >= prompt > full under DP: {'yes' if holds else 'NO'} "
                          f"({', '.join(f'{m} {_f(v)}' for m, v in by_mode.items())})")
            dp = base(k, "dp_on_real", e)
            best = max((v for v in by_mode.values() if v is not None), default=None)
            if k == "wordcnn" and dp is not None and best is not None:
                md.append(f"- wordcnn, eps={_f(e, 0)}: best synthetic {best:.3f} vs DP-on-real {dp:.3f}: "
                          f"synthetic beats DP-on-real: {'yes' if best > dp else 'NO'}")
    if scale in ("quick", "small-quick"):
        md += ["", "(smoke scale: a 'yes' or 'NO' here is not evidence either way)"]
    return "\n".join(md) + "\n", ratios


def run(args) -> int:
    from dpsynth.experiment.config import from_dict
    from dpsynth.experiment.runner import report_result, run_experiment

    if not os.path.isdir(args.data):
        print(f"paper: {args.data} not found (the real datasets of ../shared/data are needed)", file=sys.stderr)
        return 2
    scale = "quick" if args.quick else args.scale
    if scale in CPU_SCALES:
        configs = cpu_experiments(scale, args.data, pretrain_steps=args.pretrain_steps, backbone=args.backbone)
    else:
        configs = experiments(scale, args.data)
    root = args.root or os.path.join("runs", f"paper-{scale}")
    results: dict[str, dict[str, Any]] = {}
    stage_times: dict[str, float] = {}  # stage directory -> seconds (shared stages once)
    stage_names: dict[str, str] = {}  # stage directory -> "experiment: stage key"
    t0 = time.monotonic()
    for name, data in configs.items():
        if args.only and name not in args.only:
            continue
        cfg = from_dict(data)
        print(f"\n##### paper: experiment '{name}' ({len(cfg.dp_tune.modes) * len(cfg.dp_tune.epsilons)} DP runs)", flush=True)
        result = run_experiment(cfg, root=root, jobs=args.jobs)
        code = report_result(result)
        if code:
            return code
        trials = [{**t.params(), "reported_epsilon": _reported_epsilon(result.outputs[t.generate].dir),
                   "steps": _dp_steps(result.outputs[t.generate].dir)}
                  for t in result.plan.trials]
        valid_loss = {t.id: _private_valid_loss(result.plan, t.dp_tune) for t in result.plan.trials}
        metrics = load_metrics(result.report_dir)
        for key, o in result.outputs.items():
            if o.dir not in stage_times:
                stage_names[o.dir] = f"{name}: {key}"
            stage_times[o.dir] = o.seconds
        print(f"paper: experiment '{name}' done at {time.monotonic() - t0:.0f}s wall", flush=True)
        results[name] = {"rows": _rows_by_trial(metrics, trials), "metrics": metrics, "valid_loss": valid_loss,
                         "report": os.path.realpath(result.report_dir),
                         "test_labels": _labels(result.outputs["sensitive"].path("data", "test.jsonl"))}
    if "main" not in results:
        print("paper: the tables need the 'main' experiment", file=sys.stderr)
        return 2
    classifiers = list(configs["main"]["evaluate"]["classifiers"])
    command = "python bench/paper.py " + " ".join(sys.argv[1:])
    md, ratios = render(results, classifiers, scale, command)
    if scale in CPU_SCALES:
        head, _, rest = md.partition("## 1.")
        md = head + "\n".join(render_cpu_targets(results)) + "\n## 1." + rest
    stage_seconds = sum(stage_times.values())
    md += "\n## Stage times (as recorded when each stage ran; cached stages keep their first time)\n\n| stage | seconds |\n|---|---|\n"
    md += "".join(f"| {stage_names[d]} | {sec:.0f} |\n" for d, sec in stage_times.items() if sec is not None)
    md += (f"\nWall time of this command: {time.monotonic() - t0:.0f}s on {os.cpu_count()} CPU cores; the stages it used"
           f" recorded {stage_seconds / 60:.0f} stage-minutes when they ran (cached stages keep their original time). Reports: ") + ", ".join(
        f"{n}: {r['report']}" for n, r in results.items()) + "\n"
    out = args.out or os.path.join(root, "results.md")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.write(md)
    print("\n" + md)
    print("ratios against the peers measured in the same run:")
    for line in ratios:
        print("  " + line)
    print(f"results: {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the cpu study at smoke scale (minutes; numbers are meaningless)")
    p.add_argument("--scale", choices=sorted(set(SCALES) | set(CPU_SCALES)), default="cpu",
                   help="scale preset (default cpu, the measured study; small = the earlier Bible/Austen study)")
    p.add_argument("--pretrain-steps", type=int, default=None,
                   help="cpu scale: pretraining steps (default 2700 = about 45 min on 2 quiet cores, docs/paper_cpu.md)")
    p.add_argument("--backbone", action="store_true", help="cpu scale: also the LM-backbone classifier on the main grid")
    p.add_argument("--data", default=DEFAULT_DATA, help="the shared data directory (default ../shared/data)")
    p.add_argument("--root", default=None, help="experiment cache root (default runs/paper-<scale>)")
    p.add_argument("--out", default=None, help="Markdown results file (default ROOT/results.md)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes for independent trials")
    p.add_argument("--only", nargs="+", choices=sorted({"main", "full_lm", "x3", "prior", "prompt_lr"} | set(CPU_EXPERIMENTS)),
                   help="run only these experiments")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
