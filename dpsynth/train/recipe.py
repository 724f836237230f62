"""The automatic DP-tuning recipe (`dp-tune --recipe auto`): batch, steps and learning rate from the data's size.

One rule, decided a priori (docs/dp.md, "The automatic recipe", with the evidence) and
calibrated once on a public proxy task (`bench/recipe_proxy.py`: OpinRank reviews, labels from
the public corpus itself), never on D_train or D_valid. Its inputs are what every DP-SGD run
already declares: N (the number of privacy units, a side channel every report names), epsilon,
delta, the mode, the example length and a compute budget. So choosing the recipe costs no
privacy beyond the dataset size that the report already records.

The rule, from what is known of DP-SGD (Li et al. 2022, "Large language models can be strong
differentially private learners"; Sander et al. 2023, "TAN without a burn"; Ponomareva et al.
2023, "How to DP-fy ML"):

1. **Epochs E from the budget.** At a fixed number of steps, the noise in the averaged
   gradient sigma / B falls as the expected batch B grows (the accountant's sigma grows
   more slowly than q), so more passes over the data buy less noise per step. E =
   min(TARGET_EPOCHS, token_budget / (N max_tokens)), at least MIN_EPOCHS.
2. **Steps T for the optimiser.** At a fixed E, fewer and larger steps add slightly less noise
   in total (sqrt(T) / (sigma / B) falls by ~11% from T = 25 to T = 100 at epsilon 3, N 4,000,
   E 10), but a generator needs enough updates to learn the label conditioning at all (24
   steps did not teach it on 96-token reviews even without noise: docs/paper_cpu.md). T =
   TARGET_STEPS, fewer only when the batch would fall below MIN_BATCH.
3. **Batch B = E N / T** (Poisson, expected), at most N; sigma then comes from the accountant.
4. **Learning rate** (Adam) per mode at TARGET_STEPS, scaled by sqrt(TARGET_STEPS / T): in the
   noise-dominated regime Adam moves every coordinate by about lr per step, so the random
   walk of the parameters grows as lr sqrt(T); keeping lr sqrt(T) fixed keeps it bounded.
5. **The label contrast** (`label_contrast: auto`, `auto_label_contrast`): LABEL_CONTRAST
   for every label set, where the run allows it. Measured on the cpu study (docs/paper_cpu.md,
   version 3, third part): at epsilon 3 it made unguided samples carry the label (Yelp
   polarity, balanced accuracy 0.500 -> 0.683 and 0.704 in two runs; SST-2 0.604 selected ->
   0.620; AG News, 4 labels, unguided 0.283 -> 0.497 and selected 0.455 -> 0.539). It reads
   nothing but the public label set, so it costs no privacy. Its compute depends on its form
   (`label_contrast_form: auto`, `contrast_form`): the full K-way term costs K passes per
   example, so above CONTRAST_MAX_LABELS labels the sampled form (the own label against one
   other drawn at random, `dpsynth.train.lm.make_label_contrast_loss`) costs 2 for any K.

`epsilon = inf` (the non-private reference) gets the same E, T and B: the same recipe without
noise.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

from dpsynth.errors import DpsynthError

RECIPES = ("manual", "auto")
TARGET_STEPS = 100  # DP optimiser steps the recipe aims at
MIN_STEPS = 20
TARGET_EPOCHS = 10.0  # expected passes over D_train when the budget allows
MIN_EPOCHS = 1.0
MIN_BATCH = 16  # expected examples per step, at least
DEFAULT_TOKEN_BUDGET = 20_000_000  # example-tokens (E N max_tokens) a run may process, at most
# Adam learning rate per mode at TARGET_STEPS (calibrated on the public proxy task).
MODES = ("full", "prompt", "lora")  # what DP tuning trains: every weight, a soft prompt, LoRA adapters
LEARNING_RATES = {"lora": 0.01, "prompt": 0.05, "full": 0.002}
LABEL_CONTRAST = 1.0  # lambda of the label contrast the recipe adds (rule 5)
CONTRAST_MAX_LABELS = 4  # the full contrast's K passes per example: above this many labels "auto" samples one other
CONTRAST_FORMS = ("auto", "full", "sampled")  # the label contrast's forms (`contrast_form`)
SAMPLED_CONTRAST_ROWS = 2  # rows per example of the sampled form: the own label and one other
AUTO = "auto"


class RecipeError(DpsynthError, ValueError):
    """The recipe cannot be built (bad sizes or an unreachable target)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recipe:
    """What the automatic recipe chose, and why.

    Attributes:
      batch_size: expected (Poisson) batch B.
      steps: T.
      epochs: E = T B / N.
      learning_rate: Adam's learning rate.
      why: one sentence per choice (printed by `dp-tune`, recorded in the privacy report).
      example_length: the DP choice of the example length (`LengthChoice.to_json`), when the
        recipe chose it (`--max-tokens auto`); else None.
      time_budget: the measured token budget (`TimeBudget.to_json`), when the run gave a time
        budget (`--time-budget`); else None.
      contrast: (weight, why) of the label contrast rule 5 chose (`label_contrast: auto`), else
        None (given, or a manual recipe).
    """

    batch_size: float
    steps: int
    epochs: float
    learning_rate: float
    why: tuple[str, ...]
    example_length: dict | None = None
    time_budget: dict | None = None
    contrast: tuple[float, str] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": "auto", "batch_size": self.batch_size, "steps": self.steps, "epochs": self.epochs,
                "learning_rate": self.learning_rate, "why": list(self.why),
                **({"example_length": self.example_length} if self.example_length else {}),
                **({"time_budget": self.time_budget} if self.time_budget else {}),
                **({"label_contrast": self.contrast[0]} if self.contrast is not None else {}),
                "rule": "dpsynth.train.recipe (docs/dp.md, 'The automatic recipe')"}

    def with_length(self, choice: "LengthChoice") -> "Recipe":
        """This recipe, preceded by the example length it was built for."""
        return dataclasses.replace(self, why=(choice.why,) + self.why, example_length=choice.to_json())

    def with_contrast(self, weight: float, why: str) -> "Recipe":
        """This recipe, followed by the label contrast rule 5 chose."""
        return dataclasses.replace(self, why=self.why + (why,), contrast=(float(weight), why))

    def with_time(self, budget: "TimeBudget") -> "Recipe":
        """This recipe, preceded by the time budget its token budget was measured from."""
        return dataclasses.replace(self, why=(budget.why,) + self.why, time_budget=budget.to_json())


