"""Choosing the best synthetic corpus on the REAL D_valid, with DP (`dpsynth select`).

The synthetic valid split cannot choose among corpora (its accuracy rises with the guidance
weight while the real accuracy peaks and falls: issue 34), so the choice reads real data and
must be DP. For every candidate corpus (a sampling setting, a multiple of |D_train|, a model)
the downstream classifier is trained on its synthetic train split, its hyperparameters chosen
on its synthetic valid split (`train_classifier.classify`, exactly as `dpsynth evaluate`), and
its correct predictions on the real D_valid are counted (mean over the selected setting's
repeats). Only the winner is released, through `dpsynth.dp.private_selection.DpSelection`
(the exponential mechanism on the counts, sensitivity 1, or its Gaussian variant); the counts
stay in owner-only private state.

Formal guarantee (`dpsynth.dp.private_selection`): the released index is epsilon_s-DP with
respect to D_valid (the classifiers never read D_valid). The released corpus is the winner,
itself post-processing of the candidates' models and label histograms; the privacy report of
the output holds the entries of every release behind the candidates, each once by its run id
(`private_selection.tuning_entries`; a previous selection's output may be a candidate), and the
selection's entry (`"dataset": "D_valid"`), and its `epsilon` is their parallel composition
(the max over D_train and D_valid) when the split is data-independent and the tuning did not
read D_valid without DP, else their sequential composition. `selection.composition` says which.
The parallel composition needs D_valid disjoint from D_train: `check_disjoint` refuses one that
shares far more exact-duplicate records with D_train than a data-independent split explains
(`dpsynth.dp.disjoint`), and `selection.disjointness` says whether that was checked. A DP label
histogram of D_train for the candidates is drawn at the sigma the tuning reserved
(`label_noise_multiplier`), so the release stays within the tuning's target.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dpsynth import fileio, outdir
from dpsynth.dp import private_selection as ps
from dpsynth.dp import report as report_lib
from dpsynth.dp import disjoint, seeds
from dpsynth.evaluate import classifiers, corpora
from dpsynth.evaluate import train_classifier as tc
from dpsynth.evaluate.trainer import TrainConfig
from dpsynth.owner_only import make_private_dir, write_private_json

logger = logging.getLogger("dpsynth.evaluate")

SELECTION_FILE = "selection.json"  # public: the candidates, the winner, the mechanism; never the scores
SCORES_FILE = "selection_scores.json"  # owner-only: the non-DP counts on D_valid
# The winner's files copied into OUT (not its generation manifest: OUT is not a generation job's directory).
COPIED = ("train.jsonl", "valid.jsonl", "generation_report.json", "generation_config.json")
NON_DP_SCORES_NOTICE = ("correct predictions on the real D_valid per candidate, computed without noise: NOT "
                        "differentially private; for the data owner only, never published")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SelectConfig:
    """The settings of `dpsynth select`, one flag each.

    Attributes:
        epsilon: the selection's epsilon (on D_valid).
        mechanism: "exponential" (pure epsilon-DP) or "gaussian" (report-noisy-max, RDP/PLD accounted).
        delta: the Gaussian variant's delta; None = the candidates' delta.
        split: how D_valid was split from D: "files" (the user's own files) or "hash" (a per-record
            hash): data-independent, the selection composes in parallel with the tuning;
            "positional" (e.g. the last 10%): sequentially.
        classifier: the downstream classifier (`registry.names()`).
        cnn: the WordCNN's sizes (`train_classifier.CNN_SIZES`).
        repeats, max_epochs: the classifier sweep's repeats and epochs per trial.
        seed: fixes the selection's randomness (tests only: voids the guarantee for whoever knows it).
    """

    epsilon: float = 1.0
    mechanism: str = ps.EXPONENTIAL
    delta: float | None = None
    split: str = ps.FILES
    classifier: str = "wordcnn"
    cnn: str = "small"
    repeats: int = 1
    max_epochs: int = 5
    seed: int | None = None

    def __post_init__(self):
        if isinstance(self.epsilon, bool) or not isinstance(self.epsilon, (int, float)) or not 0 < self.epsilon < float("inf"):
            raise ValueError(f"epsilon must be a finite number > 0, got {self.epsilon!r}")
        if self.mechanism not in ps.MECHANISMS:
            raise ValueError(f"mechanism must be one of {ps.MECHANISMS}, got {self.mechanism!r}")
        if self.split not in ps.SPLITS:
            raise ValueError(f"split must be one of {ps.SPLITS}, got {self.split!r}")
        if self.cnn not in tc.CNN_SIZES:
            raise ValueError(f"cnn must be one of {tc.CNN_SIZES}, got {self.cnn!r}")
        if self.repeats < 1 or self.max_epochs < 1:
            raise ValueError("repeats and max_epochs must be >= 1")

    def spec(self) -> tc.ClassifierSpec:
        small = classifiers.WordCNNConfig(vocab_words=10_000, embed_dim=64, filters=64, hidden=64, max_len=128)
        return tc.ClassifierSpec(kind=self.classifier,
                                 wordcnn=small if self.cnn == "small" else classifiers.WordCNNConfig())

    def sweep(self) -> tc.SweepConfig:
        return tc.SweepConfig(repeats=self.repeats, train=TrainConfig(max_epochs=self.max_epochs))


@dataclasses.dataclass(frozen=True)
class Selection:
    """The outcome. `scores` (non-DP counts on D_valid) must stay private; the rest may be published."""

    names: tuple[str, ...]
    winner: int
    scores: tuple[float, ...]
    entry: dict
    mechanism: dict
    report: dict  # the winner's privacy report with every candidate's tuning and the selection composed
    # non-DP counts of D_valid records found in D_train (`dpsynth.dp.disjoint`): private state only
    overlaps: tuple[dict, ...] = ()

    @property
    def winner_name(self) -> str:
        return self.names[self.winner]


def correct_counts(corpus: corpora.Corpus, valid: Sequence[Mapping], config: SelectConfig, backbone=None) -> float:
    """Mean correct predictions on `valid` of the classifier trained on `corpus` (synthetic splits only)."""
    res = tc.classify(corpus.train, corpus.valid, {"real_valid": valid}, config.spec(), config.sweep(),
                      backbone=backbone)
    return float(res.test_mean["real_valid"]) * len(valid)


tuning_entries = ps.tuning_entries  # (declared in `dpsynth.dp.private_selection`, shared with the dp-tune sweep)
reads_valid_without_dp = ps.reads_valid_without_dp


def label_noise_multiplier(model_report: Mapping[str, Any], given: float | None = None) -> float:
    """The sigma at which `dpsynth select --label-source` draws the DP label histogram of D_train.

    `given` (--label-noise-multiplier), else the sigma the model's tuning reserved
    (`TuneConfig.reserve_label_noise_multiplier`), else `dpsynth.dp.histogram.DEFAULT_NOISE_MULTIPLIER`.
    Refuses (PrivacyConfigError, before anything is drawn) a histogram whose composition with the
    model's ledger, by the report's accountant, exceeds the model's target epsilon: the tuning
    reserved nothing, or less noise than that is asked for. Every corpus of the grid carries that
    composition, and the selection composes in parallel or sequentially on top of it.
    """
    from dpsynth.dp import histogram

    reserved = float((model_report.get("training") or {}).get("reserve_label_noise_multiplier") or 0.0)
    sigma = float(given) if given is not None else (reserved or histogram.DEFAULT_NOISE_MULTIPLIER)
    if not sigma > 0:
        raise ps.PrivacyConfigError(f"--label-noise-multiplier must be > 0, got {sigma:g}")
    ledger = report_lib.ledger_of(dict(model_report))
    target = ledger.target_epsilon
    ledger.record_gaussian(noise_multiplier=sigma, name="label_histogram")
    eps = ledger.epsilon(ledger.accountant)
    if not ps.within_target(eps, target):
        fix = (f"re-tune with --reserve-label-noise-multiplier {sigma:g} so that the target covers it, or omit "
               "--label-source (uniform labels, no cost)" if not reserved else
               f"the tuning reserved sigma {reserved:g}: draw at that or more (the default), or omit --label-source")
        raise ps.PrivacyConfigError(
            f"--label-source: a DP label histogram at noise multiplier {sigma:g} brings the model's epsilon to "
            f"{eps:.4f} ({ledger.accountant.upper()}), above its target {target:g}: {fix}")
    return sigma


def train_hash_sources(*, model: str | None = None, candidates: Sequence[str] = (), label_source: str | None = None,
                       encoding: str | None = None, max_dead_letters=0) -> list[tuple[str, np.ndarray]]:
    """The record hashes of D_train to check D_valid against (`dpsynth.dp.disjoint`): [(where, hashes)].

    `label_source` (D_train itself) when given; else those `dpsynth dp-tune` kept in the owner-only
    private state of `model`, or of each candidate's model (its `generation_config.json`'s
    `model_dir`), where it did (models tuned before it kept none). [] when none is known.
    """
    from dpsynth.train.tune_resume import default_state_dir

    if label_source:
        return [("--label-source", disjoint.record_hashes(corpora.read_real(
            label_source, "D_train (--label-source)", max_dead_letters=max_dead_letters, encoding=encoding)))]
    models = [model] if model else []
    for d in candidates:
        cfg = os.path.join(d, "generation_config.json")
        if os.path.exists(cfg):
            models.append(fileio.read_json(cfg).get("model_dir") or "")
    out = []
    for m in dict.fromkeys(os.path.abspath(m) for m in models if m):
        path = os.path.join(default_state_dir(m), disjoint.HASHES_FILE)
        if os.path.exists(path):
            out.append((f"the hashes dp-tune kept for {m}", disjoint.read_hashes(path)))
    return out


def check_disjoint(valid: Sequence[Mapping], sources: Sequence[tuple[str, np.ndarray]]) -> tuple[dict, tuple[dict, ...]]:
    """Refuses a D_valid that shares far more records with D_train than a data-independent split
    explains (`dpsynth.dp.disjoint.check_overlap`, against every source). Returns the public statement
    ({"checked", "detail"}, for `selection.json`) and the non-DP counts (private state only)."""
    if not sources:
        return {"checked": False, "detail": "no --label-source, and no D_train record hashes in the private state of "
                                            "the candidates' models (models tuned before dp-tune kept them have none)"}, ()
    counts = tuple({"against": where, **disjoint.check_overlap(valid, hashes, where=where).to_json()}
                   for where, hashes in sources)
    return {"checked": True, "detail": "exact-duplicate records of D_valid in D_train (8-byte SHA-256 prefixes of the "
                                       "normalized records) within what a data-independent split predicts "
                                       "(docs/dp.md)"}, counts


def select(names: Sequence[str], scores: Sequence[float], reports: Sequence[Mapping[str, Any] | None],
           config: SelectConfig, rng: np.random.Generator | None = None, *,
           disjointness: Mapping[str, Any] | None = None, overlaps: Sequence[dict] = ()) -> Selection:
    """DP-selects one candidate by its `scores` (counts on D_valid) and builds its privacy report
    (`dpsynth.dp.private_selection.select_release`; `disjointness`: `check_disjoint`'s statement,
    `overlaps` its private counts)."""
    _, delta = ps.check_candidates(names, scores, reports)
    mech = ps.DpSelection(epsilon=config.epsilon, mechanism=config.mechanism,
                          delta=config.delta if config.delta is not None else delta)
    rng = rng if rng is not None else np.random.default_rng(config.seed if config.seed is not None
                                                            else seeds.secret_seed())
    winner, entry, rep = ps.select_release(
        names, scores, reports, mech, split=config.split, rng=rng, entry_name=f"dp_selection among {len(names)} corpora",
        selected_by=f"correct predictions of a {config.classifier} (trained on each candidate's synthetic train split, "
                    "selected on its synthetic valid split) on the real D_valid, released through "
                    f"{mech.mechanism} selection at epsilon {config.epsilon:g}",
        covers="the choice of this corpus among the candidates on the real D_valid (DP, see `selection`)",
        disjointness=disjointness)
    return Selection(tuple(names), winner, tuple(float(s) for s in scores), entry, mech.to_json(), rep,
                     tuple(dict(o) for o in overlaps))


def select_corpora(paths: Mapping[str, str], valid: Sequence[Mapping], config: SelectConfig,
                   rng: np.random.Generator | None = None, *, disjointness: Mapping[str, Any] | None = None,
                   overlaps: Sequence[dict] = ()) -> Selection:
    """Scores every candidate corpus (`paths`: name -> directory) on `valid` and DP-selects one
    (`disjointness`, `overlaps`: `check_disjoint`'s, done before anything is generated or trained)."""
    from dpsynth.progress import Progress

    names, scores, reports = [], [], []
    tc.check_records("real valid", valid)
    progress = Progress(total=len(paths), desc="select: scoring", unit="candidate", interval=0.0)
    for name, path in paths.items():
        corpus = corpora.read_corpus(path, name)
        reports.append(corpus.privacy_report)
        # refuse a non-private candidate before training anything
        tuning_entries([corpus.privacy_report], where=[f"candidate {name} ({path})"])
        names.append(name)
        scores.append(correct_counts(corpus, valid, config))
        logger.info("candidate %s scored", name)  # the score goes to the private state, not to logs
        progress.update(1)  # (counts and rates only)
    return select(names, scores, reports, config, rng, disjointness=disjointness, overlaps=overlaps)


def write_selection(out_dir: str, selection: Selection, paths: Mapping[str, str], *,
                    private_dir: str | None = None, release_dir: str | None = None,
                    screening: Mapping[str, Any] | None = None) -> str:
    """Writes the winner as a corpus directory `out_dir` (its splits, reports, the composed privacy
    report and `selection.json`); the counts go to the owner-only `private_dir` (default OUT.private).
    `release_dir`: the corpus released for the winner (default its candidate directory; screening:
    the winner's setting generated at full size, `dpsynth.evaluate.screening`), described by the
    `screening` section of selection.json."""
    private_dir = private_dir or os.path.normpath(out_dir) + ".private"
    src = release_dir or paths[selection.winner_name]
    os.makedirs(out_dir, exist_ok=True)
    for name in COPIED:
        if os.path.exists(os.path.join(src, name)):
            fileio.copy_file(os.path.join(src, name), os.path.join(out_dir, name))
    report_lib.write_report(out_dir, selection.report)
    make_private_dir(private_dir)
    write_private_json(os.path.join(private_dir, SCORES_FILE), {
        "candidates": list(selection.names), "correct_on_valid": list(selection.scores), "dp": False,
        "notice": NON_DP_SCORES_NOTICE, **({"valid_in_train": list(selection.overlaps)} if selection.overlaps else {})})
    fileio.write_json(os.path.join(out_dir, SELECTION_FILE), {
        "format": "dpsynth.selection", "format_version": 1, **selection.report["selection"],
        "epsilon": selection.report["epsilon"], "delta": selection.report["delta"],
        "candidate_dirs": {n: os.path.abspath(p) for n, p in paths.items()},
        **({"screening": dict(screening)} if screening is not None else {})})
    _write_manifest(out_dir, selection.winner_name)
    return out_dir


def _write_manifest(out_dir: str, winner: str) -> None:
    """OUT/manifest.json, last: a finished corpus (`dpsynth.outdir.require_corpus`) whose splits' SHA-256s it records."""
    from dpsynth.generate import outputs, plan

    splits = {}
    for split in ("train", "valid"):
        path = os.path.join(out_dir, f"{split}.jsonl")
        if os.path.exists(path):
            splits[split] = {"files": {"jsonl": {"path": f"{split}.jsonl", "sha256": fileio.sha256_file(path)}}}
    fileio.write_json(os.path.join(out_dir, outputs.MANIFEST_FILE), {
        "format": plan.FORMAT, "format_version": plan.FORMAT_VERSION, outdir.KIND_FIELD: outdir.CORPUS,
        "private": True, "selected": winner, "splits": splits,
        "files": {"config": outputs.CONFIG_FILE, "report": outputs.REPORT_FILE, "selection": SELECTION_FILE,
                  "privacy_report": list(outputs.PRIVACY_FILES)}})


# ---------------------------------------------------------------------- the candidate grid

DEFAULT_GUIDANCES = (0.0, 1.5, 3.0, 6.0)
DEFAULT_TEMPERATURES = (1.0, 1.2)
DEFAULT_MULTIPLES = (1.0, 3.0)
# The sampling settings (guidance, temperature) a time budget keeps longest when it must screen fewer
# (`settings_by_priority`, `dpsynth.evaluate.screening.fit_time_budget`): a constant, so the kept settings
# depend on the flags alone. The order is how often study v3's DP selections released each setting of the
# default grid (README's results, docs/paper_cpu.md: 12 selections): w 0 at t 1 five times (every one with
# the label contrast, the default recipe's); w 1.5 at t 1 and w 6 at t 1 twice each; w 0 at t 1.2, w 1.5
# at t 1.2 and w 3 at t 1.2 once each; w 3 at t 1 and w 6 at t 1.2 never (ties: the one released with the
# label contrast first, then the grid's order). The two kept last are one unguided and one guided setting.
SETTING_PRIORITY = ((0.0, 1.0), (1.5, 1.0), (6.0, 1.0), (0.0, 1.2), (1.5, 1.2), (3.0, 1.2), (3.0, 1.0), (6.0, 1.2))
CANDIDATE_FILE = "candidate.json"  # in a prefix candidate: which generated corpus it is the prefix of


@dataclasses.dataclass(frozen=True)
class CandidateSpec:
    """One candidate: a sampling setting and a multiple of |D_train| (a prefix of the setting's largest corpus)."""

    guidance: float
    temperature: float
    multiple: float

    @property
    def name(self) -> str:
        return f"w{self.guidance:g}-t{self.temperature:g}-x{self.multiple:g}"

    @property
    def source_name(self) -> str:
        """The generated corpus this candidate is a prefix of (the setting at its largest multiple)."""
        return f"w{self.guidance:g}-t{self.temperature:g}"


def candidate_grid(guidances: Sequence[float] = DEFAULT_GUIDANCES, temperatures: Sequence[float] = DEFAULT_TEMPERATURES,
                   multiples: Sequence[float] = DEFAULT_MULTIPLES) -> list[CandidateSpec]:
    """Every (guidance, temperature, multiple), in that order; refuses empty axes and bad values."""
    if not guidances or not temperatures or not multiples:
        raise ValueError("the candidate grid needs at least one guidance weight, temperature and multiple")
    if any(not w >= 0 for w in guidances) or any(not t > 0 for t in temperatures) or any(not m > 0 for m in multiples):
        raise ValueError(f"guidance >= 0, temperature > 0 and multiple > 0, got {guidances}, {temperatures}, {multiples}")
    return [CandidateSpec(float(w), float(t), float(m)) for w in guidances for t in temperatures
            for m in sorted(set(multiples))]


def settings_by_priority(settings: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """`settings` (distinct (guidance, temperature) pairs, in grid order) from the one a time budget keeps
    longest to the one it drops first: those of `SETTING_PRIORITY` in its order, then the others in a
    spread order of the grid's (the middle one, the first, the last, then the midpoint of the widest gap
    left, leftmost first). Data-independent: the settings alone decide it."""
    settings = list(dict.fromkeys((float(w), float(t)) for w, t in settings))
    rank = {s: i for i, s in enumerate(SETTING_PRIORITY)}
    listed = sorted((s for s in settings if s in rank), key=rank.__getitem__)
    rest = [s for s in settings if s not in rank]
    return listed + [rest[i] for i in _spread(len(rest))]


def _spread(n: int) -> list[int]:
    """0..n-1 in spread order: the middle, both ends, then the midpoint of the widest gap (leftmost first)."""
    if n <= 0:
        return []
    order = list(dict.fromkeys(((n - 1) // 2, 0, n - 1)))
    while len(order) < n:
        chosen = sorted(order)
        a, b = max(zip(chosen, chosen[1:]), key=lambda ab: (ab[1] - ab[0], -ab[0]))
        order.append((a + b) // 2)
    return order


def sizes(multiple: float, dataset_size: int, valid_fraction: float) -> tuple[int, int]:
    """(synthetic train, synthetic valid) examples of a candidate: multiple x |D_train|, valid_fraction of that."""
    n = max(1, int(round(multiple * dataset_size)))
    return n, max(1, int(round(valid_fraction * n)))


def write_prefix(src: str, dst: str, num_train: int, num_valid: int) -> str:
    """A candidate made of the first `num_train` / `num_valid` examples of corpus `src` (reports copied,
    `candidate.json` says so): smaller multiples cost no generation of their own."""
    os.makedirs(dst, exist_ok=True)
    for split, n in (("train", num_train), ("valid", num_valid)):
        with open(os.path.join(src, f"{split}.jsonl"), encoding="utf-8") as f, \
                fileio.open_atomic(os.path.join(dst, f"{split}.jsonl")) as out:
            for i, line in enumerate(f):
                if i >= n:
                    break
                out.write(line)
    for name in (report_lib.REPORT_JSON, report_lib.REPORT_MD, "generation_config.json"):
        if os.path.exists(os.path.join(src, name)):
            fileio.copy_file(os.path.join(src, name), os.path.join(dst, name))
    fileio.write_json(os.path.join(dst, CANDIDATE_FILE), {"prefix_of": os.path.abspath(src), "num_train": num_train,
                                                          "num_valid": num_valid})
    return dst


def generate_candidates(model_dir: str, root: str, grid: Sequence[CandidateSpec], *, dataset_size: int,
                        valid_fraction: float = 0.1, label_distribution=None, beam_args: Sequence[str] = (),
                        job_kwargs: Mapping[str, Any] | None = None, **generate_options) -> dict[str, str]:
    """Generates the grid under `root`: each sampling setting once at its largest multiple, smaller
    multiples as its prefixes. One label distribution (e.g. ONE DP histogram draw) serves all.
    `generate_options`: more `GenerateConfig` fields; `job_kwargs`: more `job.generate` arguments
    (tests: `loader`). Returns candidate name -> corpus directory. Reruns resume (the job's own resume)."""
    from dpsynth.generate import job, model_info
    from dpsynth.generate.sampler_config import SamplingOptions

    kwargs = dict(job_kwargs or {})
    kwargs.setdefault("loader", model_info.load_bundle)  # (looked up now, not at import: tests patch it)
    largest: dict[str, CandidateSpec] = {}
    for c in grid:
        if c.source_name not in largest or c.multiple > largest[c.source_name].multiple:
            largest[c.source_name] = c
    out = {}
    for source, spec in largest.items():
        n, v = sizes(spec.multiple, dataset_size, valid_fraction)
        gen_dir = os.path.join(root, "generated", source)
        job.generate(job.GenerateConfig(model_dir=model_dir, out_dir=gen_dir, num_examples=n, valid_examples=v,
                                        sampling=SamplingOptions(temperature=spec.temperature, guidance=spec.guidance),
                                        label_distribution=label_distribution, **generate_options),
                     beam_args=beam_args, **kwargs)
    for c in grid:
        src = os.path.join(root, "generated", c.source_name)
        if c.multiple == largest[c.source_name].multiple:
            out[c.name] = src
        else:
            out[c.name] = write_prefix(src, os.path.join(root, "prefixes", c.name), *sizes(c.multiple, dataset_size,
                                                                                             valid_fraction))
    return out
