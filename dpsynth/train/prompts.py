"""Sensitive examples as Prefix-LM training rows, and the per-example Prefix-LM loss.

One labeled example (text, label) becomes the token row

    [BOS] + encode(template.format(label)) + encode(text) + [EOS]
    '---------- prefix ---------------'   '---- target ----'

truncated to `max_tokens` in total (default 512: the unit of privacy is one example of at
most 512 tokens). Truncation cuts the text (the prefix is kept whole; EOS is kept only if the
text fits); truncated examples are counted, never logged. Rows are padded with PAD to a
fixed length so every microbatch has one shape.

Inputs/targets are the row shifted by one; `weights[t] = 1` where target t is a text or EOS
token and 0 on the prefix (the label prompt is never trained on) and on padding. The loss of
one example is the mean over its target tokens (`prefix_lm_loss`), so per-example gradient
norms do not grow with length and clipping norms around 1 work out of the box. The full-LM
variant (`full_lm=True`) also puts weight on the prefix tokens after BOS (paper ablation).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dpsynth.tokens import BOS_ID, EOS_ID, PAD_ID

DEFAULT_TEMPLATE = "[{label}] "
DEFAULT_MAX_TOKENS = 512


class ExampleError(ValueError):
    """Bad sensitive examples (unknown label, empty set, bad template); names the record."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExampleConfig:
    """How examples become rows.

    Attributes:
        template: label prompt with a "{label}" field, e.g. "[{label}] ".
        max_tokens: maximum tokens per example in total (BOS + prefix + text + EOS).
        full_lm: also train on the prefix (ablation; default Prefix-LM: weight 0 on prefix).
    """

    template: str = DEFAULT_TEMPLATE
    max_tokens: int = DEFAULT_MAX_TOKENS
    full_lm: bool = False

    def __post_init__(self):
        if "{label}" not in self.template:
            raise ExampleError(f"label prompt template {self.template!r} has no '{{label}}' field")
        if self.max_tokens < 4:
            raise ExampleError(f"max_tokens must be >= 4, got {self.max_tokens}")

    def prompt(self, label: str) -> str:
        return self.template.replace("{label}", label)


@dataclasses.dataclass
class EncodedExamples:
    """Fixed-shape arrays for a set of examples (row i = example i).

    Attributes:
        inputs: int32 [N, L-1] tokens fed to the model.
        targets: int32 [N, L-1] next tokens.
        weights: float32 [N, L-1] loss weights (1 on target text/EOS, 0 on prefix/padding).
        truncated: number of examples cut to `max_tokens`.
        ids: example ids (for counts and dead letters; never logged with text).
    """

    inputs: np.ndarray
    targets: np.ndarray
    weights: np.ndarray
    truncated: int
    ids: list[str]

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    def arrays(self) -> dict[str, np.ndarray]:
        return {"inputs": self.inputs, "targets": self.targets, "weights": self.weights}


def encode_examples(
    records: Sequence[dict],
    tokenizer,
    labels: Sequence[str],
    config: ExampleConfig = ExampleConfig(),
    *,
    where: str = "training set",
    pad_to: int | None = None,
) -> EncodedExamples:
    """Encodes records {"id", "text", "label"} into Prefix-LM rows.

    Args:
        records: the examples.
        tokenizer: has `encode(text) -> int32[]`.
        labels: the label set; any other label is an error.
        config: template, length limit, loss variant.
        where: name of the input for error messages (e.g. the file path).
        pad_to: row length L (default: the longest encoded row, at most max_tokens).

    Raises:
        ExampleError: empty input, a record without text/label, or an unknown label.
    """
    if not records:
        raise ExampleError(f"{where}: no examples (empty training set)")
    label_set = set(labels)
    # An imported tokenizer carries its model's special ids; dpsynth's own are the constants.
    bos_id, eos_id, pad_id = (getattr(tokenizer, name, default) for name, default in
                              (("bos_id", BOS_ID), ("eos_id", EOS_ID), ("pad_id", PAD_ID)))
    prefix_cache: dict[str, np.ndarray] = {}
    rows, prefix_lens, ids, truncated = [], [], [], 0
    for n, rec in enumerate(records):
        rid = str(rec.get("id", n))
        if "text" not in rec or "label" not in rec:
            raise ExampleError(f"{where}: record {n} (id {rid}) lacks a 'text' or 'label' field")
        label = str(rec["label"])
        if label not in label_set:
            raise ExampleError(f"{where}: record {n} (id {rid}) has unknown label {label!r}; labels are {sorted(label_set)}")
        if label not in prefix_cache:
            prefix_cache[label] = np.concatenate([[bos_id], tokenizer.encode(config.prompt(label))]).astype(np.int32)
        prefix = prefix_cache[label]
        if prefix.size + 1 > config.max_tokens:
            raise ExampleError(f"{where}: the label prompt of {label!r} alone has {prefix.size} tokens >= max_tokens")
        text = np.asarray(tokenizer.encode(str(rec["text"])), np.int32)
        body = np.concatenate([text, [eos_id]]).astype(np.int32)
        room = config.max_tokens - prefix.size
        if body.size > room:
            body = body[:room]
            truncated += 1
        rows.append(np.concatenate([prefix, body]))
        prefix_lens.append(prefix.size)
        ids.append(rid)
    length = pad_to or max(r.size for r in rows)
    if length > config.max_tokens or length < max(r.size for r in rows):
        raise ExampleError(f"pad_to={length} must be in [longest row, max_tokens={config.max_tokens}]")
    n = len(rows)
    tokens = np.full((n, length), pad_id, np.int32)
    weights = np.zeros((n, length - 1), np.float32)
    for i, (row, p) in enumerate(zip(rows, prefix_lens)):
        tokens[i, : row.size] = row
        # Target position t predicts tokens[t + 1]; text/EOS targets are t + 1 >= p.
        first = 1 if config.full_lm else p
        weights[i, first - 1 : row.size - 1] = 1.0
    return EncodedExamples(inputs=tokens[:, :-1], targets=tokens[:, 1:], weights=weights, truncated=truncated, ids=ids)


def prefix_lm_loss(logits: jnp.ndarray, targets: jnp.ndarray, weights: jnp.ndarray) -> jnp.ndarray:
    """Per-example loss [B]: mean token cross-entropy over each row's weighted targets.

    Rows with no weighted target (padding rows) get loss 0.
    """
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    total = jnp.sum(nll * weights, axis=-1)
    return total / jnp.maximum(jnp.sum(weights, axis=-1), 1.0)