def auto_recipe(*, dataset_size: int, mode: str, max_tokens: int, token_budget: float | None = None) -> Recipe:
    """The automatic recipe for N = `dataset_size` privacy units.

    Epsilon and delta do not enter (the noise multiplier then comes from the accountant): the
    rule fixes the compute and the number of updates, and the accountant spends the budget on
    them. The same recipe therefore serves every epsilon of a grid, and epsilon = inf.

    Args:
      dataset_size: N, examples (or users at user level) in D_train.
      mode: "full", "prompt" or "lora".
      max_tokens: tokens per example (the compute of one example gradient).
      token_budget: example-tokens the run may process (E N max_tokens); default
        `DEFAULT_TOKEN_BUDGET`.

    Raises:
      RecipeError: N < 1, an unknown mode, or a budget of less than MIN_EPOCHS.
    """
    return _auto_recipe(int(dataset_size), str(mode), int(max_tokens),
                        float(DEFAULT_TOKEN_BUDGET if token_budget is None else token_budget))


@functools.lru_cache(maxsize=256)
def _auto_recipe(n: int, mode: str, max_tokens: int, budget: float) -> Recipe:
    if n < 1:
        raise RecipeError("the automatic recipe needs a non-empty training set")
    if mode not in LEARNING_RATES:
        raise RecipeError(f"no automatic recipe for mode {mode!r}; modes are {sorted(LEARNING_RATES)}")
    if max_tokens < 1 or not budget > 0:
        raise RecipeError(f"max_tokens and the token budget must be positive, got {max_tokens} and {budget}")
    why = []
    affordable = budget / (n * max_tokens)
    if affordable < MIN_EPOCHS:
        raise RecipeError(f"a token budget of {budget:,.0f} affords {affordable:.2f} passes over {n} examples of "
                          f"{max_tokens} tokens; the automatic recipe needs at least {MIN_EPOCHS:g}: raise the budget "
                          "or lower max_tokens")
    epochs = min(TARGET_EPOCHS, affordable)
    why.append(f"{epochs:.3g} expected passes over the {n} training examples: "
               + (f"the recipe's target ({TARGET_EPOCHS:g}; more passes lower the noise per step at a fixed number "
                  "of steps)" if epochs == TARGET_EPOCHS else
                  f"all that the token budget of {budget:,.0f} example-tokens affords at {max_tokens} tokens each"))
    steps = TARGET_STEPS
    if epochs * n / steps < MIN_BATCH:  # a small set: fewer steps, so each still averages MIN_BATCH examples
        steps = max(MIN_STEPS, int(epochs * n // MIN_BATCH))
        why.append(f"{steps} steps: fewer than the target {TARGET_STEPS}, so that each expected batch still holds "
                   f">= {MIN_BATCH} examples")
    else:
        why.append(f"{steps} steps: enough updates to learn the label conditioning (the recipe's target)")
    batch = math.floor(min(float(n), epochs * n / steps) * 1000) / 1000  # (rounded down: never over the budget)
    epochs = steps * batch / n
    why.append(f"expected batch {batch:.1f} = passes x N / steps (Poisson sampling with q = {batch / n:.4g})")
    lr = LEARNING_RATES[mode] * math.sqrt(TARGET_STEPS / steps)
    why.append(f"learning rate {lr:.3g}: the {mode} rate {LEARNING_RATES[mode]:g} at {TARGET_STEPS} steps"
               + ("" if steps == TARGET_STEPS else f", times sqrt({TARGET_STEPS}/{steps}) for {steps} steps"))
    return Recipe(batch_size=batch, steps=int(steps), epochs=epochs, learning_rate=round(lr, 6), why=tuple(why))


def contrast_form(form: str, labels: int) -> str:
    """The label contrast's form for a label set of `labels` (K) labels: `form` when given ("full":
    the K-way term, K rows per example; "sampled": the own label against one other drawn per step,
    2 rows); "auto": full for at most CONTRAST_MAX_LABELS labels, sampled above (at K = 2 the two
    are the same term)."""
    if form not in CONTRAST_FORMS:
        raise ValueError(f"label_contrast_form must be one of {CONTRAST_FORMS}, got {form!r}")
    if form != AUTO:
        return form
    return "full" if labels <= CONTRAST_MAX_LABELS else "sampled"


def contrast_rows(form: str, labels: int) -> int:
    """Rows (forward and backward passes) per example of the label contrast of `form` over K = `labels`."""
    return labels if contrast_form(form, labels) == "full" else SAMPLED_CONTRAST_ROWS


def auto_label_contrast(*, labels: int, conflict: str | None = None, form: str = AUTO) -> tuple[float, str]:
    """Rule 5: the label contrast's weight for a label set of `labels` (K) labels, and the sentence
    saying why (with its passes per example, `contrast_form` of `form`). `conflict`: why this run
    cannot take it (e.g. label dropout), which turns it off."""
    if conflict:
        return 0.0, f"no label contrast: {conflict}"
    others = "the other label" if labels == 2 else f"the other {labels - 1} labels"
    if contrast_form(form, labels) == "full":
        cost = f"{labels} passes per example"
    else:
        others = f"one of {others}, drawn at random at each step"
        cost = (f"the sampled form: {SAMPLED_CONTRAST_ROWS} passes per example instead of {labels}")
    return LABEL_CONTRAST, (f"label contrast {LABEL_CONTRAST:g}: each example also trains the model to tell its label "
                            f"from {others} (unguided samples then carry the label; {cost}; no privacy cost)")


# ---------------------------------------------------------------------- example length and token budget
# `--max-tokens auto` (with `--recipe auto`) chooses the example length as a DP quantile of
# D_train's token lengths: the exponential mechanism of `dpsynth.dp.private_selection` at a small,
# fixed share of the target epsilon, its ledger entry composed with the tuning's (the tuning's
# sigma is calibrated after it: `dpsynth.dp.plan.plan_privacy(spent=...)`). `token_budget_for`
# and `measure_speed` turn a time budget into the compute the recipe may spend (public).
LENGTH_CANDIDATES = (32, 48, 64, 96, 128, 192, 256, 384, 512)
LENGTH_QUANTILE = 0.9  # the share of examples the chosen length keeps whole
LENGTH_EPSILON_SHARE = 0.02  # of the target epsilon, spent on the example length (sigma rises by ~1-2%)
# A candidate that keeps 10% of N more or fewer examples than the quantile is exp(eps/2 x 0.1 N)
# times less likely; below exp(LENGTH_MIN_LOG_ODDS) the choice is said to be noisy.
LENGTH_MIN_LOG_ODDS = 3.0


def length_scores(lengths, candidates=LENGTH_CANDIDATES, quantile: float = LENGTH_QUANTILE) -> list[float]:
    """u(L_i) = -max(0, k - c_i) - max(0, c_(i-1) - k + 1), with c_i = #{examples of at most L_i tokens}
    (c_(-1) = 0) and k = ceil(quantile N) the rows to keep whole: 0 for the shortest candidate keeping
    k rows (c_i >= k > c_(i-1)), lower by one per row that would have to move for another candidate
    to be that one; a longer candidate keeping no more rows scores lower, so short data gets a short
    length. Sensitivity 1 under add-or-remove (k moves by 0 or 1 and each count by 0 or 1, and only
    one of the two terms can be non-zero), not monotone."""
    import numpy as np

    if not 0 < quantile < 1:
        raise RecipeError(f"the length quantile must be in (0, 1), got {quantile}")
    x = np.asarray(lengths, dtype=np.int64)
    keep = math.ceil(quantile * len(x) - 1e-9)
    counts = [int(np.count_nonzero(x <= c)) for c in candidates]
    below = [0] + counts[:-1]
    return [float(-max(0, keep - c) - max(0, b - keep + 1)) for c, b in zip(counts, below)]


def dp_example_length(lengths, *, epsilon: float, rng, candidates=LENGTH_CANDIDATES,
                      quantile: float = LENGTH_QUANTILE) -> tuple[int, dict]:
    """The example length covering about `quantile` of D_train, chosen with epsilon-DP.

    Returns (max_tokens, the selection's ledger entry on D_train): the entry must be composed into
    the run's ledger (its epsilon is spent on D_train). `rng`: seeded secretly for a release.
    """
    from dpsynth.dp import private_selection as ps

    if not len(lengths):
        raise RecipeError("the automatic example length needs a non-empty training set")
    sel = ps.DpSelection(epsilon=epsilon, monotone=False)
    i = sel.choose(length_scores(lengths, candidates, quantile), rng)
    return int(candidates[i]), sel.ledger_entry(len(candidates), name="recipe example length", dataset=ps.TRAIN)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LengthChoice:
    """The example length `--max-tokens auto` chose, and what it cost.

    Attributes:
      max_tokens: the chosen length (BOS + prompt + text + EOS).
      candidates: the lengths it chose among (public: `LENGTH_CANDIDATES` the model can hold).
      epsilon: spent on D_train (None: nothing spent: a non-private run, which takes the exact
        quantile, or a single candidate).
      entry: the ledger entry (`dpsynth.dp.ledger`), None when nothing was spent.
    """

    max_tokens: int
    candidates: tuple[int, ...]
    epsilon: float | None
    entry: dict | None
    noisy: bool = False

    @property
    def why(self) -> str:
        if len(self.candidates) == 1:
            return f"example length {self.max_tokens} tokens: the only candidate the model and the label prompts allow"
        how = (f"chosen with the exponential mechanism at epsilon {self.epsilon:.3g} ({LENGTH_EPSILON_SHARE:.0%} of "
               "the target, composed into the ledger)" if self.epsilon is not None else "exact (a non-private run)")
        return (f"example length {self.max_tokens} tokens: the candidate of {list(self.candidates)} whose count of "
                f"D_train rows at most that long is nearest {LENGTH_QUANTILE:.0%} of N, {how}"
                + (" (NOISY: too few examples for this epsilon to tell the candidates apart well; give --max-tokens "
                   "for a small set)" if self.noisy else ""))

    def to_json(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens, "candidates": list(self.candidates), "quantile": LENGTH_QUANTILE,
                "epsilon": self.epsilon, "entry": self.entry, **({"noisy": True} if self.noisy else {})}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "LengthChoice":
        return cls(max_tokens=int(d["max_tokens"]), candidates=tuple(int(c) for c in d["candidates"]),
                   epsilon=None if d["epsilon"] is None else float(d["epsilon"]), entry=d["entry"],
                   noisy=bool(d.get("noisy", False)))


def length_candidates(*, max_positions: int, min_tokens: int) -> tuple[int, ...]:
    """The `LENGTH_CANDIDATES` a model with `max_positions` positions can train on (L - 1 <= max_positions)
    that leave room for text after the longest label prompt (L >= min_tokens)."""
    out = tuple(c for c in LENGTH_CANDIDATES if c - 1 <= max_positions and c >= min_tokens)
    if not out:
        raise RecipeError(f"no automatic example length fits: the candidates {list(LENGTH_CANDIDATES)} need between "
                          f"{min_tokens} tokens (the longest label prompt and some text) and {max_positions + 1} "
                          "(the model's positions); pass --max-tokens N")
    return out


def choose_example_length(lengths, *, target_epsilon: float, rng, candidates: tuple[int, ...]) -> LengthChoice:
    """`--max-tokens auto`: the DP length quantile at `LENGTH_EPSILON_SHARE` of `target_epsilon` (exact, and
    free, for a non-private run, `target_epsilon` = inf)."""
    import numpy as np

    if not len(lengths):
        raise RecipeError("the automatic example length needs a non-empty training set")
    if len(candidates) == 1:  # nothing to choose: the data is not read
        return LengthChoice(max_tokens=int(candidates[0]), candidates=tuple(candidates), epsilon=None, entry=None)
    if math.isinf(target_epsilon):
        best = int(np.argmax(length_scores(lengths, candidates)))  # (a tie only at an exact boundary: the shorter)
        return LengthChoice(max_tokens=int(candidates[best]), candidates=tuple(candidates), epsilon=None, entry=None)
    eps = LENGTH_EPSILON_SHARE * float(target_epsilon)
    length, entry = dp_example_length(lengths, epsilon=eps, rng=rng, candidates=candidates)
    noisy = eps / 2 * 0.1 * len(lengths) < LENGTH_MIN_LOG_ODDS  # (N is public: the report records it)
    return LengthChoice(max_tokens=length, candidates=tuple(candidates), epsilon=eps, entry=entry, noisy=noisy)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TimeBudget:
    """The token budget `--time-budget` measured on this machine (public: no privacy cost).

    Attributes:
      seconds: the time budget of the DP-SGD steps (compilation and evaluation not included).
      example_tokens_per_second: the measured speed of the run's compiled step
        (`measure_speed`: microbatch x max_tokens per timed accumulation).
      microbatch: the microbatch it was measured at.
      token_budget: `token_budget_for(seconds, speed)`, what the recipe then spends.
    """

    seconds: float
    example_tokens_per_second: float
    microbatch: int
    token_budget: float

    @property
    def why(self) -> str:
        return (f"token budget {self.token_budget:,.0f} example-tokens: the time budget of {self.seconds:g} s at the "
                f"{self.example_tokens_per_second:,.0f} example-tokens/s measured on this run's compiled step "
                f"(microbatch {self.microbatch}, best of 3 after a warm-up)")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "TimeBudget":
        return cls(seconds=float(d["seconds"]), example_tokens_per_second=float(d["example_tokens_per_second"]),
                   microbatch=int(d["microbatch"]), token_budget=float(d["token_budget"]))


def token_budget_for(*, seconds: float, example_tokens_per_second: float) -> float:
    """The example-tokens a run may process in `seconds` at the measured speed (public: no privacy cost)."""
    if not seconds > 0 or not example_tokens_per_second > 0:
        raise RecipeError(f"the time budget and the speed must be positive, got {seconds} s and "
                          f"{example_tokens_per_second} tokens/s")
    return float(seconds) * float(example_tokens_per_second)


def measure_speed(step, *, example_tokens: int, repeats: int = 3, clock=None) -> float:
    """Example-tokens per second of `step()` (one call processes `example_tokens`): the best of
    `repeats` timed calls after one warm-up call (compilation). `clock`: a time source (tests)."""
    import time

    clock = clock or time.perf_counter
    step()  # warm-up: compilation and caches
    best = math.inf
    for _ in range(max(1, repeats)):
        t0 = clock()
        step()
        best = min(best, clock() - t0)
    if not best > 0:
        raise RecipeError("the timed step took no measurable time")
    return example_tokens / best
