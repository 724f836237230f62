"""Small-scale reproduction of Kurakin et al. 2023's claims, through the experiment runner.

    .venv/bin/python bench/paper.py --quick                       # the cpu study at smoke size: minutes
    .venv/bin/python bench/paper.py --scale cpu --jobs 1        # the cpu study (docs/paper_cpu.md): ~2.5 h on 2 quiet cores
    .venv/bin/python bench/paper.py --scale small --jobs 2        # the measured study: ~1.5 h on 2 cores
    .venv/bin/python bench/paper.py --scale full --jobs 2         # the `small` LM preset: many hours
    .venv/bin/python bench/paper.py --quick --base-model DIR --probe PROBE_DIR --only gen_sst2 v3_sst2
                                  # an imported generator (`dpsynth import-model`) beside the cpu preset (section 10)

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
import re
import statistics
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


def _valid_label_scores(plan, key: str, valid_path: str, max_tokens: int) -> dict[str, float] | None:
    """How well a DP-tuned model carries the label, read off the model on the real D_valid (NOT DP, see
    NON_DP_FIGURE): the generative classifier argmax_y log p(x | prompt(y)) (balanced accuracy) and the
    mean label margin log p(x | own) - max_other log p(x | other) in nats (`dpsynth.generate.label_scores`),
    each review cut to the tokens the model was tuned on after its prompt."""
    import numpy as np

    from dpsynth import fileio
    from dpsynth.evaluate.scores import classification_scores
    from dpsynth.experiment.plan import stage_dir
    from dpsynth.generate.label_scores import label_margins, record_log_likelihoods
    from dpsynth.generate.sampler import TransformerDecodeModel
    from dpsynth.models.directory import load_model
    from dpsynth.train import prompts

    model_dir = os.path.join(stage_dir(plan.root, plan.node(key)), "model")
    if not os.path.exists(os.path.join(model_dir, "manifest.json")):
        return None
    loaded = load_model(model_dir)
    labels = list(prompts.labels_of(loaded.manifest) or ())
    records = [r for r in fileio.read_jsonl(valid_path) if r["label"] in labels]
    ll, own = record_log_likelihoods(TransformerDecodeModel(loaded.config), loaded.variables, loaded.tokenizer,
                                     prompts.template_of(loaded.manifest), labels, records, max_tokens)
    return {"balanced_accuracy": classification_scores(own, np.argmax(ll, axis=1)).balanced_accuracy,
            "mean_margin": float(np.mean(label_margins(ll, own))), "examples": len(records)}


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
        # DP-on-real as in the first cpu study: DP-Adam, expected batch 512, 3 passes, the 8-point grid
        # composed (every trial accounted) and selected on the real valid split (a declared side channel).
        "dp_expected_batch_size": 512 if not quick else 64,
        "dp_epochs": 3.0 if not quick else 1.0,
    }}


def _cpu_select_options(quick: bool) -> dict[str, Any]:
    """The DP selection's classifier (`dpsynth.evaluate.dp_select.SelectConfig`): a small WordCNN per candidate,
    its hyperparameters chosen on the candidate's synthetic valid split."""
    return {"cnn": "small", "max_epochs": 3 if not quick else 1, "repeats": 1}


# The cpu study, second version (issue 22): ONE recipe for every set, chosen by the software.
#   * DP tuning: `recipe: auto` (dpsynth.train.recipe: expected batch, steps and learning rate from
#     |D_train|, the mode and max_tokens) under one token budget per run, calibrated on the public proxy
#     task (bench/recipe_proxy.py), never on the sensitive sets;
#   * one example length for every set (CPU_MAX_TOKENS tokens, for tuning and generation);
#   * labels drawn from a DP label histogram (sigma CPU_LABEL_SIGMA: the composed epsilon grows by about
#     0.003 at epsilon 3; the report shows the composed figure);
#   * label-guided sampling with weight CPU_GUIDANCE (contrast: the other labels) beside unguided sampling.
# LoRA at epsilon 1, 3, 10, inf on every set; prompt and full tuning on the main set at epsilon 3;
# 3x data and three independent repeats of the main set's epsilon-3 LoRA cells.
CPU_MAX_TOKENS = 64
# (label_contrast 0: the study ran before the contrast became the recipe's choice; lever_contrast and
# v3c_<set> add it through `options`, as they were run.)
CPU_RECIPE = {"recipe": "auto", "token_budget": 1.5e6, "label_contrast": 0}
CPU_GUIDANCE = 1.5
CPU_LABEL_SIGMA = 30.0
CPU_SETS = ("yelp_sentences", "yelp_polarity", "sst2", "ag_news")
CPU_SCALES: dict[str, dict[str, Any]] = {
    "cpu": {
        "tokenizer": {"vocab_size": 8192, "max_sentences": 300000},
        "pretrain": {"preset": "cpu", "steps": 2700, "seq_len": 128, "batch_size": 32, "learning_rate": 0.003,
                     "options": {"warmup_steps": 100, "valid_fraction": 0.01, "valid_unit": "document",
                                 "valid_groups": ["hotels/", "cars/", "enwiki:"], "eval_every": 500, "eval_batches": 16,
                                 "checkpoint_every": 250, "log_every": 50}},
        "sets": {
            "yelp_sentences": {"max_train": 5000, "max_valid": 500, "max_test": 2000},
            "yelp_polarity": {"max_train": None, "max_valid": None, "max_test": 2000},
            "sst2": {"max_train": None, "max_valid": None, "max_test": None},
            "ag_news": {"max_train": None, "max_valid": None, "max_test": None},
        },
        "max_tokens": CPU_MAX_TOKENS, "recipe": CPU_RECIPE, "epsilons": [1, 3, 10, "inf"], "replicates": 3,
        "generate_batch": 64, "label_sigma": CPU_LABEL_SIGMA,
    },
    "quick": {
        "tokenizer": {"vocab_size": 2000, "max_sentences": 20000},
        "public_max_documents": 3000,
        "pretrain": {"preset": "cpu", "steps": 30, "seq_len": 64, "batch_size": 8, "learning_rate": 0.003,
                     "options": {"model_overrides": {"d_model": 64, "num_layers": 2, "num_heads": 2, "d_ff": 128},
                                 "valid_fraction": 0.05, "valid_unit": "document", "valid_groups": ["hotels/", "enwiki:"],
                                 "eval_every": 15, "eval_batches": 2, "checkpoint_every": 15, "log_every": 10}},
        "sets": {name: {"max_train": 200, "max_valid": 50, "max_test": 100} for name in CPU_SETS},
        "max_tokens": 24, "recipe": {"recipe": "auto", "token_budget": 2e4, "label_contrast": 0}, "epsilons": [3, "inf"],
        "replicates": 2,
        "generate_batch": 32, "label_sigma": 3.0,  # ~50 examples per label: sigma 30 could zero a label's weight
    },
}
# Issue 34's levers on long reviews (Yelp polarity, LoRA, epsilon 3, unguided and guided): what makes the
# DP-tuned generator's own samples carry the label. Each changes one setting of the `yelp_polarity` run
# (its DP model is the lever table's base row). Factors scale the scale's own token budget and example
# length (the length also sets the generation and WordCNN length).
CPU_LEVERS: dict[str, dict[str, Any]] = {
    "lever_budget4x": {"token_budget_factor": 4},  # 4x the example-tokens: more DP steps
    "lever_len2x": {"max_tokens_factor": 2},  # examples twice as long (the same token budget: fewer passes)
    "lever_rank16": {"lora_rank": 16},  # LoRA rank 16 on all layers (the paper's 8-32; the default is 8)
    "lever_prompt": {"options": {"template": "A {label} review: "}},  # the label in words the corpus uses
    "lever_pretrain2x": {"pretrain_steps_factor": 2},  # a generator pretrained on 2x the tokens (same size)
    "lever_contrast": {"options": {"label_contrast": 1.0}},  # + the label's Bayes cross-entropy in each example's loss
}


