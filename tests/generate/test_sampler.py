"""Sampler properties against brute-force references on a fake model with known logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpsynth.data.tokenizers import EOS_ID
from dpsynth.generate.sampler import NEG_INF, Sampler, SamplerConfig, draw, example_keys, seed_to_key_data
from tests.generate.fakes import (BigramDecoder, greedy_reference, log_softmax_np, logits_np, make_tables,
                                  score_reference)

VOCAB, MAX_LEN = 12, 24


@pytest.fixture(scope="module")
def tables():
    table, pos_bias = make_tables(VOCAB, MAX_LEN, seed=1)
    return table, pos_bias, {"table": table, "pos_bias": pos_bias}


def _prompts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(4, VOCAB, size=rng.integers(1, 6)).astype(np.int32) for _ in range(n)]


def _keys(n, seed=7):
    return example_keys(seed_to_key_data(seed), range(n))


def _rows(out, i):
    return list(out.tokens[i, : out.lengths[i]])


@pytest.mark.parametrize(
    "cfg",
    [
        SamplerConfig(temperature=0.0, max_len=MAX_LEN, batch_size=4),
        SamplerConfig(temperature=1e-5, max_len=MAX_LEN, batch_size=4),
        SamplerConfig(temperature=1.0, top_k=1, max_len=MAX_LEN, batch_size=4),
        SamplerConfig(temperature=0.0, num_decodes=3, max_len=MAX_LEN, batch_size=4),
    ],
    ids=["t0", "t-tiny", "topk1", "t0-n3"],
)
def test_greedy_limits_equal_bruteforce_greedy(tables, cfg):
    table, pos_bias, params = tables
    prompts = _prompts(9)
    out = Sampler(BigramDecoder(), cfg).sample(params, prompts, _keys(9))
    for i, p in enumerate(prompts):
        ref, fin, score = greedy_reference(table, pos_bias, p, MAX_LEN)
        assert _rows(out, i) == ref
        assert bool(out.finished[i]) == fin
        np.testing.assert_allclose(out.scores[i], score, rtol=1e-4, atol=1e-4)
        assert np.all(out.tokens[i, out.lengths[i] :] == cfg.pad_id)


def test_num_decodes_keeps_most_likely_candidate(tables):
    table, pos_bias, params = tables
    prompts = _prompts(6, seed=3)
    cfg = SamplerConfig(temperature=1.5, num_decodes=5, max_len=MAX_LEN, batch_size=4)
    out = Sampler(BigramDecoder(), cfg).sample(params, prompts, _keys(6))
    distinct = 0
    for i, p in enumerate(prompts):
        refs = []
        for j in range(cfg.num_decodes):
            gen = list(out.all_tokens[i, j, : out.all_lengths[i, j]])
            refs.append(score_reference(table, pos_bias, p, gen, bool(out.all_finished[i, j])))
        np.testing.assert_allclose(out.all_scores[i], refs, rtol=1e-4, atol=1e-4)
        best = int(np.argmax(refs))
        assert _rows(out, i) == list(out.all_tokens[i, best, : out.all_lengths[i, best]])
        np.testing.assert_allclose(out.scores[i], max(refs), rtol=1e-4, atol=1e-4)
        distinct += len({tuple(out.all_tokens[i, j]) for j in range(cfg.num_decodes)}) > 1
    assert distinct > 0  # candidates really differ, so the selection is exercised


def test_candidate_j_is_independent_draw(tables):
    """With num_decodes=N, candidate 0 equals the single-decode sample under the same key."""
    _, _, params = tables
    prompts = _prompts(5, seed=4)
    one = Sampler(BigramDecoder(), SamplerConfig(max_len=MAX_LEN, batch_size=4)).sample(params, prompts, _keys(5))
    many = Sampler(BigramDecoder(), SamplerConfig(max_len=MAX_LEN, batch_size=4, num_decodes=3)).sample(
        params, prompts, _keys(5)
    )
    np.testing.assert_array_equal(one.all_tokens[:, 0], many.all_tokens[:, 0])


def test_draw_is_softmax_sampling_and_never_draws_a_masked_token():
    """`draw` against the exact softmax over a large vocabulary with a wide range of logits (the
    Gumbel-max of `jax.random.categorical` beside it, the same test): frequencies within 4 binomial
    standard deviations; masked tokens (first, last, scattered) never drawn, nor the only-allowed
    token ever missed."""
    vocab, n = 4096, 40000
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, vocab).astype(np.float32)
    masked = np.zeros(vocab, bool)
    masked[[0, 1, vocab - 1]] = True
    masked[rng.choice(vocab, 300, replace=False)] = True
    logits[masked] = NEG_INF
    p = np.exp(log_softmax_np(np.where(masked, -np.inf, logits.astype(np.float64))))
    keys = jax.random.split(jax.random.key(7), n)
    ours = np.asarray(jax.jit(jax.vmap(draw, in_axes=(0, None)))(keys, jnp.asarray(logits)))
    gumbel = np.asarray(jax.jit(jax.vmap(jax.random.categorical, in_axes=(0, None)))(keys, jnp.asarray(logits)))
    distance = []
    for tokens in (ours, gumbel):
        freq = np.bincount(tokens, minlength=vocab) / n
        assert not freq[masked].any()
        assert np.all(np.abs(freq - p) <= 4 * np.sqrt(p * (1 - p) / n) + 2e-4)
        distance.append(0.5 * np.abs(freq - p).sum())
    assert distance[0] < 1.2 * distance[1]  # total variation from p: no further than the reference's own noise
    # The largest vocabularies: the token of the exact (float64) inverse transform for the same uniform,
    # but where the target lies within float32 rounding (1e-6) of a boundary of the cumulative sum.
    big = rng.normal(0, 3, 262_144).astype(np.float32)
    big[rng.choice(big.size, 5000, replace=False)] = NEG_INF
    p64 = np.exp(log_softmax_np(np.where(big <= NEG_INF, -np.inf, big.astype(np.float64))))
    exact = np.cumsum(p64)
    ks = keys[:2000]
    got = np.asarray(jax.jit(jax.vmap(draw, in_axes=(0, None)))(ks, jnp.asarray(big)))
    u = 1.0 - np.asarray(jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(ks), np.float64)
    want = np.searchsorted(exact, u * exact[-1])  # the first index whose cumulative sum reaches the target
    near = (np.abs(exact[want] - u * exact[-1]) < 1e-6) | (np.abs(exact[np.maximum(want - 1, 0)] - u * exact[-1]) < 1e-6)
    assert np.all((got == want) | near) and (got == want).mean() > 0.99 and not (big[got] <= NEG_INF).any()
    one = np.full(vocab, NEG_INF, np.float32)
    for allowed in (0, 5, vocab - 1):
        assert set(np.asarray(jax.vmap(draw, in_axes=(0, None))(keys[:500], jnp.asarray(one).at[allowed].set(0.0)))) == {allowed}


def test_first_token_distribution_matches_softmax(tables):
    table, pos_bias, params = tables
    n = 4000
    prompt = np.array([5], np.int32)
    for temperature, top_k in [(1.0, 0), (0.7, 3)]:
        cfg = SamplerConfig(temperature=temperature, top_k=top_k, max_len=3, batch_size=500)
        out = Sampler(BigramDecoder(), cfg).sample(params, [prompt] * n, _keys(n, seed=11))
        first = np.where(out.lengths > 0, out.tokens[:, 0], 3)
        logits = (table[5] + pos_bias[1]) / temperature
        if top_k:
            logits = np.where(logits < np.sort(logits)[-top_k], -np.inf, logits)
        p = np.exp(log_softmax_np(logits))
        freq = np.bincount(first, minlength=VOCAB) / n
        assert np.all(freq[p == 0] == 0)
        assert np.all(np.abs(freq - p) <= 4 * np.sqrt(p * (1 - p) / n) + 1e-3), (freq, p)


def test_min_p_first_token_distribution_matches_the_brute_force_renormalised_softmax(tables):
    """min-p: only tokens with p >= min_p * max p are drawn, in proportion to p (brute force)."""
    table, pos_bias, params = tables
    n = 4000
    prompt = np.array([5], np.int32)
    for temperature, top_k, min_p in [(1.0, 0, 0.2), (0.7, 4, 0.1), (1.3, 0, 1.0)]:
        cfg = SamplerConfig(temperature=temperature, top_k=top_k, min_p=min_p, max_len=3, batch_size=500)
        out = Sampler(BigramDecoder(), cfg).sample(params, [prompt] * n, _keys(n, seed=13))
        first = np.where(out.lengths > 0, out.tokens[:, 0], 3)
        logits = (table[5] + pos_bias[1]) / temperature
        logits[[0, 2]] = -np.inf  # PAD and BOS are never drawn
        full = np.exp(log_softmax_np(logits))
        keep = np.array([full[x] >= min_p * full.max() and (not top_k or (full > full[x]).sum() < top_k)
                         for x in range(VOCAB)])  # brute force, token by token
        p = np.where(keep, full, 0.0) / np.where(keep, full, 0.0).sum()
        freq = np.bincount(first, minlength=VOCAB) / n
        assert keep.sum() >= 1 and np.all(freq[~keep] == 0), (min_p, freq, keep)
        assert np.all(np.abs(freq - p) <= 4 * np.sqrt(p * (1 - p) / n) + 1e-3), (freq, p)


def test_eos_stops_and_max_len_caps(tables):
    _, _, params = tables
    prompts = _prompts(16, seed=5)
    cfg = SamplerConfig(max_len=MAX_LEN, batch_size=8)
    out = Sampler(BigramDecoder(), cfg).sample(params, prompts, _keys(16))
    for i, p in enumerate(prompts):
        assert len(p) + out.lengths[i] + int(out.finished[i]) <= MAX_LEN
        assert cfg.eos_id not in _rows(out, i)
        if not out.finished[i]:
            assert len(p) + out.lengths[i] == MAX_LEN
    assert out.finished.any()


def test_row_output_independent_of_batch_composition(tables):
    _, _, params = tables
    prompts = _prompts(7, seed=6)
    keys = _keys(7)
    cfg = SamplerConfig(max_len=MAX_LEN, batch_size=4)
    s = Sampler(BigramDecoder(), cfg)
    full = s.sample(params, prompts, keys)
    for i in (0, 3, 6):
        alone = s.sample(params, [prompts[i]], keys[i : i + 1])
        assert _rows(alone, 0) == _rows(full, i)


def test_compiles_once_per_bucket(tables):
    _, _, params = tables
    s = Sampler(BigramDecoder(), SamplerConfig(max_len=MAX_LEN, batch_size=4, prompt_bucket=8))
    for seed in range(3):  # different prompts, lengths 1..5, batch counts: all in bucket 8
        s.sample(params, _prompts(6, seed=seed), _keys(6, seed=seed))
    assert s.compile_count == 1
    s.sample(params, [np.arange(4, 4 + 10, dtype=np.int32) % VOCAB + 4], _keys(1))
    assert s.compile_count == 2


def test_bad_config_and_prompts(tables):
    with pytest.raises(ValueError, match="temperature"):
        SamplerConfig(temperature=-1)
    with pytest.raises(ValueError, match="num_decodes"):
        SamplerConfig(num_decodes=0)
    s = Sampler(BigramDecoder(), SamplerConfig(max_len=4))
    with pytest.raises(ValueError, match="max_len"):
        s.sample(tables[2], [np.arange(4, 8, dtype=np.int32)], _keys(1))


# ------------------------------------------------------------------ label-guided sampling


def _contrasts(prompts, num, seed=9):
    rng = np.random.default_rng(seed)
    return [[rng.integers(4, VOCAB, size=rng.integers(1, 7)).astype(np.int32) for _ in range(num)] for _ in prompts]


def _guided_reference(table, pos_bias, prompt, contrasts, max_len, w, allowed):
    """Brute-force greedy guided decoding on the bigram model: every stream recomputed from its
    own prompt + the tokens drawn so far (no cache)."""
    def lp(last, pos):
        return log_softmax_np(np.where(allowed, logits_np(table, pos_bias, last, pos), -1e30))

    budget = max_len - max([len(prompt)] + [len(c) for c in contrasts])
    out, score, t = [], 0.0, 0
    while t < budget:
        last = out[-1] if out else None
        own = lp(last if out else int(prompt[-1]), len(prompt) + t)
        cons = np.stack([lp(last if out else int(c[-1]), len(c) + t) for c in contrasts])
        mixed = own + w * (own - (np.logaddexp.reduce(cons, axis=0) - np.log(len(contrasts))))
        tok = int(np.argmax(np.where(allowed, mixed, -np.inf)))
        score += own[tok]
        if tok == EOS_ID:
            return out, True, score
        out.append(tok)
        t += 1
    return out, False, score


@pytest.mark.parametrize("w,num", [(1.5, 1), (3.0, 2)])
def test_guided_greedy_equals_bruteforce(tables, w, num):
    table, pos_bias, params = tables
    prompts = _prompts(9, seed=2)
    contrasts = _contrasts(prompts, num)
    cfg = SamplerConfig(temperature=0.0, max_len=MAX_LEN, batch_size=4, guidance=w)
    out = Sampler(BigramDecoder(), cfg).sample(params, prompts, _keys(9), contrasts=contrasts)
    allowed = np.ones(VOCAB, bool)
    allowed[list(cfg.banned_ids)] = False
    unguided = Sampler(BigramDecoder(), SamplerConfig(temperature=0.0, max_len=MAX_LEN, batch_size=4)).sample(
        params, prompts, _keys(9))
    differs = 0
    for i, p in enumerate(prompts):
        ref, fin, score = _guided_reference(table, pos_bias, p, contrasts[i], MAX_LEN, w, allowed)
        assert _rows(out, i) == ref
        assert bool(out.finished[i]) == fin
        np.testing.assert_allclose(out.scores[i], score, rtol=1e-4, atol=1e-4)
        differs += _rows(out, i) != _rows(unguided, i)
    assert differs > 0  # the guidance really changes decodings


def test_guidance_zero_is_the_unguided_sampler_byte_for_byte(tables):
    _, _, params = tables
    prompts = _prompts(11, seed=3)
    plain = Sampler(BigramDecoder(), SamplerConfig(max_len=MAX_LEN, batch_size=4)).sample(params, prompts, _keys(11))
    zero = Sampler(BigramDecoder(), SamplerConfig(max_len=MAX_LEN, batch_size=4, guidance=0.0)).sample(
        params, prompts, _keys(11), contrasts=_contrasts(prompts, 2))
    for a, b in zip(plain.__dict__.values(), zero.__dict__.values()):
        assert a.tobytes() == b.tobytes()
    assert "guidance" not in SamplerConfig().identity()
    assert SamplerConfig(guidance=2).identity()["guidance"] == 2.0


def test_guided_first_token_distribution_matches_the_mixture(tables):
    table, pos_bias, params = tables
    n, w = 4000, 2.0
    prompt, contrast = np.array([5], np.int32), np.array([7, 8], np.int32)
    cfg = SamplerConfig(temperature=0.8, max_len=4, batch_size=500, guidance=w)
    out = Sampler(BigramDecoder(), cfg).sample(params, [prompt] * n, _keys(n, seed=13), contrasts=[[contrast]] * n)
    first = np.where(out.lengths > 0, out.tokens[:, 0], EOS_ID)
    allowed = np.ones(VOCAB, bool)
    allowed[list(cfg.banned_ids)] = False
    own = log_softmax_np(np.where(allowed, table[5] + pos_bias[1], -1e30))
    con = log_softmax_np(np.where(allowed, table[8] + pos_bias[2], -1e30))
    p = np.exp(log_softmax_np(np.where(allowed, (own + w * (own - con)) / 0.8, -np.inf)))
    freq = np.bincount(first, minlength=VOCAB) / n
    assert np.all(freq[p == 0] == 0)
    assert np.all(np.abs(freq - p) <= 4 * np.sqrt(p * (1 - p) / n) + 1e-3), (freq, p)


def test_guided_rows_independent_of_batching(tables):
    _, _, params = tables
    prompts = _prompts(10, seed=8)
    contrasts = _contrasts(prompts, 3, seed=4)
    keys = _keys(10)
    outs = [Sampler(BigramDecoder(), SamplerConfig(max_len=MAX_LEN, batch_size=bs, guidance=1.5, num_decodes=2,
                                                   prompt_bucket=b)).sample(params, prompts, keys, contrasts=contrasts)
            for bs, b in ((1, 1), (4, 16), (16, 8))]
    for o in outs[1:]:
        np.testing.assert_array_equal(o.tokens, outs[0].tokens)
        np.testing.assert_allclose(o.scores, outs[0].scores, rtol=1e-6)


def test_guided_needs_contrasts(tables):
    s = Sampler(BigramDecoder(), SamplerConfig(max_len=MAX_LEN, guidance=1.0))
    with pytest.raises(ValueError, match="contrast prompts"):
        s.sample(tables[2], [np.array([5], np.int32)], _keys(1))
    with pytest.raises(ValueError, match="same number"):
        s.sample(tables[2], _prompts(2), _keys(2), contrasts=[[np.array([4], np.int32)], []])
    with pytest.raises(ValueError, match="guidance"):
        SamplerConfig(guidance=-1.0)


@pytest.mark.parametrize("kw,block", [
    pytest.param({}, 128, marks=pytest.mark.slow),  # make test-slow (~22 s each): the block-3 cases below
    pytest.param({"lora_rank": 2, "prompt_length": 3}, 128, marks=pytest.mark.slow),  # cover the same equality
    # decode phases of 3 steps over a KV cache that grows between them
    ({"lora_rank": 2, "prompt_length": 3}, 3),
    ({"num_kv_heads": 2, "sliding_window": 4, "layer_kinds": ("sliding", "full")}, 3)])
def test_guided_transformer_equals_full_recomputation(kw, block):
    """The real Transformer's KV-cache streams against a full forward pass of every stream at
    every step (no cache), drawing with the sampler's own per-step keys."""
    import jax
    import jax.numpy as jnp

    from dpsynth.generate.sampler import TransformerDecodeModel, guided_log_probs
    from dpsynth.models import Transformer, get_config

    config = get_config("tiny", vocab_size=64, max_len=32, **kw)
    variables = jax.jit(Transformer(config).init)(jax.random.PRNGKey(0), np.zeros((1, 8), np.int32))
    if "lora" in variables:
        variables["lora"] = jax.tree.map(lambda x: x + 0.03, variables["lora"])
    w = 2.0
    cfg = SamplerConfig(max_len=16, batch_size=3, temperature=1.0, vocab_limit=60, guidance=w, prompt_bucket=4,
                        cache_block=block)
    label_prompts = [np.array([2, 7, 9], np.int32), np.array([2, 11], np.int32), np.array([2, 12, 13, 14], np.int32)]
    own_of = [0, 1, 2, 1]
    prompts = [label_prompts[j] for j in own_of]
    contrasts = [[label_prompts[k] for k in range(3) if k != j] for j in own_of]
    keys = example_keys(np.array([0, 5], np.uint32), range(len(prompts)))
    out = Sampler(TransformerDecodeModel(config), cfg).sample(variables, prompts, keys, contrasts=contrasts)
    apply = jax.jit(Transformer(config).apply)
    allowed = np.arange(64) < 60
    allowed[list(cfg.banned_ids)] = False

    def lp(seq):
        logits = np.asarray(apply(variables, jnp.asarray(seq, jnp.int32)[None]))[0, -1]
        return np.asarray(jax.nn.log_softmax(jnp.where(allowed, logits, -1e30)))

    for i, p in enumerate(prompts):
        cand = jax.random.fold_in(jax.random.wrap_key_data(jnp.asarray(keys[i])), 0)
        budget = cfg.max_len - max(len(p), *(len(c) for c in contrasts[i]))
        gen, score = [], 0.0
        for t in range(budget):
            own = lp(list(p) + gen)
            con = np.stack([lp(list(c) + gen) for c in contrasts[i]])
            mixed = np.where(allowed, np.asarray(guided_log_probs(jnp.asarray(own), jnp.asarray(con), w)), -1e30)
            tok = int(draw(jax.random.fold_in(cand, t), jnp.asarray(mixed / cfg.temperature)))
            score += own[tok]
            if tok == cfg.eos_id:
                break
            gen.append(tok)
        assert _rows(out, i) == gen
        np.testing.assert_allclose(out.scores[i], score, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("width,max_len,block", [(4, 16, 3), (8, 512, 128), (16, 2048, 128), (5, 6, 1), (4, 16, 0),
                                                 (30, 100, 7)])
def test_decode_phases_bound_every_step_and_cover_the_loop(width, max_len, block):
    from dpsynth.generate.sampler import MAX_PHASES, decode_phases

    phases = decode_phases(width, max_len, block)
    assert phases[-1] == (max_len, max_len) and len(phases) <= MAX_PHASES
    start, size = 0, width
    for end, cache_len in phases:
        assert end > start and cache_len >= size  # the steps go on, the cache only grows
        # after step t < end a row still generating holds <= width + t + 1 tokens, and <= max_len (its budget)
        assert min(width + (end - 1) + 1, max_len) <= cache_len <= max_len
        start, size = end, cache_len
    if block and max_len - width > block:
        assert len(phases) > 1


def test_phased_sampler_equals_the_whole_cache_sampler_unguided():
    """Phases (cache_block: a KV cache that grows between decode loops) change what a step reads, never
    the samples: prompts of every length in a bucket, best of 2, against cache_block=0, same keys."""
    from dpsynth.generate.sampler import TransformerDecodeModel
    from dpsynth.models import Transformer, get_config

    config = get_config("tiny", vocab_size=64, max_len=64, prompt_length=2)
    variables = jax.jit(Transformer(config).init)(jax.random.PRNGKey(1), np.zeros((1, 8), np.int32))
    rng = np.random.default_rng(3)
    prompts = [rng.integers(4, 60, size=n).astype(np.int32) for n in (1, 8, 5, 3, 8, 2)]
    keys = _keys(len(prompts), seed=11)
    outs = [Sampler(TransformerDecodeModel(config), SamplerConfig(
        max_len=40, batch_size=3, temperature=1.0, num_decodes=2, vocab_limit=60, prompt_bucket=8, eos_id=-1,
        cache_block=block)).sample(variables, prompts, keys) for block in (0, 4)]
    for field in ("tokens", "lengths", "all_tokens"):
        np.testing.assert_array_equal(getattr(outs[0], field), getattr(outs[1], field))
    np.testing.assert_allclose(outs[0].all_scores, outs[1].all_scores, rtol=1e-5)
    assert outs[0].lengths.max() == 40 - 1  # the 1-token prompt ran to max_len, through every phase


def test_banned_ids_are_never_drawn_even_when_most_likely(tables):
    """An imported tokenizer bans thousands of control ids (`Tokenizer.sampling_banned_ids`): the sampler
    masks them as one constant; a banned id never appears, whatever its logit, and the draws of the
    allowed ids keep the model's order (greedy equals the brute-force argmax over the allowed ids)."""
    from dpsynth.generate.sampler_config import allowed_ids

    table, pos_bias, params = tables
    prompts = _prompts(9)
    free = Sampler(BigramDecoder(), SamplerConfig(temperature=0.0, max_len=MAX_LEN, batch_size=4)).sample(
        params, prompts, _keys(9))
    drawn = {int(t) for i in range(9) for t in _rows(free, i)} - {EOS_ID}
    banned = tuple(sorted(drawn))[: max(1, len(drawn) // 2)] + (0, 2)  # ids greedy decoding chose before
    for temperature in (0.0, 1.0):
        cfg = SamplerConfig(temperature=temperature, max_len=MAX_LEN, batch_size=4, banned_ids=banned)
        out = Sampler(BigramDecoder(), cfg).sample(params, prompts, _keys(9))
        assert not {int(t) for i in range(9) for t in _rows(out, i)} & set(banned)
    allowed = allowed_ids(VOCAB, VOCAB - 1, banned + (VOCAB + 5, -1))  # ids outside the vocabulary are ignored
    assert allowed.tolist() == [i not in banned and i < VOCAB - 1 for i in range(VOCAB)]
