"""A fake decoder whose next-token logits are known: `table[last_token] + pos_bias[position]`.

Shared by the generate tests (sampler, job). The logits depend only on the previous token and
the absolute position, so reference decodings are easy to compute by brute force in NumPy.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from dpsynth.data.tokenizers import EOS_ID


def make_tables(vocab: int = 12, max_len: int = 64, seed: int = 0, eos_logit: float = -1.0):
    """Random bigram logits `[V, V]` and positional biases `[max_len + 1, V]` (distinct values)."""
    rng = np.random.default_rng(seed)
    table = rng.normal(0.0, 2.0, size=(vocab, vocab)).astype(np.float32)
    table[:, 0:3] = -1e9  # pad/unk/bos never drawn (pad and bos are masked by the sampler anyway)
    table[:, EOS_ID] = eos_logit
    pos_bias = np.zeros((max_len + 1, vocab), np.float32)
    pos_bias[:, EOS_ID] = np.linspace(0.0, 3.0, max_len + 1)  # EOS grows likelier with position
    return table, pos_bias


class BigramDecoder:
    """Implements `dpsynth.generate.sampler.DecodeModel`; params = {"table", "pos_bias"}."""

    def init_cache(self, batch, max_len):
        return {"last": jnp.zeros((batch,), jnp.int32), "pos": jnp.zeros((batch,), jnp.int32)}

    @staticmethod
    def _logits(params, last, pos):
        pos = jnp.minimum(pos, params["pos_bias"].shape[0] - 1)
        return params["table"][last] + params["pos_bias"][pos]

    def prefill(self, params, tokens, lengths, cache):
        last = jnp.take_along_axis(tokens, (lengths - 1)[:, None], axis=1)[:, 0]
        cache = {"last": last, "pos": lengths}
        return self._logits(params, last, lengths), cache

    def grow_cache(self, cache, max_len):
        return cache

    def decode_step(self, params, token, cache):
        cache = {"last": token, "pos": cache["pos"] + 1}
        return self._logits(params, token, cache["pos"]), cache

    def sequence_logits(self, params, tokens):
        """Teacher-forced logits `[B, T, V]`: position p predicts token p + 1."""
        pos = jnp.arange(1, tokens.shape[1] + 1)[None, :]
        return self._logits(params, tokens, pos)

    def __hash__(self):
        return hash("BigramDecoder")

    def __eq__(self, other):
        return isinstance(other, BigramDecoder)


def logits_np(table, pos_bias, last, pos):
    return table[last] + pos_bias[min(pos, pos_bias.shape[0] - 1)]


def log_softmax_np(x):
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def greedy_reference(table, pos_bias, prompt, max_len, eos_id=EOS_ID):
    """Brute-force greedy decoding: (tokens without EOS, finished, total log-likelihood)."""
    last, pos = int(prompt[-1]), len(prompt)
    out, score = [], 0.0
    while pos < max_len:
        lg = logits_np(table, pos_bias, last, pos)
        t = int(np.argmax(lg))
        score += log_softmax_np(lg)[t]
        if t == eos_id:
            return out, True, score
        out.append(t)
        last, pos = t, pos + 1
    return out, False, score


def score_reference(table, pos_bias, prompt, generated, finished, eos_id=EOS_ID):
    """Total log-likelihood of `generated` (+ EOS when `finished`) after `prompt`."""
    last, pos = int(prompt[-1]), len(prompt)
    score = 0.0
    for t in list(generated) + ([eos_id] if finished else []):
        score += log_softmax_np(logits_np(table, pos_bias, last, pos))[t]
        last, pos = t, pos + 1
    return score


# ----------------------------------------------------------------------------- fake model dir


class FakeTokenizer:
    """Letters a..h <-> ids 4..11 (any other character maps into the same range)."""

    vocab_size = 12

    def encode(self, text):
        return np.asarray([4 + (ord(c) - ord("a")) % 8 for c in text], np.int32)

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]

    def decode(self, ids):
        return "".join(chr(ord("a") + int(i) - 4) for i in ids if int(i) >= 4)


def write_fake_model_dir(path, *, max_len=24, seed=1, private=True, labels=("great", "other"), template="{label}",
                         tuned_len=512):
    """A model directory the job can read (manifest, config, privacy report) plus fake tables."""
    import json
    import os

    os.makedirs(path, exist_ok=True)
    table, pos_bias = make_tables(12, max_len, seed=seed)
    np.savez(os.path.join(path, "fake_tables.npz"), table=table, pos_bias=pos_bias)
    with open(os.path.join(path, "manifest.json"), "w") as f:
        json.dump({"format": "fake", "labels": list(labels), "prompt_template": template}, f)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"max_len": max_len, "vocab_size": 12}, f)
    if private:
        from dpsynth.dp.ledger import PrivacyLedger
        from dpsynth.dp.report import build_report, write_report

        ledger = PrivacyLedger(delta=1e-5, target_epsilon=3.0)
        ledger.record_dpsgd(sampling_probability=0.05, noise_multiplier=1.0, steps=100, clip_norm=1.0, dataset_size=1000)
        write_report(path, build_report(ledger, training={"mode": "lora"}, contamination_sha256=None,
                                        max_tokens_per_example=tuned_len))
    return path


def load_fake_bundle(model_dir):
    """`loader` for the job: the bigram decoder, its tables and the fake tokenizer."""
    import os

    from dpsynth.generate.model_info import ModelBundle

    z = np.load(os.path.join(model_dir, "fake_tables.npz"))
    return ModelBundle(decoder=BigramDecoder(), params={"table": z["table"], "pos_bias": z["pos_bias"]}, tokenizer=FakeTokenizer())


class InjectedFault(RuntimeError):
    pass


class ShardHookLoader:
    """A loader (`generate(..., loader=)`) whose fake bundle calls `self.on_shard(spec)` before
    each shard; subclasses define `on_shard`."""

    def __call__(self, model_dir):
        bundle = load_fake_bundle(model_dir)
        bundle.on_shard = self.on_shard
        return bundle


class FailOnShard(ShardHookLoader):
    """Raises when it reaches shard `name` (simulates a worker crash)."""

    def __init__(self, name):
        self.name = name

    def on_shard(self, spec):
        if spec.name == self.name:
            raise InjectedFault(f"injected failure on {spec.name}")


class SlowFake(ShardHookLoader):
    """Sleeps `seconds` before each shard (to kill a job midway)."""

    def __init__(self, seconds):
        self.seconds = seconds

    def on_shard(self, spec):
        import time

        time.sleep(self.seconds)


class MarkShards(ShardHookLoader):
    """Before each shard, leaves a marker `DIR/{shard}.{pid}` and sleeps `seconds` (tests see
    which worker process holds an unfinished shard, and kill it)."""

    def __init__(self, marker_dir, seconds):
        self.marker_dir = marker_dir
        self.seconds = seconds

    def on_shard(self, spec):
        import os
        import time

        os.makedirs(self.marker_dir, exist_ok=True)
        open(os.path.join(self.marker_dir, f"{spec.name}.{os.getpid()}"), "w").close()
        time.sleep(self.seconds)