def _dp_section(dp: dict[str, Any]) -> dict[str, Any]:
    """An experiment's `dp_tune` section; a contrast given in `options` (as lever_contrast and v3c_<set>
    were run and hashed) replaces the scale's label_contrast key."""
    if "label_contrast" in dp.get("options", {}):
        dp = {k: v for k, v in dp.items() if k != "label_contrast"}
    return dp


def _lever_pretrain(lever: dict[str, Any], pretrain: dict[str, Any]) -> dict[str, Any]:
    """A lever's `pretrain` section: the scale's, with its steps scaled (a longer-pretrained generator)."""
    if "pretrain_steps_factor" not in lever:
        return pretrain
    return {**pretrain, "steps": int(lever["pretrain_steps_factor"] * pretrain["steps"])}


def _lever_dp(lever: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    """A lever's `dp_tune` overrides at scale `s` (factors applied to the scale's budget and length)."""
    out = {k: v for k, v in lever.items() if not k.endswith("_factor")}
    if "token_budget_factor" in lever:
        out["token_budget"] = lever["token_budget_factor"] * s["recipe"]["token_budget"]
    if "max_tokens_factor" in lever:
        out["max_tokens"] = lever["max_tokens_factor"] * s["max_tokens"]
    return out
# Study v3 (issue 34, item 4): on every set the corpus released is the one chosen with DP on the real
# D_valid (`select:`, exponential mechanism on the count of correct predictions) among candidates of
# the set's epsilon-3 LoRA model: guidance weights x temperatures (x multiples of |D_train| on the main
# set), beside each candidate's own test accuracy; DP-on-real's sweep selected on D_valid by the same
# kind of DP selection (`evaluate.options.dp_select_epsilon`), so the comparison stays fair.
CPU_V3_GUIDANCE = (0.0, 1.5, 3.0, 6.0)
CPU_V3_TEMPERATURES = (1.0, 1.2)
CPU_V3_SETS = {"v3_yelp_sentences": "yelp_sentences", "v3_yelp_polarity": "yelp_polarity", "v3_sst2": "sst2",
               "v3_ag_news": "ag_news"}
CPU_V3_MULTIPLES = {"v3_yelp_sentences": (1, 3)}  # the number of synthetic examples as a candidate axis
# Study v3 with the label-contrast loss (`dp_tune --label-contrast`, docs/dp.md): the same candidates,
# selection and peers, from a DP model tuned with lambda = CPU_LABEL_CONTRAST (its own DP run).
CPU_LABEL_CONTRAST = 1.0
CPU_V3C_SETS = {f"v3c_{name[len('v3_'):]}": dataset for name, dataset in CPU_V3_SETS.items()}
# The study with an imported generator (issue 55; `--base-model DIR`, a directory made by `dpsynth import-model`,
# e.g. Gemma 3 270M): the v3 cells of every set (LoRA at epsilon 3, the corpus DP-selected on the real D_valid
# among the same candidates, DP-on-real selected likewise, real data) from that model and its tokenizer instead of
# the cpu preset pretrained here (experiment `base_model:`: no public corpus, dedup, tokenizer or pretraining of
# ours; its pretraining data was NOT deduplicated against D, so each row stands beside the contamination probe's
# verdict, `--probe`). Each row is tabled beside the cpu preset's v3 row of the same set.
CPU_GEN_SETS = {f"gen_{name[len('v3_'):]}": dataset for name, dataset in CPU_V3_SETS.items()}
# The quick scale's generator cells: sizes a 270M-parameter model DP-tunes, samples and is scored at on 2 CPU
# cores in minutes (64 examples, 32 tokens, 4 DP-SGD steps of expected batch 16 in microbatches of 4: a float32
# 270M model's per-example gradients fit a shared host; two candidates: unguided and guided; MAUVE on hashed
# features instead of the generator's own embedding, one compile less).
CPU_GEN_QUICK = {"sizes": {"max_train": 64, "max_valid": 32, "max_test": 64}, "max_tokens": 32,
                 "dp": {"recipe": "manual", "token_budget": None, "batch_size": 16, "steps": 4, "epochs": None,
                        "learning_rates": [0.003],
                        "options": {"microbatch_size": 4}},
                 "guidance": (0.0, 1.5), "generate_batch": 16, "embedder": "hashing"}
# The selection's epsilon. Where D_valid is split from D independently of the data (a hash, own files)
# it composes in parallel with the tuning: the release stays at the tuning's epsilon 3. Yelp polarity's
# D_valid is its last 10% (the paper's positional split): the selection composes sequentially there, at
# twice its epsilon, so the tuning reserves it (`TuneConfig.reserve_selection_epsilon`, set by the
# experiment runner: sigma 1.142 instead of 1.099 at 0.3) and the release stays at epsilon 3 (a hash split
# would change the dedup, hence the pretraining, of this cache).
CPU_V3_SELECT_EPSILON = {"default": 1.0, "yelp_polarity": 0.3}
CPU_EXPERIMENTS = ("main", "main_modes", "main_x3", "main_repeats", "yelp_polarity", "sst2", "ag_news",
                   "guidance_look", "null_contrast", *CPU_LEVERS, *CPU_V3_SETS, *CPU_V3C_SETS, *CPU_GEN_SETS)
CPU_DATASET_OF = {"main": "yelp_sentences", "main_modes": "yelp_sentences", "main_x3": "yelp_sentences",
                  "main_repeats": "yelp_sentences", "yelp_polarity": "yelp_polarity", "sst2": "sst2",
                  "ag_news": "ag_news", "guidance_look": "yelp_polarity", "null_contrast": "yelp_polarity",
                  **{name: "yelp_polarity" for name in CPU_LEVERS}, **CPU_V3_SETS, **CPU_V3C_SETS, **CPU_GEN_SETS}
# The first look at the guidance weight (Yelp polarity, LoRA, epsilon 3; reuses its DP model): the
# prototype on a held-out review set found w 1.5 > 3 > 0 (issue 22).
CPU_GUIDANCE_LOOK = (1.0, 3.0)
CPU_LABEL_DROPOUT = 0.1  # the null-contrast lever: label dropout in DP tuning, guidance against the null prompt


def _sampling(w: float, contrast: str = "others", temperature: float = 1.0) -> dict[str, Any]:
    out: dict[str, Any] = {"temperature": float(temperature), "top_k": 0, "num_decodes": 1}
    if w:
        out.update(guidance=float(w), guidance_contrast=contrast)
    return out


def cpu_experiments(scale: str, data: str, *, pretrain_steps: int | None = None, backbone: bool = False,
                    epsilons: dict[str, list] | None = None, also_guidance: tuple[float, ...] = (),
                    replicates: int = 1, multiples: tuple[float, ...] = (), base_model: str | None = None
                    ) -> dict[str, dict[str, Any]]:
    """name -> experiment config of the cpu study (one cache root: one public corpus, tokenizer,
    dedup (against all four sensitive sets at once: `dedup.also_against`) and pretraining).
    `replicates`: independent DP runs per tuning epsilon of the v3 experiments (replicate 0 is their own).
    `multiples`: a probe of the number of synthetic examples: the v3 experiments' candidates become the
    unguided corpus (w 0, t 1) at these multiples of |D_train|, DP-selected as usual, without baselines.
    `base_model`: a model directory (`dpsynth import-model`): adds the `gen_<set>` experiments (`CPU_GEN_SETS`)."""
    s = copy.deepcopy(CPU_SCALES[scale])
    quick = scale == "quick"
    datasets = cpu_datasets(data)
    sections = {}
    for name, sizes in s["sets"].items():
        sec = dict(datasets[name])
        sec.update({k: v for k, v in sizes.items() if v is not None})
        sections[name] = sec
    pretrain = s["pretrain"]
    if pretrain_steps:
        pretrain["steps"] = int(pretrain_steps)
    epsilons = dict(epsilons or {})
    if epsilons.get(""):
        s["epsilons"] = list(epsilons[""])
    public = {"embedded": False, "paths": [os.path.join(data, "public", "opinrank", "opinrank-*.jsonl.gz"),
                                           os.path.join(data, "public", "enwiki", "enwiki-*.jsonl.gz")]}
    if s.get("public_max_documents"):
        public["max_documents"] = s["public_max_documents"]
    # Unguided and guided at CPU_GUIDANCE on every set, plus any other weights asked for (a new
    # weight adds one generation per model; the existing ones stay cached).
    guided = [_sampling(w) for w in dict.fromkeys((0.0, CPU_GUIDANCE, *map(float, also_guidance)))]

    def experiment(name: str, dataset: str, modes: list[str], epsilons: list, *, samplings=None,
                   multiples=(1,), replicates: int = 1, baselines: bool = True, classifiers: list[str] | None = None,
                   dp: dict | None = None, pretrained: dict | None = None, select: float | None = None
                   ) -> dict[str, Any]:
        dp = dict(dp or {})
        max_tokens = dp.pop("max_tokens", s["max_tokens"])
        ev = _cpu_eval(max_tokens, quick)
        if classifiers:
            ev["classifiers"] = classifiers
        more = {}
        if select is not None:  # the released corpus chosen with DP on D_valid; DP-on-real's sweep likewise
            more["select"] = {"epsilon": float(select), "options": _cpu_select_options(quick)}
            ev["options"]["dp_select_epsilon"] = float(select)
        return {**more,
            "name": f"paper-{scale}-{name}", "seed": 0, "public": public, "sensitive": sections[dataset],
            "tokenizer": s["tokenizer"], "dedup": {"min_tokens": 50, "also_against": sections},
            "pretrain": pretrained or pretrain,
            "dp_tune": _dp_section({"modes": modes, "epsilons": epsilons, "clip_norms": [1.0], "max_tokens": max_tokens,
                                    "replicates": replicates, **s["recipe"], **dp}),
            "generate": {"max_tokens": max_tokens, "batch_size": s["generate_batch"], "multiples": list(multiples),
                         "samplings": samplings or guided, "label_distribution": "dp_histogram",
                         "label_noise_multiplier": s["label_sigma"]},
            "evaluate": {**ev, "baselines": baselines},
        }

    grid = lambda name: list(epsilons.get(name) or s["epsilons"])  # noqa: E731 (the set's epsilon grid)
    v3_samplings = [_sampling(w, temperature=t) for t in CPU_V3_TEMPERATURES for w in CPU_V3_GUIDANCE]
    v3 = dict(samplings=v3_samplings)  # (the candidate grid of every v3 experiment, or the multiples probe)
    if multiples:
        v3 = dict(samplings=[_sampling(0.0)], multiples=tuple(float(m) for m in multiples), baselines=False)
    main_cls = ["wordcnn", "backbone"] if backbone else None

    def generator(name: str, dataset: str) -> dict[str, Any]:
        """The set's v3 cell from the imported base model (`base_model:` replaces public/dedup/tokenizer/pretrain)."""
        select = CPU_V3_SELECT_EPSILON.get(dataset, CPU_V3_SELECT_EPSILON["default"])
        if quick:
            q = CPU_GEN_QUICK
            cfg = experiment(name, dataset, ["lora"], list(epsilons.get(name) or [3]), select=select,
                             samplings=[_sampling(w) for w in q["guidance"]],
                             dp={"max_tokens": q["max_tokens"], **copy.deepcopy(q["dp"])})
            cfg["sensitive"] = {**cfg["sensitive"], **q["sizes"]}
            cfg["generate"]["batch_size"] = q["generate_batch"]
            cfg["evaluate"]["options"]["embedder"] = q["embedder"]
        else:
            cfg = experiment(name, dataset, ["lora"], list(epsilons.get(name) or [3]), select=select,
                             replicates=replicates, **{"multiples": CPU_V3_MULTIPLES.get("v3_" + name[len("gen_"):], (1,)),
                                                       **v3})
        for section in ("public", "dedup", "tokenizer", "pretrain"):
            del cfg[section]
        return {**cfg, "base_model": os.path.abspath(base_model)}

    return {
        # LoRA at every epsilon on each set, guided and unguided, with its real-data and DP-on-real peers.
        "main": experiment("main", "yelp_sentences", ["lora"], grid("main"), classifiers=main_cls),
        "yelp_polarity": experiment("yelp_polarity", "yelp_polarity", ["lora"], grid("yelp_polarity")),
        "sst2": experiment("sst2", "sst2", ["lora"], grid("sst2")),
        "ag_news": experiment("ag_news", "ag_news", ["lora"], grid("ag_news")),
        # The first look at the guidance weight (reuses Yelp polarity's epsilon-3 model).
        "guidance_look": experiment("guidance_look", "yelp_polarity", ["lora"], [3],
                                    samplings=[_sampling(w) for w in CPU_GUIDANCE_LOOK], baselines=False),
        # The null-prompt contrast: label dropout in DP tuning (same plan, same epsilon), guidance against it.
        "null_contrast": experiment("null_contrast", "yelp_polarity", ["lora"], [3],
                                    samplings=[_sampling(0.0), _sampling(CPU_GUIDANCE, "null")], baselines=False,
                                    dp={"label_dropout": CPU_LABEL_DROPOUT}),
        # The main set: prompt and full tuning at epsilon 3; 3x data; independent repeats of the
        # epsilon-3 LoRA run (repeat 0 is main's own model), for the seed spread.
        "main_x3": experiment("main_x3", "yelp_sentences", ["lora"], [3], multiples=(3,), baselines=False),
        "main_repeats": experiment("main_repeats", "yelp_sentences", ["lora"], [3], replicates=s["replicates"],
                                   baselines=False),
        "main_modes": experiment("main_modes", "yelp_sentences", ["prompt", "full"], [3], baselines=False),
        # Study v3: the DP-selected corpus among guidance x temperature (x multiple) candidates, on every set.
        **{name: experiment(name, dataset, ["lora"], list(epsilons.get(name) or [3]), select=CPU_V3_SELECT_EPSILON.get(
                                dataset, CPU_V3_SELECT_EPSILON["default"]),
                            replicates=replicates, **{"multiples": CPU_V3_MULTIPLES.get(name, (1,)), **v3})
           for name, dataset in CPU_V3_SETS.items()},
        **{name: experiment(name, dataset, ["lora"], list(epsilons.get(name) or [3]), select=CPU_V3_SELECT_EPSILON.get(
                                dataset, CPU_V3_SELECT_EPSILON["default"]),
                            replicates=replicates, dp={"options": {"label_contrast": CPU_LABEL_CONTRAST}},
                            **{"multiples": CPU_V3_MULTIPLES.get("v3_" + name[len("v3c_"):], (1,)), **v3})
           for name, dataset in CPU_V3C_SETS.items()},
        # Issue 34's levers on long reviews (each one DP run at epsilon 3 beside yelp_polarity's).
        **{name: experiment(name, "yelp_polarity", ["lora"], [3], baselines=False, dp=_lever_dp(lever, s),
                            pretrained=_lever_pretrain(lever, pretrain))
           for name, lever in CPU_LEVERS.items()},
        # The imported generator's v3 cells (`--base-model`), beside the cpu preset's.
        **({name: generator(name, dataset) for name, dataset in CPU_GEN_SETS.items()} if base_model else {}),
    }


def _majority(labels: list[str]) -> tuple[str, float]:
    counts = {l: labels.count(l) for l in set(labels)}
    top = max(sorted(counts), key=counts.get)
    return top, counts[top] / max(len(labels), 1)


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


def _mean_std(values) -> str:
    """"mean +- sample std" of the figures that are present (one figure: std 0), "-" when none is."""
    v = [float(x) for x in values if x is not None]
    return "-" if not v else f"{statistics.mean(v):.3f} +- {statistics.stdev(v) if len(v) > 1 else 0.0:.3f}"


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
                   learning_rate=t["learning_rate"], guidance=float((t.get("sampling") or {}).get("guidance", 0.0)),
                   contrast=(t.get("sampling") or {}).get("guidance_contrast", "others"), replicate=t.get("replicate", 0),
                   temperature=float((t.get("sampling") or {}).get("temperature", 1.0)),
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


# ----------------------------------------------------------------------------- the cpu study's tables


def _pick(res: dict[str, Any] | None, *, mode: str = "lora", epsilon: float = 3.0, guidance: float = 0.0,
          multiple: float = 1.0, replicate: int = 0, contrast: str = "others") -> dict[str, Any] | None:
    if not res:
        return None
    return next((r for r in res["rows"] if r["mode"] == mode and r["epsilon"] == epsilon
                 and r["guidance"] == guidance and float(r["multiple"]) == multiple and r["replicate"] == replicate
                 and (guidance == 0.0 or r["contrast"] == contrast)), None)


def _peer(res: dict[str, Any] | None, kind: str, epsilon: float | None = None) -> dict[str, Any] | None:
    if not res:
        return None
    return next((b for b in res["metrics"].get("baselines", []) if b.get("baseline") == kind
                 and b.get("classifier") == "wordcnn" and (epsilon is None or _eps(b.get("epsilon")) == epsilon)), None)


def _ab(d: dict[str, Any] | None, prefix: str = "wordcnn_") -> str:
    """'accuracy / balanced accuracy' of a corpus row (prefix wordcnn_) or a baseline (prefix '')."""
    if not d or d.get(f"{prefix}accuracy") is None:
        return "-"
    return f"{float(d[f'{prefix}accuracy']):.3f} / {_f(d.get(f'{prefix}balanced_accuracy'))}"


def _num(d: dict[str, Any] | None, key: str) -> float | None:
    v = (d or {}).get(key)
    return None if v is None else float(v)


SET_TITLES = {"yelp_sentences": "Yelp sentences", "yelp_polarity": "Yelp polarity", "sst2": "SST-2",
              "ag_news": "AG News"}
SET_EXPERIMENT = {"yelp_sentences": "main", "yelp_polarity": "yelp_polarity", "sst2": "sst2", "ag_news": "ag_news"}


def _with_epsilon(scores: dict[str, float] | None, epsilon: float) -> dict[str, float] | None:
    return None if scores is None else {**scores, "epsilon": epsilon}


def _render_levers(results: dict[str, dict[str, Any]], scale: str) -> list[str]:
    """Section 8: issue 34's levers on long reviews, one row per DP run (the base is `yelp_polarity`'s)."""
    names = [n for n in ("yelp_polarity", *CPU_LEVERS) if n in results]
    if not any(n in CPU_LEVERS for n in names):
        return []
    w, s = CPU_GUIDANCE, CPU_SCALES[scale]
    md = ["", "## 8. Levers on long reviews (Yelp polarity, LoRA, epsilon 3)", "",
          "What makes the DP-tuned generator's own samples carry the label. Each lever changes one setting of the "
          f"base run (recipe auto, {s['recipe']['token_budget']:,.0f} example-tokens, {s['max_tokens']} tokens, LoRA rank "
          f"8 on all layers, label prompt `[{{label}}] `, a generator pretrained {s['pretrain']['steps']:,} steps). The label columns are read off the DP model on the real D_valid: the generative "
          "classifier argmax_y log p(x | prompt(y)) (balanced accuracy, chance 0.5) and the mean label margin "
          f"log p(x | own) - max log p(x | other) in nats ({NON_DP_FIGURE}s, computed without DP: they say which "
          "lever pays without looking at the test set). The synthetic columns: WordCNN on the real test set.", "",
          f"| lever | setting | DP steps | epsilon (composed) | label bal. acc. on D_valid ({NON_DP_FIGURE}) | mean label "
          f"margin on D_valid ({NON_DP_FIGURE}) | synthetic w 0 | synthetic w {w:g} | MAUVE w 0 |",
          "|---|---|---|---|---|---|---|---|---|"]
    rows = [(n, 3.0) for n in names]
    base = results.get("yelp_polarity") or {}
    if any(r["epsilon"] == math.inf for r in base.get("rows", ())) or any(
            (v or {}).get("epsilon") == math.inf for v in base.get("label_scores", {}).values()):
        rows.insert(1, ("yelp_polarity", math.inf))  # the base recipe without noise: the ceiling DP approaches
    for n, eps in rows:
        res = results[n]
        changed = {} if n == "yelp_polarity" else _lever_dp(CPU_LEVERS[n], s)
        if n in CPU_LEVERS and "pretrain_steps_factor" in CPU_LEVERS[n]:
            changed["pretraining steps"] = _lever_pretrain(CPU_LEVERS[n], s["pretrain"])["steps"]
        setting = ", ".join(f"{k} {v:g}" if isinstance(v, (int, float)) else f"{k} {json.dumps(v)}"
                            for k, v in changed.items()) or ("base" if eps == 3.0 else "base without DP (epsilon inf)")
        w0, wg = _pick(res, epsilon=eps), _pick(res, epsilon=eps, guidance=w)
        scores = next((v for v in res.get("label_scores", {}).values() if v and v.get("epsilon", 3.0) == eps), None) or {}
        md.append(f"| {n} | {setting} | {_f((w0 or {}).get('steps'), 0)} | {_f((w0 or {}).get('reported_epsilon'))} | "
                  f"{_f(scores.get('balanced_accuracy'))} | {_f(scores.get('mean_margin'))} | {_ab(w0)} | {_ab(wg)} | "
                  f"{_f(_num(w0, 'mauve'))} |")
    return md


def _release_epsilon(selection: dict[str, Any]) -> float | None:
    """The selected corpus's epsilon (RDP where reported) from a select stage's summary."""
    eps = selection.get("epsilon")
    if isinstance(eps, dict):
        eps = eps.get("rdp", next(iter(eps.values()), None))
    return None if eps is None else _eps(eps)


def _v3_groups(res: dict[str, Any]) -> list[tuple[float, int, dict[str, Any], dict[str, Any] | None]]:
    """(epsilon, replicate, selection summary, selected corpus's row) of every DP selection of one v3 result,
    by epsilon and replicate."""
    out = []
    for key, sel in res.get("selections", {}).items():
        group = key[len("select["):-1]  # e.g. "lora-eps3" or "lora-eps3-r1" (one select node per private DP run)
        m = re.search(r"-eps(.+?)(?:-r([0-9]+))?$", group)
        if m:
            picked = next((r for r in res.get("selected_rows") or () if r.get("corpus") == f"selected-{group}"), None)
            out.append((float(m.group(1)), int(m.group(2) or 0), sel, picked))
    return sorted(out, key=lambda x: x[:2])


def _render_v3(results: dict[str, dict[str, Any]]) -> list[str]:
    """Section 9: study v3, the corpus chosen with DP on D_valid on every set (each private tuning epsilon),
    beside every candidate."""
    sets = {**CPU_V3_SETS, **CPU_V3C_SETS}
    names = [n for n in sets if n in results]
    if not names:
        return []
    md = ["", "## 9. Study v3: the corpus chosen with DP on the real D_valid (LoRA)", "",
          "Each set's DP model (tuning epsilon in the second column) generates candidate corpora (guidance weight x "
          "temperature, x multiple of |D_train| on Yelp sentences); `select` trains a small WordCNN on each (its "
          "settings chosen on the candidate's synthetic valid split), counts its correct predictions on the real "
          "D_valid and releases one through the exponential mechanism (sensitivity 1). The release's epsilon composes "
          "the tuning, the DP label histogram and the selection (in parallel where D_valid is split from D "
          "independently of the data; else sequentially, with the selection reserved in the tuning's budget). "
          "DP-on-real's sweep is selected on D_valid by a DP selection too. Test accuracy / balanced accuracy of the "
          "WordCNN on the real test set; the candidates' figures are shown to compare the choice with what it could "
          "have chosen, not used by it.", "",
          "| set | tuning epsilon | selection (epsilon, composition) | release epsilon | selected candidate | selected: "
          "accuracy / balanced | best candidate | within 1 point of the best | DP-on-real (DP-selected) | real | beats "
          "DP-on-real, balanced >= chance + 5 | unguided balanced >= chance + 10 |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    detail = []
    runs: dict[tuple[str, float], list[tuple]] = {}  # (set, tuning epsilon) -> one figure tuple per DP run
    peers: dict[tuple[str, float], str] = {}  # (set, tuning epsilon) -> DP-on-real (one run, shared by the runs)
    acc = lambda r, k="wordcnn_accuracy": None if not r or r.get(k) is None else float(r[k])  # noqa: E731
    yes = lambda v: "-" if v is None else ("met" if v else "**not met**")  # noqa: E731
    for n in names:
        res, title = results[n], SET_TITLES.get(sets[n], n) + (" + label contrast" if n in CPU_V3C_SETS else "")
        labels = set(res.get("test_labels") or ())
        chance = 1 / len(labels) if labels else 0.5
        sel_eps = CPU_V3_SELECT_EPSILON.get(sets[n], CPU_V3_SELECT_EPSILON["default"])
        groups = _v3_groups(res)
        # A tuning without a DP selection (epsilon inf: the experiment plans none, nothing to protect) still has
        # its candidates: a row with no selection, the best candidate and the unguided one beside it.
        unselected = sorted({(float(r["epsilon"]), int(r.get("replicate", 0))) for r in res["rows"]
                             if r.get("wordcnn_accuracy") is not None} - {(e, r) for e, r, _, _ in groups})
        groups = sorted(groups + [(eps, rep, {}, None) for eps, rep in unselected], key=lambda g: g[:2])
        for eps, rep, sel, picked in groups:
            cands = [r for r in res["rows"] if r.get("wordcnn_accuracy") is not None and r["epsilon"] == eps
                     and r.get("replicate", 0) == rep]
            best = max(cands, key=lambda r: float(r["wordcnn_accuracy"]), default=None)
            peer = _peer(res, "dp_on_real", eps)
            within = None if acc(picked) is None or acc(best) is None else acc(best) - acc(picked) <= 0.01 + 1e-9
            beats = (None if acc(picked) is None or acc(peer, "accuracy") is None else
                     acc(picked) > acc(peer, "accuracy") and acc(picked, "wordcnn_balanced_accuracy") >= chance + 0.05)
            unguided = [r for r in cands if r["guidance"] == 0.0 and r.get("temperature", 1.0) == 1.0
                        and float(r["multiple"]) == 1.0]
            ung = acc(unguided[0], "wordcnn_balanced_accuracy") if unguided else None
            run = f"{eps:g}" + (f" (run {rep + 1})" if any(g[1] for g in groups if g[0] == eps) else "")
            if sel:  # (the spread is over DP runs with their selection)
                runs.setdefault((title, eps), []).append((acc(picked), acc(picked, "wordcnn_balanced_accuracy"),
                                                          acc(best), ung))
            peers[(title, eps)] = _ab(peer, "")
            how = f"{sel_eps:g}, {sel.get('composition', '-')}" if sel else "none (no DP selection)"
            md.append(f"| {title} | {run} | {how} | {_f(_release_epsilon(sel))} | "
                      f"{sel.get('selected', '-')} | {_ab(picked)} | {_ab(best)} ({(best or {}).get('trial', '-')}) | "
                      f"{yes(within)} | {_ab(peer, '')} | {_ab(_peer(res, 'real'), '')} | {yes(beats)} | "
                      f"{yes(None if ung is None else ung >= chance + 0.10)} |")
            detail += ["", f"Candidates of {title} at tuning epsilon {run} (test figures, not seen by the selection):",
                       "", "| candidate | guidance | temperature | multiple | accuracy / balanced | MAUVE |",
                       "|---|---|---|---|---|---|"]
            for r in sorted(cands, key=lambda r: (float(r["multiple"]), r.get("temperature", 1.0), r["guidance"])):
                mark = " (selected)" if r["trial"] == sel.get("selected") else ""
                detail.append(f"| {r['trial']}{mark} | {r['guidance']:g} | {r.get('temperature', 1.0):g} | "
                              f"{float(r['multiple']):g} | {_ab(r)} | {_f(_num(r, 'mauve'))} |")
    return md + _v3_spread(runs, peers) + detail


def _v3_spread(runs: dict[tuple[str, float], list[tuple]], peers: dict[tuple[str, float], str]) -> list[str]:
    """The seed spread of the v3 cells run more than once (`--replicates N`): mean +- sample std over the
    independent DP runs (each its own tuning, candidates and DP selection) of each figure; DP-on-real is one
    run, beside them."""
    many = {k: v for k, v in runs.items() if len(v) > 1}
    if not many:
        return []
    md = ["", "Independent DP runs of the same cell (fresh secret noise and generation seeds; mean +- sample std):", "",
          "| set | tuning epsilon | runs | selected: accuracy | selected: balanced | best candidate: accuracy | "
          "unguided: balanced | DP-on-real (one run) |", "|---|---|---|---|---|---|---|---|"]
    for (title, eps), figures in many.items():
        md.append(f"| {title} | {eps:g} | {len(figures)} | " + " | ".join(_mean_std(c) for c in zip(*figures))
                  + f" | {peers.get((title, eps), '-')} |")
    return md


from dpsynth.evaluate.contamination import REPORT_JSON as PROBE_FILE  # noqa: E402 (what `dpsynth probe` writes; its "verdict" beside the figures)
# The probe reads D without DP (`dpsynth.evaluate.contamination`): its verdict is owner-only, a non-DP figure here.
PROBE_COLUMN = f"contamination probe ({NON_DP_FIGURE})"
PROBE_NOTE = (f"(Contamination probe, a {NON_DP_FIGURE}: `dpsynth probe` compares the base model's behaviour on D "
              "with a control set without DP; its verdict is read from the probe's owner-only output and is not "
              "covered by any epsilon.)")


def probe_verdict(path: str | None) -> str:
    """The contamination probe's verdict (`dpsynth probe`'s `contamination_probe.json`, in directory `path` or
    the file itself), as one cell: its "verdict" field, or why there is none. Never fails."""
    if not path:
        return "not probed"
    file = os.path.join(path, PROBE_FILE) if os.path.isdir(path) else path
    try:
        with open(file, encoding="utf-8") as f:
            verdict = json.load(f).get("verdict")
    except (OSError, ValueError, AttributeError) as e:
        return f"no probe result ({type(e).__name__} reading {file})"
    return "no verdict in the probe file" if verdict in (None, "") else str(verdict)


def _render_generators(results: dict[str, dict[str, Any]], base_model: str | None, probe: str | None) -> list[str]:
    """Section 10: the imported generator's v3 cells beside the cpu preset's, each with the contamination
    probe's verdict (the imported model's pretraining data was not deduplicated against D)."""
    names = [n for n in CPU_GEN_SETS if n in results]
    if not names:
        return []
    verdict = probe_verdict(probe)
    md = ["", "## 10. The imported generator beside the cpu preset (LoRA, epsilon 3, the corpus DP-selected on the "
          "real D_valid)", "",
          f"Imported generator: `{base_model}` ({results[names[0]].get('generator', 'imported')}). DP covers the "
          "fine-tuning data only: its pretraining data was NOT deduplicated against the sensitive sets (the cpu "
          "preset's was: `dedup` cut every >= 50-token overlap first), so each of its figures stands beside the "
          f"contamination probe's verdict (`dpsynth probe`{f', {probe}' if probe else ''}: {verdict}). Accuracy / "
          "balanced accuracy of the WordCNN trained on the selected corpus, on the real test set.", "", PROBE_NOTE, "",
          "| set | generator | D_train | release epsilon | selected candidate | selected: accuracy / balanced | best "
          f"candidate | DP-on-real (DP-selected) | real | {PROBE_COLUMN} |", "|---|---|---|---|---|---|---|---|---|---|"]
    for n in names:
        dataset = CPU_GEN_SETS[n]
        for exp, who, cell in (("v3_" + n[len("gen_"):], "cpu preset (pretrained here, deduplicated against D)",
                                "- (dedup, not probed)"), (n, f"imported: {os.path.basename(str(base_model).rstrip('/'))}",
                                                           verdict)):
            res = results.get(exp)
            if not res:
                md.append(f"| {SET_TITLES.get(dataset, dataset)} | {who} | not run |" + " |" * 7)
                continue
            for eps, rep, sel, picked in _v3_groups(res):
                if eps != 3.0:
                    continue
                cands = [r for r in res["rows"] if r.get("wordcnn_accuracy") is not None and r["epsilon"] == eps
                         and r.get("replicate", 0) == rep]
                best = max(cands, key=lambda r: float(r["wordcnn_accuracy"]), default=None)
                md.append(f"| {SET_TITLES.get(dataset, dataset)}{f' (run {rep + 1})' if rep else ''} | {who} | "
                          f"{res.get('num_train', '-')} | {_f(_release_epsilon(sel))} | {sel.get('selected', '-')} | "
                          f"{_ab(picked)} | {_ab(best)} | {_ab(_peer(res, 'dp_on_real', eps), '')} | "
                          f"{_ab(_peer(res, 'real'), '')} | {cell} |")
    return md


def render_cpu(results: dict[str, dict[str, Any]], scale: str, command: str, *, base_model: str | None = None,
               probe: str | None = None) -> tuple[str, list[str]]:
    """The cpu study's Markdown (targets, every table of issue 22) and the printed ratio lines."""
    w = CPU_GUIDANCE
    md = [f"# The cpu-scale study, one recipe for every set ({scale} scale)", "", f"Command: `{command}`", "",
          f"One recipe for all four sets: DP tuning `recipe: auto` (token budget {CPU_RECIPE['token_budget']:,.0f} "
          f"example-tokens per run), {CPU_SCALES[scale]['max_tokens']} tokens per example, labels from a DP label "
          f"histogram (sigma {CPU_SCALES[scale]['label_sigma']:g}), generation unguided (w 0) and label-guided (w {w:g}, contrast: the "
          "other labels). Accuracy / balanced accuracy of the WordCNN trained on the synthetic data (selected on the "
          "synthetic valid split) on the real test set; DP-on-real: the same WordCNN trained with DP-Adam on the real "
          "training set at the same epsilon; real: trained on the real training set without DP.", ""]
    if scale == "quick":
        md += ["**Smoke scale**: a tiny model, a few steps, a few hundred examples. These numbers only show that",
               "every stage and table works end to end; they say nothing about the method.", ""]
    ratios: list[str] = []
    # 0. Targets: one row per set, one column per guidance weight (the same weight on every set is one recipe).
    weights = sorted({float(r["guidance"]) for res in results.values() for r in res["rows"]
                      if r["mode"] == "lora" and r["epsilon"] == 3.0 and r["contrast"] in ("others", None)
                      and float(r["multiple"]) == 1.0 and r["replicate"] == 0} | {0.0, w})
    md += ["## 0. Targets at epsilon 3 (LoRA, one recipe)", "",
           "Each cell: accuracy / balanced accuracy of the synthetic corpus at that guidance weight, and whether it "
           "meets the target (beats DP-on-real's accuracy AND balanced accuracy >= chance + 5 points).", "",
           "| set | " + " | ".join(f"synthetic, w {g:g}" for g in weights)
           + " | DP-on-real | real data | majority (chance) | moonshot gap to real (best w) |",
           "|---|" + "---|" * (len(weights) + 4)]
    met = {g: 0 for g in weights}
    for ds in CPU_SETS:
        res = results.get(SET_EXPERIMENT[ds])
        if not res:
            md.append(f"| {SET_TITLES[ds]} | not run |" + " |" * (len(weights) + 3))
            continue
        dp, real = _peer(res, "dp_on_real", 3.0), _peer(res, "real")
        maj = res["metrics"].get("majority") or {}
        chance = 1.0 / maj["num_classes"] if maj.get("num_classes") else None
        cells, best = [], None
        for g in weights:
            r = _pick(res, guidance=g) or (_pick(results.get("guidance_look"), guidance=g)
                                          if ds == "yelp_polarity" else None)
            acc, bal = _num(r, "wordcnn_accuracy"), _num(r, "wordcnn_balanced_accuracy")
            if acc is None:
                cells.append("-")
                continue
            ok = bool(dp and chance and bal is not None and acc > float(dp["accuracy"]) and bal >= chance + 0.05)
            met[g] += ok
            cells.append(f"{_ab(r)} {'(met)' if ok else '(not met)'}")
            best = acc if best is None else max(best, acc)
            if g > 0 and dp:
                ratios.append(f"{SET_TITLES[ds]} eps 3: synthetic (w {g:g}) {acc:.3f} vs DP-on-real "
                              f"{float(dp['accuracy']):.3f} -> ratio {acc / float(dp['accuracy']):.3f}")
        gap = f"{100 * (float(real['accuracy']) - best):.1f} points" if real and best is not None else "-"
        md.append(f"| {SET_TITLES[ds]} | " + " | ".join(cells) + f" | {_ab(dp, '')} | {_ab(real, '')} | "
                  f"{_f(maj.get('accuracy'))} ({_f(chance)}) | {gap} |")
    md += ["", "Target met on: " + "; ".join(f"w {g:g}: {met[g]} of {len(CPU_SETS)} sets" for g in weights) + ".", "",
           "Targets (issue 22): on every set the synthetic corpus beats DP-on-real and its balanced accuracy is at "
           "least 5 points above chance; moonshot: within 5 points of the real-data WordCNN on Yelp sentences, within "
           "10 on the others.", ""]
    # 1. Every epsilon.
    md += ["## 1. LoRA at every epsilon", "",
           f"| set | epsilon (composed, RDP) | DP steps | synthetic w 0 | synthetic w {w:g} | DP-on-real | MAUVE w 0 / w {w:g} |",
           "|---|---|---|---|---|---|---|"]
    for ds in CPU_SETS:
        res = results.get(SET_EXPERIMENT[ds])
        if not res:
            continue
        for e in sorted({r["epsilon"] for r in res["rows"]}):
            w0, wg = _pick(res, epsilon=e), _pick(res, epsilon=e, guidance=w)
            dp = _peer(res, "dp_on_real", e) if math.isfinite(e) else None
            composed = "inf" if not math.isfinite(e) else _f((w0 or {}).get("reported_epsilon"))
            md.append(f"| {SET_TITLES[ds]} | {composed} | {_f((w0 or {}).get('steps'), 0)} | {_ab(w0)} | {_ab(wg)} | "
                      f"{_ab(dp, '') if dp else ('-' if math.isfinite(e) else 'real: ' + _ab(_peer(res, 'real'), ''))} | "
                      f"{_f(_num(w0, 'mauve'))} / {_f(_num(wg, 'mauve'))} |")
    # 2. Modes.
    main, modes = results.get("main"), results.get("main_modes")
    md += ["", "## 2. LoRA, prompt and full tuning on Yelp sentences (epsilon 3)", "",
           f"| mode | DP steps | synthetic w 0 | synthetic w {w:g} | MAUVE w 0 | perplexity of the real test set |",
           "|---|---|---|---|---|---|"]
    for mode, res in (("lora", main), ("prompt", modes), ("full", modes)):
        w0, wg = _pick(res, mode=mode), _pick(res, mode=mode, guidance=w)
        md.append(f"| {mode} | {_f((w0 or {}).get('steps'), 0)} | {_ab(w0)} | {_ab(wg)} | {_f(_num(w0, 'mauve'))} | "
                  f"{_f(_num(w0, 'perplexity'), 1)} |")
    # 3. 1x vs 3x.
    x3 = results.get("main_x3")
    md += ["", "## 3. 1x against 3x synthetic data (Yelp sentences, LoRA, epsilon 3)", "",
           f"| size | synthetic w 0 | synthetic w {w:g} | MAUVE w 0 |", "|---|---|---|---|",
           f"| 1x | {_ab(_pick(main))} | {_ab(_pick(main, guidance=w))} | {_f(_num(_pick(main), 'mauve'))} |",
           f"| 3x | {_ab(_pick(x3, multiple=3.0))} | {_ab(_pick(x3, multiple=3.0, guidance=w))} | "
           f"{_f(_num(_pick(x3, multiple=3.0), 'mauve'))} |"]
    # 4. Repeats.
    reps = results.get("main_repeats")
    md += ["", "## 4. Independent repeats (Yelp sentences, LoRA, epsilon 3: a fresh secret noise seed and generation "
           "seed each)", "", "| guidance | accuracy per repeat | mean +- std | balanced accuracy mean +- std |", "|---|---|---|---|"]
    for g in (0.0, w):
        rows = [r for r in (reps or {}).get("rows", []) if r["guidance"] == g and r["wordcnn_accuracy"] is not None] \
            if reps else []
        accs = [float(r["wordcnn_accuracy"]) for r in rows]
        bals = [float(r["wordcnn_balanced_accuracy"]) for r in rows if r.get("wordcnn_balanced_accuracy") is not None]
        md.append(f"| w {g:g} | {', '.join(f'{a:.3f}' for a in accs) or '-'} | {_mean_std(accs)} | {_mean_std(bals)} |")
    # 5. Guidance: signal and diversity.
    md += ["", "## 5. What guidance does (LoRA, epsilon 3): accuracy, MAUVE and diversity", "",
           "| set | guidance | synthetic | MAUVE | distinct-1 | distinct-2 | duplicate rate |", "|---|---|---|---|---|---|---|"]
    look, null = results.get("guidance_look"), results.get("null_contrast")
    for ds in CPU_SETS:
        res = results.get(SET_EXPERIMENT[ds])
        cells = [(g, _pick(res, guidance=g) or (_pick(look, guidance=g) if ds == "yelp_polarity" else None))
                 for g in weights]
        for g, r in cells:
            if r is None:
                continue
            md.append(f"| {SET_TITLES[ds]} | w {g:g} | {_ab(r)} | {_f(_num(r, 'mauve'))} | {_f(_num(r, 'distinct_1'))} | "
                      f"{_f(_num(r, 'distinct_2'))} | {_f(_num(r, 'duplicate_rate'))} |")
    if null:
        for g, label in ((0.0, "label dropout 0.1, w 0"), (w, f"label dropout 0.1, w {w:g} against the null prompt")):
            r = _pick(null, guidance=g, contrast="null")
            md.append(f"| Yelp polarity | {label} | {_ab(r)} | {_f(_num(r, 'mauve'))} | {_f(_num(r, 'distinct_1'))} | "
                      f"{_f(_num(r, 'distinct_2'))} | {_f(_num(r, 'duplicate_rate'))} |")
    # 6. Ranking correlation.
    md += ["", "## 6. Hyperparameter-ranking correlation (WordCNN grid: synthetic valid -> real test)", "",
           "| set | epsilon | guidance | Spearman | Kendall | RBO | upper bound (real valid) Spearman |", "|---|---|---|---|---|---|---|"]
    for ds in CPU_SETS:
        res = results.get(SET_EXPERIMENT[ds])
        for r in (res or {}).get("rows", []):
            if r["epsilon"] in (1.0, 3.0) and r["replicate"] == 0:
                md.append(f"| {SET_TITLES[ds]} | {_f(r['epsilon'], 0)} | {r['guidance']:g} | "
                          f"{_f(r.get('wordcnn_rank_spearman'))} | {_f(r.get('wordcnn_rank_kendall'))} | "
                          f"{_f(r.get('wordcnn_rank_rbo'))} | {_f(r.get('wordcnn_rank_upper_spearman'))} |")
    # 7. Proxies.
    every = [r for res in results.values() for r in res["rows"] if r.get("wordcnn_accuracy") is not None]
    accs = [float(r["wordcnn_balanced_accuracy"]) if r.get("wordcnn_balanced_accuracy") is not None else None
            for r in every]
    md += ["", "## 7. Do the proxy metrics rank corpora as balanced accuracy does? (Spearman over every corpus)", ""]
    md.append(", ".join(f"{p} {_f(_spearman([_num(r, p) for r in every], accs))}"
                        for p in ("mauve", "bigram_mauve", "perplexity", "distinct_2")))
    # 8. Levers on long reviews.
    md += _render_levers(results, scale)
    # 9. Study v3: the DP-selected corpus.
    md += _render_v3(results)
    # 10. The imported generator beside the cpu preset.
    md += _render_generators(results, base_model, probe)
    return "\n".join(md) + "\n", ratios


def run(args) -> int:
    from dpsynth.experiment.config import from_dict
    from dpsynth.experiment.runner import report_result, run_experiment

    if not os.path.isdir(args.data):
        print(f"paper: {args.data} not found (the real datasets of ../shared/data are needed)", file=sys.stderr)
        return 2
    scale = "quick" if args.quick else args.scale
    if scale in CPU_SCALES:
        configs = cpu_experiments(scale, args.data, pretrain_steps=args.pretrain_steps, backbone=args.backbone,
                                  epsilons=_epsilon_grids(args.epsilons), also_guidance=tuple(args.also_guidance),
                                  replicates=args.replicates, multiples=tuple(args.multiples),
                                  base_model=args.base_model)
    else:
        configs = experiments(scale, args.data)
    root = args.root or os.path.join("runs", f"paper-{scale}")
    if args.label_repeats:
        return run_label_repeats(args, configs, root, scale)
    results: dict[str, dict[str, Any]] = {}
    stage_times: dict[str, float] = {}  # stage directory -> seconds (shared stages once)
    stage_names: dict[str, str] = {}  # stage directory -> "experiment: stage key"
    t0 = time.monotonic()
    order = list(dict.fromkeys(args.only)) if args.only else list(configs)  # --only runs in the order given
    for name in order:
        if name not in configs:
            print(f"paper: no experiment '{name}' at scale {scale} (it has: {', '.join(configs)})", file=sys.stderr)
            return 2
        cfg = from_dict(configs[name])
        runs = len(cfg.dp_tune.modes) * len(cfg.dp_tune.epsilons) * cfg.dp_tune.replicates
        print(f"\n##### paper: experiment '{name}' ({runs} DP runs)", flush=True)
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
        label_scores = {}  # the lever table's figures: the DP model's label margin on the real D_valid (NOT DP)
        if scale in CPU_SCALES and (name in CPU_LEVERS or name == "yelp_polarity"):
            valid = result.outputs["sensitive"].path("data", "valid.jsonl")
            models = {t.dp_tune: _eps(t.epsilon) for t in result.plan.trials
                      if _eps(t.epsilon) in (3.0, math.inf) and not t.replicate}  # (each model once)
            label_scores = {key: _with_epsilon(_valid_label_scores(result.plan, key, valid, int(cfg.dp_tune.max_tokens)),
                                               eps) for key, eps in models.items()}
        results[name] = {"rows": _rows_by_trial(metrics, trials), "metrics": metrics, "valid_loss": valid_loss,
                         "label_scores": label_scores,
                         # the DP selections (select[...] stages: the winner, its composition and epsilon) and
                         # the selected corpora's metric rows (corpus "selected-<group>")
                         "selections": {key: dict(o.summary) for key, o in result.outputs.items()
                                        if key.startswith("select[")},
                         "selected_rows": [r for r in metrics.get("corpora", [])
                                           if str(r.get("corpus", "")).startswith("selected-")],
                         "report": os.path.realpath(result.report_dir),
                         "test_labels": _labels(result.outputs["sensitive"].path("data", "test.jsonl")),
                         "num_train": result.outputs["sensitive"].summary.get("num_train")}
        if "base_model" in result.outputs:  # the imported generator: its family, for the table
            results[name]["generator"] = result.outputs["base_model"].summary.get("family") or "imported"
    if "main" not in results and scale not in CPU_SCALES:
        print("paper: the tables need the 'main' experiment", file=sys.stderr)
        return 2
    classifiers = list(configs["main"]["evaluate"]["classifiers"])
    command = "python bench/paper.py " + " ".join(sys.argv[1:])
    if scale in CPU_SCALES:
        md, ratios = render_cpu(results, scale, command, base_model=args.base_model, probe=args.probe)
    else:
        md, ratios = render(results, classifiers, scale, command)
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


def run_label_repeats(args, configs: dict[str, dict[str, Any]], root: str, scale: str) -> int:
    """`--label-repeats N`: each `--only` experiment DP-tuned N times (independent secret noise seeds:
    `dp_tune.replicates`; the first is the experiment's own model) and stopped there; each model's
    label accuracy and margin on the real D_valid (`_valid_label_scores`, non-DP study-author
    figures), per repeat and as mean +- std: is a lever's effect larger than the seed spread?"""
    from dpsynth.experiment.config import from_dict
    from dpsynth.experiment.runner import report_result, run_experiment

    rows = []
    for name in dict.fromkeys(args.only or []):
        if name not in configs:
            print(f"paper: no experiment '{name}' at scale {scale}", file=sys.stderr)
            return 2
        data = copy.deepcopy(configs[name])
        data["dp_tune"]["replicates"] = int(args.label_repeats)
        cfg = from_dict(data)
        print(f"\n##### paper: experiment '{name}', {args.label_repeats} DP repeats, until dp_tune", flush=True)
        result = run_experiment(cfg, root=root, jobs=args.jobs, until="dp_tune")
        code = report_result(result)
        if code:
            return code
        valid = result.outputs["sensitive"].path("data", "valid.jsonl")
        models = dict.fromkeys(t.dp_tune for t in result.plan.trials)
        scores = [_valid_label_scores(result.plan, key, valid, int(cfg.dp_tune.max_tokens)) for key in models]
        rows.append((name, [s for s in scores if s]))
    md = ["## Label accuracy and margin on the real D_valid over independent DP repeats (non-DP study-author figures)",
          "", f"Command: `python bench/paper.py {' '.join(sys.argv[1:])}`", "",
          f"| experiment | repeats | label bal. acc. per repeat ({NON_DP_FIGURE}) | mean +- std | mean label margin per "
          f"repeat, nats ({NON_DP_FIGURE}) | mean +- std |", "|---|---|---|---|---|---|"]
    for name, scores in rows:
        acc = [s["balanced_accuracy"] for s in scores]
        margin = [s["mean_margin"] for s in scores]
        md.append(f"| {name} | {len(scores)} | {', '.join(f'{a:.3f}' for a in acc)} | {_mean_std(acc)} | "
                  f"{', '.join(f'{m:.3f}' for m in margin)} | {_mean_std(margin)} |")
    text = "\n".join(md) + "\n"
    out = args.out or os.path.join(root, "label_repeats.md")
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    print("\n" + text + f"\nresults: {out}")
    return 0


def _epsilon_grids(items: list[str] | None) -> dict[str, list]:
    """`--epsilons` -> {"": default grid, experiment: its grid}."""
    out: dict[str, list] = {}
    for item in items or []:
        name, _, values = item.rpartition("=")
        out.setdefault(name, []).extend(_epsilon(v) for v in values.split(",") if v)
    return out


def _epsilon(text: str) -> float | str:
    if text.strip().lower() in ("inf", "infinity"):
        return "inf"
    value = float(text)
    return int(value) if value.is_integer() else value  # 3, as the default grid spells it


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
                   help="run only these experiments, in this order (the tables need 'main')")
    p.add_argument("--also-guidance", nargs="+", type=float, default=[], metavar="W",
                   help=f"cpu scale: guidance weights to generate with on every set besides 0 and {CPU_GUIDANCE:g}")
    p.add_argument("--label-repeats", type=int, default=None, metavar="N",
                   help="cpu scale: DP-tune each --only experiment N times (independent noise seeds), stop there, and "
                        "table each model's label accuracy and margin on the real D_valid (non-DP study-author figures)")
    p.add_argument("--multiples", nargs="+", type=float, default=[], metavar="M",
                   help="cpu scale: probe the number of synthetic examples: the v3 experiments' candidates become the "
                        "unguided corpus (w 0, t 1) at these multiples of |D_train|, DP-selected, without baselines")
    p.add_argument("--replicates", type=int, default=1, metavar="N",
                   help="cpu scale: N independent DP runs (fresh secret noise and generation seeds) per tuning epsilon "
                        "of the v3 experiments, each with its own candidates and DP selection; the v3 table adds "
                        "their mean and spread (replicate 0 is the cached run)")
    p.add_argument("--epsilons", nargs="+", default=None, metavar="EPS|SET=EPS,EPS",
                   help="cpu scale: the epsilon grid of the four sets (default 1 3 10 inf), and per set "
                        "(e.g. `3 inf main=3`: main at 3 only); cached stages are reused")
    p.add_argument("--base-model", "--generator", dest="base_model", default=None, metavar="DIR",
                   help="cpu scale: a model directory (`dpsynth import-model --hf DIR | --gguf FILE --out DIR`, e.g. "
                        "Gemma 3 270M): adds the gen_<set> experiments, each set's v3 cell from that generator, tabled "
                        "beside the cpu preset's (default: none)")
    p.add_argument("--probe", default=None, metavar="DIR",
                   help=f"the contamination probe of the --base-model (`dpsynth probe`: DIR/{PROBE_FILE} or the file): "
                        "its verdict is printed beside the generator's figures (default: none, 'not probed')")
    args = p.parse_args(argv)
    if args.base_model and not (args.quick or args.scale in CPU_SCALES):
        p.error("--base-model: only at the cpu scales (cpu, quick)")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
