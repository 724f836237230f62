"""Evaluation of synthetic text: downstream classifiers, proxy metrics, ranking study, report.

Modules: `divergence` (divergence frontiers), `mauve` (MAUVE / MAUVE*), `ngrams` (unigram,
bigram and length frontiers), `embed` (pluggable embedders), `lm` (generator perplexity and
features), `text` (word tokenization), `classifiers` (WordCNN, backbone classifier),
`train_classifier` (training on the shared core, sweeps, DP-on-real), `ranking` (Spearman,
Kendall, RBO), `corpora` (inputs and checks), `report` (tables, plots, HTML), `pipeline` (Beam).
"""
