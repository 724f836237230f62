"""DP selection of one candidate by a count on a held-out sensitive split (D_valid).

Candidates (synthetic corpora, sweep trials) are scored by a COUNT on D_valid (correct
predictions of a classifier that never read D_valid); only the index of the winner is
released, through one of two mechanisms (`DpSelection.mechanism`):

* `EXPONENTIAL` (default): the exponential mechanism, sampled exactly as report-noisy-max with
  Gumbel noise (argmax of eps' u_i + Gumbel(0, 1) is candidate i with probability proportional
  to exp(eps' u_i)). With a MONOTONE score of sensitivity 1 (adding one record to D_valid raises
  every candidate's count by 0 or 1, removing one lowers it by 0 or 1: true of a count of correct
  predictions under add-or-remove adjacency) eps' = epsilon; otherwise eps' = epsilon / 2
  (McSherry and Talwar 2007; Dwork and Roth 2014, Thm 3.10 and its remark on monotone scores).
  Ledger entry `{"mechanism": "exponential", "name", "epsilon", "candidates", "dataset"}`: pure
  epsilon-DP; the RDP accountant composes it as epsilon^2/8-zCDP (`accounting.exponential_event`), a part of
  D read by such selections alone costs at most the sum of their epsilons (`guarantee`).
* `GAUSSIAN`: report-noisy-max with N(0, sigma^2) noise on each of the k counts; releasing all k
  noisy counts is a Gaussian mechanism of L2 sensitivity sqrt(k), i.e. the ledger entry
  `{"mechanism": "gaussian", "noise_multiplier": sigma, "count": k, "dataset"}` (k Gaussian
  mechanisms of sensitivity 1), accounted in RDP/PLD; the argmax is post-processing. sigma is
  calibrated so that this entry alone is (epsilon, delta)-DP.

Formal guarantee. Let D = D_train + D_valid (disjoint), with add-or-remove adjacency on D.
(1) For any fixed candidates whose scores' dependence on D_valid is a count of sensitivity 1,
the released index is epsilon-DP (EXPONENTIAL) or (epsilon, delta)-DP (GAUSSIAN) with respect
to D_valid. (2) Composition with the tuning that produced the candidates (an (eps_t, delta)-DP
release about D_train, `composition`): when the split of D into D_train / D_valid is
data-independent (each record's side depends on that record alone: the user's own files, a
per-record hash; `DATA_INDEPENDENT_SPLITS`), one added or removed record changes exactly one of
D_train, D_valid, so the pair (tuned model and its corpora, selected index) is
(max(eps_t, eps_s), delta)-DP with respect to D (parallel composition, also under adaptivity:
the selection is a post-processing of the tuning for a fixed D_valid). If eps_s <= eps_t the
release stays at the tuning's epsilon. A positional split (the last 10% of a file) is not
data-independent (adding one record moves another across the boundary, so D_valid may change by
two records: the selection is then accounted at twice its epsilon, `group_size`), and neither is
a D_valid that the tuning itself read without DP (`valid_read_by_tuning`, still a declared side
channel of the tuning): then the two compose sequentially (every entry in one ledger, exactly,
by dp-accounting). (Under a positional split D_train may change by two records as well; the
tuning's own report, as before, states its guarantee with respect to D_train.)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dpsynth.dp import accounting, histogram
from dpsynth.dp.accounting import PrivacyConfigError  # noqa: F401 (raised by callers too)

EXPONENTIAL, GAUSSIAN = "exponential", "gaussian"
MECHANISMS = (EXPONENTIAL, GAUSSIAN)
PARALLEL, SEQUENTIAL = "parallel", "sequential"
# How D_valid was split from D: by the user's own files, a per-record hash, or a position (the last 10%).
FILES, HASH, POSITIONAL = "files", "hash", "positional"
SPLITS = (FILES, HASH, POSITIONAL)
DATA_INDEPENDENT_SPLITS = (FILES, HASH)
SENSITIVITY = 1.0  # of a count of correct predictions under add-or-remove adjacency
VALID = "D_valid"
TRAIN = "D_train"


@dataclasses.dataclass(frozen=True, kw_only=True)
class DpSelection:
    """One DP selection on a count of sensitivity 1.

    Attributes:
        epsilon: the selection's epsilon (> 0, finite).
        mechanism: `EXPONENTIAL` (pure epsilon-DP) or `GAUSSIAN` (needs delta).
        delta: the Gaussian variant's delta (ignored by the exponential mechanism).
        monotone: the score moves in one direction for every candidate when one record is added
            (a count of correct predictions: True); False pays the factor 2 of the general case.
        accountant: calibrates the Gaussian variant's sigma.
    """

    epsilon: float
    mechanism: str = EXPONENTIAL
    delta: float | None = None
    monotone: bool = True
    accountant: str = accounting.DEFAULT_ACCOUNTANT

    def __post_init__(self):
        accounting.check_epsilon(self.epsilon)
        if not math.isfinite(self.epsilon):
            raise PrivacyConfigError(f"a DP selection needs a finite epsilon, got {self.epsilon}")
        if self.mechanism not in MECHANISMS:
            raise PrivacyConfigError(f"selection mechanism must be one of {MECHANISMS}, got {self.mechanism!r}")
        if self.mechanism == GAUSSIAN:
            if self.delta is None:
                raise PrivacyConfigError("the Gaussian selection needs a delta")
            accounting.check_delta(self.delta)

    # ------------------------------------------------------------------ the mechanism
    @property
    def scale(self) -> float:
        """eps' of exp(eps' u): epsilon for a monotone score, epsilon / 2 otherwise (sensitivity 1)."""
        return self.epsilon / SENSITIVITY / (1.0 if self.monotone else 2.0)

    def noise_multiplier(self, candidates: int) -> float:
        """The Gaussian variant's sigma: k Gaussian mechanisms of sensitivity 1 together (epsilon, delta)-DP."""
        k = _check_candidates(candidates)
        # k Gaussians of sensitivity 1 and std sigma compose exactly to one of std sigma / sqrt(k).
        return histogram.calibrate_histogram_noise(self.epsilon, self.delta, self.accountant) * math.sqrt(k)

    def probabilities(self, scores: Sequence[float]) -> np.ndarray:
        """The exponential mechanism's selection probabilities, proportional to exp(eps' u_i)."""
        if self.mechanism != EXPONENTIAL:
            raise ValueError("closed-form probabilities exist for the exponential mechanism only")
        u = _check_scores(scores) * self.scale
        w = np.exp(u - u.max())
        return w / w.sum()

    def choose(self, scores: Sequence[float], rng: np.random.Generator) -> int:
        """The selected index. `rng` must be seeded secretly (`dpsynth.dp.seeds.secret_seed`) for a release."""
        u = _check_scores(scores)
        if self.mechanism == EXPONENTIAL:
            return int(np.argmax(u * self.scale + rng.gumbel(size=u.shape)))
        sigma = self.noise_multiplier(len(u))
        return int(np.argmax(u + rng.normal(0.0, sigma * SENSITIVITY, size=u.shape)))

    def ledger_entry(self, candidates: int, name: str = "dp_selection", dataset: str = VALID,
                     group: int = 1) -> dict[str, Any]:
        """The ledger entry of one selection among `candidates` (`dpsynth.dp.ledger` format).

        `group`: how many records of the part one record of D may change (`group_size`): the entry
        is accounted for that group (epsilon x group; the Gaussian's sigma / group).
        """
        k = _check_candidates(candidates)
        if self.mechanism == EXPONENTIAL:
            return {"mechanism": EXPONENTIAL, "name": name, "epsilon": float(self.epsilon) * group, "candidates": k,
                    "dataset": dataset, **({"group": group} if group != 1 else {})}
        return {"mechanism": "gaussian", "name": name, "noise_multiplier": self.noise_multiplier(k) / group, "count": k,
                "dataset": dataset, **({"group": group} if group != 1 else {})}

    def to_json(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, "epsilon": self.epsilon, "delta": self.delta, "monotone": self.monotone,
                "sensitivity": SENSITIVITY}


