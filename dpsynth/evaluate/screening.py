"""Screening for `dpsynth select --model`: small candidates, the DP choice, the winner at full size.

Generating every sampling setting of the grid at its full size before the classifiers can score
them costs settings x |D_train| x multiple long examples (8 x 66,000 for 20,000 reviews at the
default grid). Screening generates each setting as a small candidate instead (`screen_size`
synthetic train examples, default `DEFAULT_SCREEN_SIZE`), DP-selects among those on the real
D_valid exactly as `dpsynth.evaluate.dp_select.select_corpora` does (same mechanism, same
epsilon, same composition: `dpsynth.dp.private_selection.select_release`), then generates ONLY
the winner's setting at the size asked for (the largest of the grid's multiples x |D_train|
that fits the time budget, below) and releases that corpus.

Privacy (`dpsynth.dp.private_selection`): the selection is the one DP mechanism that reads
D_valid, at the epsilon given, among the screened candidates; its ledger entry is the one the
full-size path writes (the exponential mechanism's epsilon does not depend on the number of
candidates; the Gaussian variant's sigma does, its (epsilon, delta) does not). The full-size
corpus is generated from the same DP-tuned model with the selected sampling setting:
post-processing of the model and of the DP choice, no further privacy cost. The multiple is
not chosen on D_valid (choosing it as well would be a second selection on D_valid, whose epsilon
would add to the first's on D_valid): the release has the largest multiple asked for that fits
the time budget.

The plan before compute (`SelectPlan`): the examples and tokens to generate (screening and
final), the classifier trainings, and an ETA from a timed probe (`probe`: a few batches sampled
with the real model, and one classifier training on a small set made of those samples; no
private data is read and nothing is written).

The time budget (`fit_time_budget`; `--time-budget`, default `DEFAULT_TIME_BUDGET`, one hour;
0: no limit) covers the whole run by the plan's ETA: the probe's own time (already spent when the
plan is fitted: `Speed.probe_seconds`), the screening generation, the classifier trainings and the
final generation. A plan whose ETA does not fit is shrunk, in this order (`SHRINK_ORDER`, each
stage tried only when the ones before it cannot fit):

1. the released size: the final corpus at the largest of the asked multiples x |D_train| that
   fits, down to the smallest asked multiple (`--multiples 1,2,3`: 3x, then 2x, then 1x). The
   multiples are the sizes the user allowed; the release takes the largest of them the budget
   affords (without a budget, the largest asked).
2. then the screening size, down to `MIN_SCREEN_SIZE` (the screening is what makes the DP
   choice worth its epsilon: `bench/select_screening.py` measured the ranking lost at small
   sizes, so it shrinks after the multiple).
3. then the grid: the sampling settings are dropped one at a time, down to `MIN_SETTINGS`, in the
   fixed order of `dp_select.settings_by_priority` (`dp_select.SETTING_PRIORITY`: the settings
   study v3's DP selections released most often are kept longest; others in a spread order). At
   each grid size the release and the screening size are maximized again (stages 1 and 2 on the
   kept settings), so the first grid size where the smallest asked multiple fits is kept.
4. then the release below the smallest asked multiple: with `MIN_SETTINGS` settings screened at
   `MIN_SCREEN_SIZE`, the largest final train size that fits (its valid `--valid-fraction` of
   it), down to the screening size in use. That floor: below it the release would be smaller
   than each screened candidate, the winner's own screened corpus among them, so shrinking
   further buys a worse corpus than one the run already made.
5. else `BudgetError`: one line, the smallest plan's ETA and the budget it needs, ending with
   "(--time-budget 0: no limit)".

Why the grid (3) before the release below the asked multiples (4): a smaller release loses on
every use of the corpus (the downstream accuracy grows with the synthetic train size: 1x to 3x
gained in study v3, docs/paper_cpu.md), while dropping a setting loses only when the dropped one
would have won and the DP choice at a screening size would have found it; the two settings kept
last were the release in 7 of study v3's 12 selections, and at `MIN_SCREEN_SIZE` examples the
choice among many settings is noisy anyway. The release below the asked multiples is what the
user did not ask for, so it comes last.

The re-plan after the selection (`replan_final`): the plan counts the final at the slowest
setting's rate (the winner is unknown; guided settings sample ~3.5x slower than unguided), so an
unguided winner would finish early with a release smaller than the budget affords. Once the DP
selection has chosen, the final is re-planned at the winner's rate: the largest final train size
(valid `--valid-fraction` of it) that fits the budget left after the stages already run, capped at
the size asked (the largest asked multiple x |D_train|) and never below the plan's (the plan's size
is a floor: the re-plan only grows it). Without a budget nothing changes. The run prints one line
when it grows, and selection.json's `screening.time_budget.replan` says asked, planned and
re-planned sizes and the rate used.

The plan says what shrank and from what (`SelectPlan.final_asked`, `SelectPlan.screen_asked`,
`SelectPlan.settings_asked`, `SelectPlan.eta_asked`: `SelectPlan.shrink_line`), and so does
selection.json's `screening.time_budget` (`budget_record`).

Privacy of the budget: the sizes and the kept settings are chosen from the probe's timing,
|D_train| (the published privacy report's dataset size), the flags and constants alone. The probe
samples the DP-tuned model and trains one classifier on those samples (post-processing of the
model), and reads no private data; the plan is fixed before D_valid is read (`dpsynth select`
fits it before it opens --valid; `--dry-run` prints it without D_valid), and the time counted is
the probe's own (its clock), not the run's wall time since start, which would include reading
D_valid. So the released size and the grid are data-independent choices: no privacy cost, and no
second selection on D_valid (unlike choosing the multiple by the classifiers' scores, which this
module does not do). A smaller grid is still ONE DP selection at the epsilon given, among the kept
settings' candidates: the exponential mechanism's epsilon does not depend on the number of
candidates; the Gaussian variant's sigma does, and is calibrated on the number of candidates
scored, which are exactly `SelectPlan.screening`'s jobs, fixed with the plan before D_valid is
read. Keep it so: nothing that reads D_valid or D_train may enter `fit_time_budget`.

Privacy of the re-plan (`replan_final`): the re-planned size is a function of the DP selection's
output (the winner), the plan (public, above), the probe's speed, the budget and the plan's ETA of
the stages already run (`spent_seconds`): post-processing of the DP choice, no privacy cost. The
time spent is deliberately NOT the wall clock since the run began: between the probe and the final,
the run reads D_valid, checks it disjoint from D_train (hashing --label-source), draws the label
histogram from D_train and scores every candidate's classifiers on D_valid; the time of that work
depends on |D_valid|, |D_train| and the texts' lengths, which are private (|D_valid| is not in the
plan, and neighbouring datasets differ in it), so a size read off the wall clock would publish a
timing channel on them that no epsilon accounts for. The plan's ETA of those stages (the probe's
own measured time, plus the screening and classifier trainings at the probe's rates and the
plan's public counts) is the same on neighbouring datasets. Its cost: the re-plan trusts the ETA
(as the plan did) instead of correcting for how the run actually went. Keep it so: nothing timed
after D_valid is read may enter `replan_final`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dpsynth import errors
from dpsynth.evaluate import dp_select

logger = logging.getLogger("dpsynth.evaluate")

DEFAULT_SCREEN_SIZE = 2000  # synthetic train examples per screened sampling setting (valid: valid_fraction of it)
MIN_SCREEN_SIZE = 200  # the smallest screening size --time-budget shrinks to (fewer cannot rank the settings)
MIN_SETTINGS = 2  # the fewest sampling settings --time-budget screens (one cannot be a choice)
DEFAULT_TIME_BUDGET = 3600  # seconds the whole of `dpsynth select --model` may take by default (0: no limit)
PROBE_BATCHES = 2  # timed sampler calls of the generation probe, per kind of setting (after one warm-up call)
PROBE_CLASSIFIER_EXAMPLES = 256  # the classifier probe's train set (the probe's samples, repeated)
SCREEN_DIR, FINAL_DIR = "screened", "final"  # under OUT.candidates/
# What --time-budget shrinks, in order (`fit_time_budget` follows it; the module docstring says why):
# the one declaration `dpsynth select --help` prints and the docs name.
SHRINK_ORDER = (
    "the release, to the largest --multiples that fits (down to the smallest asked)",
    f"the screening size (down to {MIN_SCREEN_SIZE})",
    f"the sampling settings (down to {MIN_SETTINGS}; the study's least often released first, "
    "dp_select.SETTING_PRIORITY)",
    "the release below the smallest --multiples (down to the screening size)",
)


def shrink_order_text() -> str:
    """`SHRINK_ORDER` as one phrase: "A, then B, then C, then D"."""
    return ", then ".join(SHRINK_ORDER)


class BudgetError(errors.DpsynthError, ValueError):
    """The plan does not fit `--time-budget` (the message says what fits)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Speed:
    """What the probe measured on this machine (public: the model's samples, never D_valid).

    Attributes:
      examples_per_second: sampling speed, {False: unguided settings, True: guided settings}.
      job_overhead_seconds: a generation job's fixed cost (model load and compilation, as measured).
      mean_tokens: mean generated tokens per example in the probe.
      classifier_seconds_per_example: one classifier training's seconds per synthetic train
        example (one trial at the sweep's epochs, the probe's compilation included: an upper estimate).
      probe_seconds: the probe's own time, already spent when the plan is fitted (its clock, from
        loading the model to the end of its classifier training: nothing private is read in it).
        The ETA, and so the time budget, counts it.
    """

    examples_per_second: Mapping[bool, float]
    job_overhead_seconds: float
    mean_tokens: float
    classifier_seconds_per_example: float
    probe_seconds: float = 0.0

    def rate(self, guided: bool) -> float:
        return self.examples_per_second.get(guided) or min(self.examples_per_second.values())

    def to_json(self) -> dict[str, Any]:
        return {"examples_per_second": {("guided" if k else "unguided"): v for k, v in self.examples_per_second.items()},
                "job_overhead_seconds": self.job_overhead_seconds, "mean_tokens": self.mean_tokens,
                "classifier_seconds_per_example": self.classifier_seconds_per_example,
                "probe_seconds": self.probe_seconds}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Job:
    """One generation job of the plan: a sampling setting at a size."""

    guidance: float
    temperature: float
    train: int
    valid: int

    @property
    def examples(self) -> int:
        return self.train + self.valid

    @property
    def name(self) -> str:
        return setting_name(self.guidance, self.temperature)


