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
0: no limit): a plan whose ETA does not fit is shrunk, in this order:

1. the released size: the final corpus at the largest of the asked multiples x |D_train| that
   fits, down to the smallest asked multiple (`--multiples 1,2,3`: 3x, then 2x, then 1x). The
   multiples are the sizes the user allowed; the release takes the largest of them the budget
   affords (without a budget, the largest asked). Never below the smallest asked multiple.
2. then the screening size, down to `MIN_SCREEN_SIZE` (the screening is what makes the DP
   choice worth its epsilon: `bench/select_screening.py` measured the ranking lost at small
   sizes, so it shrinks last).
3. else `BudgetError`: one line saying what fits, ending with "(--time-budget 0: no limit)".

The grid (the sampling settings) is never shrunk. The plan says what shrank and from what
(`SelectPlan.final_asked`, `SelectPlan.screen_asked`), and so does selection.json's `screening`
section.

Privacy of the budget: the sizes are chosen from the probe's timing, |D_train| (the published
privacy report's dataset size) and the flags alone. The probe samples the DP-tuned model and
trains one classifier on those samples (post-processing of the model), and reads no private
data; D_valid is not read before the plan is fixed (`--dry-run` prints it without D_valid). So
the released size is a data-independent choice: no privacy cost, and no second selection on
D_valid (unlike choosing the multiple by the classifiers' scores, which this module does not do).
Keep it so: nothing that reads D_valid or D_train may enter `fit_time_budget`.
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
DEFAULT_TIME_BUDGET = 3600  # seconds the whole of `dpsynth select --model` may take by default (0: no limit)
PROBE_BATCHES = 2  # timed sampler calls of the generation probe, per kind of setting (after one warm-up call)
PROBE_CLASSIFIER_EXAMPLES = 256  # the classifier probe's train set (the probe's samples, repeated)
SCREEN_DIR, FINAL_DIR = "screened", "final"  # under OUT.candidates/


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
    """

    examples_per_second: Mapping[bool, float]
    job_overhead_seconds: float
    mean_tokens: float
    classifier_seconds_per_example: float

    def rate(self, guided: bool) -> float:
        return self.examples_per_second.get(guided) or min(self.examples_per_second.values())

    def to_json(self) -> dict[str, Any]:
        return {"examples_per_second": {("guided" if k else "unguided"): v for k, v in self.examples_per_second.items()},
                "job_overhead_seconds": self.job_overhead_seconds, "mean_tokens": self.mean_tokens,
                "classifier_seconds_per_example": self.classifier_seconds_per_example}


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
        return f"w{self.guidance:g}-t{self.temperature:g}"


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
      final_multiple: the multiple of `final` (the largest asked, unless the time budget shrank it).
      final_asked: `final` as asked (the largest multiple); differs from `final` when shrunk.
      screen_asked: the screening size asked; differs from `screen_size` when shrunk.
      time_budget: the seconds the plan was fitted to (`fit_time_budget`); None: no limit.
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
    time_budget: float | None = None

    @property
    def final_shrunk(self) -> bool:
        """Whether the time budget shrank the released size below the one asked for."""
        return self.final is not None and self.final_asked is not None and self.final != self.final_asked

    @property
    def screen_shrunk(self) -> bool:
        """Whether the time budget shrank the screening size below the one asked for."""
        return 0 < self.screen_size < self.screen_asked

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
            slowest = min(speed.rate(j.guidance > 0) for j in self.screening)
            final = speed.job_overhead_seconds + self.final.examples / slowest
        train = self.trainings_per_candidate * speed.classifier_seconds_per_example * sum(self.candidate_train_sizes)
        parts = {"screening": gen(self.screening), "classifiers": train, "final": final}
        return {**parts, "total": sum(parts.values())}

    def lines(self, speed: Speed | None = None) -> list[str]:
        """The plan, for the user, one line each (counts only: nothing private)."""
        eta = self.seconds(speed) if speed is not None else None

        def took(part):
            return f" ~{_fmt(eta[part])}" if eta is not None else ""

        what = (f"screening {len(self.screening)} sampling settings at {self.screen_size:,} train examples each"
                if self.screen_size else f"{len(self.screening)} sampling settings at full size (no screening)")
        if self.screen_shrunk:
            what += f" (shrunk from {self.screen_asked:,} to fit the time budget)"
        out = [self.budget_line(),
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
            out.append(f"plan: ETA {_fmt(eta['total'])} (probe: {rates}; a generation job's load and compilation "
                       f"{_fmt(speed.job_overhead_seconds)}; a classifier training "
                       f"{speed.classifier_seconds_per_example * 1000:.3g} ms per train example)")
        return out

    def budget_line(self) -> str:
        """The plan's line on the time budget (`DEFAULT_TIME_BUDGET` unless the user gave one)."""
        if not self.time_budget:
            return "plan: no time budget (--time-budget 0)"
        given = "the default" if self.time_budget == DEFAULT_TIME_BUDGET else f"--time-budget {self.time_budget:g}"
        return f"plan: time budget {_fmt(self.time_budget)} ({given}; --time-budget 0: no limit)"

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
                          multiples=multiples, final_multiple=multiples[-1], final_asked=final, screen_asked=screen_size)
    jobs = []
    for w, t in settings:
        m = max(c.multiple for c in grid if (c.guidance, c.temperature) == (w, t))
        jobs.append(Job(guidance=w, temperature=t, **dict(zip(("train", "valid"),
                                                               dp_select.sizes(m, dataset_size, valid_fraction)))))
    return SelectPlan(screen_size=0, screening=tuple(jobs), final=None, candidates=len(grid), max_len=max_len,
                      trainings_per_candidate=trainings_per_candidate,
                      candidate_train_sizes=tuple(dp_select.sizes(c.multiple, dataset_size, valid_fraction)[0]
                                                  for c in grid),
                      dataset_size=dataset_size, multiples=multiples)


