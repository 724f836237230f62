"""Choosing among synthetic corpora (e.g. sampling settings) on the synthetic valid split only.

The paper tunes generation settings without touching real data: each corpus's downstream
classifier is scored on that corpus's own synthetic valid split, and the best corpus per
group (e.g. per DP mode and epsilon) is kept. Nothing here reads a real split, so the
choice spends no privacy (the real test accuracy of the chosen corpus is only reported).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def select_on_synthetic_valid(rows: Sequence[Mapping[str, Any]], group_by: Sequence[str],
                              classifier: str = "wordcnn") -> list[dict[str, Any]]:
    """The row with the best `<classifier>_synthetic_valid_accuracy` in each group.

    Args:
      rows: evaluation rows (`dpsynth.evaluate.scoring` metrics rows); rows without a
        synthetic-valid score (errors) are skipped.
      group_by: row fields that define a group (e.g. ("mode", "epsilon")).
      classifier: whose synthetic-valid accuracy decides.

    Returns:
      one row per group, in the order groups first appear, with `selected_by` and
      `candidates` (the group's size) added. Ties go to the earlier row.
    """
    key = f"{classifier}_synthetic_valid_accuracy"
    best: dict[tuple, dict[str, Any]] = {}
    sizes: dict[tuple, int] = {}
    for row in rows:
        score = row.get(key)
        if score is None:
            continue
        group = tuple(row.get(g) for g in group_by)
        sizes[group] = sizes.get(group, 0) + 1
        if group not in best or float(score) > float(best[group][key]):
            best[group] = dict(row)
    return [{**r, "selected_by": key, "candidates": sizes[g]} for g, r in best.items()]
