"""The real stage functions of the experiment runner: thin adapters over the stage libraries.

Each function takes a `cache.StageContext` (its config subset, its inputs' output
directories, a directory to write) and calls ONE library function of its stage; it returns a
small JSON summary (counts, metrics, hashes: never private text) and writes a short human
report with `ctx.report`. A stage whose library is not installed raises `StageUnavailable`
naming the module, and the runner stops there.

Output layout of each stage directory (besides `stage.json` and `report.txt`):

| stage      | files                                                                      |
|------------|----------------------------------------------------------------------------|
| sensitive  | `data/{train,valid,test}.jsonl` (`id`, `text`, `label`), `dead_letters.jsonl` |
| public     | `corpus/public.jsonl` (`id`, `text`), `planted.json` (ids only)             |
| tokenizer  | `tokenizer.model`                                                          |
| dedup      | the dedup job's output: `clean/` token shards + JSONL, `contamination.json` |
| pretrain   | `checkpoint/` (the checkpoint-directory layout of `dpsynth.train.checkpoint`) |
| dp_tune    | `model/` (tuned checkpoint + `privacy_report.json`/`.md`)                  |
| generate   | the generation job's output (`train.jsonl`, `valid.jsonl`, `generation_report.json`) |
| evaluate   | the batch report (`metrics.json`, `metrics.csv`, `report.html`)             |
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import random
from collections.abc import Mapping, Sequence
from typing import Any

from dpsynth.experiment.cache import StageContext, StageUnavailable

VALID_FRACTION = 0.1  # the paper's split: last 10% of train is valid
PLANT_MIN_WORDS = 80  # planted reviews must be long enough to hold a >= 50-token sequence


def _module(stage: str, name: str, attr: str | None = None):
    """Imports `name` (and checks `attr`), or raises StageUnavailable when it does not exist.

    A module that exists but fails to import is a bug, not a missing stage: that error
    propagates unchanged.
    """
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        spec = None
    if spec is None:
        raise StageUnavailable(stage, f"module {name} does not exist yet")
    module = importlib.import_module(name)
    if attr is not None and not hasattr(module, attr):
        raise StageUnavailable(stage, f"{name}.{attr} does not exist yet")
    return module


def _write_json(path: str, value: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, sort_keys=True, allow_nan=True)


def _read_jsonl(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ----------------------------------------------------------------------------- data


def _embedded():
    from dpsynth.data import embedded

    return embedded


def _quiet(fn):
    """Calls `fn()` without the `rdata` package's warnings about R classes it maps."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return fn()


def load_sensitive_splits(config: Mapping[str, Any]) -> tuple[dict[str, list[dict[str, Any]]], list[Any]]:
    """The train/valid/test records of the `sensitive` config subset, plus dead letters.

    Embedded: the fine-food reviews (`dpsynth.data.embedded`). Files: read with
    `dpsynth.data.readers.read_sensitive`; without a valid file, the last 10% of train is
    valid. `max_*` keep the first N records of each split.
    """
    dead: list[Any] = []
    if config["embedded"]:
        splits = _quiet(_embedded().fine_food_splits)
    else:
        from dpsynth.data import readers

        splits = {}
        for split in ("train", "valid", "test"):
            path = config.get(split)
            if not path:
                continue
            if config.get("format", "auto") != "auto":
                for f in readers.resolve_inputs(path):
                    if f.format != config["format"]:
                        raise readers.InputError(f"{f.path}: sensitive.format is {config['format']!r} but the file is {f.format}")
            ds = readers.read_sensitive(path, text_column=config["text_column"], label_column=config["label_column"])
            dead.extend(ds.dead_letters)
            splits[split] = [{"id": r["id"], "text": r["text"], "label": str(r["label"])} for r in ds.records]
        if "valid" not in splits:
            n_valid = int(round(len(splits["train"]) * VALID_FRACTION))
            splits["valid"] = splits["train"][len(splits["train"]) - n_valid :]
            splits["train"] = splits["train"][: len(splits["train"]) - n_valid]
    for split in ("train", "valid", "test"):
        limit = config.get(f"max_{split}")
        if limit:
            splits[split] = splits[split][:limit]
    return splits, dead


