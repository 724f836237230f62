"""The privacy report: `DIR/privacy_report.json` and `DIR/privacy_report.md`.

Written with every checkpoint of a DP-tuned model and carried into every dataset generated
from it. The JSON is self-contained: it embeds the ledger, so later mechanisms (the
generator's DP label histogram) compose into it with `compose_gaussian` and the epsilons
are recomputed from the full ledger, never added by hand.

Schema (format "dpsynth.privacy_report", version 1):

| field | meaning |
|---|---|
| `private` | false iff some entry is non-private (epsilon = inf) |
| `privacy_unit` | "example" or "user" |
| `unit_of_privacy` | one example (label + text), at most `max_tokens_per_example` tokens; or one user (all of their rows, at most `max_examples_per_user` kept) |
| `adjacency` | "add-or-remove one example" (or "... one user (all of their examples)") |
| `max_examples_per_user` | K, the contribution bound (user level only) |
| `mechanism` | "dpsgd" or "bandmf" (with `bands` and `strategy_sha256` for BandMF) |
| `delta`, `target_epsilon` | the guarantee asked for |
| `epsilon` | {"rdp": .., "pld": ..} of the whole ledger (null where unsupported, "inf" if non-private) |
| `accountant` | the accountant the budget was enforced with |
| `training` | mode, noise multiplier, q, expected batch, dataset size, steps, clipping norm, sampling method, optimizer... |
| `ledger` | the ledger (`dpsynth.dp.ledger`) the epsilons are computed from |
| `covers` | what the guarantee covers |
| `contamination_sha256` | SHA-256 of the pretraining corpus's contamination report (null if unknown) |
| `side_channels` | every non-DP release about the sensitive data: [{"name", "detail"}] |
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from dpsynth import fileio
from dpsynth.dedup import DEFAULT_MIN_TOKENS
from dpsynth.dp import accounting, mechanisms
from dpsynth.dp.ledger import PrivacyLedger
from dpsynth.errors import MissingFileError

FORMAT = "dpsynth.privacy_report"
FORMAT_VERSION = 1
REPORT_JSON = "privacy_report.json"
REPORT_MD = "privacy_report.md"
PRIVACY_FILES = (REPORT_JSON, REPORT_MD)  # what a released directory carries of its privacy
ADJACENCY = "add-or-remove one example"
USER_ADJACENCY = "add-or-remove one user (all of their examples)"
COVERS = ("every checkpoint written by this run (the final model and all intermediate checkpoints) and "
          "everything computed from them without further access to the sensitive data (synthetic data "
          "generated from the model, classifiers trained on it, metrics of it): post-processing")
SAMPLING_METHOD = mechanisms.dpsgd.SAMPLING_METHOD  # the default mechanism's (reports without a `sampling` field)

LABEL_SET_CHANNEL = {
    "name": "label set",
    "detail": "the set of label names is taken from the configuration/data without DP; the per-label counts "
              "are NOT released (generation uses a uniform label distribution or a DP histogram)",
}


PUBLIC_OVERLAP_CHANNEL = {
    "name": "public pretraining corpus",
    "detail": "the base model and the released tokenizer are trained on the public corpus after every sequence of "
              f">= k tokens (k = {DEFAULT_MIN_TOKENS} by default) shared with the sensitive data was cut (the contamination report's "
              "hash is above); shorter shared sequences remain and are not covered by epsilon. The tokenizer is "
              "trained after that cut, on the cleaned corpus only (the dedup's own tokenizer is never released)",
}
COMPOSITION_CHANNEL = {
    "name": "other releases about the same data",
    "detail": "epsilon covers this release only. Publishing several releases computed from the same D_train "
              "(other models or synthetic corpora of a grid, label histograms, DP-on-real baselines) costs their "
              "composition: `dpsynth experiment --dry-run` and the experiment's `privacy_composition.md` give it "
              "for a whole experiment root (`dpsynth.dp.compose`)",
}


def _fmt_eps(x: float | None) -> float | str | None:
    if x is None:
        return None
    return "inf" if math.isinf(x) else float(x)


def build_report(
    ledger: PrivacyLedger,
    *,
    training: dict[str, Any],
    contamination_sha256: str | None,
    side_channels: Sequence[dict[str, str]] = (LABEL_SET_CHANNEL,),
    max_tokens_per_example: int = 512,
    extra: dict[str, Any] | None = None,
    privacy_unit: str = "example",
    max_examples_per_user: int | None = None,
    mechanism: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The privacy report of a ledger (epsilons recomputed by every accountant).

    `privacy_unit="user"` (with `max_examples_per_user` K) states the user-level unit and
    adjacency; `mechanism` is {"name": "dpsgd"} (default) or {"name": <a registered mechanism>,
    **its `report_fields`} (e.g. BandMF's "bands" and "strategy_sha256").
    """
    eps = ledger.epsilons()
    private = not any(v is not None and math.isinf(v) for v in eps.values())
    if privacy_unit == "user":
        if not max_examples_per_user:
            raise ValueError("a user-level report needs max_examples_per_user")
        unit = (f"one user: all of their rows (at most {int(max_examples_per_user)} kept per user), each at most "
                f"{max_tokens_per_example} tokens")
        adjacency = USER_ADJACENCY
    elif privacy_unit == "example":
        unit, adjacency = f"one example (label + text), at most {max_tokens_per_example} tokens", ADJACENCY
    else:
        raise ValueError(f"unknown privacy unit {privacy_unit!r}")
    mech = dict(mechanism or {"name": mechanisms.DEFAULT})
    report = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "private": private,
        "privacy_unit": privacy_unit,
        "unit_of_privacy": unit,
        "max_tokens_per_example": int(max_tokens_per_example),
        "max_examples_per_user": int(max_examples_per_user) if privacy_unit == "user" else None,
        "mechanism": mech.pop("name"),
        **mech,  # the mechanism's own fields (`Mechanism.report_fields`)
        "adjacency": adjacency,
        "delta": ledger.delta,
        "target_epsilon": _fmt_eps(ledger.target_epsilon),
        "accountant": ledger.accountant,
        "epsilon": {k: _fmt_eps(v) for k, v in eps.items()},
        "training": copy.deepcopy(training),
        "ledger": ledger.to_json(),
        "covers": COVERS,
        "contamination_sha256": contamination_sha256,
        "side_channels": [dict(c) for c in side_channels],
    }
    if extra:
        report.update(copy.deepcopy(extra))
    return report


