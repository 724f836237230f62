"""What publishing an experiment root costs: every release about D_train, composed.

An experiment trains many DP models on the same D_train (every grid point), may draw a DP
label histogram per model, and trains DP-on-real baseline classifiers on it; every synthetic
corpus is post-processing of one model (and its histogram). Each corpus's privacy report
gives its OWN epsilon; whoever publishes the whole root publishes all of them, so the root's
cost is their composition. This module lists the releases and composes them exactly with
dp-accounting (`dpsynth.dp.compose`):

* `planned_releases` (the dry run): from the plan, with the privacy plans the stages will use
  (`dpsynth.train.tune_config.plan_run`, `dpsynth.dp.plan.plan_privacy`);
* `completed_releases` (the evaluate stage, i.e. the final report): from the ledgers the
  stages wrote (each model's `privacy_report.json`, each histogram's draw, each DP-on-real
  baseline's report).

The DP selections of one corpus per DP run on D_valid (`select` stages) are releases too: their
entries (`"dataset": "D_valid"`) are composed with the rest sequentially, an upper bound for the
whole root (each selected corpus's own report says whether its selection composes in parallel
with its tuning, `dpsynth.dp.private_selection`).

Releases that are not DP are named, never composed into a finite number: a trial at epsilon =
inf, and the real-data baseline (a classifier trained on D_train without noise, whose test
accuracy is published). D_valid (model selection) and D_test (every accuracy, MAUVE against
real test text) are used without DP; `OTHER_USES` says so in every rendering.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from dpsynth import fileio
from dpsynth.binding import make_config
from dpsynth.dp import compose as compose_lib
from dpsynth.dp.compose import Release

# The file the `labels` stage writes its DP label histogram draw to (`completed_releases` reads its sigma).
LABEL_DISTRIBUTION_FILE = "label_distribution.json"
FILE_JSON = "privacy_composition.json"
FILE_MD = "privacy_composition.md"
FORMAT = "dpsynth.privacy_composition"
FORMAT_VERSION = 1
OTHER_USES = (
    "D_valid: DP tuning keeps the run's final model but the grid's trials are compared on D_valid "
    "losses/accuracy without DP (a side channel listed in each privacy report); the classifiers' "
    "hyperparameter selection and early stopping also read (real or synthetic) validation data",
    "D_test: every reported accuracy and the MAUVE / n-gram scores are computed on the real test "
    "set without DP; publish them only if D_test may be published",
)


@dataclasses.dataclass(frozen=True)
class RootPrivacy:
    """Releases of a root, their composition, and each corpus's own cost.

    Attributes:
        delta: the delta of every epsilon here.
        releases: every release about D_train.
        composition: `compose_lib.Composition` of all of them.
        corpora: per synthetic corpus (trial id): the names of the releases it is made of.
        notes: why something could not be planned (data size unknown, ...).
    """

    delta: float
    releases: tuple[Release, ...]
    composition: compose_lib.Composition
    corpora: dict[str, tuple[str, ...]]
    notes: tuple[str, ...] = ()

    @functools.cached_property
    def release_epsilons(self) -> dict[str, dict[str, float | None]]:
        """Each release's own epsilon, per accountant (computed once)."""
        return {r.name: r.epsilons(self.delta) for r in self.releases}

    @functools.cached_property
    def _corpus_epsilons(self) -> dict[str, dict[str, float | None]]:
        by_name = {r.name: r for r in self.releases}
        memo: dict[tuple[str, ...], dict[str, float | None]] = {}
        out = {}
        for trial, names in self.corpora.items():
            if names not in memo:
                memo[names] = (self.release_epsilons[names[0]] if len(names) == 1 else
                               compose_lib.compose([by_name[n] for n in names], self.delta).epsilon)
            out[trial] = memo[names]
        return out

    def corpus_epsilons(self) -> dict[str, dict[str, float | None]]:
        """Each corpus's own epsilon (its model + its label histogram), per accountant."""
        return dict(self._corpus_epsilons)

    def to_json(self) -> dict[str, Any]:
        own = self.corpus_epsilons()
        return {
            "format": FORMAT, "format_version": FORMAT_VERSION, "delta": self.delta,
            "adjacency": "add-or-remove one example of D_train",
            "root": self.composition.to_json(),
            "releases": [{"name": r.name, "kind": r.kind, "private": r.private,
                          "epsilon": {k: _num(v) for k, v in self.release_epsilons[r.name].items()},
                          "entries": [dict(e) for e in r.entries]} for r in self.releases],
            "corpora": [{"trial": t, "releases": list(n), "epsilon": {k: _num(v) for k, v in own[t].items()}}
                        for t, n in self.corpora.items()],
            "other_uses_of_sensitive_data": list(OTHER_USES),
            "notes": list(self.notes),
        }


