"""The contamination report (`contamination.json`) from merged shard statistics.

Schema (format "dpsynth.contamination", version 1; keys sorted when written):

```
{
  "format": "dpsynth.contamination", "format_version": 1,
  "min_tokens": 50,
  "sensitive_index_sha256": "<SensitiveIndex.sha256>",
  "sensitive": [                                  # one entry per sensitive dataset, in order
    {"name": "train", "num_examples": 3600,
     "num_examples_shared": 2,                    # examples sharing a >= min_tokens sequence
     "shared_example_ids": ["r12", "r907"],       # their ids (sorted), never their text
     "longest_shared_tokens": 312,                # longest sequence shared, any length
     "num_unread": 0,                             # records of the set that could not be read (dead
                                                  # letters): never matched, so NOT protected
     "unread_records": [{"file": "...", "record": 7}]}  # only when num_unread > 0 (the run said
  ],                                                    # --allow-unread-sensitive); never their text
  "public": {"shards": 4, "documents": 6, "documents_touched": 2, "documents_emptied": 0,
             "tokens": 950000, "tokens_removed": 1204},
  "report_sha256": "<sha256 of the canonical JSON of every other key>"
}
```

`report_sha256` is stable: the same inputs give the same hash on every run and machine; later
privacy reports record it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from apache_beam.io.filesystems import FileSystems

from dpsynth.dedup.index import SensitiveIndex
from dpsynth.dedup.match import ShardStats
from dpsynth.fileio import dumps_json, write_bytes_fs

FORMAT = "dpsynth.contamination"
FORMAT_VERSION = 1
REPORT_FILE = "contamination.json"


def merge_stats(stats: Iterable[ShardStats]) -> ShardStats:
    """Merges per-shard statistics (order does not matter)."""
    total = ShardStats(shards=0)
    for s in stats:
        total = total.merge(s)
    return total


def report_sha256(report: dict) -> str:
    """SHA-256 of the canonical JSON (sorted keys, compact) of the report minus its own hash."""
    body = {k: v for k, v in report.items() if k != "report_sha256"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def build_report(index: SensitiveIndex, stats: Iterable[ShardStats] | ShardStats, min_tokens: int,
                 unread: dict[str, list[dict]] | None = None) -> dict:
    """The contamination report dict for `index` and the public shards' statistics.

    Args:
      index: the sensitive index the shards were matched against.
      stats: per-shard ShardStats (merged here) or an already merged one.
      min_tokens: the k the shards were cut with.
      unread: per sensitive set, its records that could not be read (`{"file", "record"}`).
    """
    unread = unread or {}
    total = stats if isinstance(stats, ShardStats) else merge_stats(stats)
    if total.sensitive_shared and max(total.sensitive_shared) >= index.num_documents:
        raise ValueError("statistics name sensitive documents outside the index (another index?)")
    longest = total.dataset_longest + (0,) * (len(index.datasets) - len(total.dataset_longest))
    sensitive = []
    for i, ds in enumerate(index.datasets):
        docs = [d for d in total.sensitive_shared if ds.first_doc <= d < ds.first_doc + ds.num_examples]
        sensitive.append(
            {
                "name": ds.name,
                "num_examples": ds.num_examples,
                "num_examples_shared": len(docs),
                "shared_example_ids": sorted(index.doc_ids[d] for d in docs),
                "longest_shared_tokens": int(longest[i]),
                "num_unread": len(unread.get(ds.name, [])),
            }
        )
        if unread.get(ds.name):
            sensitive[-1]["unread_records"] = sorted(unread[ds.name], key=lambda r: (r["file"], r["record"]))
    report = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "min_tokens": int(min_tokens),
        "sensitive_index_sha256": index.sha256,
        "sensitive": sensitive,
        "public": {
            "shards": total.shards,
            "documents": total.documents,
            "documents_touched": total.documents_touched,
            "documents_emptied": total.documents_emptied,
            "tokens": total.tokens,
            "tokens_removed": total.tokens_removed,
        },
    }
    report["report_sha256"] = report_sha256(report)
    return report


def summary_text(report: dict) -> str:
    """A short human-readable summary: counts, lengths and hashes only (no text, no ids)."""
    pub = report["public"]
    pct = 100.0 * pub["tokens_removed"] / pub["tokens"] if pub["tokens"] else 0.0
    unread = sum(ds.get("num_unread", 0) for ds in report["sensitive"])
    lines = [
        f"Contamination report (sequences of >= {report['min_tokens']} tokens shared with sensitive data)"
        + (f": {unread} sensitive records could NOT be read and are NOT protected (a public copy of them was "
           "not looked for; `unread_records` in contamination.json lists them)" if unread else ""),
        f"  public corpus: {pub['documents']} documents, {pub['tokens']} tokens; "
        f"removed {pub['tokens_removed']} tokens ({pct:.4f}%) from {pub['documents_touched']} documents"
        + (f" ({pub['documents_emptied']} left empty)" if pub["documents_emptied"] else ""),
    ]
    for ds in report["sensitive"]:
        lines.append(
            f"  sensitive {ds['name']!r}: {ds['num_examples_shared']} of {ds['num_examples']} examples "
            f"share a >= {report['min_tokens']}-token sequence; longest shared sequence "
            f"{ds['longest_shared_tokens']} tokens"
            + (f"; {ds['num_unread']} records unread, NOT protected" if ds.get("num_unread") else
               "; 0 records unread")
        )
    lines.append(f"  report sha256: {report['report_sha256']}")
    return "\n".join(lines)


def write_report(directory: str, report: dict) -> str:
    """Writes `directory/contamination.json` (sorted keys, trailing newline); returns the path."""
    if report.get("report_sha256") != report_sha256(report):
        raise ValueError("report_sha256 does not match the report content")
    path = FileSystems.join(directory, REPORT_FILE)
    write_bytes_fs(path, dumps_json(report).encode("utf-8"))
    return path


def summarize(report: dict) -> str:
    """Alias of `summary_text` (the name the experiment runner calls)."""
    return summary_text(report)