def ledger_of(report: dict[str, Any]) -> PrivacyLedger:
    return PrivacyLedger.from_json(report["ledger"], where="privacy report ledger")


def refresh(report: dict[str, Any], ledger: PrivacyLedger) -> dict[str, Any]:
    """A copy of `report` with `ledger` and the epsilons recomputed from it."""
    out = copy.deepcopy(report)
    eps = ledger.epsilons()
    out["ledger"] = ledger.to_json()
    out["epsilon"] = {k: _fmt_eps(v) for k, v in eps.items()}
    out["private"] = not any(v is not None and math.isinf(v) for v in eps.values())
    return out


def check_gaussian_composable(report: dict[str, Any], name: str) -> None:
    """Raises ValueError unless a Gaussian mechanism of sensitivity 1 per example composes into `report`.

    A user-level report refuses it: one user may change several counts, so the mechanism's
    per-user sensitivity is not 1 and composing it would overstate the guarantee. Callers that
    draw such a mechanism (a DP label histogram) check this BEFORE drawing it or writing anything.
    """
    if report.get("privacy_unit", "example") != "example":
        raise ValueError(f"{name}: this report is user-level; a Gaussian mechanism with sensitivity 1 per example "
                         "does not compose into it (one user may change several counts)")


def compose_gaussian(report: dict[str, Any], *, noise_multiplier: float, name: str, count: int = 1,
                     detail: str | None = None, run: str | None = None) -> dict[str, Any]:
    """Composes `count` Gaussian mechanisms (L2 sensitivity 1) into the report's ledger.

    For example the generator's DP label histogram (`name="label_histogram"`). The epsilons
    of the returned report cover the tuning AND this mechanism. The target epsilon is not
    changed: `epsilon` may now exceed it, and the report says so in `composed`. `run`: the draw's
    run id (one draw composed into several reports is one release); default a fresh one.
    """
    check_gaussian_composable(report, name)
    ledger = ledger_of(report)
    ledger.record_gaussian(noise_multiplier=noise_multiplier, name=name, count=count, run=run)
    out = refresh(report, ledger)
    out.setdefault("composed", []).append(
        {"name": name, "mechanism": "gaussian", "noise_multiplier": float(noise_multiplier), "count": int(count),
         "detail": detail or ""})
    return out