def count_train(config: Mapping[str, Any]) -> int:
    """|D_train| of a `sensitive` config subset (reads the data; used by dry runs)."""
    splits, _ = load_sensitive_splits(config)
    return len(splits["train"])


def sensitive_data(ctx: StageContext) -> dict[str, Any]:
    """Reads the sensitive dataset once into `train/valid/test.jsonl` (the stages' one copy)."""
    from dpsynth.data import readers

    splits, dead = load_sensitive_splits(ctx.config)
    for split, records in splits.items():
        if not records:
            raise readers.EmptyDatasetError(f"sensitive.{split}: no records")
        readers.write_jsonl(os.path.join(ctx.out_dir, "data", f"{split}.jsonl"), records)
    readers.write_jsonl(os.path.join(ctx.out_dir, "dead_letters.jsonl"), [d.to_json() for d in dead])
    labels = sorted({r["label"] for r in splits["train"]})
    unknown = sorted({r["label"] for s in ("valid", "test") for r in splits[s]} - set(labels))
    if unknown:
        raise readers.InputError(f"sensitive: labels {unknown} appear in valid/test but not in train")
    summary = {f"num_{s}": len(r) for s, r in splits.items()}
    summary.update(labels=labels, dead_lettered=len(dead))
    source = "embedded fine-food reviews" if ctx.config["embedded"] else "files"
    ctx.report(
        f"sensitive data ({source}): train {summary['num_train']} / valid {summary['num_valid']} / "
        f"test {summary['num_test']} examples; labels {', '.join(labels)}; {len(dead)} dead-lettered"
    )
    return summary


def plant_documents(
    documents: list[dict[str, Any]], candidates: Sequence[dict[str, Any]], n: int, seed: int
) -> tuple[list[dict[str, Any]], list[str]]:
    """Copies `n` long candidate texts into public documents at paragraph boundaries.

    For the demo only: it contaminates the public corpus ON PURPOSE, so the dedup stage
    can be seen to find and cut the planted reviews. Returns (new documents, planted ids).
    """
    rng = random.Random(seed)
    long_enough = [c for c in candidates if len(c["text"].split()) >= PLANT_MIN_WORDS]
    if len(long_enough) < n:
        raise ValueError(f"public.plant: only {len(long_enough)} sensitive training texts have >= {PLANT_MIN_WORDS} words; asked for {n}")
    chosen = rng.sample(long_enough, n)
    docs = [dict(d) for d in documents]
    for c in chosen:
        doc = docs[rng.randrange(len(docs))]
        paragraphs = doc["text"].split("\n\n")
        at = rng.randrange(len(paragraphs) + 1)
        paragraphs.insert(at, c["text"])
        doc["text"] = "\n\n".join(paragraphs)
    return docs, [c["id"] for c in chosen]


