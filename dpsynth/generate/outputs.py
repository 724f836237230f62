"""The generation job's files: the output directory, shard files, merged splits, privacy report.

`prepare_out_dir` writes `generation_config.json` first and refuses a directory holding
another job's config; `shard_complete` tells which shards a rerun may skip; `merge_outputs`
concatenates the shards in index order into `{split}.jsonl` (and Parquet / TFRecord);
`copy_privacy_report` carries the model's privacy report (composed with a DP label
histogram) into the output; `write_generation_report` and `write_manifest` come last. Shards,
splits and JSON files are written atomically (temporary file + rename).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from dpsynth import fileio, outdir
from dpsynth.dp import report as dp_report
from dpsynth.generate.model_info import GenerateError, ModelInfo, read_json
from dpsynth.generate.plan import FORMAT, FORMAT_VERSION, SHARD_DIR, SPLITS, GenerationPlan, ShardSpec
from dpsynth.generate.postprocess import filter_samples, keys_of

CONFIG_FILE = "generation_config.json"
MANIFEST_FILE = "manifest.json"
REPORT_FILE = "generation_report.json"
PRIVACY_FILES = dp_report.PRIVACY_FILES
MEMORISATION_AUDIT_FILE = "memorisation_audit.json"  # owner-only, outside the output directory


def shard_complete(plan: GenerationPlan, spec: ShardSpec) -> bool:
    """True when the shard's file exists with exactly the planned number of records."""
    path = plan.shard_path(spec)
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip()) == spec.count


def prepare_out_dir(plan: GenerationPlan) -> None:
    """Creates the output dir, or checks it belongs to this job (same config hash)."""
    out = plan.out_dir
    cfg_path = os.path.join(out, CONFIG_FILE)
    if os.path.exists(cfg_path):
        existing = read_json(cfg_path)
        if existing.get("config_hash") != plan.config_hash:
            raise GenerateError(
                f"{out}: holds another generation job's output (config hash {str(existing.get('config_hash'))[:12]} != "
                f"{plan.config_hash[:12]}); choose another --out or delete the directory"
            )
    elif os.path.isdir(os.path.join(out, SHARD_DIR)) and os.listdir(os.path.join(out, SHARD_DIR)):
        raise GenerateError(f"{out}: has shards but no {CONFIG_FILE}; choose another --out or delete the directory")
    os.makedirs(os.path.join(out, SHARD_DIR), exist_ok=True)
    for name in os.listdir(os.path.join(out, SHARD_DIR)):  # partial writes of a killed run
        if fileio.TMP_MARK in name:
            os.remove(os.path.join(out, SHARD_DIR, name))
    if not os.path.exists(cfg_path):
        fileio.write_json(cfg_path, plan.config_json)


def _write_parquet(path: str, rows: list[dict[str, str]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"text": [r["text"] for r in rows], "label": [r["label"] for r in rows]})
    with fileio.atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def _write_tfrecord(path: str, rows: list[dict[str, str]]) -> None:
    try:
        import tensorflow as tf
    except ImportError as e:  # pragma: no cover - depends on the [tf] extra
        raise GenerateError("--format tfrecord needs the [tf] extra (pip install 'dpsynth[tf]')") from e
    with fileio.atomic_path(path) as tmp, tf.io.TFRecordWriter(tmp) as writer:
        for r in rows:
            feature = {k: tf.train.Feature(bytes_list=tf.train.BytesList(value=[r[k].encode("utf-8")])) for k in ("text", "label")}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def merge_outputs(plan: GenerationPlan, formats: Sequence[str]) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """Concatenates the shards of each split in order into DIR/{split}.{jsonl,...}.

    With `plan.postprocess`, each split keeps the first N samples (N = the requested number)
    that pass its filters; the counts are in the entry's "postprocess" field.

    Returns:
      (the manifest's "splits" entry, the kept records per split for the report).
    """
    splits: dict[str, Any] = {}
    kept_keys: set = set()
    records: dict[str, list[dict[str, Any]]] = {}
    for split in SPLITS:
        specs = [s for s in plan.specs if s.split == split]
        if not specs:
            continue
        rows, shard_entries = [], []
        for spec in specs:
            path = plan.shard_path(spec)
            with open(path, "rb") as f:
                data = f.read()
            shard_rows = fileio.parse_jsonl(data)
            if len(shard_rows) != spec.count:
                raise GenerateError(f"{path}: {len(shard_rows)} records, expected {spec.count} (rerun to regenerate it)")
            rows.extend(shard_rows)
            shard_entries.append({"name": spec.name, "num_examples": spec.count, "sha256": fileio.sha256_bytes(data)})
        counts = None
        if plan.postprocess is not None:
            want = int(plan.config_json["num_examples"][split])
            rows, counts = filter_samples(rows, plan.postprocess, want, seen=kept_keys if split == "valid" else ())
            if not rows:
                raise GenerateError(f"{plan.out_dir}: no {split} sample survived the post-processing filters {counts}")
            kept_keys |= keys_of(rows)
        records[split] = rows
        out_rows = [{"text": r["text"], "label": r["label"]} for r in rows]
        files = {}
        jsonl = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in out_rows).encode("utf-8")
        fileio.write_bytes(os.path.join(plan.out_dir, f"{split}.jsonl"), jsonl)
        files["jsonl"] = {"path": f"{split}.jsonl", "sha256": fileio.sha256_bytes(jsonl)}
        if "parquet" in formats:
            _write_parquet(os.path.join(plan.out_dir, f"{split}.parquet"), out_rows)
            files["parquet"] = {"path": f"{split}.parquet"}
        if "tfrecord" in formats:
            _write_tfrecord(os.path.join(plan.out_dir, f"{split}.tfrecord"), out_rows)
            files["tfrecord"] = {"path": f"{split}.tfrecord"}
        splits[split] = {"num_examples": len(rows), "files": files, "shards": shard_entries}
        if counts is not None:
            splits[split]["postprocess"] = counts
    return splits, records


