"""Post-processing of generated samples: drop empty, truncated, duplicate and off-label ones.

Filtering synthetic samples by their own content is post-processing of the DP model's output
(no sensitive data is read), so it costs no privacy. What each filter drops:

* `empty`: fewer than `min_words` whitespace-separated words after stripping.
* `truncated`: the sampler hit `max_len` before emitting EOS (`finished` is false).
* `duplicate`: the same (label, text) as an earlier kept sample of the split (text compared
  after collapsing whitespace), or, for the valid split, as any kept training sample.
* `off_label`: the DP model itself does not find the sample more likely under its own label
  prompt than under every other label's by more than `min_margin` nats (`label_margin`,
  computed by the generation workers: `dpsynth.generate.label_scores`). Reads only the model
  and its samples: still post-processing.

A job asks for `oversample` x the requested examples, filters them in order and keeps the
first N survivors, so the output still has N examples when enough survive (deterministic:
the same samples are kept on every run). With `off_label`, whose pass rate differs between
labels, the N are kept per label: label l keeps the first N_l survivors, N_l its share of the
drawn labels (largest remainder), so the label distribution the job drew for is kept. Counts
per split go into the generation report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

FILTERS = ("empty", "truncated", "duplicate", "off_label")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PostprocessConfig:
    """Which filters to apply, and how many extra samples to draw to make up for them.

    Attributes:
      drop: filters from `FILTERS` (empty = keep everything).
      min_words: the `empty` filter's threshold.
      min_margin: the `off_label` filter keeps samples with `label_margin > min_margin` (nats).
      oversample: draw ceil(oversample x N) samples per split, keep the first N survivors.
    """

    drop: tuple[str, ...] = ()
    min_words: int = 1
    min_margin: float = 0.0
    oversample: float = 1.0

    def __post_init__(self):
        bad = [f for f in self.drop if f not in FILTERS]
        if bad:
            raise ValueError(f"postprocess: unknown filter(s) {bad}; known: {', '.join(FILTERS)}")
        if self.min_words < 1:
            raise ValueError(f"postprocess: min_words must be >= 1, got {self.min_words}")
        if not 1.0 <= self.oversample <= 10.0:
            raise ValueError(f"postprocess: oversample must be in [1, 10], got {self.oversample}")

    @property
    def scores_labels(self) -> bool:
        """Whether generation must record each sample's `label_margin`."""
        return "off_label" in self.drop

    def to_json(self) -> dict[str, Any]:
        """The config as JSON (`min_margin` only with `off_label`, so earlier job hashes stay valid)."""
        out = dataclasses.asdict(self)
        if not self.scores_labels:
            out.pop("min_margin")
        return out

    @property
    def active(self) -> bool:
        return bool(self.drop) or self.oversample != 1.0

    def drawn(self, n: int) -> int:
        """How many samples to draw for `n` wanted ones."""
        return n if n == 0 else -(-int(round(n * self.oversample * 1e6)) // 1_000_000)


def _key(record: Mapping[str, Any]) -> tuple[str, str]:
    return str(record["label"]), " ".join(str(record["text"]).split())


def label_quotas(labels: Sequence[str], want: int) -> dict[str, int]:
    """Each label's share of `want`, proportional to its count in `labels` (largest remainder)."""
    if not labels:
        return {}
    counts: dict[str, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    exact = {l: want * c / len(labels) for l, c in counts.items()}
    quotas = {l: int(v) for l, v in exact.items()}
    for l in sorted(exact, key=lambda l: (-(exact[l] - quotas[l]), l))[: want - sum(quotas.values())]:
        quotas[l] += 1
    return quotas


def filter_samples(records: Sequence[Mapping[str, Any]], config: PostprocessConfig, want: int,
                   seen: Iterable[tuple[str, str]] = ()) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """(the first `want` records that pass the filters, counts).

    Args:
      records: generated records in order (`text`, `label`, optional `finished`, and
        `label_margin` with the `off_label` filter).
      config: the filters.
      want: how many to keep at most (with `off_label`: per label, its share of `want`).
      seen: (label, normalized text) keys that count as earlier samples (e.g. the kept
        training split, when filtering the valid split).

    Returns:
      kept records (in their original order) and counts `{"drawn", "kept",
      "dropped_empty", "dropped_truncated", "dropped_duplicate", "unused"}` (plus
      "dropped_off_label" with that filter; `unused`: survivors beyond the quota; `kept <
      want` means too few survived: raise `oversample`). A record failing several filters is
      counted under the first of empty, truncated, duplicate, off_label.

    Raises:
      ValueError: `off_label` is on and a record has no `label_margin`.
    """
    # off_label is counted only when on, so the counts of earlier jobs keep their keys
    counted = [f for f in FILTERS if f != "off_label" or config.scores_labels]
    counts = {"drawn": len(records), "kept": 0, "unused": 0, **{f"dropped_{f}": 0 for f in counted}}
    quotas = label_quotas([str(r["label"]) for r in records], want) if config.scores_labels else None
    keys = set(seen)
    kept: list[dict[str, Any]] = []
    kept_per_label: dict[str, int] = {}
    for i, r in enumerate(records):
        key = _key(r)
        if config.scores_labels and r.get("label_margin") is None:
            raise ValueError(f"record {i} ({r.get('id', 'no id')}): no `label_margin`; the off_label filter needs "
                             "shards generated with it on (regenerate them)")
        full = (kept_per_label.get(key[0], 0) >= quotas.get(key[0], 0)) if quotas is not None else len(kept) >= want
        if "empty" in config.drop and len(key[1].split()) < config.min_words:
            counts["dropped_empty"] += 1
        elif "truncated" in config.drop and not r.get("finished", True):
            counts["dropped_truncated"] += 1
        elif "duplicate" in config.drop and key in keys:
            counts["dropped_duplicate"] += 1
        elif config.scores_labels and not float(r["label_margin"]) > config.min_margin:
            counts["dropped_off_label"] += 1
        elif full:
            counts["unused"] += 1
        else:
            keys.add(key)
            kept.append(dict(r))
            kept_per_label[key[0]] = kept_per_label.get(key[0], 0) + 1
    counts["kept"] = len(kept)
    return kept, counts


def keys_of(records: Iterable[Mapping[str, Any]]) -> set[tuple[str, str]]:
    """The duplicate keys of `records` (for `filter_samples(seen=...)`)."""
    return {_key(r) for r in records}
