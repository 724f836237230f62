"""Tests for dpsynth.evaluate.tables: the plain-text summaries of a `metrics.json`."""

from dpsynth.evaluate import tables


def test_plain_summary_says_how_good_the_data_is_in_numbers():
    metrics = {"corpora": [
        {"corpus": "lora-eps3", "status": "ok", "epsilon": 2.9995, "target_epsilon": 3.0, "wordcnn_accuracy": 0.80, "mauve": 0.5,
         "wordcnn_balanced_accuracy": 0.71, "wordcnn_macro_f1": 0.69, "mode": "lora"},
        {"corpus": "prompt-eps3", "status": "ok", "epsilon": 2.9995, "target_epsilon": 3.0, "wordcnn_accuracy": 0.70},
        {"corpus": "broken", "status": "error", "error": "label sets differ"}],
        "baselines": [{"baseline": "real", "classifier": "wordcnn", "epsilon": "inf", "accuracy": 0.90,
                       "balanced_accuracy": 0.88, "macro_f1": 0.87},
                      {"baseline": "dp_on_real", "classifier": "wordcnn", "epsilon": 3.0, "accuracy": 0.75,
                       "balanced_accuracy": 0.60}]}
    text = tables.plain_summary(metrics, ["great"] * 70 + ["other"] * 30)
    # Balanced accuracy and macro-F1 beside accuracy; chance (the majority's balanced accuracy) is 1/2.
    assert "majority class 'great': 0.700 (balanced accuracy 0.500 = 1/2 classes: chance; macro-F1 0.412)" in text
    assert "(no privacy): 0.900 (balanced accuracy 0.880, macro-F1 0.870)" in text
    assert "    balanced accuracy 0.710 (+21.0 points vs chance 0.500), macro-F1 0.690" in text
    # It ends with the verdicts.
    assert text.splitlines()[-3:] == [
        "  broken: not scored (label sets differ)",
        "  lora-eps3: eps 3, lora, wordcnn: synthetic 0.800 (balanced 0.710) vs DP-on-real 0.750 (0.600) vs real "
        "0.900 (0.880): beats DP-on-real",
        "  prompt-eps3: eps 3, wordcnn: synthetic 0.700 (balanced -) vs DP-on-real 0.750 (0.600) vs real 0.900 "
        "(0.880): does NOT beat DP-on-real"]
    assert "majority class 'great': 0.700" in text and "(no privacy): 0.900" in text
    assert "lora-eps3 (epsilon 3): 0.800, +10.0 points vs majority, +5.0 vs DP-on-real (0.750)" in text
    assert "recovers 50% of the real data's gain" in text and "MAUVE 0.500" in text
    assert "carries label signal" in text  # lora
    assert "prompt-eps3 (epsilon 3): 0.700, +0.0 points" in text and "does NOT beat" in text
    assert "broken: not scored (label sets differ)" in text
