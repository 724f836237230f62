"""Sensitive datasets from TensorFlow Datasets (the `[tf]` extra), with the paper's split.

dpsynth never downloads at run time: `load_tfds` reads a `data_dir` that already holds the
prepared dataset (made elsewhere with `tfds build imdb_reviews --data_dir DIR`, or copied).
Splits: the first 90% of `train` (stored order) is train, the last 10% is valid, `test` is
test (`split_train_valid`). Records are `{"id", "text", "label"}` with the label as the
class name (e.g. "pos"/"neg").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from dpsynth.errors import MissingFileError

VALID_FRACTION = 0.1


@dataclasses.dataclass(frozen=True)
class TfdsSpec:
    """How one TFDS dataset maps to text: the feature(s) joined by `joiner`, and the label."""

    text_features: tuple[str, ...]
    label_feature: str = "label"
    joiner: str = ". "


SUPPORTED: dict[str, TfdsSpec] = {
    "imdb_reviews": TfdsSpec(("text",)),
    "yelp_polarity_reviews": TfdsSpec(("text",)),
    "ag_news_subset": TfdsSpec(("title", "description")),
}


def split_train_valid(rows: Sequence[Any], valid_fraction: float = VALID_FRACTION) -> tuple[list, list]:
    """The paper's split: first (1 - f) of the rows (in stored order) and the last f (rounded)."""
    if not 0.0 <= valid_fraction < 1.0:
        raise ValueError(f"valid_fraction must be in [0, 1), got {valid_fraction}")
    n_valid = int(round(len(rows) * valid_fraction))
    cut = len(rows) - n_valid
    return list(rows[:cut]), list(rows[cut:])


def _text(example: dict[str, Any], spec: TfdsSpec) -> str:
    parts = []
    for f in spec.text_features:
        v = example[f]
        parts.append(v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v))
    return spec.joiner.join(p.strip() for p in parts if p.strip())


def load_tfds(name: str, *, data_dir: str | None = None, valid_fraction: float = VALID_FRACTION) -> dict[str, list[dict[str, str]]]:
    """`{"train", "valid", "test"}` record lists of a prepared TFDS dataset.

    Raises:
      ValueError: unsupported dataset name.
      MissingFileError (a FileNotFoundError): the dataset is not prepared in `data_dir` (dpsynth does not download).
    """
    if name not in SUPPORTED:
        raise ValueError(f"tfds:{name}: unsupported; choose one of {sorted(SUPPORTED)} or export it to JSONL/CSV")
    import tensorflow_datasets as tfds

    spec = SUPPORTED[name]
    builder = tfds.builder(name, data_dir=data_dir)
    label = builder.info.features[spec.label_feature]
    out: dict[str, list[dict[str, str]]] = {}
    for split in ("train", "test"):
        try:
            ds = builder.as_dataset(split=split, shuffle_files=False)
        except (AssertionError, FileNotFoundError, ValueError) as e:
            raise MissingFileError(
                f"tfds:{name}: split {split!r} is not prepared under data_dir={data_dir!r} ({e}); prepare it "
                f"offline with `tfds build {name} --data_dir DIR` and pass --tfds-data-dir DIR"
            ) from e
        rows = []
        for i, ex in enumerate(tfds.as_numpy(ds)):
            rows.append({"id": f"{name}/{split}-{i:06d}", "text": _text(ex, spec),
                         "label": label.int2str(int(ex[spec.label_feature]))})
        out[split] = rows
    out["train"], out["valid"] = split_train_valid(out["train"], valid_fraction)
    return out
