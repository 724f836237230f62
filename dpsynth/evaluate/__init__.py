"""Evaluation of synthetic text: downstream classifiers, proxy metrics, ranking study, report.

Modules: `divergence` (divergence frontiers), `mauve` (MAUVE / MAUVE*), `ngrams` (unigram,
bigram and length frontiers), `embed` (pluggable embedders), `lm` (generator perplexity and
features), `text` (word tokenization), `classifiers` (WordCNN, backbone classifier),
`registry` (classifiers by name; families in `wordcnn` and `backbone`), `trainer` (one run on
the shared core, early stopping, DP-Adam), `train_classifier` (sweeps, DP-on-real), `scores` (accuracy,
balanced accuracy, macro-F1 from predictions), `ranking` (Spearman, Kendall, RBO), `corpora`
(inputs and checks), `verdict` (does a corpus beat DP-on-real?), `scoring` (`EvaluateConfig`,
`Scorer`: metrics rows), `tables` (metrics.json, metrics.csv, plain summaries), `plots` (PNGs),
`html_report` (report.html), `report` (`evaluate`, `write_report`: runs them), `pipeline` (Beam).
"""
