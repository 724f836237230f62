import numpy as np
import pytest
from sklearn.metrics import accuracy_score, balanced_accuracy_score, f1_score

from dpsynth.evaluate import scores


@pytest.mark.parametrize("num_classes", [2, 3, 4, 7])
@pytest.mark.parametrize("n", [1, 5, 40, 333])
def test_scores_match_scikit_learn_on_random_predictions(num_classes, n):
    import warnings

    rng = np.random.default_rng(1000 * num_classes + n)
    for trial in range(20):
        # Skewed true labels (some classes may be absent), predictions that are partly right and
        # may name classes the truth lacks.
        t = rng.choice(num_classes, n, p=rng.dirichlet(np.full(num_classes, 0.5)))
        p = np.where(rng.random(n) < rng.random(), t, rng.integers(num_classes, size=n))
        got = scores.classification_scores(t, p)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # sklearn warns about classes absent from y_true
            want = (accuracy_score(t, p), balanced_accuracy_score(t, p), f1_score(t, p, average="macro"))
        assert got.accuracy == want[0]  # the same division
        assert got.balanced_accuracy == pytest.approx(want[1], abs=1e-12)
        assert got.macro_f1 == pytest.approx(want[2], abs=1e-12)
        assert list(got.as_dict()) == list(scores.METRICS)


def test_scores_edge_cases():
    perfect = scores.classification_scores([0, 1, 2, 2], [0, 1, 2, 2])
    assert perfect.as_dict() == {"accuracy": 1.0, "balanced_accuracy": 1.0, "macro_f1": 1.0}
    # 3 of 4 right by always answering the majority: accuracy 0.75, balanced accuracy 1/2.
    const = scores.classification_scores([1, 1, 1, 0], [1, 1, 1, 1])
    assert const.accuracy == 0.75 and const.balanced_accuracy == 0.5 and const.macro_f1 == pytest.approx(6 / 7 / 2)
    # Large ids and uint dtypes are class ids like any other.
    assert scores.classification_scores(np.array([900, 5], np.uint32), np.array([900, 900], np.uint32)).accuracy == 0.5
    with pytest.raises(ValueError, match="as many"):
        scores.classification_scores([0, 1], [0])
    with pytest.raises(ValueError, match="as many"):
        scores.classification_scores([], [])
    with pytest.raises(ValueError, match="integer"):
        scores.classification_scores([0.0, 1.0], [0, 1])


@pytest.mark.parametrize("counts", [{"a": 7, "b": 3}, {"x": 5, "y": 5}, {"n": 2, "p": 9, "q": 4, "r": 1}])
def test_majority_predictor_scores_one_over_k_balanced(counts):
    labels = [name for name, c in counts.items() for _ in range(c)]
    np.random.default_rng(0).shuffle(labels)
    m = scores.majority(labels)
    top = max(sorted(counts.items()), key=lambda kv: kv[1])[0]
    k, n = len(counts), sum(counts.values())
    assert m.label == top and m.num_classes == k and m.n == n
    assert m.scores.accuracy == counts[top] / n
    assert m.scores.balanced_accuracy == pytest.approx(1 / k)
    share = counts[top] / n
    assert m.scores.macro_f1 == pytest.approx(2 * share / (1 + share) / k)  # F1 of the majority class, 0 elsewhere
    names = sorted(counts)
    want = f1_score([names.index(x) for x in labels], [names.index(top)] * n, average="macro")
    assert m.scores.macro_f1 == pytest.approx(want, abs=1e-12)
    assert m.as_dict()["balanced_accuracy"] == m.scores.balanced_accuracy
    with pytest.raises(ValueError):
        scores.majority([])