def _check_candidates(candidates: int) -> int:
    if int(candidates) < 1:
        raise ValueError(f"nothing to select from: {candidates} candidates")
    return int(candidates)


def _check_scores(scores: Sequence[float]) -> np.ndarray:
    u = np.asarray(scores, dtype=np.float64)
    _check_candidates(u.size)
    if u.ndim != 1 or not np.all(np.isfinite(u)):
        raise ValueError(f"selection scores must be a finite vector, got {scores!r}")
    return u


# ---------------------------------------------------------------------- composition with the tuning


def composition(split: str, *, valid_read_by_tuning: bool = False) -> str:
    """`PARALLEL` when the selection and the tuning see disjoint parts of D split data-independently,
    else `SEQUENTIAL`."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return PARALLEL if split in DATA_INDEPENDENT_SPLITS and not valid_read_by_tuning else SEQUENTIAL


def group_size(split: str) -> int:
    """Records of D_valid that one added or removed record of D may change: 1 for a data-independent
    split; 2 for a positional one (the record itself and one moved across the boundary), whose
    selection is therefore accounted by group privacy at twice its epsilon."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return 1 if split in DATA_INDEPENDENT_SPLITS else 2


RESERVED_NAME = "reserved: a DP selection on D_valid after the tuning"


def reserved_entry(epsilon: float) -> dict[str, Any]:
    """The ledger entry a tuning run reserves for a later exponential-mechanism selection at
    `epsilon` that composes SEQUENTIALLY with it (a positional split, or a D_valid the tuning read):
    accounted as a positional split's selection (twice `epsilon`, `group_size`), which also covers
    the group-1 case. `dpsynth.dp.plan.plan_privacy(reserved=...)` calibrates the tuning's sigma on
    the run composed with it, so that the selected release meets the tuning's target."""
    return DpSelection(epsilon=epsilon).ledger_entry(1, name=RESERVED_NAME, group=group_size(POSITIONAL))


