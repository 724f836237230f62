"""Selection on the synthetic valid split (dpsynth.evaluate.select)."""

from dpsynth.evaluate.select import select_on_synthetic_valid


def test_best_synthetic_valid_per_group_never_real_test():
    rows = [
        {"corpus": "lora-t1", "mode": "lora", "epsilon": 3.0, "wordcnn_synthetic_valid_accuracy": 0.70, "wordcnn_accuracy": 0.9},
        {"corpus": "lora-t07", "mode": "lora", "epsilon": 3.0, "wordcnn_synthetic_valid_accuracy": 0.80, "wordcnn_accuracy": 0.6},
        {"corpus": "full-t1", "mode": "full", "epsilon": 3.0, "wordcnn_synthetic_valid_accuracy": 0.60, "wordcnn_accuracy": 0.7},
        {"corpus": "full-t07", "mode": "full", "epsilon": 3.0, "wordcnn_synthetic_valid_accuracy": 0.60, "wordcnn_accuracy": 0.8},
        {"corpus": "broken", "mode": "full", "epsilon": 3.0, "status": "error"},
    ]
    out = select_on_synthetic_valid(rows, ("mode", "epsilon"))
    # lora: the higher synthetic-valid score wins although its real test accuracy is lower
    assert [(r["corpus"], r["candidates"]) for r in out] == [("lora-t07", 2), ("full-t1", 2)]  # tie -> earlier
    assert all(r["selected_by"] == "wordcnn_synthetic_valid_accuracy" for r in out)
    assert select_on_synthetic_valid(rows, ("mode",), classifier="backbone") == []
