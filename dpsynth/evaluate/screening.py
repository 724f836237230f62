"""Screening for `dpsynth select --model`: small candidates, the DP choice, the winner at full size.

Generating every sampling setting of the grid at its full size before the classifiers can score
them costs settings x |D_train| x multiple long examples (8 x 66,000 for 20,000 reviews at the
default grid). Screening generates each setting as a small candidate instead (`screen_size`
synthetic train examples, default `DEFAULT_SCREEN_SIZE`), DP-selects among those on the real
D_valid exactly as `dpsynth.evaluate.dp_select.select_corpora` does (same mechanism, same
epsilon, same composition: `dpsynth.dp.private_selection.select_release`), then generates ONLY
the winner's setting at the size asked for (the largest of the grid's multiples x |D_train|)
and releases that corpus.

Privacy (`dpsynth.dp.private_selection`): the selection is the one DP mechanism that reads
D_valid, at the epsilon given, among the screened candidates; its ledger entry is the one the
full-size path writes (the exponential mechanism's epsilon does not depend on the number of
candidates; the Gaussian variant's sigma does, its (epsilon, delta) does not). The full-size
corpus is generated from the same DP-tuned model with the selected sampling setting:
post-processing of the model and of the DP choice, no further privacy cost. The multiple is
not chosen (choosing it as well would be a second selection on D_valid, whose epsilon would add
to the first's on D_valid): the release has the largest multiple asked for.

The plan before compute (`SelectPlan`): the examples and tokens to generate (screening and
final), the classifier trainings, and an ETA from a timed probe (`probe`: a few batches sampled
with the real model, and one classifier training on a small set made of those samples; no
private data is read and nothing is written). `fit_time_budget` shrinks the screening size to
fit `--time-budget` or refuses with one line saying what fits; the grid and the final size are
what the user asked for and are never shrunk.
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
    """

    screen_size: int
    screening: tuple[Job, ...]
    final: Job | None
    candidates: int
    trainings_per_candidate: int
    max_len: int
    candidate_train_sizes: tuple[int, ...] = ()

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
        out = [f"plan: {what}: {self.screening_examples:,} examples to generate{took('screening')}",
               f"plan: {self.candidates} candidates x {self.trainings_per_candidate} classifier trainings = "
               f"{self.trainings:,} trainings{took('classifiers')}"]
        if self.final is not None:
            out.append(f"plan: the winner at full size: {self.final.examples:,} examples ({self.final.train:,} train + "
                       f"{self.final.valid:,} valid){took('final')}")
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
    largest = max(c.multiple for c in grid)
    if screen_size:
        s_train, s_valid = screen_size, max(1, int(round(valid_fraction * screen_size)))
        f_train, f_valid = dp_select.sizes(largest, dataset_size, valid_fraction)
        return SelectPlan(screen_size=screen_size, candidates=len(settings), max_len=max_len,
                          trainings_per_candidate=trainings_per_candidate,
                          screening=tuple(Job(guidance=w, temperature=t, train=s_train, valid=s_valid)
                                          for w, t in settings),
                          final=Job(guidance=-1.0, temperature=-1.0, train=f_train, valid=f_valid),
                          candidate_train_sizes=(s_train,) * len(settings))
    jobs = []
    for w, t in settings:
        m = max(c.multiple for c in grid if (c.guidance, c.temperature) == (w, t))
        jobs.append(Job(guidance=w, temperature=t, **dict(zip(("train", "valid"),
                                                               dp_select.sizes(m, dataset_size, valid_fraction)))))
    return SelectPlan(screen_size=0, screening=tuple(jobs), final=None, candidates=len(grid), max_len=max_len,
                      trainings_per_candidate=trainings_per_candidate,
                      candidate_train_sizes=tuple(dp_select.sizes(c.multiple, dataset_size, valid_fraction)[0]
                                                  for c in grid))


def fit_time_budget(plan: SelectPlan, speed: Speed, seconds: float | None, *, valid_fraction: float,
                    min_screen_size: int = MIN_SCREEN_SIZE) -> SelectPlan:
    """`plan` if it fits `seconds` (None: no budget), else the plan at the largest screening size
    that fits (at least `min_screen_size`); `BudgetError` (one line: what fits) when none does.
    The grid and the final size are never shrunk: they are what was asked for."""
    if seconds is None:
        return plan
    if not seconds > 0:
        raise BudgetError(f"--time-budget must be > 0 seconds, got {seconds:g}")
    need = plan.seconds(speed)["total"]
    if need <= seconds:
        return plan

    def at(size):
        return dataclasses.replace(
            plan, screen_size=size, candidate_train_sizes=(size,) * len(plan.candidate_train_sizes),
            screening=tuple(dataclasses.replace(j, train=size, valid=max(1, int(round(valid_fraction * size))))
                            for j in plan.screening))

    if not plan.screen_size:
        raise BudgetError(f"--time-budget {seconds:g} s: the full-size candidates need ~{_fmt(need)} on this machine "
                          f"(measured); screening (--screen-size {DEFAULT_SCREEN_SIZE}, the default) needs "
                          f"~{_fmt(at(DEFAULT_SCREEN_SIZE).seconds(speed)['total'])}")
    lo, hi = min_screen_size, plan.screen_size
    if at(lo).seconds(speed)["total"] > seconds:
        rest = seconds - (at(lo).seconds(speed)["total"] - at(lo).seconds(speed)["final"]) - speed.job_overhead_seconds
        slowest = min(speed.rate(j.guidance > 0) for j in plan.screening)
        fits = int(rest * slowest / (1 + valid_fraction)) if rest > 0 else 0
        raise BudgetError(
            f"--time-budget {seconds:g} s: even screening at {lo} examples needs ~{_fmt(at(lo).seconds(speed)['total'])} "
            f"on this machine (measured), ~{_fmt(at(lo).seconds(speed)['final'])} of it the winner's "
            f"{plan.final_examples:,} examples; "
            + (f"what fits is a final corpus of about {fits:,} train examples (lower --multiples), or a budget of "
               f"{math.ceil(at(lo).seconds(speed)['total']):,} s" if fits > 0 else
               f"nothing fits: give a budget of at least {math.ceil(at(lo).seconds(speed)['total']):,} s"))
    while hi - lo > 1:  # (total time grows with the size: the largest size that fits)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if at(mid).seconds(speed)["total"] <= seconds else (lo, mid)
    return at(lo)


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
        "multiples": "not chosen: the release has the largest multiple of |D_train| asked for",
        "plan": plan.to_json(), **({"probe": speed.to_json()} if speed is not None else {}),
    }