def _num(x: float | None) -> float | str | None:
    return None if x is None else ("inf" if math.isinf(x) else float(x))


def fmt_eps(eps: Mapping[str, float | None]) -> str:
    """`3.000 (rdp) / 2.714 (pld)`; inf as `inf`; unsupported as `n/a`."""
    parts = []
    for name, v in eps.items():
        parts.append(f"{'n/a' if v is None else ('inf' if math.isinf(v) else f'{v:.3f}')} ({name})")
    return " / ".join(parts)


def render(root: RootPrivacy, *, title: str) -> str:
    """Plain text (also valid Markdown-ish) of the composition, per release and per corpus."""
    c = root.composition
    lines = [f"{title} (D_train, delta {root.delta:.3g}, add-or-remove adjacency; composed exactly with "
             "dp-accounting from the ledgers):"]
    width = max([len(r.name) for r in root.releases] + [len(t) for t in root.corpora] + [10])
    for r in root.releases:
        eps = root.release_epsilons[r.name]
        lines.append(f"  {r.name.ljust(width)}  {r.kind:<16} {fmt_eps(eps)}" + ("" if r.private else "  NOT DP"))
    lines.append(f"  all {c.dp_releases} DP release(s) together: epsilon {fmt_eps(c.epsilon_dp_releases)}")
    if c.nonprivate:
        lines.append(f"  the whole root: NOT DP (epsilon inf): it holds {len(c.nonprivate)} non-private release(s): "
                     + ", ".join(c.nonprivate))
    else:
        lines.append(f"  the whole root: epsilon {fmt_eps(c.epsilon)}")
    if root.corpora:
        parts = "its model + its label histogram" if c.counts.get("label_histogram") else "its model"
        lines.append(f"  per synthetic corpus: its own epsilon ({parts})  |  all DP releases of the root together"
                     + (" (the root as a whole: NOT DP)" if c.nonprivate else ""))
        own = root.corpus_epsilons()
        for trial, eps in own.items():
            lines.append(f"    {trial.ljust(width)}  {fmt_eps(eps)}  |  {fmt_eps(c.epsilon_dp_releases)}")
    lines += [f"  not composed (no DP): {u}" for u in OTHER_USES]
    lines += [f"  note: {n}" for n in root.notes]
    return "\n".join(lines)


def write(root: RootPrivacy, out_dir: str, *, title: str) -> tuple[str, str]:
    """Writes `privacy_composition.json` and `.md` into `out_dir`; returns both paths."""
    return (fileio.write_json(os.path.join(out_dir, FILE_JSON), root.to_json(), indent=1),
            fileio.write_text(os.path.join(out_dir, FILE_MD),
                              "# Privacy of the whole experiment root\n\n```\n" + render(root, title=title) + "\n```\n"))