def setting_name(guidance: float, temperature: float) -> str:
    """A sampling setting's name: its screened candidate's (`w1.5-t1`)."""
    return f"w{guidance:g}-t{temperature:g}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SelectPlan:
    """What `dpsynth select --model` will compute, before it does.

    Attributes:
      screen_size: synthetic train examples per screened setting; 0 = no screening (every
        candidate of the grid at its size, the winner copied as it is).
      screening: the generation jobs scored by the classifiers.
      final: the winner's full-size job (None without screening). Its setting is the DP choice,
        unknown before (guidance and temperature -1 here; `generate_final` sets the winner's): the
        ETA counts it at the slowest setting of the grid.
      candidates: the candidates the classifiers score (a prefix candidate costs no generation).
      trainings_per_candidate: classifier trainings of one candidate's sweep (trials x repeats).
      max_len: tokens per example at most (prompt + text).
      candidate_train_sizes: each candidate's synthetic train examples (what its classifiers train on).
      dataset_size: |D_train| (the model's privacy report's, public), the multiples' unit.
      multiples: the asked multiples of |D_train|, ascending (the sizes the release may take).
      final_multiple: the multiple of `final` (the largest asked, unless the time budget shrank it;
        below the smallest asked: `final.train` / |D_train|).
      final_asked: `final` as asked (the largest multiple); differs from `final` when shrunk.
      screen_asked: the screening size asked; differs from `screen_size` when shrunk.
      settings_asked: the grid's sampling settings as asked (names, grid order).
      settings_dropped: those the time budget dropped (names, the first dropped first:
        `dp_select.settings_by_priority` reversed); `screening` holds the others.
      time_budget: the seconds the plan was fitted to (`fit_time_budget`); None: no limit.
      eta_asked: the ETA of the plan as asked (the probe included), when the time budget shrank it.
      winner: the DP selection's setting (name), once made (`replan_final`): the ETA counts `final`
        at its rate; None before the selection (the final at the slowest setting's rate).
      final_planned: `final` as the plan fixed it before the selection, once `replan_final` ran
        (its floor: the re-plan only grows the release).
    """

    screen_size: int
    screening: tuple[Job, ...]
    final: Job | None
    candidates: int
    trainings_per_candidate: int
    max_len: int
    candidate_train_sizes: tuple[int, ...] = ()
    dataset_size: int = 0
    multiples: tuple[float, ...] = ()
    final_multiple: float | None = None
    final_asked: Job | None = None
    screen_asked: int = 0
    settings_asked: tuple[str, ...] = ()
    settings_dropped: tuple[str, ...] = ()
    time_budget: float | None = None
    eta_asked: float | None = None
    winner: str | None = None
    final_planned: Job | None = None

    @property
    def final_grown(self) -> bool:
        """Whether `replan_final` grew the release above the plan's size (the winner's rate left time)."""
        return self.final_planned is not None and self.final is not None and self.final.train > self.final_planned.train

    @property
    def final_shrunk(self) -> bool:
        """Whether the time budget shrank the released size below the one asked for."""
        return self.final is not None and self.final_asked is not None and self.final != self.final_asked

    @property
    def screen_shrunk(self) -> bool:
        """Whether the time budget shrank the screening size below the one asked for."""
        return 0 < self.screen_size < self.screen_asked

    @property
    def final_below_asked(self) -> bool:
        """Whether the time budget shrank the release below the smallest multiple asked for."""
        return (self.final is not None and bool(self.multiples) and self.final_multiple is not None
                and self.final_multiple < min(self.multiples))

    @property
    def settings(self) -> tuple[str, ...]:
        """The sampling settings screened (names, grid order)."""
        return tuple(j.name for j in self.screening)

    @property
    def shrunk(self) -> bool:
        return self.final_shrunk or self.screen_shrunk or bool(self.settings_dropped)

    @property
    def screening_examples(self) -> int:
        return sum(j.examples for j in self.screening)

    @property
    def final_examples(self) -> int:
        return self.final.examples if self.final is not None else 0

    @property
    def examples(self) -> int:
        return self.screening_examples + self.final_examples

    @property
    def trainings(self) -> int:
        return self.candidates * self.trainings_per_candidate

    def max_tokens(self) -> int:
        """Tokens to generate at most (every example at `max_len`)."""
        return self.examples * self.max_len

    def seconds(self, speed: Speed) -> dict[str, float]:
        """The ETA's parts: screening generation, classifier trainings, final generation, total."""
        def gen(jobs):
            return sum(speed.job_overhead_seconds + j.examples / speed.rate(j.guidance > 0) for j in jobs)

        final = 0.0
        if self.final is not None:
            final = speed.job_overhead_seconds + self.final.examples / self.final_rate(speed)
        train = self.trainings_per_candidate * speed.classifier_seconds_per_example * sum(self.candidate_train_sizes)
        parts = {"probe": speed.probe_seconds, "screening": gen(self.screening), "classifiers": train, "final": final}
        return {**parts, "total": sum(parts.values())}

    def final_rate(self, speed: Speed) -> float:
        """The final job's examples per second: the winner's setting's once known, else the slowest of the grid's."""
        if self.winner is not None:
            return speed.rate(self.winner_job.guidance > 0)
        return min(speed.rate(j.guidance > 0) for j in self.screening)

    @property
    def winner_job(self) -> Job:
        """The winner's screened job (`winner` set)."""
        return {j.name: j for j in self.screening}[self.winner]

    def lines(self, speed: Speed | None = None) -> list[str]:
        """The plan, for the user, one line each (counts only: nothing private)."""
        eta = self.seconds(speed) if speed is not None else None

        def took(part):
            return f" ~{_fmt(eta[part])}" if eta is not None else ""

        of = f" of {len(self.settings_asked)}" if self.settings_dropped else ""
        what = (f"screening {len(self.screening)}{of} sampling settings at {self.screen_size:,} train examples each"
                if self.screen_size else f"{len(self.screening)} sampling settings at full size (no screening)")
        if self.screen_shrunk:
            what += f" (shrunk from {self.screen_asked:,} to fit the time budget)"
        out = [self.budget_line(), *([self.shrink_line()] if self.shrunk else []),
               f"plan: {what}: {self.screening_examples:,} examples to generate{took('screening')}",
               f"plan: {self.candidates} candidates x {self.trainings_per_candidate} classifier trainings = "
               f"{self.trainings:,} trainings{took('classifiers')}"]
        if self.final is not None:
            shrunk = (f"; shrunk from {self.final_asked.train:,} train examples to fit the time budget"
                      if self.final_shrunk else "")
            out.append(f"plan: the winner at full size: {self.final.examples:,} examples ({self.final.train:,} train + "
                       f"{self.final.valid:,} valid{shrunk}){took('final')}")
        tokens = f"plan: {self.examples:,} examples, at most {self.max_tokens():,} tokens ({self.max_len} per example)"
        if speed is not None:
            tokens += f", ~{self.examples * speed.mean_tokens:,.0f} at the probe's {speed.mean_tokens:.1f} per example"
        out.append(tokens)
        if eta is not None:
            rates = ", ".join(f"{'guided' if g else 'unguided'} {r:.3g} example/s"
                              for g, r in sorted(speed.examples_per_second.items()))
            out.append(f"plan: ETA {_fmt(eta['total'])}, the probe's {_fmt(speed.probe_seconds)} (already spent) "
                       f"included (probe: {rates}; a generation job's load and compilation "
                       f"{_fmt(speed.job_overhead_seconds)}; a classifier training "
                       f"{speed.classifier_seconds_per_example * 1000:.3g} ms per train example)")
        return out

    def budget_line(self) -> str:
        """The plan's line on the time budget (`DEFAULT_TIME_BUDGET` unless the user gave one)."""
        if not self.time_budget:
            return "plan: no time budget (--time-budget 0)"
        given = "the default" if self.time_budget == DEFAULT_TIME_BUDGET else f"--time-budget {self.time_budget:g}"
        return f"plan: time budget {_fmt(self.time_budget)} ({given}; --time-budget 0: no limit)"

    def shrink_line(self) -> str:
        """The plan's line on what the time budget shrank, and from what (`fit_time_budget`)."""
        budget = "the default one-hour budget" if self.time_budget == DEFAULT_TIME_BUDGET else \
            f"--time-budget {self.time_budget:g}"
        parts = []
        if self.final_shrunk:
            asked = max(self.multiples) if self.multiples else self.final_multiple
            below = (f", below the smallest asked, {min(self.multiples):g}x" if self.final_below_asked
                     and min(self.multiples) != asked else "")
            parts.append(f"released {self.final.train:,} train examples ({self.final_multiple:.3g}x |D_train|, asked "
                         f"{asked:g}x = {self.final_asked.train:,}{below})")
        if self.settings_dropped:
            parts.append(f"{len(self.screening)} of {len(self.settings_asked)} sampling settings screened "
                         f"({', '.join(self.settings)}; dropped {', '.join(self.settings_dropped)}, in the fixed "
                         "order of dp_select.SETTING_PRIORITY)")
        if self.screen_shrunk:
            parts.append(f"screening at {self.screen_size:,} train examples per setting (asked {self.screen_asked:,})")
        full = f" (~{_fmt(self.eta_asked)})" if self.eta_asked is not None else ""
        return f"plan: shrunk to fit {budget}: {'; '.join(parts)}; --time-budget 0 for the plan as asked{full}"

    def to_json(self) -> dict[str, Any]:
        return {"screen_size": self.screen_size, "screening_examples": self.screening_examples,
                "final_examples": self.final_examples, "examples": self.examples, "trainings": self.trainings,
                "max_tokens": self.max_tokens()}


