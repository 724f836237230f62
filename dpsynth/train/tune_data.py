"""D_train / D_valid of a `dp_tune` run as padded Prefix-LM rows.

`encode_data` turns the records into `TuneData` (`dpsynth.train.prompts` rows, plus the null-prompt copies
of label dropout), padded to a multiple of `LENGTH_BUCKET` tokens (fewer compiled shapes);
`data_fingerprint` hashes the rows into the fingerprint a resume is checked against; `gather_train`
gathers a step's rows (with the sampled label contrast, each example's own label and the one other
label `sampled_contrast_labels` draws for it at that step).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
from collections.abc import Sequence

import numpy as np

from dpsynth.dp import sampling
from dpsynth.train.prompts import EncodedExamples, encode_examples, encode_null_examples
from dpsynth.train.tune_config import TuneConfig, TuneError

logger = logging.getLogger("dpsynth.train.finetune")  # the tuner's one logger, whichever module logs

LENGTH_BUCKET = 16  # rows are padded to a multiple of this (fewer distinct compiled shapes)
CONTRAST_STREAM = 0xC0_27A5  # tag of the sampled label contrast's stream (`sampled_contrast_labels`)
CONTRAST_KEYS = ("contrast_inputs", "contrast_targets", "contrast_weights")


def row_length(enc: EncodedExamples, limit: int) -> int:
    need = enc.inputs.shape[1]
    return min(int(math.ceil(need / LENGTH_BUCKET) * LENGTH_BUCKET), limit)


def _pad_cols(a: np.ndarray, length: int) -> np.ndarray:
    if a.shape[1] >= length:
        return a[:, :length]
    return np.pad(a, ((0, 0), (0, length - a.shape[1])))


def data_fingerprint(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(arrays):
        h.update(k.encode())
        h.update(np.ascontiguousarray(arrays[k]).tobytes())
    return h.hexdigest()


@dataclasses.dataclass(frozen=True)
class TuneData:
    """D_train / D_valid as padded Prefix-LM rows (rows N..2N-1: the null prompt, with label dropout;
    with label contrast, `train_arrays` also holds `contrast_arrays`)."""

    train: EncodedExamples
    valid: EncodedExamples | None
    train_arrays: dict[str, np.ndarray]
    valid_arrays: dict[str, np.ndarray] | None


def contrast_arrays(records: Sequence[dict], tokenizer, labels: Sequence[str], config: TuneConfig,
                    length: int) -> dict[str, np.ndarray]:
    """Every example under every label prompt, for `dpsynth.train.lm.make_label_contrast_loss`:
    "contrast_inputs", "contrast_targets", "contrast_weights" [N, K, length] (row k: the example's
    text after label k's prompt, Prefix-LM weights) and "contrast_label" int32 [N] (its own label's
    index in `labels`). The own label's row is the example's Prefix-LM row, except that a text
    truncated to `max_tokens` keeps, under every prompt, the tokens that the longest prompt leaves."""
    per_label = []
    for label in labels:
        enc = encode_examples([dict(r, label=label) for r in records], tokenizer, labels, config.example_config(),
                              where="D_train")
        length = max(length, row_length(enc, config.max_tokens - 1))
        per_label.append(enc.arrays())
    out = {f"contrast_{k}": np.stack([_pad_cols(a[k], length) for a in per_label], axis=1)
           for k in ("inputs", "targets", "weights")}
    # A long text truncated after a longer prompt keeps fewer tokens: every label scores the same
    # tokens (the fewest any prompt leaves), so the likelihoods compared are of one text.
    w = out["contrast_weights"]
    kept = w.sum(axis=-1).min(axis=1, keepdims=True)  # [N, 1]
    out["contrast_weights"] = np.where(np.cumsum(w, axis=-1) <= kept[..., None], w, 0.0).astype(w.dtype)
    index = {label: i for i, label in enumerate(labels)}
    out["contrast_label"] = np.asarray([index[str(r["label"])] for r in records], np.int32)
    return out


def sampled_contrast_labels(own: np.ndarray, step: int, *, seed: int, labels: int) -> np.ndarray:
    """The other label each example is contrasted with at `step` under the sampled label contrast.

    `own`: every training example's label index [N] (`contrast_arrays`' "contrast_label"). Example
    i's other label is uniform over the K - 1 labels that are not its own: the i-th of N draws of a
    generator seeded with SeedSequence([seed, CONTRAST_STREAM, step]). So it is a function of the
    run's seed, the step and the example's index alone, drawn before (and whatever) the batch is:
    never of the other examples, the batch or microbatch the example lands in, or any gradient, and
    a resumed run draws the same. Returns int32 [N], != own everywhere.
    """
    own = np.asarray(own, np.int64)
    if labels < 2:
        raise TuneError(f"the label contrast needs at least 2 labels, got {labels}")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed) % (1 << 64), CONTRAST_STREAM, int(step)]))
    d = rng.integers(0, labels - 1, size=own.shape[0])
    return (d + (d >= own)).astype(np.int32)  # skips the own label: uniform over the others


def gather_train(arrays: dict[str, np.ndarray], indices: np.ndarray, step: int, *, seed: int,
                 form: str) -> dict[str, np.ndarray]:
    """Rows `indices` (-1: padding) of D_train's arrays at `step` (`sampling.gather`).

    With the full label contrast, each example's K contrast rows come whole. With `form`
    "sampled", each example gets 2: its own label's row (column 0; "contrast_label" 0) and the row
    of the label `sampled_contrast_labels` drew for it at `step` (column 1), so the loss
    (`dpsynth.train.lm.make_label_contrast_loss`) is softplus(s_other - s_own) on 2 passes.
    """
    if "contrast_inputs" in arrays and form not in ("full", "sampled"):
        raise TuneError(f"the label contrast's form {form!r} is resolved before a step's rows are gathered "
                        "(`resolve_label_contrast`)")
    if form != "sampled" or "contrast_inputs" not in arrays:
        return sampling.gather(arrays, indices)
    out = sampling.gather({k: v for k, v in arrays.items() if k not in CONTRAST_KEYS + ("contrast_label",)}, indices)
    own_all = arrays["contrast_label"]
    idx = np.asarray(indices, np.int64)
    safe = np.where(idx >= 0, idx, 0)
    other = sampled_contrast_labels(own_all, step, seed=seed, labels=arrays["contrast_inputs"].shape[1])
    columns = np.stack([own_all[safe], other[safe]], axis=1)  # [B, 2]
    for k in CONTRAST_KEYS:
        out[k] = arrays[k][safe[:, None], columns]
    out["contrast_label"] = np.zeros(idx.shape[0], np.int32)
    return out


def encode_data(train_records: Sequence[dict], valid_records: Sequence[dict], tokenizer, labels: list[str],
            config: TuneConfig) -> TuneData:
    try:
        train = encode_examples(train_records, tokenizer, labels, config.example_config(), where="D_train")
        valid = (encode_examples(valid_records, tokenizer, labels, config.example_config(), where="D_valid")
                 if valid_records else None)
    except ValueError as e:
        raise TuneError(str(e)) from e
    if train.truncated:
        logger.info("D_train: %d of %d examples truncated to %d tokens", train.truncated, len(train), config.max_tokens)
    length = row_length(train, config.max_tokens - 1)
    null_train = None
    if config.label_dropout:  # rows N..2N-1: the same examples under the null prompt
        null_train = encode_null_examples(train_records, tokenizer, config.example_config(), where="D_train")
        length = max(length, row_length(null_train, config.max_tokens - 1))
    train_arrays = {k: _pad_cols(v, length) for k, v in train.arrays().items()}
    if null_train is not None:
        train_arrays = {k: np.concatenate([v, _pad_cols(null_train.arrays()[k], length)]) for k, v in train_arrays.items()}
    if config.contrast:
        train_arrays.update(contrast_arrays(train_records, tokenizer, labels, config, length))
    valid_arrays = ({k: _pad_cols(v, row_length(valid, config.max_tokens - 1)) for k, v in valid.arrays().items()}
                    if valid else None)
    return TuneData(train=train, valid=valid, train_arrays=train_arrays, valid_arrays=valid_arrays)