def reserved_epsilon(report: Mapping[str, Any]) -> float:
    """The selection epsilon a tuning's privacy report reserved (0.0 when none)."""
    return float((report.get("training") or {}).get("reserve_selection_epsilon") or 0.0)


def entries_by_dataset(entries: Sequence[Mapping[str, Any]]) -> dict[str, list[dict]]:
    """Ledger entries grouped by their `dataset` (default D_train)."""
    out: dict[str, list[dict]] = {}
    for e in entries:
        out.setdefault(e.get("dataset", TRAIN), []).append(dict(e))
    return out


def guarantee(entries: Sequence[Mapping[str, Any]], delta: float, how: str) -> dict[str, Any]:
    """The epsilon of a release whose ledger holds tuning (D_train) and selection (D_valid) entries.

    Returns {"composition": how, "epsilon": per accountant (max over datasets when PARALLEL, the
    exact composition of every entry when SEQUENTIAL), "epsilon_by_dataset", "epsilon_sequential"}.
    """
    from dpsynth.dp.ledger import PrivacyLedger

    def eps(es):
        return PrivacyLedger(delta=delta, target_epsilon=math.inf, entries=[dict(e) for e in es]).epsilons()

    by = {}
    for name, es in entries_by_dataset(entries).items():
        by[name] = eps(es)
        if all(e["mechanism"] == EXPONENTIAL for e in es):  # pure DP: basic composition may be tighter
            pure = sum(float(e["epsilon"]) for e in es)
            by[name] = {acc: (pure if v is None else min(v, pure)) for acc, v in by[name].items()}
    sequential = eps(entries)
    if how == PARALLEL:
        total = {acc: (None if any(v[acc] is None for v in by.values()) else max(v[acc] for v in by.values()))
                 for acc in sequential}
    elif how == SEQUENTIAL:
        total = sequential
    else:
        raise ValueError(f"composition must be {PARALLEL!r} or {SEQUENTIAL!r}, got {how!r}")
    return {"composition": how, "epsilon": total, "epsilon_by_dataset": by, "epsilon_sequential": sequential}


def within_tuning(tuning_epsilon: float, selection_epsilon: float) -> bool:
    """Whether a parallel selection leaves the release at the tuning's epsilon (eps_s <= eps_t)."""
    return float(selection_epsilon) <= float(tuning_epsilon)


