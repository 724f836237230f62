"""The backbone classifier family's own settings: `truncate` against a brute-force reference,
and the path a family setting takes (spec options, evaluate config, flags) without other files."""

import numpy as np
import pytest

from dpsynth.evaluate import backbone, registry, scoring
from dpsynth.evaluate import train_classifier as tc
from tests.evaluate.conftest import make_records


def _reference(tok, texts, max_len, pad_id, tail):
    rows = np.full((len(texts), max_len), pad_id, np.int32)
    for i, t in enumerate(texts):
        ids = list(tok.encode(t))
        ids = ids[len(ids) - (max_len - 1):] if tail and len(ids) > max_len - 1 else ids[: max_len - 1]
        row = [tok.bos_id] + ids
        rows[i, : len(row)] = row
    return rows


@pytest.mark.parametrize("truncate", backbone.TRUNCATIONS)
def test_truncate_reads_the_first_or_last_tokens_after_bos(tiny_lm, truncate):
    cfg, variables, tok = tiny_lm
    texts = [r["text"] for r in make_records(20, 5)] + ["x", "a much longer text " * 12]
    lm = backbone.Backbone(cfg, variables["params"], tok)
    for max_len in (2, 6, 16):
        model = backbone.backbone_model(lm, 2, max_len=max_len, settings=backbone.BackboneSettings(truncate=truncate))
        want = _reference(tok, texts, max_len, model.featurize.pad_id, tail=truncate == "tail")
        np.testing.assert_array_equal(model.featurize(texts), want)
    head = backbone.backbone_model(lm, 2, max_len=6)  # the default: the featurizer of before
    assert type(head.featurize) is backbone.classifiers.SubwordFeaturizer


def test_a_family_setting_reaches_the_spec_the_evaluate_config_and_the_flags():
    kind = registry.get("backbone")
    spec = tc.ClassifierSpec(kind="backbone", model_dir="m", options={"truncate": "tail"})
    assert kind.settings_of(spec) == backbone.BackboneSettings(truncate="tail")
    assert kind.settings_of(tc.ClassifierSpec(kind="backbone", model_dir="m")) == backbone.BackboneSettings()
    with pytest.raises(ValueError, match="backbone.truncate: must be one of head, tail"):
        tc.ClassifierSpec(kind="backbone", model_dir="m", options={"truncate": "middle"})
    with pytest.raises(ValueError, match="backbone.pad: not an option of BackboneSettings"):
        tc.ClassifierSpec(kind="backbone", model_dir="m", options={"pad": 1})
    with pytest.raises(ValueError, match="wordcnn.truncate: not an option of WordCNNSettings"):
        tc.ClassifierSpec(kind="wordcnn", options={"truncate": "tail"})
    # pooling and freeze are the backbone's, vocabulary the WordCNN's: validated by each family's declaration.
    with pytest.raises(ValueError, match="backbone.pooling: must be one of mean, last"):
        tc.ClassifierSpec(kind="backbone", model_dir="m", options={"pooling": "max"})
    with pytest.raises(ValueError, match="wordcnn.vocabulary: must be one of"):
        tc.ClassifierSpec(kind="wordcnn", options={"vocabulary": "bytes"})
    with pytest.raises(ValueError, match="'tokenizer' needs model_dir"):
        tc.ClassifierSpec(kind="wordcnn", options={"vocabulary": "tokenizer"})
    assert registry.get("wordcnn").settings_of(tc.ClassifierSpec(options={"vocabulary": "hashing"})).vocabulary == "hashing"
    config = scoring.EvaluateConfig(classifiers=("backbone",), model_dir="m",
                                    classifier_options={"backbone": {"truncate": "tail"}})
    assert config.spec("backbone").options == {"truncate": "tail"} and config.spec("wordcnn").options == {}
    with pytest.raises(ValueError, match="classifier must be one of"):
        scoring.EvaluateConfig(classifier_options={"nosuch": {}})
    import argparse

    p = argparse.ArgumentParser()
    registry.add_setting_flags(p)
    assert registry.options_from_args(p.parse_args([])) == {}
    assert registry.options_from_args(p.parse_args(["--backbone-truncate", "tail"])) == {"backbone": {"truncate": "tail"}}
    with pytest.raises(SystemExit):
        p.parse_args(["--backbone-truncate", "middle"])  # choices from the setting's declaration
