"""The label-prompt contract: label prompts, and sensitive examples as Prefix-LM training rows.

The one home of the label prompt, for tuning (`encode_examples`), generation
(`dpsynth.generate.transforms`) and evaluation (`dpsynth.evaluate.lm`): the prefix of label `l` is

    prompt_ids(tokenizer, template, l) = [BOS] + encode(template with "{label}" -> l)

and a tuned model directory records its template and label set in its manifest under
`TEMPLATE_KEY` ("prompt_template") and `LABELS_KEY` ("labels") (`manifest_fields` writes them,
`template_of` / `labels_of` read them; docs/models.md, "The model directory").

One labeled example (text, label) becomes the token row

    prompt_ids(tokenizer, template, label) + encode(text) + [EOS]
    '------------- prefix ---------------'   '---- target ----'

truncated to `max_tokens` in total (default 512: the unit of privacy is one example of at
most 512 tokens).

The null prompt is the template with an empty label (`NULL_LABEL`; "[{label}] " -> "[] "):
label dropout in DP tuning (`dpsynth.train.finetune`, `label_dropout = p`) trains each example
under it with probability p, and label-guided sampling (`dpsynth.generate.sampler`, contrast
"null") contrasts every label's prompt with it. A model tuned with label dropout records p in
its manifest under `LABEL_DROPOUT_KEY` ("label_dropout"). Labels are never empty (readers
dead-letter empty labels), so the null prompt is nobody's label prompt. Truncation cuts the text (the prefix is kept whole; EOS is kept only if the
text fits); truncated examples are counted, never logged. Rows are padded with PAD to a
fixed length so every microbatch has one shape.

Inputs/targets are the row shifted by one; `weights[t] = 1` where target t is a text or EOS
token and 0 on the prefix (the label prompt is never trained on) and on padding. The loss of
one example is the mean over its target tokens (`dpsynth.train.lm.make_lm_loss`), so per-example gradient
norms do not grow with length and clipping norms around 1 work out of the box. The full-LM
variant (`full_lm=True`) also puts weight on the prefix tokens after BOS (paper ablation).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dpsynth.data.tokenizers import BOS_ID, EOS_ID, PAD_ID
from dpsynth.errors import DpsynthError

DEFAULT_TEMPLATE = "[{label}] "
DEFAULT_MAX_TOKENS = 512
TEMPLATE_KEY = "prompt_template"  # the model manifest's key for the label-prompt template
LABELS_KEY = "labels"  # the model manifest's key for the label set the model was tuned on
LABEL_DROPOUT_KEY = "label_dropout"  # the model manifest's key for the label-dropout probability (when > 0)
NULL_LABEL = ""  # the null prompt's label: the template with nothing in its "{label}" field
# What label-guided sampling contrasts each label's prompt with: the other labels' prompts, or the null prompt.
GUIDANCE_CONTRASTS = ("others", "null")


class ExampleError(DpsynthError, ValueError):
    """Bad sensitive examples (unknown label, empty set, bad template); names the record."""


def check_template(template: str) -> str:
    """Returns `template`; raises `ExampleError` unless it is a string with a "{label}" field."""
    if not isinstance(template, str) or "{label}" not in template:
        raise ExampleError(f"label prompt template {template!r} has no '{{label}}' field")
    return template


def prompt_text(template: str, label: str) -> str:
    """The label prompt of `label`, e.g. "[{label}] " -> "[great] "."""
    return check_template(template).replace("{label}", label)


def prompt_ids(tokenizer, template: str, label: str) -> np.ndarray:
    """int32 token ids of the label prompt: BOS + encode(prompt_text(template, label)).

    The prefix of every tuning row and every generation prompt. BOS is the tokenizer's own
    (`bos_id`, an imported model's) or dpsynth's `BOS_ID`.
    """
    bos_id = getattr(tokenizer, "bos_id", BOS_ID)
    ids = np.asarray(tokenizer.encode(prompt_text(template, label)), np.int32)
    return np.concatenate([np.array([bos_id], np.int32), ids])


def null_prompt_ids(tokenizer, template: str) -> np.ndarray:
    """int32 token ids of the null prompt: `prompt_ids` of the empty label."""
    return prompt_ids(tokenizer, template, NULL_LABEL)


def manifest_fields(template: str, labels: Sequence[str], label_dropout: float = 0.0) -> dict[str, Any]:
    """The label-prompt entries of a tuned model's manifest (and of its privacy report's training
    section); the label-dropout probability only when > 0 (earlier manifests stay as they were)."""
    fields = {TEMPLATE_KEY: check_template(template), LABELS_KEY: list(labels)}
    if label_dropout:
        fields[LABEL_DROPOUT_KEY] = float(label_dropout)
    return fields


def label_dropout_of(manifest: Mapping[str, Any]) -> float:
    """The label-dropout probability a model manifest records (0 when it records none)."""
    return float(manifest.get(LABEL_DROPOUT_KEY) or 0.0)


def template_of(manifest: Mapping[str, Any]) -> str:
    """The label-prompt template a model manifest records (`DEFAULT_TEMPLATE` when it records none)."""
    template = manifest.get(TEMPLATE_KEY)
    return DEFAULT_TEMPLATE if template is None else check_template(template)


def labels_of(manifest: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The label set a model manifest records (None when it records none, e.g. a pretrained base)."""
    labels = manifest.get(LABELS_KEY)
    return tuple(str(l) for l in labels) if labels else None


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
        check_template(self.template)
        if self.max_tokens < 4:
            raise ExampleError(f"max_tokens must be >= 4, got {self.max_tokens}")

    def prompt(self, label: str) -> str:
        return prompt_text(self.template, label)


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