def _fmt(seconds: float) -> str:
    from dpsynth.progress import format_duration

    return format_duration(seconds)


def settings_of(grid: Sequence[dp_select.CandidateSpec]) -> list[tuple[float, float]]:
    """The grid's sampling settings (guidance, temperature), in grid order."""
    return list(dict.fromkeys((c.guidance, c.temperature) for c in grid))


def make_plan(grid: Sequence[dp_select.CandidateSpec], *, dataset_size: int, valid_fraction: float, screen_size: int,
              trainings_per_candidate: int, max_len: int) -> SelectPlan:
    """The plan of `dpsynth select --model` over `grid` (`dp_select.candidate_grid`).

    `screen_size` > 0: each setting once at `screen_size` train examples, one candidate each, and
    the winner at the largest multiple. 0: the full-size path (`dp_select.generate_candidates`:
    each setting at its largest multiple, the smaller multiples its prefixes, all candidates).
    """
    if screen_size < 0:
        raise ValueError(f"the screening size must be >= 0 (0: no screening), got {screen_size}")
    settings = settings_of(grid)
    multiples = tuple(sorted({c.multiple for c in grid}))
    if screen_size:
        s_train, s_valid = screen_size, max(1, int(round(valid_fraction * screen_size)))
        final = _final_job(multiples[-1], dataset_size, valid_fraction)
        return SelectPlan(screen_size=screen_size, candidates=len(settings), max_len=max_len,
                          trainings_per_candidate=trainings_per_candidate,
                          screening=tuple(Job(guidance=w, temperature=t, train=s_train, valid=s_valid)
                                          for w, t in settings),
                          final=final, candidate_train_sizes=(s_train,) * len(settings), dataset_size=dataset_size,
                          multiples=multiples, final_multiple=multiples[-1], final_asked=final, screen_asked=screen_size,
                          settings_asked=tuple(setting_name(w, t) for w, t in settings))
    jobs = []
    for w, t in settings:
        m = max(c.multiple for c in grid if (c.guidance, c.temperature) == (w, t))
        jobs.append(Job(guidance=w, temperature=t, **dict(zip(("train", "valid"),
                                                               dp_select.sizes(m, dataset_size, valid_fraction)))))
    return SelectPlan(screen_size=0, screening=tuple(jobs), final=None, candidates=len(grid), max_len=max_len,
                      trainings_per_candidate=trainings_per_candidate,
                      candidate_train_sizes=tuple(dp_select.sizes(c.multiple, dataset_size, valid_fraction)[0]
                                                  for c in grid),
                      dataset_size=dataset_size, multiples=multiples, settings_asked=tuple(j.name for j in jobs))