def html_section(root: RootPrivacy) -> str:
    """An HTML section for the evaluation report (what publishing the root costs)."""
    import html

    c = root.composition
    own = root.corpus_epsilons()
    rows = "".join(f"<tr><td>{html.escape(t)}</td><td>{html.escape(fmt_eps(e))}</td>"
                   f"<td>{html.escape(fmt_eps(c.epsilon_dp_releases))}</td></tr>" for t, e in own.items())
    rel = "".join(f"<tr><td>{html.escape(r.name)}</td><td>{html.escape(r.kind)}</td>"
                  f"<td>{html.escape(fmt_eps(root.release_epsilons[r.name]))}{'' if r.private else ' NOT DP'}</td></tr>"
                  for r in root.releases)
    whole = ("NOT DP (epsilon inf): non-private releases " + ", ".join(c.nonprivate)) if c.nonprivate else \
        f"epsilon {fmt_eps(c.epsilon)}"
    return (f"<h2>Privacy of the whole root (D_train, delta {root.delta:.3g})</h2>"
            f"<p>Composed exactly with dp-accounting from every release's ledger. All {c.dp_releases} DP releases "
            f"together: epsilon {html.escape(fmt_eps(c.epsilon_dp_releases))}. The whole root: {html.escape(whole)}.</p>"
            "<table><tr><th>corpus</th><th>its own epsilon</th><th>all DP releases of the root</th></tr>" + rows + "</table>"
            "<table><tr><th>release</th><th>kind</th><th>epsilon</th></tr>" + rel + "</table>"
            + "".join(f"<p>Not composed (no DP): {html.escape(u)}</p>" for u in OTHER_USES))


def add_to_html(path: str, section: str) -> None:
    """Inserts `section` before `</body>` of the HTML report at `path` (if it exists)."""
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        text = f.read()
    i = text.rfind("<script")
    i = i if i >= 0 else text.rfind("</body>")
    if i < 0:
        return
    fileio.write_text(path, text[:i] + section + text[i:])


# ----------------------------------------------------------------------------- the releases


def _gaussian(name: str, sigma: float) -> Release:
    return Release(name=name, kind="label_histogram",
                   entries=({"mechanism": "gaussian", "name": "label_histogram", "noise_multiplier": float(sigma),
                             "count": 1},))


SELECTION_NOTE = ("each DP selection on D_valid is composed with the D_train releases sequentially here (an upper "
                  "bound for the whole root); a selected corpus's own privacy report composes it in parallel where "
                  "D_valid was split from D independently of the data")


def _selection(name: str, entries: Sequence[Mapping[str, Any]]) -> Release:
    return Release(name=name, kind="dp_selection", entries=tuple(dict(e) for e in entries))


def planned_selection(node, delta: float) -> Release:
    """The release of one `select` node, as the stage will record it (`DpSelection.ledger_entry`)."""
    from dpsynth.dp import private_selection as ps

    c = node.config
    mech = ps.DpSelection(epsilon=float(c["epsilon"]), mechanism=c.get("mechanism", ps.EXPONENTIAL), delta=delta)
    return _selection(node.key, [mech.ledger_entry(len(c["candidates"]), name=node.key, group=ps.group_size(c["split"]))])


def evaluate_options(c: Mapping[str, Any]) -> dict[str, Any]:
    """The evaluate node's `EvaluateConfig` options: DP-on-real takes the shared `dp_tune` delta and
    accountant unless `evaluate.options` say otherwise (the dry run plans with the same)."""
    shared_dp = c.get("dp_tune") or {}
    defaults = {k: shared_dp[src] for k, src in (("dp_delta", "delta"), ("dp_accountant", "accountant"))
                if shared_dp.get(src) is not None}
    return {**defaults, **dict(c.get("options") or {})}


def _evaluate_config(eval_cfg: Mapping[str, Any]):
    from dpsynth.evaluate.scoring import EvaluateConfig  # JAX-heavy: only when baselines are planned

    return make_config(EvaluateConfig, evaluate_options(eval_cfg), "evaluate.options")


def baseline_epsilons(eval_cfg: Mapping[str, Any]) -> list[float]:
    """The finite epsilons the evaluate stage trains DP-on-real baselines at (none without baselines)."""
    if not eval_cfg.get("baselines"):
        return []
    return sorted({float(t["epsilon"]) for t in eval_cfg["trials"]} - {math.inf})