def add_side_channel(report: dict[str, Any], name: str, detail: str) -> dict[str, Any]:
    out = copy.deepcopy(report)
    out["side_channels"].append({"name": name, "detail": detail})
    return out


def check_report(report: dict[str, Any], where: str = "privacy report") -> dict[str, Any]:
    if report.get("format") != FORMAT:
        raise ValueError(f"{where}: not a dpsynth privacy report (format {report.get('format')!r})")
    if report.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{where}: privacy report version {report.get('format_version')} is not {FORMAT_VERSION}")
    ledger_of(report)
    return report


def write_report(directory: str, report: dict[str, Any]) -> tuple[str, str]:
    """Writes `privacy_report.json` and `.md` into `directory` (atomically); returns both paths."""
    os.makedirs(directory, exist_ok=True)
    return (fileio.write_json(os.path.join(directory, REPORT_JSON), report, indent=1),
            fileio.write_text(os.path.join(directory, REPORT_MD), render_markdown(report) + "\n"))


def load_report(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, REPORT_JSON)
    if not os.path.exists(path):
        raise MissingFileError(f"{path}: no privacy report (was this model DP-tuned by `dpsynth dp-tune`?)")
    return check_report(fileio.read_json(path), where=path)


def _num(x) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, str):
        return x
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def _recipe_sources(recipe: dict) -> str:
    return (", public settings and the DP example length in the ledger" if recipe.get("example_length")
            else " and public settings")


def _target(report: dict[str, Any]) -> str:
    """"target epsilon T", or the candidates' targets of a DP selection among models tuned at different ones."""
    targets = (report.get("selection") or {}).get("target_epsilons")
    if targets and len({float(t) for t in targets.values()}) > 1:
        return "the " + describe_targets(targets)
    return f"target epsilon {_num(report['target_epsilon'])}"


def _no_contamination(training: dict[str, Any]) -> str:
    """The report's words for a missing contamination report: an imported base has none to have."""
    if training.get("base_source"):
        return "none: the base model was imported and its pretraining data was not deduplicated against D"
    return "unknown"