def _final_job(multiple: float, dataset_size: int, valid_fraction: float) -> Job:
    train, valid = dp_select.sizes(multiple, dataset_size, valid_fraction)
    return Job(guidance=-1.0, temperature=-1.0, train=train, valid=valid)


def fit_time_budget(plan: SelectPlan, speed: Speed, seconds: float | None, *, valid_fraction: float,
                    min_screen_size: int = MIN_SCREEN_SIZE, min_settings: int = MIN_SETTINGS) -> SelectPlan:
    """`plan` fitted to a time budget of `seconds` (None or 0: no limit), by its ETA at `speed` (the
    probe's own time included: `Speed.probe_seconds`).

    A plan that fits is returned as it is (its `time_budget` set). Else, in the order of
    `SHRINK_ORDER` (the module docstring says why): (1) the final corpus at the largest of the asked
    `plan.multiples` x |D_train| that fits, down to the smallest asked; (2) at the smallest multiple,
    the screening size, the largest that fits down to `min_screen_size` (a screening size asked below
    it is not shrunk); (3) the grid: the settings dropped one at a time in the order of
    `dp_select.settings_by_priority` reversed, down to `min_settings`, (1) and (2) again at each grid
    size; (4) with `min_settings` settings at the smallest screening size, the release below the
    smallest multiple: the largest final train size that fits, down to the screening size. The
    decision reads the plan's counts, the probe's speed and constants only (no private data:
    data-independent, no privacy cost).

    Raises:
      BudgetError: `seconds` < 0, or even the plan of stage (4) at its floor does not fit (one line:
        its ETA and the budget it needs, ending with "(--time-budget 0: no limit)"); a plan without
        screening (`screen_size` 0) that does not fit is refused too (its candidates are the grid's,
        all at their full size: `--screen-size` is what the budget can shrink).
    """
    if seconds is None or seconds == 0:
        return plan
    if not seconds > 0:
        raise BudgetError(f"--time-budget must be >= 0 seconds (0: no limit), got {seconds:g}")
    plan = dataclasses.replace(plan, time_budget=float(seconds))

    def need(p):
        return p.seconds(speed)["total"]

    def fits(p):
        return need(p) <= seconds

    if fits(plan):
        return plan
    if not plan.screen_size:
        raise BudgetError(f"--time-budget {seconds:g} s: the full-size candidates need ~{_fmt(need(plan))} on this "
                          f"machine (measured); screening (--screen-size {DEFAULT_SCREEN_SIZE}, the default) needs "
                          f"~{_fmt(need(_screened(plan, valid_fraction)))} (--time-budget 0: no limit)")
    plan = dataclasses.replace(plan, eta_asked=need(plan))
    multiples = sorted(plan.multiples or (plan.final_multiple,), reverse=True)
    smallest_screen = min(min_screen_size, plan.screen_size)
    # The settings, the first kept longest (a constant order: `dp_select.SETTING_PRIORITY`).
    order = [setting_name(w, t) for w, t in dp_select.settings_by_priority(
        [(j.guidance, j.temperature) for j in plan.screening])]

    def keep(k):
        names = set(order[:k])
        jobs = tuple(j for j in plan.screening if j.name in names)
        return dataclasses.replace(plan, screening=jobs, candidates=len(jobs),
                                   candidate_train_sizes=plan.candidate_train_sizes[:len(jobs)],
                                   settings_dropped=tuple(reversed(order[k:])))

    def at(p, multiple, size):
        final = _final_job(multiple, p.dataset_size, valid_fraction) if p.multiples else p.final
        return dataclasses.replace(
            p, screen_size=size, candidate_train_sizes=(size,) * len(p.screening), final=final,
            final_multiple=multiple, screening=tuple(
                dataclasses.replace(j, train=size, valid=max(1, int(round(valid_fraction * size))))
                for j in p.screening))

    # (1), (2) at every grid size from the asked one down to `min_settings` (3): the first that fits.
    for k in range(len(order), min(min_settings, len(order)) - 1, -1):
        p = keep(k)
        for m in multiples:  # (1) the largest asked multiple that fits, at the asked screening size
            if fits(at(p, m, plan.screen_size)):
                return at(p, m, plan.screen_size)
        size = _largest(smallest_screen, plan.screen_size, lambda n: fits(at(p, multiples[-1], n)))
        if size is not None:  # (2) at the smallest multiple, the largest screening size that fits
            return at(p, multiples[-1], size)
    # (4) The fewest settings at the smallest screening size; the release below the smallest multiple.
    p = at(keep(min(min_settings, len(order))), multiples[-1], smallest_screen)

    def release(n):
        job = Job(guidance=-1.0, temperature=-1.0, train=n, valid=max(1, int(round(valid_fraction * n))))
        return dataclasses.replace(p, final=job, final_multiple=n / p.dataset_size if p.dataset_size else 0.0)

    floor, below = smallest_screen, p.final.train - 1
    n = _largest(floor, below, lambda n: fits(release(n))) if below >= floor else None
    if n is None:
        raise BudgetError(_nothing_fits(release(floor) if below >= floor else p, speed, seconds))
    return release(n)


