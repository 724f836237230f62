"""Post-processing of generated samples: drop empty, truncated and duplicate ones.

Filtering synthetic samples by their own content is post-processing of the DP model's output
(no sensitive data is read), so it costs no privacy. What each filter drops:

* `empty`: fewer than `min_words` whitespace-separated words after stripping.
* `truncated`: the sampler hit `max_len` before emitting EOS (`finished` is false).
* `duplicate`: the same (label, text) as an earlier kept sample of the split (text compared
  after collapsing whitespace), or, for the valid split, as any kept training sample.

A job asks for `oversample` x the requested examples, filters them in order and keeps the
first N survivors, so the output still has N examples when enough survive (deterministic:
the same samples are kept on every run). Counts per split go into the generation report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

FILTERS = ("empty", "truncated", "duplicate")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PostprocessConfig:
    """Which filters to apply, and how many extra samples to draw to make up for them.

    Attributes:
      drop: filters from `FILTERS` (empty = keep everything).
      min_words: the `empty` filter's threshold.
      oversample: draw ceil(oversample x N) samples per split, keep the first N survivors.
    """

    drop: tuple[str, ...] = ()
    min_words: int = 1
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
    def active(self) -> bool:
        return bool(self.drop) or self.oversample != 1.0

    def drawn(self, n: int) -> int:
        """How many samples to draw for `n` wanted ones."""
        return n if n == 0 else -(-int(round(n * self.oversample * 1e6)) // 1_000_000)


def _key(record: Mapping[str, Any]) -> tuple[str, str]:
    return str(record["label"]), " ".join(str(record["text"]).split())


def filter_samples(records: Sequence[Mapping[str, Any]], config: PostprocessConfig, want: int,
                   seen: Iterable[tuple[str, str]] = ()) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """(the first `want` records that pass the filters, counts).

    Args:
      records: generated records in order (`text`, `label`, optional `finished`).
      config: the filters.
      want: how many to keep at most.
      seen: (label, normalized text) keys that count as earlier samples (e.g. the kept
        training split, when filtering the valid split).

    Returns:
      kept records and counts `{"drawn", "kept", "dropped_empty", "dropped_truncated",
      "dropped_duplicate", "unused"}` (`unused`: survivors beyond `want`; `kept < want` means
      too few survived: raise `oversample`). A record failing several filters is counted
      under the first of empty, truncated, duplicate.
    """
    counts = {"drawn": len(records), "kept": 0, "unused": 0, **{f"dropped_{f}": 0 for f in FILTERS}}
    keys = set(seen)
    kept: list[dict[str, Any]] = []
    for r in records:
        key = _key(r)
        if "empty" in config.drop and len(key[1].split()) < config.min_words:
            counts["dropped_empty"] += 1
        elif "truncated" in config.drop and not r.get("finished", True):
            counts["dropped_truncated"] += 1
        elif "duplicate" in config.drop and key in keys:
            counts["dropped_duplicate"] += 1
        elif len(kept) >= want:
            counts["unused"] += 1
        else:
            keys.add(key)
            kept.append(dict(r))
    counts["kept"] = len(kept)
    return kept, counts


def keys_of(records: Iterable[Mapping[str, Any]]) -> set[tuple[str, str]]:
    """The duplicate keys of `records` (for `filter_samples(seen=...)`)."""
    return {_key(r) for r in records}
