"""The contamination-removal demo on the embedded default (tokenizer + tokenize + dedup).

`run_contamination_demo` writes the fine-food splits (sensitive) and Jane Austen's novels
(public), PLANTS a few long sensitive training reviews into its own copy of the public
corpus (on purpose, and says so), then does what a real run does with a contaminated public
corpus: a temporary tokenizer trained on it serves the dedup job (and is deleted), the dedup
job finds and cuts the planted reviews, and the released tokenizer is trained on the
deduplicated corpus only, which is then re-tokenized with it
(`dpsynth.beam.jobs.release_tokenizer`).
"""

from __future__ import annotations

import os
import random
import shutil
import warnings
from typing import Any

from dpsynth import fileio
from dpsynth.data import embedded, readers
from dpsynth.dedup import DEFAULT_MIN_TOKENS

PLANT_MIN_WORDS = 80  # long enough to hold a >= 50-token sequence


def _quiet(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return fn(*args)


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


def run_contamination_demo(
    data_dir: str | None,
    out_dir: str,
    *,
    vocab_size: int = 8000,
    num_planted: int = 5,
    min_tokens: int = DEFAULT_MIN_TOKENS,
    seed: int = 0,
    num_shards: int = 4,
    beam_args: list[str] | None = None,
) -> dict[str, Any]:
    """Runs the demo; returns paths and counts.

    Returns:
      `{"clean_corpus": DIR/dedup/clean, "clean_tokens": DIR/released/clean_tokens (in the
      released tokenizer's ids), "tokenizer": DIR/released/tokenizer.model, "sensitive":
      {"train","valid","test"} JSONL paths, "contamination": DIR/dedup/contamination.json,
      "planted_ids": [...], "found_ids": [...], "report": dict}`.
    """
    from dpsynth.beam import jobs
    from dpsynth.data.tokenizer_training import train_public_tokenizer

    os.makedirs(out_dir, exist_ok=True)
    splits = _quiet(embedded.fine_food_splits, data_dir)
    books = _quiet(embedded.austen_documents, data_dir)
    sensitive = {}
    for split, rows in splits.items():
        sensitive[split] = os.path.join(out_dir, "sensitive", f"{split}.jsonl")
        readers.write_jsonl(sensitive[split], rows)
    public_dir = os.path.join(out_dir, "public")
    os.makedirs(public_dir, exist_ok=True)
    for d in books:
        with open(os.path.join(public_dir, f"{d['id']}.txt"), "w", encoding="utf-8") as f:
            f.write(d["text"])
    print(f"demo: sensitive fine-food reviews train/valid/test = "
          f"{len(splits['train'])}/{len(splits['valid'])}/{len(splits['test'])}; public: {len(books)} Austen novels")

    rng = random.Random(seed)
    long_reviews = [r for r in splits["train"] if len(r["text"].split()) >= PLANT_MIN_WORDS]
    chosen = sorted(rng.sample(long_reviews, min(num_planted, len(long_reviews))), key=lambda r: r["id"])
    planted_dir = os.path.join(out_dir, "public_planted")
    os.makedirs(planted_dir, exist_ok=True)
    for d in plant(books, chosen, seed):
        with open(os.path.join(planted_dir, f"{d['id']}.txt"), "w", encoding="utf-8") as f:
            f.write(d["text"])
    planted_ids = [r["id"] for r in chosen]
    print(f"demo: PLANTING {len(chosen)} sensitive training reviews (>= {PLANT_MIN_WORDS} words each; ids "
          f"{', '.join(planted_ids)}) into this demo's copy of the public corpus ON PURPOSE, to show dedup cutting them")

    # The dedup's tokenizer sees the contaminated corpus: it serves the dedup only, then goes.
    temporary = os.path.join(out_dir, "dedup_tokenizer.model")
    train_public_tokenizer([planted_dir], vocab_size=vocab_size, out=temporary, seed=seed)
    dedup_dir = os.path.join(out_dir, "dedup")
    report = jobs.dedup([planted_dir], [f"fine_food={os.path.join(out_dir, 'sensitive')}"],
                        tokenizer_path=temporary, out_dir=dedup_dir, min_tokens=min_tokens,
                        num_shards=num_shards, threads=os.cpu_count() or 1, beam_args=beam_args)
    os.remove(temporary)
    shutil.rmtree(os.path.join(dedup_dir, "clean_tokens"), ignore_errors=True)  # the temporary tokenizer's ids
    found = set()
    for entry in report.get("sensitive", []):
        for key in ("shared_example_ids",):
            found.update(str(i) for i in entry.get(key, []))
    hit = [i for i in planted_ids if i in found]
    print(f"demo: {len(hit)} of the {len(planted_ids)} planted reviews were found and cut from the public corpus"
          + ("" if len(hit) == len(planted_ids) else f" (missed: {', '.join(i for i in planted_ids if i not in found)})"))
    fileio.write_json(os.path.join(out_dir, "planted.json"), {"planted_ids": planted_ids, "found": hit},
                      sort_keys=False, newline=False)
    released = jobs.release_tokenizer(os.path.join(dedup_dir, "clean"), vocab_size=vocab_size,
                                      out_dir=os.path.join(out_dir, "released"), seed=seed,
                                      num_shards=num_shards, beam_args=beam_args)
    print(f"demo: released tokenizer trained on the deduplicated corpus only -> {released['tokenizer']}")
    return {
        "clean_corpus": os.path.join(dedup_dir, "clean"),
        "clean_tokens": released["tokens"],
        "tokenizer": released["tokenizer"],
        "sensitive": sensitive,
        "contamination": os.path.join(dedup_dir, "contamination.json"),
        "planted_ids": planted_ids,
        "found_ids": hit,
        "report": report,
    }