def planned_baselines(eval_cfg: Mapping[str, Any], num_train: int) -> list[Release]:
    """The DP-on-real and real-data baselines the evaluate stage will train, planned.

    One DP-on-real sweep per (classifier, epsilon) of k = |lr| x |wd| x |C| x repeats trials,
    planned by the baseline's own `DPConfig.plan` (`plan_privacy(compositions=k)` by default:
    all k together meet the target; "selected-only": one trial at the target is accounted),
    each accounted trial's steps in the ledger.
    """
    from dpsynth.dp import selection

    if not eval_cfg.get("baselines"):
        return []
    ecfg = _evaluate_config(eval_cfg)
    out: list[Release] = []
    for kind in eval_cfg["classifiers"]:
        sweep = ecfg.sweep_for(kind)
        k = len(sweep.learning_rates) * len(sweep.weight_decays) * len(sweep.clip_norms) * sweep.repeats
        if ecfg.real_baseline:
            out.append(compose_lib.nonprivate(f"real-data baseline [{kind}]", "real_baseline"))
        for eps in baseline_epsilons(eval_cfg):
            dp = ecfg.dp_config(eps, num_train)
            p = dp.plan(num_train, k)
            entry = p.ledger_entry(steps=p.steps, clip_norm=1.0, name="dp_on_real")
            accounted = selection.compositions(dp.sweep_accounting, k)
            out.append(Release(name=f"dp-on-real [{kind}, eps={eps:g}, {k} trials]", kind="dp_on_real",
                               entries=tuple(dict(entry) for _ in range(accounted))))
    return out


# The strategy hash of a BandMF release in the dry run: the banded strategy is optimised (or read
# from the cache) when the run starts; its hash identifies it and plays no part in the accounting.
PLANNED_STRATEGY = "planned (optimised when the run starts)"


def planned_entry(row: Mapping[str, Any], clip_norm: float) -> dict[str, Any]:
    """The ledger entry a DP-tuning node will record, from its dry-run row's `PrivacyPlan`.

    It is the plan's own `ledger_entry` for all T steps (the tuner records exactly these, one
    step at a time, merged), so mechanism, bands and privacy unit are the run's: a BandMF run is
    accounted as ceil(T / b) participations, a user-level run at the plan's user-level delta.
    """
    p = row["plan"]
    return p.ledger_entry(steps=p.steps, clip_norm=float(clip_norm),
                          strategy_sha256=PLANNED_STRATEGY)  # used only by mechanisms with a strategy matrix


def planned_delta(config, num_train: int, budgets: Sequence[Mapping[str, Any]]) -> float:
    """The delta of the dry run's composition: that of the DP-tuning plans (1/|users| at user level
    unless given), as the final report takes it from the models' privacy reports."""
    for row in budgets:
        p = row.get("plan")
        if p is not None and p.private:
            return float(p.delta)
    return config.dp_tune.delta if config.dp_tune.delta is not None else 1.0 / num_train


def unit_conflicts(config) -> list[tuple[str, str]]:
    """(config key, message) for every release of `config` that cannot be composed with the others.

    A user-level model's epsilon bounds add-or-remove-one-user releases only; an example-level
    release about the same D_train (a DP-on-real baseline, a DP label histogram of sensitivity 1
    per example) has no common unit with it, so the root's cost cannot be stated. The experiment
    refuses such a config when it is loaded, before any stage runs.
    """
    dp_tune = config.dp_tune
    if dp_tune.privacy_unit != "user" or not any(math.isfinite(e) for e in dp_tune.epsilons):
        return []
    out = []
    if config.evaluate.baselines:
        out.append(("evaluate.baselines", "the DP-on-real baselines are example-level DP releases about the same "
                    "D_train, and a user-level epsilon does not bound them (nor can they be composed with the "
                    "user-level models into one epsilon); set `evaluate: {baselines: false}`, or "
                    "`dp_tune: {privacy_unit: example}`"))
    if config.generate.label_distribution == "dp_histogram":
        out.append(("generate.label_distribution", "a DP label histogram has sensitivity 1 per example, not per "
                    "user (one user may change several counts), so it cannot be composed into a user-level "
                    "privacy report; set `generate: {label_distribution: uniform}`, or "
                    "`dp_tune: {privacy_unit: example}`"))
    return out


