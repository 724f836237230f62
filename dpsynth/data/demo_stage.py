"""Planting sensitive texts into a public corpus, for the demo's contamination check.

The demo (`dpsynth.experiment.stages.public_corpus` with `public.plant: N`) contaminates its
copy of the public corpus ON PURPOSE, and says so, so that the dedup stage can be seen finding
and cutting the planted texts; `plant` does the insertion.
"""

from __future__ import annotations

import random


def plant(documents: list[dict[str, str]], reviews: list[dict[str, str]], seed: int) -> list[dict[str, str]]:
    """Copies of `documents` with each review inserted at a random paragraph boundary of one of them."""
    rng = random.Random(seed)
    docs = [dict(d) for d in documents]
    for review in reviews:
        doc = docs[rng.randrange(len(docs))]
        paragraphs = doc["text"].split("\n\n")
        paragraphs.insert(rng.randrange(len(paragraphs) + 1), review["text"])
        doc["text"] = "\n\n".join(paragraphs)
    return docs
