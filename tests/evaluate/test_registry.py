"""The classifier registry: a classifier is one `ClassifierKind` and one registry entry.

The bag-of-words logistic regression below is registered by this test alone (no library file
names it) and trains, is selected and is scored through the normal path (`train_classifier.
classify`, non-private and DP-on-real), which shows that nothing else branches on the name.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from dpsynth.evaluate import classifiers, registry, scoring
from dpsynth.evaluate import text as text_lib
from dpsynth.evaluate import train_classifier as tc
from dpsynth.evaluate import trainer as tr
from tests.evaluate.conftest import make_records


class BagOfWords(nn.Module):
    """Logistic regression on the mean of the words' per-class weights."""

    vocab_size: int
    num_classes: int

    @nn.compact
    def __call__(self, tokens):
        mask = (tokens != text_lib.PAD)[..., None].astype(jnp.float32)
        weights = nn.Embed(self.vocab_size, self.num_classes, name="weights")(tokens)
        bias = self.param("bias", nn.initializers.zeros, (self.num_classes,))
        return (weights * mask).sum(axis=1) / jnp.maximum(mask.sum(axis=1), 1.0) + bias


class BagOfWordsKind(registry.ClassifierKind):
    """Hashed words (no data read), `spec.max_len` of them."""

    def make(self, spec, train_texts, num_classes, *, backbone=None, private=False):
        assert train_texts is None  # reads_train_texts is False by default
        feat = classifiers.HashingWordFeaturizer(64, spec.max_len)
        module = BagOfWords(feat.vocab_size, num_classes)
        params = module.init(jax.random.PRNGKey(0), jnp.zeros((1, spec.max_len), jnp.int32))["params"]
        vocab = {"source": "hashing", "detail": "words hashed into 64 buckets", "size": feat.vocab_size}
        return tr.Model(module, params, {}, feat, "bow", vocabulary=vocab)


@pytest.fixture
def bow(monkeypatch):
    monkeypatch.setitem(registry.REGISTRY, "bow", BagOfWordsKind())
    return "bow"


def test_the_registry_names_its_classifiers_and_refuses_others():
    assert registry.names() == ("wordcnn", "backbone")
    assert registry.get("backbone").needs_model_dir and registry.get("backbone").uses_backbone
    assert not registry.get("wordcnn").needs_model_dir
    with pytest.raises(ValueError, match="classifier must be one of .*'wordcnn'.*got 'bow'"):
        tc.ClassifierSpec(kind="bow")
    with pytest.raises(ValueError, match="unknown classifier 'bow'"):
        scoring.EvaluateConfig(classifiers=("bow",))


def test_a_classifier_registered_in_a_test_trains_through_the_normal_path(bow):
    train, valid, test = make_records(200, 1, signal=3), make_records(60, 2, signal=3), make_records(100, 3, signal=3)
    spec = tc.ClassifierSpec(kind=bow, max_len=16)
    assert spec.input_len == 16 and registry.names()[-1] == bow
    with pytest.raises(ValueError, match=f"the {bow} classifier has no settings"):  # a family without settings
        tc.ClassifierSpec(kind=bow, options={"vocabulary": "hashing"})
    assert scoring.EvaluateConfig(classifiers=("wordcnn", bow)).sweep_for(bow) == tc.SweepConfig()
    sweep = tc.SweepConfig(learning_rates=(1e-3, 0.3), weight_decays=(0.0,), repeats=1,
                           train=tr.TrainConfig(max_epochs=6, patience=6))
    res = tc.classify(train, valid, {"real": test}, spec, sweep)
    assert len(res.trials) == 2 and res.privacy is None
    best = max(res.trials, key=lambda t: t["valid_accuracy"])
    assert res.selected["learning_rate"] == best["learning_rate"]
    assert res.test_mean["real"] > 0.8  # far above chance (0.5) on the toy task

    dp = tr.DPConfig(epsilon=8.0, expected_batch_size=50, microbatch_size=25, epochs=2, seed=0)
    res = tc.classify(train, valid, {"real": test}, spec, tc.SweepConfig(learning_rates=(0.3,), weight_decays=(0.0,),
                                                                        clip_norms=(1.0,), repeats=1), dp=dp)
    rep = res.privacy
    assert rep["classifier"] == bow and rep["vocabulary"]["source"] == "hashing"
    assert rep["max_tokens_per_example"] == 16 and res.trials[0]["epsilon"] <= 8.0
    assert tc.privacy_summary(rep)["trials_accounted"] == 1