def _final_job(multiple: float, dataset_size: int, valid_fraction: float) -> Job:
    train, valid = dp_select.sizes(multiple, dataset_size, valid_fraction)
    return Job(guidance=-1.0, temperature=-1.0, train=train, valid=valid)


def fit_time_budget(plan: SelectPlan, speed: Speed, seconds: float | None, *, valid_fraction: float,
                    min_screen_size: int = MIN_SCREEN_SIZE) -> SelectPlan:
    """`plan` fitted to a time budget of `seconds` (None or 0: no limit), by its ETA at `speed`.

    A plan that fits is returned as it is (its `time_budget` set). Else, in this order (the
    module docstring says why): the released size, the final corpus at the largest of the asked
    `plan.multiples` x |D_train| that fits, down to the smallest asked; then, at the smallest
    multiple, the screening size, the largest that fits down to `min_screen_size` (a screening
    size asked below it is not shrunk). The grid is never shrunk. The decision reads the plan's
    counts and the probe's speed only (no private data: data-independent, no privacy cost).

    Raises:
      BudgetError: `seconds` < 0, or nothing fits (one line: what fits, ending with
        "(--time-budget 0: no limit)"); a plan without screening (`screen_size` 0) that does
        not fit is refused too (its candidates are the grid's, all at their full size).
    """
    if seconds is None or seconds == 0:
        return plan
    if not seconds > 0:
        raise BudgetError(f"--time-budget must be >= 0 seconds (0: no limit), got {seconds:g}")
    plan = dataclasses.replace(plan, time_budget=float(seconds))

    def need(p):
        return p.seconds(speed)["total"]

    if need(plan) <= seconds:
        return plan

    def at(multiple, size):
        final = _final_job(multiple, plan.dataset_size, valid_fraction) if plan.multiples else plan.final
        return dataclasses.replace(
            plan, screen_size=size, candidate_train_sizes=(size,) * len(plan.candidate_train_sizes), final=final,
            final_multiple=multiple, screening=tuple(
                dataclasses.replace(j, train=size, valid=max(1, int(round(valid_fraction * size))))
                for j in plan.screening))

    if not plan.screen_size:
        raise BudgetError(f"--time-budget {seconds:g} s: the full-size candidates need ~{_fmt(need(plan))} on this "
                          f"machine (measured); screening (--screen-size {DEFAULT_SCREEN_SIZE}, the default) needs "
                          f"~{_fmt(need(_screened(plan, valid_fraction)))} (--time-budget 0: no limit)")
    # 1. The released size: the largest asked multiple that fits, at the asked screening size.
    multiples = sorted(plan.multiples or (plan.final_multiple,), reverse=True)
    for m in multiples[1:]:
        if need(at(m, plan.screen_size)) <= seconds:
            return at(m, plan.screen_size)
    # 2. The screening size, at the smallest multiple: the largest that fits.
    m = multiples[-1]
    lo, hi = min(min_screen_size, plan.screen_size), plan.screen_size
    smallest = at(m, lo)
    if need(smallest) > seconds:
        raise BudgetError(_what_fits(smallest, speed, seconds, valid_fraction))
    while hi - lo > 1:  # (total time grows with the size: the largest size that fits)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if need(at(m, mid)) <= seconds else (lo, mid)
    return at(m, lo)


