"""A few samples of a model directory, for reports (e.g. what a pretrained LM writes).

`preview_samples(model_dir, n)` draws `n` continuations of BOS (or of given text prompts) with
the KV-cache sampler, deterministically from `seed`. For a pretrained model these are
samples of PUBLIC-data language modelling; never call it on anything trained on private text
without the privacy guarantee that covers the model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dpsynth.data.tokenizers import BOS_ID
from dpsynth.generate.sampler import Sampler, SamplerConfig, example_keys, seed_to_key_data


def preview_samples(model_dir: str, n: int = 3, *, prompts: Sequence[str] = (), max_len: int = 64, seed: int = 0,
                    temperature: float = 1.0, top_k: int = 40, loader=None) -> list[str]:
    """`n` sampled texts (each prompt, if given, is repeated in turn and prefixed to its text)."""
    from dpsynth.generate.model_info import load_bundle

    bundle = (loader or load_bundle)(model_dir)
    tok = bundle.tokenizer
    ids_kw = {}
    if hasattr(tok, "eos_id"):  # the model's own special ids (an imported model's differ from dpsynth's)
        ids_kw = dict(eos_id=tok.eos_id, pad_id=tok.pad_id, banned_ids=tok.sampling_banned_ids)
    sampler = Sampler(bundle.decoder, SamplerConfig(temperature=temperature, top_k=top_k, max_len=max_len, batch_size=n,
                                                    vocab_limit=getattr(tok, "vocab_size", None), **ids_kw))
    texts = [prompts[i % len(prompts)] if prompts else "" for i in range(n)]
    ids = [np.asarray([getattr(tok, "bos_id", BOS_ID)] + list(bundle.tokenizer.encode(t)), np.int32) for t in texts]
    out = sampler.sample(bundle.params, ids, example_keys(seed_to_key_data(seed), range(n)))
    return [(t + " " if t else "") + bundle.tokenizer.decode(out.tokens[i, : out.lengths[i]].tolist()).strip()
            for i, t in enumerate(texts)]