# ---------------------------------------------------------------------- a selected release's report
# One home for what a DP selection among candidates releases (`dpsynth select` among corpora,
# `dpsynth dp-tune --sweep-select-epsilon` among sweep trials): the winner's privacy report with
# every candidate's tuning entries and the selection's entry composed, as `guarantee` says.


def tuning_entries(reports: Sequence[Mapping[str, Any] | None],
                   where: Sequence[str] | None = None) -> tuple[list[dict], float]:
    """The entries of every release behind the candidates, each counted once, and their common delta.

    An entry with a run id (`dpsynth.dp.ledger`, `"run"`) is one release however many reports
    carry it: the union keeps, per (run, content), the most copies any one report holds. So the
    corpora of one model count its tuning and its label histogram once, a previous selection's
    output counts its selection once, and two tunings with the same settings count twice. Entries
    without a run id (reports written before run ids) are merged as whole ledgers, each distinct
    one once: such candidates are taken to come from one run per distinct ledger.

    Raises ValueError for a candidate without a privacy report (a non-private corpus cannot be
    selected into a DP release) or for different deltas; `where` names each candidate in the
    message (default "candidate I").
    """
    import collections
    import json

    from dpsynth.dp import report as report_lib

    taken: collections.Counter = collections.Counter()
    legacy, entries, deltas = set(), [], set()
    for i, rep in enumerate(reports):
        name = where[i] if where is not None else f"candidate {i}"
        if not rep:
            raise ValueError(f"{name} has no privacy report: a non-private corpus cannot be selected with DP")
        report_lib.check_report(dict(rep), f"{name}'s privacy report")
        deltas.add(float(rep["delta"]))
        own = [e for e in rep["ledger"]["entries"] if "run" not in e]
        key = json.dumps(own, sort_keys=True)
        if own and key not in legacy:
            legacy.add(key)
            entries += [dict(e) for e in own]
        here: collections.Counter = collections.Counter()
        for e in rep["ledger"]["entries"]:
            if "run" in e:
                k = json.dumps(e, sort_keys=True)
                here[k] += 1
                if here[k] > taken[k]:
                    taken[k] += 1
                    entries.append(dict(e))
    if len(deltas) != 1:
        raise ValueError(f"the candidates' privacy reports have different deltas {sorted(deltas)}")
    return entries, deltas.pop()


def reads_valid_without_dp(report: Mapping[str, Any]) -> bool:
    """Whether the tuning's report declares a non-DP use of D_valid (a validation-based sweep selection)."""
    return any(str(ch.get("name", "")).startswith("validation-based") or "selected-only" in str(ch.get("name", ""))
               for ch in report.get("side_channels", []))


def check_candidates(names: Sequence[str], scores: Sequence[float],
                     reports: Sequence[Mapping[str, Any] | None]) -> tuple[list[dict], float]:
    """`tuning_entries(reports)`, after checking one score and one report per candidate (>= 1)."""
    if not (len(names) == len(scores) == len(reports)) or not names:
        raise ValueError("a selection needs one score and one privacy report per candidate, and at least one candidate")
    return tuning_entries(reports)


