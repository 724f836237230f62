"""The evaluation report's files are byte-identical for a fixed input (metrics.json, metrics.csv,
report.html): a pin against accidental changes when the report code moves."""

import math
import os
import pathlib

from dpsynth.evaluate import report

GOLDEN = pathlib.Path(__file__).parent / "golden"


def fixed_input():
    """Two scored corpora (private, non-private), one error row, both baselines and the majority."""
    trials = [{"valid_accuracy": 0.6 + 0.05 * i, "real_test_accuracy": 0.55 + 0.04 * i} for i in range(3)]
    ok = {"status": "ok", "mauve": 0.8125, "mauve_std": 0.0125, "mauve_star": 0.75, "unigram_mauve": 0.9,
          "bigram_mauve": 0.7, "length_mauve": 0.95, "perplexity": 12.5, "n_train": 40, "invalid_rows": 1,
          "wordcnn_accuracy": 0.6875, "wordcnn_accuracy_std": 0.03125, "wordcnn_balanced_accuracy": 0.625,
          "wordcnn_macro_f1": 0.5, "wordcnn_rank_spearman": 0.5, "wordcnn_rank_kendall": 1 / 3,
          "wordcnn_rank_rbo": 0.75}
    rows = [
        {"corpus": "lora_eps3", "private": True, "mode": "lora", "target_epsilon": 3.0, "epsilon": 2.9995, **ok},
        {"corpus": "nonprivate <b>", "private": False, "mode": None, "epsilon": math.inf, **ok,
         "wordcnn_accuracy": 0.75, "perplexity": None},
        {"corpus": "broken", "status": "error", "error": "label sets differ: <x> & y", "private": None},
    ]
    card = {"private": True, "epsilon": 2.9995, "delta": 1e-4, "accountant": "rdp", "mode": "lora",
            "noise_multiplier": 1.1, "steps": 100, "clip_norm": 1.0, "contamination_sha256": "ab" * 32,
            "side_channels": [{"name": "label distribution"}], "temperature": 1.0, "top_k": None,
            "num_decodes": None, "invalid_rows": 1}
    plots = [
        {"corpus": "lora_eps3", "card": card, "generation_report": {"kept": 40, "dropped": 2, "note": "a & b"},
         "examples": {"bad": ["awful <thing>"], "great": ["lovely", "fine ..."]},
         "lengths": ([10, 20, 30, 400], [12, 22, 25], [0.0, 100.0, 200.0, 300.0, 400.0]),
         "bigram_curve": [[0.1, 0.9], [0.5, 0.5], [0.9, 0.1]], "trials": {"wordcnn": trials}},
        {"corpus": "nonprivate <b>", "card": {**card, "private": False, "epsilon": None}, "generation_report": None,
         "examples": {}, "trials": {"wordcnn": trials[:2]}},
        {"corpus": "broken"},
    ]
    baselines = [
        {"baseline": "real", "classifier": "wordcnn", "epsilon": math.inf, "accuracy": 0.8, "accuracy_std": 0.01,
         "balanced_accuracy": 0.79, "macro_f1": 0.78},
        {"baseline": "dp_on_real", "classifier": "wordcnn", "epsilon": 3.0, "accuracy": 0.65, "accuracy_std": 0.02,
         "balanced_accuracy": 0.6, "macro_f1": 0.55, "epsilon_spent": {"rdp": 2.99, "pld": 2.7}, "delta": 1e-4,
         "sweep_accounting": "composed", "vocabulary": "hashing",
         "side_channels": [{"name": "fixed seed", "detail": "seed <0>"}],
         "privacy_report": "baselines/dp_on_real-wordcnn-eps3/privacy_report.json"},
    ]
    majority = {"label": "great", "num_classes": 2, "n_test": 100, "accuracy": 0.7, "balanced_accuracy": 0.5,
                "macro_f1": 0.4117647058823529}
    return rows, plots, baselines, majority


def write_fixed(out_dir):
    rows, plots, baselines, majority = fixed_input()
    return report.write_report(rows, plots, baselines, str(out_dir), ["wordcnn"], majority=majority)


def test_report_files_are_byte_identical(tmp_path):
    paths = write_fixed(tmp_path)
    assert [os.path.relpath(p, tmp_path) for p in paths["plots"]] == [
        "plots/accuracy_wordcnn.png", "plots/length_1.png", "plots/bigram_frontiers.png", "plots/ranking_wordcnn.png"]
    for key, name in (("metrics_json", "metrics.json"), ("metrics_csv", "metrics.csv"), ("report_html", "report.html")):
        assert pathlib.Path(paths[key]).read_bytes() == (GOLDEN / name).read_bytes(), name