def _screened(plan: SelectPlan, valid_fraction: float, screen_size: int = DEFAULT_SCREEN_SIZE) -> SelectPlan:
    """The screened plan of the full-size `plan`'s grid (its settings; the final at its largest multiple)."""
    s_valid = max(1, int(round(valid_fraction * screen_size)))
    final = _final_job(max(plan.multiples), plan.dataset_size, valid_fraction)
    return dataclasses.replace(
        plan, screen_size=screen_size, candidates=len(plan.screening), final=final, final_asked=final,
        final_multiple=max(plan.multiples), screen_asked=screen_size,
        screening=tuple(dataclasses.replace(j, train=screen_size, valid=s_valid) for j in plan.screening),
        candidate_train_sizes=(screen_size,) * len(plan.screening))


def _what_fits(smallest: SelectPlan, speed: Speed, seconds: float, valid_fraction: float) -> str:
    """The refusal's one line: the smallest plan asked for does not fit `seconds`; what would."""
    eta = smallest.seconds(speed)
    rest = seconds - (eta["total"] - eta["final"]) - speed.job_overhead_seconds
    slowest = min(speed.rate(j.guidance > 0) for j in smallest.screening)
    fits = int(rest * slowest / (1 + valid_fraction)) if rest > 0 else 0
    at = f"{smallest.final_multiple:g}x |D_train| = " if smallest.final_multiple else ""
    head = (f"--time-budget {seconds:g} s: even the smallest plan asked for (the final corpus at "
            f"{at}{smallest.final.train:,} train examples, screening at "
            f"{smallest.screen_size:,} per setting) needs ~{_fmt(eta['total'])} on this machine (measured), "
            f"~{_fmt(eta['final'])} of it the final corpus; ")
    if fits <= 0:
        return head + f"nothing fits: give a budget of at least {math.ceil(eta['total']):,} s (--time-budget 0: no limit)"
    multiple = math.floor(100 * fits / smallest.dataset_size) / 100 if smallest.dataset_size else 0
    lower = f"--multiples {multiple:g}" if multiple > 0 else "a smaller --multiples"
    return head + (f"what fits is a final corpus of about {fits:,} train examples ({lower}), or a budget of "
                   f"{math.ceil(eta['total']):,} s (--time-budget 0: no limit)")


# ---------------------------------------------------------------------- the probe


def probe(model_dir: str, settings: Sequence[tuple[float, float]], *, config: "dp_select.SelectConfig",
          loader: Callable | None = None, batches: int = PROBE_BATCHES, clock=time.perf_counter,
          **generate_options) -> tuple[Speed, int]:
    """Times the real model's sampler (one warm-up call, then `batches` batches; once unguided
    and once guided when the grid has both kinds of settings) and one classifier training on
    a small set of those samples. Reads no private data and writes nothing.

    Returns (the `Speed`, the tokens per example the jobs will sample at).
    """
    import numpy as np

    from dpsynth.evaluate import train_classifier as tc
    from dpsynth.generate import job, model_info
    from dpsynth.generate.sampler import Sampler, example_keys, seed_to_key_data
    from dpsynth.generate.sampler_config import SamplingOptions
    from dpsynth.generate.transforms import worker_sampler_config
    from dpsynth.train import prompts

    loader = loader or model_info.load_bundle
    t0 = clock()
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
                 classifier_seconds_per_example=per_example), int(max_len)


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
                      "the time budget (a data-independent choice: the probe's timing, no private data)"),
        "released_multiple": plan.final_multiple, "multiples_asked": list(plan.multiples),
        "time_budget": budget_record(plan),
        "plan": plan.to_json(), **({"probe": speed.to_json()} if speed is not None else {}),
    }


def budget_record(plan: SelectPlan) -> dict[str, Any]:
    """What the time budget did to `plan` (public: sizes only): the budget, and what shrank from what."""
    shrunk = []
    if plan.final_shrunk:
        shrunk.append({"what": "multiples", "asked": max(plan.multiples), "kept": plan.final_multiple,
                       "train_size_asked": plan.final_asked.train, "train_size_kept": plan.final.train})
    if plan.screen_shrunk:
        shrunk.append({"what": "screen_size", "asked": plan.screen_asked, "kept": plan.screen_size})
    return {"seconds": plan.time_budget, "default": plan.time_budget == DEFAULT_TIME_BUDGET, "shrunk": shrunk}