def planned_releases(plan, config, num_train: int | None, budgets: Sequence[Mapping[str, Any]]) -> RootPrivacy | None:
    """The dry run's `RootPrivacy`, from the plan and the rows of `runner.privacy_budgets`.

    Each DP-tuning release is the ledger entry its own `PrivacyPlan` (the row's `plan`) records,
    so the dry run composes exactly what the final report will (`completed_releases`).
    Returns None when |D_train| is unknown (nothing can be planned).
    """
    if num_train is None:
        return None
    delta = planned_delta(config, num_train, budgets)
    releases: list[Release] = []
    notes: list[str] = []
    for row in budgets:
        if math.isinf(row["epsilon"]):
            releases.append(compose_lib.nonprivate(row["dp_tune"], "dp_tune"))
        elif "plan" in row:
            node = plan.node(row["dp_tune"])
            releases.append(Release(name=row["dp_tune"], kind="dp_tune",
                                    entries=(planned_entry(row, node.config["clip_norm"]),)))
        else:
            notes.append(f"{row['dp_tune']}: not planned ({row.get('note', '?')})")
    for node in plan.nodes:
        if node.stage == "labels":
            releases.append(_gaussian(node.key, node.config["noise_multiplier"]))
        elif node.stage == "select":
            releases.append(planned_selection(node, delta))
    if any(r.kind == "dp_selection" for r in releases):
        notes.append(SELECTION_NOTE)
    for node in plan.nodes:
        if node.stage == "base_model":
            notes.append(planned_base_model_note(node.config["path"]))
    try:
        releases += planned_baselines(plan.node("evaluate").config, num_train)
    except Exception as e:  # the evaluate library may be absent at planning time; say so
        notes.append(f"baselines not planned ({type(e).__name__}: {e})")
    planned = {r.name for r in releases}
    corpora = {t.id: tuple(n for n in (t.dp_tune, t.labels) if n and n in planned) for t in plan.trials
               if t.dp_tune in planned}  # a corpus whose model could not be planned has no epsilon to show
    return RootPrivacy(delta=delta, releases=tuple(releases), composition=compose_lib.compose(releases, delta),
                       corpora=corpora, notes=tuple(notes))


BASE_MODEL_NOTE = "base model: "  # (the prefix of the note on a `base_model:` experiment's base)


def base_model_caveat(manifest: Mapping[str, Any], path: str) -> str:
    """What DP does not cover with a base model this experiment did not pretrain: the imported base's
    side channel of the privacy report (`dpsynth.train.tune_report.imported_base_channel`, the one
    wording); for a dpsynth model pretrained elsewhere, its contamination report's hash."""
    from dpsynth.train.tune_report import imported_base_channel

    source = manifest.get("source") or manifest.get("base_source")
    if source:
        return imported_base_channel(source)["detail"]
    return (f"the base model ({path}) was not pretrained by this experiment: its pretraining corpus was deduplicated "
            f"against this sensitive data only if its contamination report (sha256 "
            f"{manifest.get('contamination_sha256') or 'unknown'}) covers it, so the DP guarantee covers the "
            "fine-tuning data only")


def planned_base_model_note(path: str) -> str:
    """The note on a `base_model:` directory: what DP does not cover (`base_model_caveat`)."""
    try:
        manifest = fileio.read_json(os.path.join(path, "manifest.json"))
    except Exception as e:  # the directory may be absent at planning time; the plan still prints
        return f"{BASE_MODEL_NOTE}{path} unreadable ({type(e).__name__}); DP covers the fine-tuning data only"
    return BASE_MODEL_NOTE + base_model_caveat(manifest, path)