def public_corpus(ctx: StageContext) -> dict[str, Any]:
    """Collects the public corpus into `corpus/public.jsonl`; plants sensitive texts if asked."""
    from dpsynth.data import readers

    docs: list[dict[str, Any]] = []
    if ctx.config["embedded"]:
        docs += [{"id": f"austen/{d['id']}", "text": d["text"]} for d in _quiet(_embedded().austen_documents)]
    if ctx.config["paths"]:
        ds = readers.read_public(list(ctx.config["paths"]))
        docs += [{"id": r["id"], "text": r["text"]} for r in ds.records]
        if ds.dead_letters:
            readers.write_jsonl(os.path.join(ctx.out_dir, "dead_letters.jsonl"), [d.to_json() for d in ds.dead_letters])
    if ctx.config.get("max_documents"):
        docs = docs[: ctx.config["max_documents"]]
    planted: list[str] = []
    if ctx.config["plant"]:
        train = _read_jsonl(ctx.inputs["sensitive"].path("data", "train.jsonl"))
        docs, planted = plant_documents(docs, train, ctx.config["plant"], ctx.config["seed"])
    os.makedirs(os.path.join(ctx.out_dir, "corpus"))
    readers.write_jsonl(os.path.join(ctx.out_dir, "corpus", "public.jsonl"), docs)
    _write_json(os.path.join(ctx.out_dir, "planted.json"), {"planted_ids": planted})
    size = sum(len(d["text"].encode("utf-8")) for d in docs)
    text = f"public corpus: {len(docs)} documents, {size / 1e6:.2f} MB"
    if planted:
        text += (f"\n  DEMO: planted {len(planted)} sensitive training reviews into the public corpus on purpose "
                 f"(ids {', '.join(planted)}); the dedup stage must find and cut them")
    ctx.report(text)
    return {"num_documents": len(docs), "bytes": size, "planted_ids": planted}


# ----------------------------------------------------------------------------- tokenizer


def tokenizer(ctx: StageContext) -> dict[str, Any]:
    """SentencePiece on the PUBLIC corpus only (`dpsynth.data.tokenizer_training`)."""
    training = _module("tokenizer", "dpsynth.data.tokenizer_training", "train_public_tokenizer")
    tok = training.train_public_tokenizer(
        [ctx.inputs["public"].path("corpus")],
        vocab_size=ctx.config["vocab_size"],
        out=os.path.join(ctx.out_dir, "tokenizer.model"),
        max_sentences=ctx.config["max_sentences"],
        seed=ctx.config["seed"],
    )
    ctx.report(f"tokenizer: {tok.vocab_size} pieces, sha256 {tok.sha256[:12]}")
    return {"vocab_size": tok.vocab_size, "sha256": tok.sha256}


REGISTRY = {
    "sensitive": sensitive_data,
    "public": public_corpus,
    "tokenizer": tokenizer,
}


# ----------------------------------------------------------------------------- dedup


def _contaminated_ids(report: Mapping[str, Any]) -> set[str]:
    """Ids of sensitive examples that the contamination report lists as found."""
    found: set[str] = set()
    for entry in report.get("sensitive", []):
        for key in ("contaminated_ids", "ids"):
            if key in entry:
                found.update(str(i) for i in entry[key])
    return found


def dedup(ctx: StageContext) -> dict[str, Any]:
    """Cuts every >= min_tokens sequence shared with the sensitive data (`dpsynth.beam.jobs.dedup`)."""
    jobs = _module("dedup", "dpsynth.beam.jobs", "dedup")
    report_lib = _module("dedup", "dpsynth.dedup.report", "summarize")
    report = jobs.dedup(
        [ctx.inputs["public"].path("corpus")],
        [f"sensitive={ctx.inputs['sensitive'].path('data')}"],
        tokenizer_path=ctx.inputs["tokenizer"].path("tokenizer.model"),
        out_dir=ctx.out_dir,
        min_tokens=ctx.config["min_tokens"],
        threads=os.cpu_count() or 1,
    )
    ctx.report(report_lib.summarize(report), echo=False)  # the job printed it already
    planted = list(ctx.inputs["public"].summary.get("planted_ids", []))
    summary: dict[str, Any] = {"contamination_sha256": _sha256_file(os.path.join(ctx.out_dir, "contamination.json"))}
    if planted:
        found = _contaminated_ids(report)
        hit = [i for i in planted if i in found]
        summary.update(planted=len(planted), planted_found=len(hit))
        ctx.report(f"DEMO check: {len(hit)} of the {len(planted)} planted reviews were found and cut from the public corpus"
                   + ("" if len(hit) == len(planted) else f" (missed: {', '.join(i for i in planted if i not in found)})"))
    return summary


def _sha256_file(path: str) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


REGISTRY["dedup"] = dedup
