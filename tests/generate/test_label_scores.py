"""Label margins (dpsynth.generate.label_scores) and the off_label post-processing filter."""

import json
import os

import numpy as np
import pytest

from dpsynth.generate.job import generate
from dpsynth.generate.label_scores import label_log_likelihoods, label_margins, record_log_likelihoods
from dpsynth.generate.postprocess import PostprocessConfig, filter_samples, label_quotas
from dpsynth.train import prompts
from tests.generate.fakes import (BigramDecoder, FakeTokenizer, load_fake_bundle, make_tables, score_reference,
                                  write_fake_model_dir)
from tests.generate.test_job import MAX_LEN, TABLE_SEED, _config


def test_log_likelihoods_equal_brute_force_at_any_batching():
    table, pos_bias = make_tables(12, 40, seed=3)
    params = {"table": table, "pos_bias": pos_bias}
    rng = np.random.default_rng(0)
    prompt_ids = {"a": np.array([2, 5], np.int32), "bb": np.array([2, 6, 7, 8], np.int32), "c": np.array([2, 9], np.int32)}
    samples = [rng.integers(3, 12, size=n).astype(np.int32) for n in (1, 5, 17, 9, 30)]
    want = np.array([[score_reference(table, pos_bias, p, s, finished=False) for p in prompt_ids.values()]
                     for s in samples])
    for batch_size, bucket in ((1, 1), (4, 16), (32, 8)):
        got = label_log_likelihoods(BigramDecoder(), params, prompt_ids, samples, batch_size=batch_size, bucket=bucket)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    # vocab_limit renormalises over the allowed ids only.
    limited = label_log_likelihoods(BigramDecoder(), params, prompt_ids, [np.array([4, 5], np.int32)], vocab_limit=11)
    assert not np.allclose(limited, label_log_likelihoods(BigramDecoder(), params, prompt_ids, [np.array([4, 5], np.int32)]))


def test_record_log_likelihoods_score_each_text_cut_to_the_example_length():
    """Labelled records: each text under every label prompt, cut to max_tokens less the longest prompt, equal to
    scoring the prompts and cut token ids directly; the own-label column of each record."""
    table, pos_bias = make_tables(12, 40, seed=3)
    params = {"table": table, "pos_bias": pos_bias}
    tok, template, labels = FakeTokenizer(), "{label}", ["ab", "cdeg"]
    records = [{"text": "abcdefghabc", "label": "cdeg"}, {"text": "hh", "label": "ab"}]
    ll, own = record_log_likelihoods(BigramDecoder(), params, tok, template, labels, records, max_tokens=10)
    ids = {l: prompts.prompt_ids(tok, template, l) for l in labels}
    room = 10 - max(len(p) for p in ids.values())
    assert room < len(records[0]["text"])  # the first text is cut
    want = label_log_likelihoods(BigramDecoder(), params, ids, [tok.encode(r["text"])[:room] for r in records])
    np.testing.assert_allclose(ll, want)
    assert own == [1, 0]


def test_margins():
    ll = np.array([[-1.0, -3.0, -2.0], [-5.0, -4.0, -4.5], [-2.0, -2.0, -9.0]])
    np.testing.assert_allclose(label_margins(ll, [0, 0, 1]), [1.0, -1.0, 0.0])
    assert np.isinf(label_margins(np.array([[-1.0]]), [0])).all()


def test_decoder_without_sequence_logits_is_refused():
    class NoScore:
        pass

    with pytest.raises(TypeError, match="sequence_logits"):
        label_log_likelihoods(NoScore(), {}, {"a": np.array([1])}, [np.array([4])])


def test_quotas_follow_the_drawn_labels():
    assert label_quotas(["a"] * 30 + ["b"] * 10, 8) == {"a": 6, "b": 2}
    q = label_quotas(["a", "b", "c"] * 3 + ["a"], 7)
    assert sum(q.values()) == 7 and q["a"] == 3
    assert label_quotas([], 5) == {}


def rec(text, label, margin):
    return {"text": text, "label": label, "finished": True, "label_margin": margin}