def _baseline_release(row: Mapping[str, Any], out_dir: str) -> Release | None:
    """The ledger of one DP-on-real baseline row of the evaluation (`privacy_report` dict or path)."""
    rep = row.get("privacy_report")
    if isinstance(rep, str):
        rep = fileio.read_json(os.path.join(out_dir, rep))
    if not isinstance(rep, Mapping) or "ledger" not in rep:
        return None
    return Release(name=f"dp-on-real [{row['classifier']}, eps={float(row['epsilon']):g}]", kind="dp_on_real",
                   entries=tuple(dict(e) for e in rep["ledger"]["entries"]))


def completed_releases(
    *,
    eval_cfg: Mapping[str, Any],
    models: Sequence[Any],
    labels: Sequence[Any],
    baselines: Sequence[Mapping[str, Any]],
    out_dir: str,
    num_train: int,
    selections: Sequence[Any] = (),
    base_caveat: str | None = None,
) -> RootPrivacy:
    """The final report's `RootPrivacy`, from the ledgers the stages wrote.

    Args:
        eval_cfg: the evaluate node's config (its `trials` carry each corpus's model and
            histogram node keys).
        models: the `dp_tune` stage outputs (`model/privacy_report.json` holds each ledger).
        labels: the `labels` stage outputs (one DP label histogram draw each).
        baselines: the evaluation's baseline rows (a DP-on-real row's `privacy_report`, as a
            dict or a path relative to `out_dir`, holds its ledger; rows without one are
            planned as the evaluate stage calibrates them, and a note says so).
        out_dir: the evaluate stage's directory.
        num_train: |D_train|.
        selections: the `select` stage outputs (each holds its selected corpus's privacy report, whose
            `"dataset": "D_valid"` entry is the selection).
        base_caveat: with `base_model:`, what DP does not cover of that base (the base_model stage's
            summary); a note of the composition.
    """
    from dpsynth.dp import report as report_lib

    releases: list[Release] = []
    notes: list[str] = []
    delta = None
    for out in models:
        rep = report_lib.load_report(out.path("model"))
        if delta is None and rep.get("private", True):  # a non-private (epsilon inf) model's delta is 1/|train|
            delta = float(rep["delta"])
        releases.append(Release(name=out.key, kind="dp_tune", entries=tuple(dict(e) for e in rep["ledger"]["entries"])))
    for out in labels:
        releases.append(_gaussian(out.key, fileio.read_json(out.path(LABEL_DISTRIBUTION_FILE))["noise_multiplier"]))
    for out in selections:
        rep = report_lib.load_report(out.path())
        releases.append(_selection(out.key, [e for e in rep["ledger"]["entries"] if e.get("dataset") == "D_valid"]))
    if selections:
        notes.append(SELECTION_NOTE)
    if base_caveat:
        notes.append(BASE_MODEL_NOTE + base_caveat)
    missing = False
    for row in baselines:
        if row.get("baseline") == "real":
            releases.append(compose_lib.nonprivate(f"real-data baseline [{row['classifier']}]", "real_baseline"))
        elif row.get("baseline") == "dp_on_real":
            r = _baseline_release(row, out_dir)
            missing |= r is None
            if r is not None:
                releases.append(r)
    if missing:  # an evaluation library that writes no ledger for its baselines: planned instead
        releases = [r for r in releases if r.kind != "dp_on_real"] + [
            r for r in planned_baselines(eval_cfg, num_train) if r.kind == "dp_on_real"]
        notes.append("DP-on-real baselines: no ledger in the evaluation's output; planned as the evaluate stage "
                     "calibrates them")
    delta = delta if delta is not None else 1.0 / num_train
    names = {r.name for r in releases}
    corpora = {t["id"]: tuple(n for n in (t.get("dp_tune"), t.get("labels")) if n and n in names)
               for t in eval_cfg["trials"]}
    return RootPrivacy(delta=delta, releases=tuple(releases), composition=compose_lib.compose(releases, delta),
                       corpora=corpora, notes=tuple(notes))
