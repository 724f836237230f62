"""`dpsynth audit`: the owner-only audit of a released synthetic corpus (`audit_release`).

Inputs: a synthetic corpus directory (the output of `dpsynth generate`, with its
`manifest.json`), D_train and D_test (any reader format), a tokenizer (default: the corpus's
generator model's). Optional: the canary run (`dpsynth.release_audit.canaries`), which needs
the base model and the dp-tune configuration, and reruns dp-tune and generate on D_train with
canaries planted, into the output directory's `canary_run/`.

Output (`OUT`, created 0700, files 0600; it reads D_train and is NOT differentially private,
so it is never part of a release and must not sit inside one): `release_audit.json` and
`release_audit.md` (docs/formats.md). No record text is written, only numbers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from dpsynth import fileio
from dpsynth.data import dead_letters
from dpsynth.errors import DpsynthError
from dpsynth.release_audit import copying

FORMAT = "dpsynth.release_audit"
FORMAT_VERSION = 1
REPORT_JSON, REPORT_MD = "release_audit.json", "release_audit.md"
NOTICE = ("This audit reads D_train and is NOT differentially private: it is for the data owner and must never "
          "be published or shipped with the synthetic corpus.")


class AuditError(DpsynthError, ValueError):
    """Bad input of `dpsynth audit` (names the file and the reason)."""


def read_release(corpus_dir: str) -> tuple[list[dict], dict, int]:
    """The records of every split of a synthetic corpus (as its manifest lists them), the
    manifest, and the number of rows skipped (empty, non-text or unlabeled; counted, as every
    corpus reader does, `dpsynth.evaluate.corpora`).

    A directory without `manifest.json` (an unfinished or foreign directory) is refused.
    """
    from dpsynth.evaluate.corpora import read_jsonl_split

    path = os.path.join(corpus_dir, "manifest.json")
    if not os.path.isfile(path):
        raise AuditError(f"{corpus_dir}: no manifest.json (not a finished synthetic corpus)")
    try:
        manifest = fileio.read_json(path)
    except (OSError, ValueError) as e:
        raise AuditError(f"{path}: unreadable JSON ({e})") from e
    if manifest.get("format") != "dpsynth.synthetic" or not isinstance(manifest.get("splits"), dict):
        raise AuditError(f"{path}: not a synthetic corpus manifest (format {manifest.get('format')!r})")
    records: list[dict] = []
    skipped = 0
    for split in sorted(manifest["splits"]):
        rows, invalid = read_jsonl_split(os.path.join(corpus_dir, f"{split}.jsonl"))
        records.extend(rows)
        skipped += invalid
    return records, manifest, skipped


def generator_model(corpus_dir: str, manifest: dict) -> str | None:
    """The corpus's generator model directory: its manifest's `model_dir` (`dpsynth generate`), else
    its `generation_config.json`'s (a corpus released by `dpsynth select` carries the winner's)."""
    if manifest.get("model_dir"):
        return manifest["model_dir"]
    path = os.path.join(corpus_dir, "generation_config.json")
    try:
        return fileio.read_json(path).get("model_dir") if os.path.isfile(path) else None
    except (OSError, ValueError) as e:
        raise AuditError(f"{path}: unreadable JSON ({e})") from e


def check_location(out_dir: str, corpus_dir: str) -> None:
    """Raises `AuditError` unless `out_dir` lies outside the corpus and is (or can be made) a writable directory."""
    from dpsynth.owner_only import check_report_location

    try:
        check_report_location(out_dir, corpus_dir, "--out: the audit directory")
    except ValueError as e:
        raise AuditError(str(e)) from e


def check_out(out_dir: str, corpus_dir: str) -> str:
    """Creates the owner-only `out_dir` (0700) after checking it lies outside the corpus, holds no
    report yet and is writable; returns its absolute path. (`dpsynth audit` holds it first with
    `outdir.claim`: its run record and lock are the only files allowed there besides dead letters.)"""
    from dpsynth.owner_only import make_report_dir

    try:
        return make_report_dir(out_dir, corpus_dir, what="--out: the audit directory", report_file=REPORT_JSON,
                               allowed=(dead_letters.FILE,),
                               foreign_hint=", e.g. another command's output or an interrupted audit")
    except ValueError as e:
        raise AuditError(str(e)) from e


def audit_release(corpus_dir: str, train: Sequence[dict], test: Sequence[dict], out_dir: str, *, tokenizer=None,
                  thresholds: Sequence[int] = copying.DEFAULT_THRESHOLDS, seed: int = 0,
                  significance: float = copying.DEFAULT_SIGNIFICANCE, threads: int = 1,
                  canary_run=None) -> dict[str, Any]:
    """Runs the copying audit (and, given `canary_run`, the canary run) and writes the owner-only report.

    Args:
      corpus_dir: the synthetic corpus.
      train, test: D_train and D_test records ({"text", ...}).
      out_dir: owner-only output directory, outside `corpus_dir`; refused if it holds anything
        but the command's dead letters (another command's output, a report, an interrupted run).
      tokenizer: default: the tokenizer of the corpus's generator model (`generator_model`).
      thresholds, seed, significance, threads: see `copying.copying_audit`.
      canary_run: a callable `(work_dir) -> dict` running the canary audit (e.g.
        `functools.partial(canaries.release_canary_audit, ...)`), or None.

    Returns:
      The report (also written to `out_dir/release_audit.json` and `.md`).
    """
    out_dir = check_out(out_dir, corpus_dir)
    synthetic, manifest, skipped = read_release(corpus_dir)
    if tokenizer is None:
        from dpsynth.data.tokenizers import load_tokenizer

        model_dir = generator_model(corpus_dir, manifest)
        if not model_dir or not os.path.isdir(model_dir):
            raise AuditError(f"{corpus_dir}: the generator model {model_dir!r} is not here; pass --tokenizer MODEL_DIR")
        tokenizer = load_tokenizer(model_dir)
    enc = lambda rows: tokenizer.encode_batch([r["text"] for r in rows]) if rows else []
    report: dict[str, Any] = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "dp": False, "notice": NOTICE,
        "synthetic_corpus": os.path.abspath(corpus_dir), "corpus_config_hash": manifest.get("config_hash"),
        "corpus_private": manifest.get("private"), "synthetic_rows_skipped": skipped,
        "copying": copying.copying_audit(enc(synthetic), enc(train), enc(test), thresholds=thresholds, seed=seed,
                                         significance=significance, threads=threads),
    }
    if canary_run is not None:
        report["canaries"] = canary_run(os.path.join(out_dir, "canary_run"))
    from dpsynth.owner_only import write_private_json, write_private_text

    write_private_json(os.path.join(out_dir, REPORT_JSON), report)
    write_private_text(os.path.join(out_dir, REPORT_MD), render_markdown(report))
    return report


def headline(report: dict[str, Any]) -> dict[str, Any]:
    """The figures a command prints: counts at each threshold, the verdict, the canary bounds."""
    c = report["copying"]
    out = {"sharing_at_least": c["sharing_at_least"], "longest_shared_with_train": c["longest_shared_with_train"],
           "share_closer_to_train": c["held_out_comparison"]["share_closer_to_train"],
           "p_value": c["held_out_comparison"]["p_value"], "verdict": c["held_out_comparison"]["verdict"]}
    k = report.get("canaries")
    if k:
        out["canaries"] = {name: k[name] for name in ("auroc", "auroc_p_value", "mean_exposure",
                                                      "epsilon_lb_clopper_pearson", "epsilon_lb_one_run",
                                                      "accounted_epsilon", "verdict")}
    return out


def _f(x, digits=3) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def render_markdown(report: dict[str, Any]) -> str:
    """The report's headline figures as Markdown (numbers only)."""
    c = report["copying"]
    held = c["held_out_comparison"]
    lines = ["# Release audit (owner-only, NOT differentially private)", "", report["notice"], "",
             f"Synthetic corpus: `{report['synthetic_corpus']}`", "", "## Copying", "",
             f"- {c['num_synthetic']} synthetic examples ({report['synthetic_rows_skipped']} empty or unlabeled rows "
             f"skipped) against {c['num_train']} D_train and {c['num_test']} D_test "
             f"records; longest sequence shared with D_train: {c['longest_shared_with_train']} tokens."]
    lines += [f"- sharing >= {t} tokens with D_train: {n} of {c['num_synthetic']}" for t, n in c["sharing_at_least"].items()]
    lines += ["", "| closeness (longest shared tokens) | mean | p50 | p95 | p99 | max |", "|---|---|---|---|---|---|"]
    for name, d in (("synthetic -> D_train", c["synthetic_to_train"]),
                    (f"synthetic -> D_train subsample ({held['reference_size']})", held["synthetic_to_train_subsample"]),
                    (f"synthetic -> D_test ({held['reference_size']})", held["synthetic_to_test"]),
                    ("D_test -> D_train (held-out real records)", c["test_to_train"])):
        lines.append(f"| {name} | {_f(d['mean'])} | {_f(d['p50'])} | {_f(d['p95'])} | {_f(d['p99'])} | {d['max']} |")
    lines += ["", f"Closer to D_train than to D_test: {held['closer_to_train']}, closer to D_test: "
                  f"{held['closer_to_test']}, ties: {held['ties']} (share {_f(held['share_closer_to_train'])}; "
                  f"0.5 = no memorisation); sign test p = {_f(held['p_value'])}.",
              f"Among the {held['beyond_common_phrases']['num_examples']} examples whose closer match has >= "
              f"{held['beyond_common_phrases']['min_length']} tokens (longer than half the held-out real records share "
              f"with D_train): {held['beyond_common_phrases']['closer_to_train']} closer to D_train, "
              f"{held['beyond_common_phrases']['closer_to_test']} to D_test; p = "
              f"{_f(held['beyond_common_phrases']['p_value'])}.", "",
              f"**Verdict: {held['verdict']}** (at significance {held['significance']})."]
    k = report.get("canaries")
    if held["verdict"] == copying.MEMORISING:  # (what the phrase test cannot tell apart, and what can)
        lines += ["", "This test compares phrases: it cannot tell the training sample's phrase statistics, which DP "
                      "allows (it bounds each record's influence, not the sample's), from copied records. The "
                      "canaries test the records themselves" + (" (below)." if k else
                                                                 ": rerun with --canaries before concluding.")]
    if k:
        lines += ["", "## Canaries through the release", "",
                  f"- {k['num_inserted']} canaries inserted x {k['canaries']['repeats']}, {k['num_held_out']} held out; "
                  f"attacker: {k['attacker']}.",
                  f"- AUROC {_f(k['auroc'])} (at chance with these many canaries: {_f(k['auroc_chance'])}, the "
                  f"median over random relabellings; permutation p = {_f(k['auroc_p_value'])}); mean exposure "
                  f"{_f(k['mean_exposure'])} bits (chance {_f(k['chance_exposure'])}, max {_f(k['max_exposure'])}).",
                  f"- epsilon lower bounds ({int(round(100 * (1 - k['significance'])))}% confidence, delta "
                  f"{_f(k['delta'])}): Clopper-Pearson {_f(k['epsilon_lb_clopper_pearson'])}, one-run "
                  f"{_f(k['epsilon_lb_one_run'])}; accounted epsilon {_f(k['accounted_epsilon'])} "
                  f"({k['accountant']}).",
                  "- a lower bound above the accounted epsilon (repeats = 1) contradicts the privacy report.", "",
                  f"**Canary verdict: {k['verdict']}** (permutation test at significance {k['significance']})."]
    return "\n".join(lines) + "\n"