def _largest(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """The largest n in [lo, hi] with ok(n), for ok monotone (true up to some n, false above); None if not ok(lo)."""
    if hi < lo or not ok(lo):
        return None
    while hi > lo:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def _screened(plan: SelectPlan, valid_fraction: float, screen_size: int = DEFAULT_SCREEN_SIZE) -> SelectPlan:
    """The screened plan of the full-size `plan`'s grid (its settings; the final at its largest multiple)."""
    s_valid = max(1, int(round(valid_fraction * screen_size)))
    final = _final_job(max(plan.multiples), plan.dataset_size, valid_fraction)
    return dataclasses.replace(
        plan, screen_size=screen_size, candidates=len(plan.screening), final=final, final_asked=final,
        final_multiple=max(plan.multiples), screen_asked=screen_size,
        screening=tuple(dataclasses.replace(j, train=screen_size, valid=s_valid) for j in plan.screening),
        candidate_train_sizes=(screen_size,) * len(plan.screening))


def _nothing_fits(smallest: SelectPlan, speed: Speed, seconds: float) -> str:
    """The refusal's one line: the smallest plan the budget may shrink to does not fit `seconds`."""
    eta = smallest.seconds(speed)
    return (f"--time-budget {seconds:g} s: nothing fits: even the smallest plan it may shrink to ("
            f"{len(smallest.screening)} sampling settings screened at {smallest.screen_size:,} train examples each, "
            f"the release at {smallest.final.train:,} train examples) needs ~{_fmt(eta['total'])} on this machine "
            f"(measured, the probe's {_fmt(speed.probe_seconds)} included); give a budget of at least "
            f"{math.ceil(eta['total']):,} s (--time-budget 0: no limit)")


def spent_seconds(plan: SelectPlan, speed: Speed) -> float:
    """The run's time before the final generation, as the plan counts it: the probe's own (measured,
    `Speed.probe_seconds`) plus the plan's ETA of the screening generation and of the classifier
    trainings, never the wall clock since (the module docstring says why)."""
    eta = plan.seconds(speed)
    return eta["probe"] + eta["screening"] + eta["classifiers"]


def replan_final(plan: SelectPlan, speed: Speed, winner: str, *, valid_fraction: float) -> SelectPlan:
    """`plan` with the DP selection's `winner` (a screened setting's name) and the final re-planned at
    its rate: the largest final train size (valid: `valid_fraction` of it) whose ETA at the winner's
    rate fits what the budget leaves after `spent_seconds`, capped at the size asked
    (`plan.final_asked`) and never below the plan's (`plan.final`: the re-plan only grows it).
    Without a time budget (or without screening) the sizes are the plan's. Reads the plan's counts,
    the probe's speed and the DP choice only: post-processing, no privacy cost.
    """
    if plan.final is None:
        return plan
    plan = dataclasses.replace(plan, winner=winner, final_planned=plan.final)
    if not plan.time_budget or plan.final_asked is None or plan.final.train >= plan.final_asked.train:
        return plan

    def release(n):
        multiple = next((m for m in plan.multiples
                         if dp_select.sizes(m, plan.dataset_size, valid_fraction)[0] == n), None)
        job = (_final_job(multiple, plan.dataset_size, valid_fraction) if multiple is not None else
               Job(guidance=-1.0, temperature=-1.0, train=n, valid=max(1, int(round(valid_fraction * n)))))
        return dataclasses.replace(plan, final=job, final_multiple=multiple if multiple is not None else (
            n / plan.dataset_size if plan.dataset_size else 0.0))

    n = _largest(plan.final.train, plan.final_asked.train,
                 lambda n: release(n).seconds(speed)["total"] <= plan.time_budget)
    return plan if n is None or n == plan.final.train else release(n)


def replan_line(plan: SelectPlan, speed: Speed) -> str:
    """The plan's line on the re-planned release (`replan_final`; printed when it grew)."""
    job = plan.winner_job
    left = plan.time_budget - spent_seconds(plan, speed)
    return (f"plan: the winner ({plan.winner}, {'guided' if job.guidance > 0 else 'unguided'}, "
            f"{plan.final_rate(speed):.3g} example/s) leaves {_fmt(left)}: its final corpus grows from "
            f"{plan.final_planned.train:,} to {plan.final.train:,} train examples "
            f"({plan.final_multiple:.3g}x |D_train|)")


# ---------------------------------------------------------------------- the probe


def probe(model_dir: str, settings: Sequence[tuple[float, float]], *, config: "dp_select.SelectConfig",
          loader: Callable | None = None, batches: int = PROBE_BATCHES, clock=time.perf_counter,
          **generate_options) -> tuple[Speed, int]:
    """Times the real model's sampler (one warm-up call, then `batches` batches; once unguided
    and once guided when the grid has both kinds of settings) and one classifier training on
    a small set of those samples. Reads no private data and writes nothing.

    Returns (the `Speed`, its `probe_seconds` the probe's whole time, and the tokens per example the
    jobs will sample at).
    """
    import numpy as np

    from dpsynth.evaluate import train_classifier as tc
    from dpsynth.generate import job, model_info
    from dpsynth.generate.sampler import Sampler, example_keys, seed_to_key_data
    from dpsynth.generate.sampler_config import SamplingOptions
    from dpsynth.generate.transforms import worker_sampler_config
    from dpsynth.train import prompts

    loader = loader or model_info.load_bundle
    started = t0 = clock()  # (the probe's own time: counted against the budget, `Speed.probe_seconds`)
    bundle = loader(model_dir)
    info = job.read_model_info(model_dir)
    load_seconds = clock() - t0
    kinds = {}
    for w, t in settings:
        kinds.setdefault(w > 0, (w, t))
    rates, overhead, tokens, samples, max_len = {}, load_seconds, [], [], 0
    for guided, (w, t) in sorted(kinds.items()):
        cfg = job.GenerateConfig(model_dir=model_dir, out_dir=os.devnull, num_examples=1,
                                 sampling=SamplingOptions(temperature=t, guidance=w), **generate_options)
        if cfg.batch_size == "auto":
            from dpsynth.generate.auto_batch import resolve_batch

            cfg = resolve_batch(cfg)
        n = cfg.batch_size * max(1, batches)
        plan = job.make_plan(dataclasses.replace(cfg, num_examples=n), info)
        max_len = plan.sampler.max_len
        sampler = Sampler(bundle.decoder, worker_sampler_config(plan.sampler, bundle.tokenizer))
        labels = [lab for s in plan.specs if s.split == "train" for lab in s.labels][:n]

        def prompt_of(label):
            return prompts.prompt_ids(bundle.tokenizer, plan.prompt_template, label)

        contrasts = [plan.contrast_prompts(lab, prompt_of) for lab in labels] if plan.sampler.guided else None
        keys = example_keys(seed_to_key_data(0), range(n))

        def run(k):
            return sampler.sample(bundle.params, [prompt_of(lab) for lab in labels[:k]], keys[:k],
                                  contrasts=contrasts[:k] if contrasts is not None else None)

        t0 = clock()
        run(cfg.batch_size)  # warm-up: compilation
        overhead = max(overhead, load_seconds + clock() - t0)
        t0 = clock()
        out = run(n)
        rates[guided] = n / max(clock() - t0, 1e-9)
        tokens.extend(int(x) for x in out.lengths)
        samples.extend({"text": bundle.tokenizer.decode(out.tokens[r, : out.lengths[r]].tolist()) or "a",
                        "label": labels[r]} for r in range(n))
    # One classifier training (one trial, the sweep's epochs) on the probe's samples, repeated.
    labels_seen = sorted({s["label"] for s in samples})
    train = [dict(samples[i % len(samples)], label=labels_seen[i % len(labels_seen)])
             for i in range(PROBE_CLASSIFIER_EXAMPLES)]  # (every label present: the sweep requires it)
    sweep = config.sweep()
    one = dataclasses.replace(sweep, learning_rates=sweep.learning_rates[:1], weight_decays=sweep.weight_decays[:1],
                              repeats=1)
    t0 = clock()
    tc.classify(train, train[: max(len(labels_seen), 16)], {}, config.spec(), one)
    per_example = (clock() - t0) / len(train)
    return Speed(examples_per_second=rates, job_overhead_seconds=overhead, mean_tokens=float(np.mean(tokens)),
                 classifier_seconds_per_example=per_example, probe_seconds=clock() - started), int(max_len)


def trainings_per_candidate(config: "dp_select.SelectConfig") -> int:
    """Classifier trainings of one candidate's sweep (learning rates x weight decays x repeats)."""
    sweep = config.sweep()
    return len(sweep.learning_rates) * len(sweep.weight_decays) * sweep.repeats


# ---------------------------------------------------------------------- the run


def generate_screened(model_dir: str, root: str, plan: SelectPlan, *, label_distribution=None,
                      beam_args: Sequence[str] = (), job_kwargs: Mapping[str, Any] | None = None,
                      **generate_options) -> dict[str, str]:
    """Generates the plan's screening jobs under `root/screened/` (one small corpus per setting,
    named like the setting); returns candidate name -> corpus directory. Reruns resume."""
    from dpsynth.progress import Progress

    out = {}
    progress = Progress(total=plan.screening_examples, desc="select: screening generation", unit="example",
                        interval=0.0)  # (one line per job: the run's rate and ETA; the shards print their own)
    for j in plan.screening:
        out[j.name] = _generate(model_dir, os.path.join(root, SCREEN_DIR, j.name), j, label_distribution,
                                beam_args, job_kwargs, generate_options)
        progress.update(j.examples)
    return out


def generate_final(model_dir: str, root: str, plan: SelectPlan, winner: str, *, label_distribution=None,
                   beam_args: Sequence[str] = (), job_kwargs: Mapping[str, Any] | None = None,
                   **generate_options) -> str:
    """Generates the winner's setting at the plan's final size under `root/final/` (the same model,
    label distribution and generation settings as its screened candidate); returns the directory."""
    from dpsynth.progress import Progress

    screened = {j.name: j for j in plan.screening}[winner]
    j = dataclasses.replace(plan.final, guidance=screened.guidance, temperature=screened.temperature)
    progress = Progress(total=j.examples, desc="select: the winner at full size", unit="example", interval=0.0)
    path = _generate(model_dir, os.path.join(root, FINAL_DIR, j.name), j, label_distribution, beam_args,
                     job_kwargs, generate_options)
    progress.update(j.examples)
    return path


def _generate(model_dir, out_dir, j: Job, label_distribution, beam_args, job_kwargs, generate_options) -> str:
    from dpsynth.generate import job, model_info
    from dpsynth.generate.sampler_config import SamplingOptions

    kwargs = dict(job_kwargs or {})
    kwargs.setdefault("loader", model_info.load_bundle)  # (looked up now, not at import)
    job.generate(job.GenerateConfig(model_dir=model_dir, out_dir=out_dir, num_examples=j.train, valid_examples=j.valid,
                                    sampling=SamplingOptions(temperature=j.temperature, guidance=j.guidance),
                                    label_distribution=label_distribution, **generate_options),
                 beam_args=beam_args, **kwargs)
    return out_dir


def screening_record(plan: SelectPlan, winner: str, final_dir: str, speed: Speed | None = None) -> dict[str, Any]:
    """The `screening` section of selection.json (public: sizes, the setting, the probe's speed; no score)."""
    screened = {j.name: j for j in plan.screening}[winner]
    return {
        "screen_size": plan.screen_size, "screen_valid_size": screened.valid,
        "released_train_size": plan.final.train, "released_valid_size": plan.final.valid,
        "released_setting": {"guidance": screened.guidance, "temperature": screened.temperature},
        "released_dir": os.path.abspath(final_dir),
        "privacy": ("the candidates were screened at the small size; the released corpus was generated afterwards, "
                    "at the size asked for, from the same DP-tuned model with the selected sampling setting: "
                    "post-processing of the model and of the DP choice, no further privacy cost (the epsilon above "
                    "is the release's whole guarantee)"),
        "multiples": ("not chosen on D_valid: the release has the largest multiple of |D_train| asked for that fits "
                      "the time budget, below the smallest asked only when no smaller grid fits it (`time_budget`; "
                      "a data-independent choice: the probe's timing, no private data)"),
        "released_multiple": plan.final_multiple, "multiples_asked": list(plan.multiples),
        "time_budget": budget_record(plan, speed),
        "plan": plan.to_json(), **({"probe": speed.to_json()} if speed is not None else {}),
    }


def budget_record(plan: SelectPlan, speed: Speed | None = None) -> dict[str, Any]:
    """What the time budget did to `plan` (public: sizes, setting names and timings only): the budget,
    and what shrank from what, in `SHRINK_ORDER`'s order; with `speed`, the ETA (the probe's time included)."""
    shrunk = []
    if plan.final_shrunk:
        shrunk.append({"what": "multiples", "asked": max(plan.multiples), "kept": plan.final_multiple,
                       "train_size_asked": plan.final_asked.train, "train_size_kept": plan.final.train,
                       "below_smallest_asked": plan.final_below_asked})
    if plan.screen_shrunk:
        shrunk.append({"what": "screen_size", "asked": plan.screen_asked, "kept": plan.screen_size})
    if plan.settings_dropped:
        shrunk.append({"what": "settings", "asked": list(plan.settings_asked), "kept": list(plan.settings),
                       "dropped": list(plan.settings_dropped), "order": "dp_select.SETTING_PRIORITY"})
    out = {"seconds": plan.time_budget, "default": plan.time_budget == DEFAULT_TIME_BUDGET, "shrunk": shrunk}
    if plan.final_planned is not None and plan.time_budget:  # `replan_final`: the release at the winner's rate
        out["replan"] = {"setting": plan.winner, "guided": plan.winner_job.guidance > 0,
                         "train_size_asked": plan.final_asked.train, "train_size_planned": plan.final_planned.train,
                         "train_size_replanned": plan.final.train, "grown": plan.final_grown,
                         **({"examples_per_second": plan.final_rate(speed),
                             "spent_seconds_eta": spent_seconds(plan, speed)} if speed is not None else {}),
                         "spent": "the probe's own time and the plan's ETA of the screening and the classifiers "
                                  "(not the wall clock: it would time reading and scoring D_valid)"}
    if plan.eta_asked is not None:
        out["eta_asked_seconds"] = plan.eta_asked
    if speed is not None:
        out.update(eta_seconds=plan.seconds(speed)["total"], probe_seconds_included=speed.probe_seconds)
    return out
