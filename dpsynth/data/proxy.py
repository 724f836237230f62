"""A public proxy task: a labeled dataset made from a public corpus alone, labels from its document ids.

The automatic DP-tuning recipe (`dpsynth.train.recipe`) is calibrated on such a task, never on
the sensitive data: it has the shape of a sensitive task (N labeled texts of some length, a few
classes) and labels that the generator never saw as prompts, so how fast DP tuning learns the
label conditioning at a given (N, epsilon, length) can be measured at no privacy cost
(`bench/recipe_proxy.py`). Example: OpinRank hotel reviews of four cities,

    build_proxy_task(["../shared/data/public/opinrank/*.jsonl.gz"],
                     {"london": "hotels/london/", "new york": "hotels/new-york-city/",
                      "las vegas": "hotels/las-vegas/", "chicago": "hotels/chicago/"},
                     num_train=4000, num_valid=400, num_test=800)

A document belongs to the label whose id prefix it starts with (documents matching none are
skipped; a prefix of one label may not be a prefix of another's). Within each label the
documents with the smallest seeded id hash (`dpsynth.data.splits.hash_unit`) are kept, so the
task is balanced, deterministic and independent of file order; they are then dealt to train,
valid and test. Records are `{"id", "text", "label"}` like a sensitive set's.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Mapping, Sequence
from typing import Any

from dpsynth.data.readers import Columns, DeadLetter, InputError, iter_file, resolve_inputs
from dpsynth.data.splits import SPLITS, hash_unit



@dataclasses.dataclass(frozen=True)
class ProxyTask:
    """The proxy dataset: records per split, the label set, and what was read."""

    train: list[dict[str, Any]]
    valid: list[dict[str, Any]]
    test: list[dict[str, Any]]
    labels: tuple[str, ...]
    documents_read: int
    dead_letters: int

    def split(self, name: str) -> list[dict[str, Any]]:
        return getattr(self, name)


def build_proxy_task(paths: Sequence[str] | str, groups: Mapping[str, str], *, num_train: int, num_valid: int,
                     num_test: int, seed: int = 0, text_column: str = "text") -> ProxyTask:
    """Builds a balanced labeled task from a public corpus (see the module docstring).

    Args:
      paths: the public corpus (files, directories or globs; JSONL/txt/Parquet with ids).
      groups: label -> document-id prefix.
      num_train, num_valid, num_test: examples per split, spread evenly over the labels (the
        first `n % len(groups)` labels get one more).
      seed: the hash seed that picks the documents.

    Raises:
      InputError: overlapping prefixes, or a label with too few documents.
    """
    labels = tuple(str(l) for l in groups)
    prefixes = [str(groups[l]) for l in labels]
    if not labels or len(set(labels)) != len(labels):
        raise InputError(f"proxy task: give two or more distinct labels, got {list(labels)}")
    for i, a in enumerate(prefixes):
        for j, b in enumerate(prefixes):
            if i != j and b.startswith(a):
                raise InputError(f"proxy task: the id prefix {a!r} of {labels[i]!r} also matches {labels[j]!r}'s {b!r}")
    sizes = {s: n for s, n in zip(SPLITS, (num_train, num_valid, num_test))}
    if any(n < 0 for n in sizes.values()):
        raise InputError(f"proxy task: split sizes must be >= 0, got {sizes}")
    want = {l: sum(_share(n, len(labels), k) for n in sizes.values()) for k, l in enumerate(labels)}
    heaps: dict[str, list[tuple[float, str, str]]] = {l: [] for l in labels}  # max-heaps of (-hash, id, text)
    read = dead = 0
    for f in resolve_inputs(paths):
        for item in iter_file(f, Columns.public(text_column)):
            if isinstance(item, DeadLetter):
                dead += 1
                continue
            read += 1
            doc_id = str(item["id"])
            label = next((l for l, p in zip(labels, prefixes) if doc_id.startswith(p)), None)
            if label is None or want[label] == 0:
                continue
            entry = (-hash_unit(seed, "proxy", doc_id), doc_id, item["text"])
            heap = heaps[label]
            if len(heap) < want[label]:
                heapq.heappush(heap, entry)
            elif entry > heap[0]:
                heapq.heapreplace(heap, entry)
    for label in labels:
        if len(heaps[label]) < want[label]:
            raise InputError(f"proxy task: label {label!r} (ids {groups[label]!r}*) has {len(heaps[label])} documents "
                             f"in {paths}; {want[label]} needed")
    out: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    for k, label in enumerate(labels):
        docs = sorted(heaps[label], key=lambda e: (-e[0], e[1]))  # smallest hash first
        start = 0
        for split in SPLITS:
            n = _share(sizes[split], len(labels), k)
            out[split] += [{"id": d, "text": t, "label": label} for _, d, t in docs[start:start + n]]
            start += n
    for split in SPLITS:  # interleave the labels (file order must not group them)
        out[split].sort(key=lambda r: hash_unit(seed, "proxy-order", r["id"]))
    return ProxyTask(train=out["train"], valid=out["valid"], test=out["test"], labels=labels, documents_read=read,
                     dead_letters=dead)


def _share(n: int, k: int, i: int) -> int:
    """Label i's share of n examples over k labels (the first n % k labels get one more)."""
    return n // k + (1 if i < n % k else 0)
