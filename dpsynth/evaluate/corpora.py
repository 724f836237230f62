"""Reading synthetic corpora (generation output directories) and the real splits, with checks.

A synthetic corpus is a directory with `train.jsonl` and `valid.jsonl` (`text`, `label`),
optionally `privacy_report.json` (absent: the corpus is marked NON-PRIVATE),
`generation_report.json` and `generation_config.json`. A directory a `dpsynth generate` run
left without its `manifest.json`, or whose split files differ from it, is refused
(`dpsynth.outdir.require_corpus`). Rows whose text is empty or not a
string are dropped and COUNTED (`invalid_rows`, shown in every table); a corpus with no valid
row in a split is an error. Real splits are read with `dpsynth.data.readers.read_sensitive`; by
default any dead-lettered record there is an error naming the file, the record and the reason;
an entry point that has told the user about them (`dpsynth.data.dead_letters`) passes its
`--max-dead-letters` limit instead.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from dpsynth import binding, fileio, outdir
from dpsynth.errors import DpsynthError
from dpsynth.generate.sampler_config import SamplingOptions


class CorpusError(DpsynthError, ValueError):
    """A synthetic corpus or real split that cannot be evaluated (names the file and reason)."""


@dataclasses.dataclass
class Corpus:
    """One synthetic corpus as read from its directory."""

    name: str
    path: str
    train: list[dict]
    valid: list[dict]
    invalid_rows: int
    privacy_report: dict | None
    generation_report: dict | None
    generation_config: dict | None

    @property
    def private(self) -> bool:
        return bool(self.privacy_report) and bool(self.privacy_report.get("private", True))

    def card(self) -> dict[str, Any]:
        """Flat privacy/contamination/generation facts for the table and the report cards."""
        pr, gc = self.privacy_report or {}, self.generation_config or {}
        training = pr.get("training") or {}
        eps = pr.get("epsilon") or {}
        accountant = pr.get("accountant")
        epsilon = eps.get(accountant) if isinstance(eps, dict) and accountant else None
        if epsilon is None and isinstance(eps, dict):
            epsilon = next((v for v in eps.values() if v is not None), None)
        if epsilon is None and not isinstance(eps, dict):
            epsilon = eps
        sampler = gc.get("sampler") or {}
        return {
            "private": self.private,
            "epsilon": _num(epsilon) if self.private else float("inf"),
            "target_epsilon": _num(pr.get("target_epsilon")) if self.private else float("inf"),
            "delta": pr.get("delta"),
            "accountant": accountant,
            "mode": training.get("mode") or gc.get("mode") or ("unknown" if self.private else "non-private"),
            "noise_multiplier": training.get("noise_multiplier"),
            "steps": training.get("steps"),
            "clip_norm": training.get("clip_norm") or training.get("clipping_norm"),
            "contamination_sha256": pr.get("contamination_sha256"),
            "side_channels": "; ".join(str(s.get("name", s)) for s in pr.get("side_channels") or []) or None,
            **sampling_card(sampler),
            "generator": gc.get("model_dir"),
        }


# Sampling options the card leaves out: guidance was in generation configs before the card
# derived its columns from `SamplingOptions` (reports of guided corpora keep their bytes);
# guidance_contrast is not in the sampler's identity (the job records it beside it).
CARD_OMITS = ("guidance", "guidance_contrast")


def sampling_card(sampler: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling options (`dpsynth.generate.sampler_config.SamplingOptions`) of a corpus's
    `generation_config.json` "sampler": the first ones always (None when absent), the ones
    added later (`binding.UNLESS_DEFAULT`, e.g. min_p) only when the corpus used them."""
    out = {}
    for f in dataclasses.fields(SamplingOptions):
        if f.name not in CARD_OMITS and (binding.UNLESS_DEFAULT not in f.metadata or f.name in sampler):
            out[f.name] = sampler.get(f.name)
    return out


def _num(x) -> float | None:
    if x is None:
        return None
    if isinstance(x, str):
        return float("inf") if x.lower() in ("inf", "infinity") else float(x)
    return float(x)


def _read_json(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    try:
        return fileio.read_json(path)
    except (OSError, json.JSONDecodeError) as e:
        raise CorpusError(f"{path}: unreadable JSON ({e})") from e


def read_jsonl_split(path: str) -> tuple[list[dict], int]:
    """Valid `{"text", "label"}` rows of a JSONL file and the number of invalid rows dropped."""
    if not os.path.exists(path):
        raise CorpusError(f"{path}: missing (a synthetic corpus has train.jsonl and valid.jsonl)")
    rows, invalid = [], 0
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                invalid += 1
                continue
            text, label = (obj.get("text"), obj.get("label")) if isinstance(obj, dict) else (None, None)
            if not isinstance(text, str) or not text.strip() or label in (None, ""):
                invalid += 1
                continue
            rows.append({"id": str(obj.get("id", f"{os.path.basename(path)}:{n}")), "text": text, "label": str(label)})
    if not rows:
        raise CorpusError(f"{path}: no valid row ({invalid} invalid: empty, non-text or unlabeled)")
    return rows, invalid


def read_corpus(path: str, name: str | None = None) -> Corpus:
    """Reads one synthetic corpus directory."""
    if not os.path.isdir(path):
        raise CorpusError(f"{path}: not a directory")
    try:
        outdir.require_corpus(path)
    except outdir.OutDirError as e:
        raise CorpusError(str(e)) from None
    train, bad_train = read_jsonl_split(os.path.join(path, "train.jsonl"))
    valid, bad_valid = read_jsonl_split(os.path.join(path, "valid.jsonl"))
    return Corpus(
        name=name or os.path.basename(os.path.normpath(path)), path=os.path.abspath(path), train=train, valid=valid,
        invalid_rows=bad_train + bad_valid,
        privacy_report=_read_json(os.path.join(path, "privacy_report.json")),
        generation_report=_read_json(os.path.join(path, "generation_report.json")),
        generation_config=_read_json(os.path.join(path, "generation_config.json")))


def find_corpora(root: str) -> list[str]:
    """Every directory under `root` (itself included) holding a `train.jsonl`, sorted."""
    found = []
    for dirpath, _, files in os.walk(root):
        if "train.jsonl" in files:
            found.append(dirpath)
    if not found:
        raise CorpusError(f"{root}: no synthetic corpus (no directory with train.jsonl)")
    return sorted(found)


def read_real(path: str, name: str, *, max_dead_letters=0, encoding: str | None = None) -> list[dict]:
    """A real labeled split (JSONL, CSV, Parquet; see `dpsynth.data.readers`).

    More dead-lettered records than `max_dead_letters` (`dpsynth.data.dead_letters.parse_limit`:
    N or "P%"; default 0: any bad record) is an error naming the count, the reasons and the first.
    A caller that tolerates some must have told the user (`dead_letters.read_checked`).
    `encoding`: the file's text encoding (default UTF-8).
    """
    from dpsynth.data import dead_letters, readers

    try:
        ds = readers.read_sensitive(path, encoding=encoding)
        dead_letters.check(ds, name=f"{name} ({path})", limit=max_dead_letters)
    except readers.InputError as e:
        raise CorpusError(f"{name}: {e}") from e
    return [{"id": r["id"], "text": r["text"], "label": str(r["label"])} for r in ds.records]


def label_set(records: Sequence[dict]) -> frozenset[str]:
    return frozenset(str(r["label"]) for r in records)