def render_markdown(report: dict[str, Any]) -> str:
    """A human-readable rendering of the report."""
    eps = report["epsilon"]
    t = report.get("training", {})
    status = "DIFFERENTIALLY PRIVATE" if report["private"] else "NOT PRIVATE (epsilon = inf)"
    units = t.get("dataset_size")
    unit = "users" if report.get("privacy_unit") == "user" else "examples"
    weak = report["private"] and units and accounting.weak_delta(report["delta"], units)
    lines = [
        "# Privacy report",
        "",
        f"**{status}**: ({_num(eps.get(report['accountant']))}, {report['delta']:.3g})-DP "
        f"by the {report['accountant'].upper()} accountant ({_target(report)})."
        + (f" **{accounting.weak_delta_note(report['delta'], units, unit)}.**" if weak else ""),
        "",
        "| | |",
        "|---|---|",
        f"| unit of privacy | {report['unit_of_privacy']} |",
        f"| adjacency | {report['adjacency']} |",
        f"| delta | {report['delta']:.4g} |",
    ]
    for name, value in eps.items():
        lines.append(f"| epsilon ({name.upper()}) | {_num(value)} |")
    user = report.get("privacy_unit") == "user"
    if user:
        lines.append(f"| max examples per user | {report['max_examples_per_user']} |")
    row = mechanisms.get(report.get("mechanism", mechanisms.DEFAULT)).report_row(report)
    if row:
        lines.append(row)
    for key in ("mode", "noise_multiplier", "clip_norm", "sampling_probability", "expected_batch_size",
                "dataset_size", "steps", "epochs", "optimizer", "learning_rate", "max_batch_size"):
        if key in t:
            label = key.replace("_", " ")
            if user and key in ("expected_batch_size", "dataset_size"):
                label += " (users)"
            lines.append(f"| {label} | {_num(t[key])} |")
    if t.get("label_dropout"):
        lines.append(f"| label dropout | {_num(t['label_dropout'])} |")
    lines += [
        f"| sampling | {t.get('sampling', SAMPLING_METHOD)} |",
        f"| pretraining contamination report sha256 | {report.get('contamination_sha256') or _no_contamination(t)} |",
        "",
        f"**Covers**: {report['covers']}.",
        "",
        *([f"**Recipe** (automatic, from |D_train|{_recipe_sources(t['recipe'])}): " + "; ".join(t["recipe"]["why"]) + ".", ""]
          if isinstance(t.get("recipe"), dict) else []),
        "## Mechanisms (ledger)",
        "",
    ]
    for e in report["ledger"]["entries"]:
        if mechanisms.is_training_entry(e):
            kind = mechanisms.get(e["mechanism"]).describe(e)
            lines.append(f"- `{e['name']}`: {e['steps']} {kind} steps, q = {e['sampling_probability']:.4g}, "
                         f"noise multiplier {e['noise_multiplier']:.4g}, clipping norm {e['clip_norm']:g}"
                         + (f", batch cap {e['max_batch_size']}" if e.get("max_batch_size") else "")
                         + (", per user" if e.get("unit") == "user" else ""))
        elif e["mechanism"] == "gaussian":
            lines.append(f"- `{e['name']}`: {e['count']} x Gaussian mechanism (sensitivity 1), "
                         f"noise multiplier {e['noise_multiplier']:.4g}")
        elif e["mechanism"] == "exponential":
            lines.append(f"- `{e['name']}`: exponential mechanism, epsilon {e['epsilon']:.4g} (pure DP), one of "
                         f"{e['candidates']} candidates, on {e.get('dataset', 'D_train')}")
        else:
            lines.append(f"- `{e['name']}`: NON-PRIVATE release")
    if t.get("reserve_selection_epsilon"):
        lines.append(f"- reserved (not spent by this run; the target covers it): a DP selection on D_valid at epsilon "
                     f"{_num(t['reserve_selection_epsilon'])}, accounted at "
                     f"{_num(sum(e['epsilon'] for e in t.get('reserved', ()) if e.get('mechanism') == 'exponential'))} "
                     "(a positional split: one record may move another across the boundary)")
    if t.get("reserve_label_noise_multiplier"):
        lines.append(f"- reserved (not spent by this run; the target covers it): a DP label histogram of D_train at "
                     f"noise multiplier {_num(t['reserve_label_noise_multiplier'])} (`dpsynth select --label-source` "
                     "draws it at that sigma)")
    lines += ["", "## Non-DP side channels", ""]
    lines += [f"- **{c['name']}**: {c['detail']}" for c in report["side_channels"]] or ["- none"]
    return "\n".join(lines)


def describe_targets(targets: Mapping[str, Any]) -> str:
    """"tuning's target epsilon 3", or, when the candidates' targets differ, "candidates' target epsilons 3 (a, b),
    8 (c)"."""
    by: dict[float, list[str]] = {}
    for name, t in targets.items():
        by.setdefault(float(t), []).append(name)
    if len(by) == 1:
        return f"tuning's target epsilon {next(iter(by)):g}"
    return "candidates' target epsilons " + ", ".join(f"{t:g} ({', '.join(ns)})" for t, ns in sorted(by.items()))