def test_off_label_filter_keeps_each_labels_share():
    records = ([rec(f"a{i}", "a", m) for i, m in enumerate([0.5, -1, 2, 0.0, 3, 1, 1, 1])]
               + [rec(f"b{i}", "b", m) for i, m in enumerate([-2, -1, 0.1, 4])])
    cfg = PostprocessConfig(drop=("off_label",), oversample=2.0)
    kept, counts = filter_samples(records, cfg, want=6)  # drawn 8 a : 4 b -> quotas 4 : 2
    assert [r["text"] for r in kept] == ["a0", "a2", "a4", "a5", "b2", "b3"]
    assert counts == {"drawn": 12, "kept": 6, "unused": 2, "dropped_empty": 0, "dropped_truncated": 0,
                      "dropped_duplicate": 0, "dropped_off_label": 4}
    kept, counts = filter_samples(records, PostprocessConfig(drop=("off_label",), min_margin=1.5), want=12)
    assert {r["text"] for r in kept} == {"a2", "a4", "b3"}
    with pytest.raises(ValueError, match="record 0.*label_margin"):
        filter_samples([{"text": "x", "label": "a"}], cfg, want=1)
    # The margin threshold is in the config's JSON only when the filter is on (old job hashes stay valid).
    assert "min_margin" not in PostprocessConfig(drop=("empty",)).to_json()
    assert cfg.to_json()["min_margin"] == 0.0


def test_job_records_margins_and_keeps_the_label_distribution(tmp_path):
    model = write_fake_model_dir(str(tmp_path / "m"), max_len=MAX_LEN, seed=TABLE_SEED)
    post = PostprocessConfig(drop=("off_label",), oversample=3.0)
    generate(_config(model, tmp_path / "o", valid_examples=0, postprocess=post), loader=load_fake_bundle)
    shards = sorted(os.listdir(tmp_path / "o" / "shards"))
    rows = [json.loads(l) for s in shards for l in open(tmp_path / "o" / "shards" / s)]
    assert len(rows) == 3 * 37 and all("label_margin" in r for r in rows)
    # Each margin equals the brute-force one under the fake model's two label prompts.
    z = np.load(os.path.join(model, "fake_tables.npz"))
    tok = FakeTokenizer()
    prompt_of = {l: prompts.prompt_ids(tok, "{label}", l) for l in ("great", "other")}
    for r in rows[:20]:
        ids = tok.encode(r["text"]) if r["text"] else np.zeros((0,), np.int32)
        ll = {l: score_reference(z["table"], z["pos_bias"], p, ids, r["finished"]) for l, p in prompt_of.items()}
        other = "other" if r["label"] == "great" else "great"
        assert r["label_margin"] == pytest.approx(ll[r["label"]] - ll[other], abs=2e-3)
    train = [json.loads(l) for l in open(tmp_path / "o" / "train.jsonl")]
    drawn = [r["label"] for r in rows]
    assert {l: sum(r["label"] == l for r in train) for l in ("great", "other")} == label_quotas(drawn, 37)
    assert sorted(train[0]) == ["label", "text"]  # the margin never reaches the released corpus
    counts = json.load(open(tmp_path / "o" / "generation_report.json"))["postprocess"]["train"]
    assert counts["kept"] == 37 and counts["dropped_off_label"] == sum(r["label_margin"] <= 0 for r in rows)


@pytest.mark.parametrize("kw", [{}, {"lora_rank": 2, "prompt_length": 3}])
def test_transformer_scores_equal_the_samplers_own(kw):
    """Under the generating label, the scorer reproduces the sampler's sample log-likelihoods
    (KV-cache decoding vs one teacher-forced pass; soft prompt and LoRA included)."""
    import jax

    from dpsynth.generate.sampler import Sampler, SamplerConfig, TransformerDecodeModel, example_keys
    from dpsynth.models import Transformer, get_config

    config = get_config("tiny", vocab_size=64, max_len=32, **kw)
    variables = jax.jit(Transformer(config).init)(jax.random.PRNGKey(0), np.zeros((1, 8), np.int32))
    if "lora" in variables:
        variables["lora"] = jax.tree.map(lambda x: x + 0.03, variables["lora"])
    decoder = TransformerDecodeModel(config)
    cfg = SamplerConfig(max_len=20, batch_size=4, temperature=1.0, vocab_limit=60)
    prompt_ids = {"x": np.array([2, 7, 9], np.int32), "y": np.array([2, 11], np.int32)}
    labels = ["x", "y", "x", "y", "y"]
    out = Sampler(decoder, cfg).sample(variables, [prompt_ids[l] for l in labels],
                                       example_keys(np.array([0, 7], np.uint32), range(len(labels))))
    samples = [np.append(out.tokens[r, : out.lengths[r]], [cfg.eos_id] if out.finished[r] else [])
               for r in range(len(labels))]
    ll = label_log_likelihoods(decoder, variables, prompt_ids, samples, batch_size=3,
                               vocab_limit=cfg.vocab_limit, banned_ids=cfg.banned_ids)
    own = ll[np.arange(len(labels)), [0 if l == "x" else 1 for l in labels]]
    np.testing.assert_allclose(own, out.scores, rtol=1e-4, atol=1e-3)