def example_lengths(records: Sequence[dict], tokenizer, template: str) -> np.ndarray:
    """int64 [N]: the untruncated length of each record's Prefix-LM row (BOS + prompt + text + EOS,
    what `encode_examples` would build with no length limit). Records lacking a text or label
    count their prompt alone (`encode_examples` refuses them later, naming the record)."""
    prefix_cache: dict[str, int] = {}
    out = np.zeros(len(records), np.int64)
    for i, rec in enumerate(records):
        label = str(rec.get("label", ""))
        if label not in prefix_cache:
            prefix_cache[label] = int(prompt_ids(tokenizer, template, label).size)
        out[i] = prefix_cache[label] + len(tokenizer.encode(str(rec.get("text", "")))) + 1
    return out


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
    eos_id, pad_id = getattr(tokenizer, "eos_id", EOS_ID), getattr(tokenizer, "pad_id", PAD_ID)
    prefix_cache: dict[str, np.ndarray] = {}
    rows, prefix_lens, ids, truncated = [], [], [], 0
    for n, rec in enumerate(records, start=1):  # (counted from 1, as the readers and dead letters count)
        rid = str(rec.get("id", n))
        if "text" not in rec or "label" not in rec:
            raise ExampleError(f"{where}: record {n} (id {rid}) lacks a 'text' or 'label' field")
        label = str(rec["label"])
        if label not in label_set:
            raise ExampleError(f"{where}: record {n} (id {rid}) has unknown label {label!r}; labels are {sorted(label_set)}")
        if label not in prefix_cache:
            prefix_cache[label] = prompt_ids(tokenizer, config.template, label)
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



def encode_null_examples(records: Sequence[dict], tokenizer, config: ExampleConfig = ExampleConfig(), *,
                         where: str = "training set", pad_to: int | None = None) -> EncodedExamples:
    """`encode_examples` of the same records under the null prompt (label dropout's rows).

    Row i is example i with its label prompt replaced by the null prompt; the Prefix-LM weights
    are as for any prompt (0 on the null prefix, 1 on the text and EOS).
    """
    return encode_examples([dict(r, label=NULL_LABEL) for r in records], tokenizer, [NULL_LABEL], config,
                           where=where, pad_to=pad_to)


def label_dropout_rows(indices: np.ndarray, step: int, *, seed: int, p: float, num_examples: int) -> np.ndarray:
    """The rows that train the examples `indices` (-1 = padding) at `step` under label dropout.

    The training arrays hold every example twice: row i under its label prompt, row
    `num_examples + i` under the null prompt (`encode_null_examples`). At each step each
    example trains under the null prompt with probability `p`, drawn independently per
    (step, example) from the run's (secret) seed, so the choice does not depend on the batch
    or microbatch it lands in, and a resumed run draws the same. The choice is independent of
    the data and replaces the example's row (never adds one): the sampled set, each example's
    clipped contribution and so the DP guarantee are those of the run without dropout.
    """
    idx = np.asarray(indices)
    if p <= 0:
        return idx
    drop = np.random.default_rng([int(seed) % (1 << 64), int(step), 0x1AB31D]).random(num_examples) < p
    return np.where((idx >= 0) & drop[np.maximum(idx, 0)], idx + num_examples, idx)