def select_release(names: Sequence[str], scores: Sequence[float], reports: Sequence[Mapping[str, Any] | None],
                   mech: DpSelection, *, split: str, rng: np.random.Generator, entry_name: str, selected_by: str,
                   covers: str, disjointness: Mapping[str, Any] | None = None) -> tuple[int, dict, dict]:
    """Selects one candidate with `mech` and builds the release's privacy report.

    Returns (winner, the selection's ledger entry on D_valid, the winner's report refreshed with
    every candidate's tuning entries and the selection's entry, its `epsilon` as `guarantee`
    composes them, and a `selection` section). `covers` is appended to the report's coverage.
    `disjointness`: whether D_valid was checked disjoint from D_train (`dpsynth.dp.disjoint`;
    {"checked": bool, "detail": str}), recorded in the section and stated by its `guarantee`;
    None: not a question for this caller (the guarantee text asserts the declared split).
    """
    from dpsynth.dp import report as report_lib
    from dpsynth.dp.ledger import new_run_id

    entries, delta = check_candidates(names, scores, reports)
    winner = mech.choose(scores, rng)
    entry = {**mech.ledger_entry(len(names), name=entry_name, group=group_size(split)), "run": new_run_id()}
    how = composition(split, valid_read_by_tuning=any(reads_valid_without_dp(r) for r in reports))
    g = guarantee(entries + [entry], delta, how)
    # (what the candidates' releases read of D_train: an earlier selection's D_valid entry is not tuning)
    tuning_eps = guarantee([e for e in entries if e.get("dataset", TRAIN) != VALID], delta, SEQUENTIAL)["epsilon"]
    targets = target_epsilons(names, reports)
    target = max(targets.values())
    rep = report_lib.refresh(dict(reports[winner]), _ledger(reports[winner], entries + [entry], delta, target))
    fmt = report_lib._fmt_eps
    rep["epsilon"] = {k: fmt(v) for k, v in g["epsilon"].items()}
    rep["target_epsilon"] = fmt(target)
    rep["covers"] = rep.get("covers", "") + "; and " + covers
    acc = rep.get("accountant", "rdp")
    rep["selection"] = {
        "candidates": list(names), "selected": names[winner], "selected_by": selected_by,
        **mech.to_json(), "split": split, "composition": how,
        "within_tuning_epsilon": how == PARALLEL and within_tuning(tuning_eps.get(acc) or 0.0,
                                                                   g["epsilon_by_dataset"][VALID].get(acc) or 0.0),
        "epsilon_tuning": {k: fmt(v) for k, v in tuning_eps.items()},
        "epsilon_by_dataset": {d: {k: fmt(v) for k, v in e.items()} for d, e in g["epsilon_by_dataset"].items()},
        "epsilon_sequential": {k: fmt(v) for k, v in g["epsilon_sequential"].items()},
        "guarantee": _guarantee_text(how, split, disjointness),
        **({"disjointness": dict(disjointness)} if disjointness is not None else {}),
        # The smallest selection epsilon the candidates' tunings reserved (`reserved_entry`), and whether
        # the release (tuning + selection, as composed above) stays within the tuning's target epsilon.
        "reserved_by_tuning": min(reserved_epsilon(r) for r in reports),
        # Whether the release stays within the target (the candidates' tunings' targets: the largest
        # when they differ, `target_epsilons` lists them all).
        "within_target": within_target(g["epsilon"].get(acc), target),
        "target_epsilons": {n: fmt(t) for n, t in targets.items()},
    }
    return winner, entry, rep


def within_target(epsilon: float | None, target: float, rel_tol: float = 1e-6) -> bool:
    """epsilon <= target up to the calibration's tolerance (None: not composed by the accountant)."""
    return epsilon is not None and epsilon <= target * (1.0 + rel_tol)


def target_epsilons(names: Sequence[str], reports: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Each candidate's target epsilon (its tuning's, from its privacy report's ledger)."""
    return {n: float(r["ledger"]["target_epsilon"]) for n, r in zip(names, reports)}


def _ledger(report, entries, delta, target):
    from dpsynth.dp.ledger import PrivacyLedger

    return PrivacyLedger(delta=delta, target_epsilon=float(target), accountant=report["ledger"]["accountant"],
                         entries=[dict(e) for e in entries])


def _guarantee_text(how: str, split: str, disjointness: Mapping[str, Any] | None = None) -> str:
    if how == PARALLEL:
        parallel = ("one record changes D_train or D_valid, never both, so the release is (max(epsilon_tuning, "
                    "epsilon_selection), delta)-DP with respect to D (parallel composition)")
        if disjointness is not None and not disjointness.get("checked"):
            return (f"D_valid was declared split from D data-independently ({split}) and the tuning did not read it, "
                    "but its disjointness from D_train was NOT checked (no record hashes of D_train: "
                    f"{disjointness.get('detail', '')}): if it is disjoint, {parallel}; if not, the release is "
                    "only (epsilon_sequential, delta)-DP")
        checked = (" and checked disjoint from D_train (exact duplicates within what such a split predicts)"
                   if disjointness is not None else "")
        return (f"D_valid was split from D data-independently ({split}){checked} and the tuning did not read it: "
                f"{parallel}")
    return (f"the split ({split}) is not data-independent or the tuning read D_valid without DP: the tuning and the "
            "selection compose sequentially (every ledger entry composed)")
