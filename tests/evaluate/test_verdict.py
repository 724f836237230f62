import itertools

import pytest

from dpsynth.evaluate import verdict

BASELINES = [
    {"baseline": "real", "classifier": "wordcnn", "epsilon": "inf", "accuracy": 0.80, "balanced_accuracy": 0.79},
    {"baseline": "dp_on_real", "classifier": "wordcnn", "epsilon": 3.0, "accuracy": 0.57, "balanced_accuracy": 0.52},
    {"baseline": "dp_on_real", "classifier": "wordcnn", "epsilon": 1.0, "accuracy": 0.55, "balanced_accuracy": 0.50},
    {"baseline": "dp_on_real", "classifier": "backbone", "epsilon": 3.0, "accuracy": 0.70, "balanced_accuracy": 0.70},
]


def _row(name, acc, bal, eps=2.9995, target=3.0, mode="lora", **kw):
    return {"corpus": name, "status": "ok", "epsilon": eps, "target_epsilon": target, "mode": mode,
            "wordcnn_accuracy": acc, "wordcnn_balanced_accuracy": bal, **kw}


def test_the_example_line_of_the_issue():
    v = verdict.corpus_verdict(_row("lora_eps3", 0.61, 0.60), BASELINES, "wordcnn")
    assert v["line"] == ("lora_eps3: eps 3, lora, wordcnn: synthetic 0.610 (balanced 0.600) vs DP-on-real 0.570 (0.520) "
                         "vs real 0.800 (0.790): beats DP-on-real")
    assert v["status"] == verdict.BEATS and v["beats_dp_on_real"] is True and v["epsilon"] == 3.0
    assert (v["dp_on_real_accuracy"], v["dp_on_real_balanced_accuracy"], v["real_balanced_accuracy"]) == (0.57, 0.52, 0.79)


@pytest.mark.parametrize("acc,bal", list(itertools.product([0.50, 0.57, 0.60], [0.45, 0.52, 0.55])))
def test_beats_only_when_ahead_on_accuracy_and_balanced_accuracy(acc, bal):
    v = verdict.corpus_verdict(_row("c", acc, bal), BASELINES, "wordcnn")
    beats = acc > 0.57 and bal > 0.52  # ties do not beat
    assert v["beats_dp_on_real"] is beats and v["status"] == (verdict.BEATS if beats else verdict.DOES_NOT_BEAT)
    assert v["line"].endswith("beats DP-on-real") == beats
    if not beats:
        assert ": does NOT beat DP-on-real" in v["line"]
        if acc > 0.57:
            assert "(ahead on accuracy, not on balanced accuracy)" in v["line"]
        if bal > 0.52:
            assert "(ahead on balanced accuracy, not on accuracy)" in v["line"]


def test_missing_baselines_and_unscored_corpora_are_said_plainly():
    # Epsilon 10 has no DP-on-real baseline; a non-private corpus has none by definition.
    v = verdict.corpus_verdict(_row("eps10", 0.7, 0.7, eps=10.0, target=None), BASELINES, "wordcnn")
    assert v["status"] == verdict.NO_DP_BASELINE and v["beats_dp_on_real"] is None
    assert "no DP-on-real baseline at eps 10 (not run): cannot say whether it beats DP-on-real" in v["line"]
    v = verdict.corpus_verdict(_row("nonpriv", 0.7, 0.7, eps="inf", target=None, mode=None), BASELINES, "wordcnn")
    assert v["epsilon"] == float("inf") and "nonpriv: eps inf, wordcnn: synthetic 0.700" in v["line"]
    assert "no DP-on-real baseline at eps inf (non-private corpus)" in v["line"]
    v = verdict.corpus_verdict({"corpus": "bad", "status": "error", "error": "label sets differ"}, BASELINES, "wordcnn")
    assert v["status"] == verdict.NOT_SCORED and v["line"] == "bad: not scored (label sets differ)"
    # Without a real-data baseline, and from an older metrics.json without balanced accuracy.
    only_dp = [b for b in BASELINES if b["baseline"] == "dp_on_real"]
    old = [{k: v for k, v in b.items() if k != "balanced_accuracy"} for b in only_dp]
    v = verdict.corpus_verdict({"corpus": "old", "status": "ok", "epsilon": 1.0, "wordcnn_accuracy": 0.6}, old, "wordcnn")
    assert v["line"] == ("old: eps 1, wordcnn: synthetic 0.600 (balanced -) vs DP-on-real 0.550 (-) vs real (not run): "
                         "beats DP-on-real (on accuracy; balanced accuracy not recorded)")
    # Per classifier: the backbone's own DP-on-real baseline.
    row = _row("both", 0.61, 0.60, backbone_accuracy=0.65, backbone_balanced_accuracy=0.66)
    vs = verdict.corpus_verdicts([row, _row("a", 0.1, 0.1)], BASELINES, ["wordcnn", "backbone"])
    assert [(v["corpus"], v["classifier"], v["status"]) for v in vs] == [
        ("a", "wordcnn", "does_not_beat"), ("a", "backbone", "not_scored"),
        ("both", "wordcnn", "beats"), ("both", "backbone", "does_not_beat")]
    assert "no backbone classifier" in vs[1]["line"] and "vs real (not run)" in vs[3]["line"]


def test_majority_text():
    text = verdict.majority_text({"label": "pos", "accuracy": 0.73, "balanced_accuracy": 0.5, "macro_f1": 0.42,
                                  "num_classes": 2})
    assert text == ("always answering the majority class 'pos': accuracy 0.730, balanced accuracy 0.500 "
                    "(= 1/2 classes, chance), macro-F1 0.420")
