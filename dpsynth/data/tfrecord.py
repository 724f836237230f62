"""TFRecord / `tf.Example` output (the `[tf]` extra), e.g. for synthetic datasets.

Each record becomes one `tf.train.Example` whose string fields are `bytes_list` features
(UTF-8), integer fields `int64_list` and float fields `float_list`; the same field names as
the JSONL output (`id`, `text`, `label`, ...). Files are written through a temporary name
and renamed, so a reader never sees a partial file.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from dpsynth import fileio


def to_example(record: dict[str, Any]) -> bytes:
    """One record as a serialized `tf.train.Example`."""
    import tensorflow as tf

    feats = {}
    for key in sorted(record):
        value = record[key]
        if isinstance(value, bool) or isinstance(value, int):
            feats[key] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))
        elif isinstance(value, float):
            feats[key] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
        elif isinstance(value, (str, bytes)):
            data = value.encode("utf-8") if isinstance(value, str) else value
            feats[key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[data]))
        else:
            raise TypeError(f"field {key!r}: unsupported type {type(value).__name__} for tf.Example")
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


def write_tfrecord(path: str, records: Iterable[dict[str, Any]]) -> int:
    """Writes records as `tf.Example`s to one TFRecord file (`gs://` works through TF); returns the count."""
    import tensorflow as tf

    if "://" not in path:  # local: whole or absent (`fileio.atomic_path`; a full disk: `DiskFullError`)
        with fileio.atomic_path(path) as tmp:
            return _write_all(tf, tmp, records)
    tmp = fileio.temp_path(path)
    n = _write_all(tf, tmp, records)
    tf.io.gfile.rename(tmp, path, overwrite=True)
    return n


def _write_all(tf, path: str, records: Iterable[dict[str, Any]]) -> int:
    n = 0
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(to_example(record))
            n += 1
    return n


def read_tfrecord(path: str, string_fields: Sequence[str] = ("id", "text", "label")) -> list[dict[str, Any]]:
    """Reads back a file written by `write_tfrecord` (all features, strings decoded)."""
    import tensorflow as tf

    out = []
    for raw in tf.data.TFRecordDataset([path]).as_numpy_iterator():
        ex = tf.train.Example.FromString(raw)
        row = {}
        for key, feat in ex.features.feature.items():
            kind = feat.WhichOneof("kind")
            value = list(getattr(feat, kind).value)[0]
            row[key] = value.decode("utf-8") if kind == "bytes_list" and key in string_fields else value
        out.append(row)
    return out