def copy_privacy_report(plan: GenerationPlan, private: bool) -> None:
    """Carries the model's privacy report into DIR (composed with a DP label histogram, if
    one was used), or writes a non-private marker."""
    dist = plan.config_json["label_distribution"]
    if private and dist["source"] == "dp_histogram":
        from dpsynth.dp import report as dp_report

        report = dp_report.load_report(plan.model_dir)
        report = dp_report.compose_gaussian(
            report, noise_multiplier=dist["noise_multiplier"], name="label_histogram", run=dist.get("run"),
            detail="generator's label distribution: Gaussian mechanism on the label counts of D_train (sensitivity 1)",
        )
        dp_report.write_report(plan.out_dir, report)
        return
    if private or os.path.exists(os.path.join(plan.model_dir, PRIVACY_FILES[0])):  # a non-private report says so
        for name in PRIVACY_FILES:
            src = os.path.join(plan.model_dir, name)
            if os.path.exists(src):
                fileio.copy_file(src, os.path.join(plan.out_dir, name))
        return
    marker = {
        "private": False,
        "reason": f"generated with --allow-non-private from {plan.model_dir}, which has no privacy report",
        "guarantee": "none: this synthetic data may reveal its training data",
    }
    fileio.write_json(os.path.join(plan.out_dir, "privacy_report.json"), marker)
    fileio.write_text(os.path.join(plan.out_dir, "privacy_report.md"),
                      "# Privacy report\n\n**NOT PRIVATE.** " + marker["reason"] + ". " + marker["guarantee"].capitalize() + ".\n")


def write_generation_report(plan: GenerationPlan, splits: dict[str, Any],
                            records: dict[str, list[dict[str, Any]]]) -> None:
    """Writes DIR/generation_report.json, computed from the synthetic records alone (and the
    post-processing counts of `merge_outputs`, when it filtered)."""
    from dpsynth.generate import report as report_lib

    gen_report = report_lib.generation_report(records, plan.config_json["label_distribution"],
                                              max_len=plan.sampler.max_len)
    if plan.postprocess is not None:
        gen_report["postprocess"] = {"config": plan.postprocess.to_json(), "note":
                                     "samples filtered by their own content: post-processing, no privacy cost",
                                     **{split: entry["postprocess"] for split, entry in splits.items()}}
    fileio.write_json(os.path.join(plan.out_dir, REPORT_FILE), gen_report)


def write_manifest(plan: GenerationPlan, info: ModelInfo, splits: dict[str, Any]) -> dict[str, Any]:
    """Writes DIR/manifest.json (the job's identity, the model's, and every split's files); returns it."""
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        outdir.KIND_FIELD: outdir.CORPUS,
        "config_hash": plan.config_hash,
        "private": info.private,
        "model_dir": plan.config_json["model_dir"],
        "model_fingerprint": info.fingerprint,
        "splits": splits,
        "files": {"config": CONFIG_FILE, "report": REPORT_FILE, "privacy_report": list(PRIVACY_FILES)},
    }
    fileio.write_json(os.path.join(plan.out_dir, MANIFEST_FILE), manifest)
    return manifest


def default_audit_dir(out_dir: str) -> str:
    """The default owner-only directory of a job's memorisation audit: `OUT.private` beside OUT."""
    return os.path.abspath(out_dir).rstrip(os.sep) + ".private"
