"""The label-prompt contract and Prefix-LM rows: prefix gets no loss (and no gradient),
per-example normalisation, truncation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpsynth.data.tokenizers import BOS_ID, EOS_ID
from dpsynth.train import prompts
from dpsynth.train.prompts import ExampleConfig, ExampleError, encode_examples
from tests.train.reference import prefix_lm_loss


class CharTokenizer:
    """One id per character (ids 10 + ord % 200): lengths are easy to reason about."""

    def encode(self, text):
        return np.array([10 + ord(c) % 200 for c in text], np.int32)


RECORDS = [{"id": "a", "text": "hello", "label": "pos"}, {"id": "b", "text": "xy", "label": "neg"}]


def test_layout_and_weights():
    enc = encode_examples(RECORDS, CharTokenizer(), ["pos", "neg"], ExampleConfig(template="<{label}>"))
    prefix = len("<pos>") + 1  # BOS + prompt
    row = np.concatenate([enc.inputs[0][:1], enc.targets[0]])
    assert row[0] == BOS_ID and row[prefix + 5] == EOS_ID
    # Targets t >= prefix - 1 predict text/EOS tokens: exactly len(text) + 1 weighted targets.
    assert enc.weights[0].sum() == 6 and enc.weights[1].sum() == 3
    assert (enc.weights[0][: prefix - 1] == 0).all() and (enc.weights[0][prefix - 1 : prefix + 5] == 1).all()
    full = encode_examples(RECORDS, CharTokenizer(), ["pos", "neg"], ExampleConfig(template="<{label}>", full_lm=True))
    assert full.weights[0].sum() == 6 + len("<pos>")


def test_truncation_counted_and_bad_input():
    long = [{"id": "c", "text": "z" * 100, "label": "pos"}] + RECORDS
    enc = encode_examples(long, CharTokenizer(), ["pos", "neg"], ExampleConfig(template="[{label}] ", max_tokens=20))
    assert enc.truncated == 1 and enc.inputs.shape[1] == 19
    assert EOS_ID not in enc.targets[0]  # a truncated text has no EOS
    with pytest.raises(ExampleError, match="unknown label 'pos'"):
        encode_examples(RECORDS, CharTokenizer(), ["neg"], where="train.jsonl")
    with pytest.raises(ExampleError, match="empty"):
        encode_examples([], CharTokenizer(), ["neg"])
    with pytest.raises(ExampleError, match="label"):
        ExampleConfig(template="no field")


def test_per_example_normalisation_and_no_gradient_into_prefix_targets():
    enc = encode_examples(RECORDS, CharTokenizer(), ["pos", "neg"])
    t = enc.targets.shape[1]
    logits = jax.random.normal(jax.random.PRNGKey(0), (2, t, 256))
    targets, weights = jnp.asarray(enc.targets), jnp.asarray(enc.weights)
    loss = prefix_lm_loss(logits, targets, weights)
    logp = jax.nn.log_softmax(logits)
    nll = -np.take_along_axis(np.asarray(logp), np.asarray(targets)[..., None], -1)[..., 0]
    for i in range(2):
        w = np.asarray(weights[i])
        np.testing.assert_allclose(loss[i], (nll[i] * w).sum() / w.sum(), rtol=1e-5)
    # Duplicating an example's target tokens' loss does not scale it with length: mean, not sum.
    g = jax.grad(lambda lg: prefix_lm_loss(lg, targets, weights).sum())(logits)
    prefix_positions = np.asarray(weights) == 0
    assert np.all(np.asarray(g)[prefix_positions] == 0)
    assert np.any(np.asarray(g)[~prefix_positions] != 0)


def test_prompt_ids_manifest_fields_and_bad_templates():
    tok = CharTokenizer()
    ids = prompts.prompt_ids(tok, "[{label}] ", "pos")
    assert ids.dtype == np.int32 and ids[0] == BOS_ID and list(ids[1:]) == list(tok.encode("[pos] "))
    assert prompts.prompt_text("[{label}] ", "great") == "[great] "
    # The tuner's rows start with exactly these ids.
    enc = encode_examples(RECORDS, tok, ["pos", "neg"], ExampleConfig(template="[{label}] "))
    np.testing.assert_array_equal(enc.inputs[0][: ids.size], ids)
    # One manifest key for the template and one for the labels, written and read by this module.
    manifest = prompts.manifest_fields("<{label}>", ["pos", "neg"])
    assert manifest == {prompts.TEMPLATE_KEY: "<{label}>", prompts.LABELS_KEY: ["pos", "neg"]}
    assert prompts.TEMPLATE_KEY == "prompt_template" and prompts.LABELS_KEY == "labels"
    assert prompts.template_of(manifest) == "<{label}>" and prompts.labels_of(manifest) == ("pos", "neg")
    assert prompts.template_of({}) == prompts.DEFAULT_TEMPLATE and prompts.labels_of({}) is None
    for bad in (lambda: prompts.prompt_text("no field", "great"), lambda: prompts.template_of({"prompt_template": "x"}),
                lambda: prompts.manifest_fields("x", ["pos"])):
        with pytest.raises(ExampleError, match="label"):
            bad()


def test_null_prompt_rows_train_the_text_only():
    tok = CharTokenizer()
    null = prompts.encode_null_examples(RECORDS, tok, ExampleConfig(template="<{label}>"))
    ids = prompts.null_prompt_ids(tok, "<{label}>")
    assert list(ids[1:]) == list(tok.encode("<>")) and prompts.prompt_text("<{label}>", prompts.NULL_LABEL) == "<>"
    np.testing.assert_array_equal(null.inputs[0][: ids.size], ids)
    # Prefix-LM: the null prefix gets weight 0, the text and EOS weight 1 (as for a label prompt).
    assert null.weights[0].sum() == len("hello") + 1 and (null.weights[0][: ids.size - 1] == 0).all()
    assert prompts.manifest_fields("<{label}>", ["a"], 0.25)[prompts.LABEL_DROPOUT_KEY] == 0.25
    assert prompts.LABEL_DROPOUT_KEY not in prompts.manifest_fields("<{label}>", ["a"], 0.0)
    assert prompts.label_dropout_of({}) == 0.0 and prompts.label_dropout_of({"label_dropout": 0.1}) == 0.1


def test_label_dropout_rows():
    n, p = 50, 0.3
    idx = np.array([[3, 7, -1], [0, 49, 12]])
    np.testing.assert_array_equal(prompts.label_dropout_rows(idx, 5, seed=9, p=0.0, num_examples=n), idx)
    drops = []
    for step in range(400):
        rows = prompts.label_dropout_rows(idx, step, seed=9, p=p, num_examples=n)
        assert rows[0, 2] == -1  # padding stays padding
        assert np.all((rows[idx >= 0] % n) == idx[idx >= 0])  # an example's own row or its null row, never another
        drops.append(rows[idx >= 0] >= n)
        # The draw is per (step, example): the same however the indices are split into microbatches.
        parts = [prompts.label_dropout_rows(m, step, seed=9, p=p, num_examples=n) for m in idx]
        np.testing.assert_array_equal(np.stack(parts), rows)
    rate = np.mean(drops)
    assert abs(rate - p) < 4 * np.sqrt(p * (1 - p) / np.size(drops))
    other_seed = [prompts.label_dropout_rows(idx, s, seed=10, p=p, num_examples=n) for s in range(20)]
    assert any(not np.array_equal(a, prompts.label_dropout_rows(idx, s, seed=9, p=p, num_examples=n))
               for s, a in enumerate(other_seed))
