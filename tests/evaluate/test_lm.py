import math

import jax

import numpy as np
import pytest

from dpsynth.evaluate import lm
from tests.evaluate.conftest import make_records


def _brute_nll(cfg, variables, tok, record, template):
    """Scores one example alone, token by token from the full logits (no padding, no batching)."""
    from dpsynth.models import Transformer
    from dpsynth.data.tokenizers import BOS_ID, EOS_ID

    prefix = [BOS_ID] + list(tok.encode(template.replace("{label}", record["label"])))
    body = list(tok.encode(record["text"])) + [EOS_ID]
    row = np.array([prefix + body], np.int32)
    logits = np.asarray(jax.jit(Transformer(cfg).apply)(variables, row[:, :-1]))[0]
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(-1, keepdims=True)
    nll = [-logp[t, row[0, t + 1]] for t in range(len(prefix) - 1, row.shape[1] - 1)]
    return float(np.sum(nll)), len(nll)


def test_perplexity_matches_per_example_brute_force(tiny_lm):
    cfg, variables, tok = tiny_lm
    model = lm.LanguageModel(cfg, variables, tok)
    recs = make_records(5, 5)
    out = model.perplexity(recs, ["great", "other"], batch_size=4)
    sums = [_brute_nll(cfg, variables, tok, r, model.template) for r in recs]
    total, count = sum(s for s, _ in sums), sum(c for _, c in sums)
    assert out["target_tokens"] == count and out["examples"] == 5
    assert out["perplexity"] == pytest.approx(math.exp(total / count), rel=2e-4)


def test_embed_is_mean_pooled_and_batch_invariant(tiny_lm):
    cfg, variables, tok = tiny_lm
    model = lm.LanguageModel(cfg, variables, tok)
    texts = [r["text"] for r in make_records(5, 6)]
    a = model.embed(texts, batch_size=2)
    b = model.embed(texts[:1], batch_size=8)
    assert a.shape == (5, cfg.d_model)
    np.testing.assert_allclose(a[0], b[0], atol=1e-5)
    with pytest.raises(Exception, match="unknown label"):
        model.perplexity([{"text": "x", "label": "nope"}], ["great", "other"])
