"""The one outer training loop: steps, metrics, evaluation, checkpoints, stop-after, progress.

Every trainer (pretraining, DP fine-tuning, the downstream classifiers) runs its steps through
`run_loop`; what differs between them is passed in as hooks. The loop is host-side only: the
pure jitted steps (`dpsynth.train.core`, with the DP strategies of `dpsynth.dp`) are called
from the `step` hook and are not changed by it.

Per step `s` in `[start, end)`, with `done = s + 1` (the step count after it), the hooks run in
this order:

  1. `batch(s)`: the step's inputs (a batch, a list of microbatches, ...);
  2. `step(state, batch) -> (state, metrics)`: the training step;
  3. `after_step(done, state, metrics)`: per-step host bookkeeping (a ledger, loss sums);
  4. `log(done, state)` when `done % log_every == 0` or `done == end`;
  5. `evaluate(done, state)` when `done % eval_every == 0` or `done == total`;
  6. `save(done, state)` when `done % checkpoint_every == 0` or `done == end` (so a run that
     stops after a step, the last or `stop_after`, always ends with a checkpoint);
  7. the progress line (step count, rate, ETA and the metrics the hooks returned) at most
     every `progress_interval` seconds, and once at the end;
  8. `should_stop(done, state)`: True ends the loop early (early stopping).

`after_step`, `log` and `evaluate` may return a mapping of numbers to show on the progress
line (never private text). `end = min(total, stop_after)`: stopping after a step (tests,
time-sliced jobs) runs the same steps as a run killed there, so resuming from its checkpoint
(`start` = the checkpoint's step) continues exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Generic, TextIO, TypeVar

from dpsynth.progress import Progress

State = TypeVar("State")
Batch = TypeVar("Batch")
Shown = Mapping[str, float] | None  # numbers a hook adds to the progress line


@dataclasses.dataclass(frozen=True)
class LoopResult(Generic[State]):
    """What `run_loop` ends with.

    Attributes:
      state: the training state after the last step run.
      step: the step count after the last step run (`start` when none ran).
      stopped_early: True when `should_stop` ended the loop before `end`.
    """

    state: State
    step: int
    stopped_early: bool


def _due(done: int, every: int | None, last: int | None) -> bool:
    return (every is not None and done % every == 0) or done == last


def run_loop(
    state: State,
    *,
    start: int,
    total: int,
    batch: Callable[[int], Batch],
    step: Callable[[State, Batch], tuple[State, Any]],
    stop_after: int | None = None,
    after_step: Callable[[int, State, Any], Shown] | None = None,
    log: Callable[[int, State], Shown] | None = None,
    log_every: int | None = None,
    evaluate: Callable[[int, State], Shown] | None = None,
    eval_every: int | None = None,
    save: Callable[[int, State], None] | None = None,
    checkpoint_every: int | None = None,
    should_stop: Callable[[int, State], bool] | None = None,
    desc: str = "train",
    progress_interval: float = 10.0,
    stream: TextIO | None = None,
) -> LoopResult[State]:
    """Runs steps `start .. min(total, stop_after) - 1`; see the module docstring for the hooks.

    Args:
      state: the training state at step `start` (fresh, or restored from a checkpoint).
      start: the first step to run (the resumed checkpoint's step count; 0 for a fresh run).
      total: the run's planned number of steps.
      batch, step, after_step, log, evaluate, save, should_stop: the hooks (module docstring).
      stop_after: stop once this step count is reached, as if killed there (None: at `total`).
      log_every, eval_every, checkpoint_every: hook cadences in steps (None: only at the end
        given in the module docstring).
      desc: the progress lines' label; a resumed run says where it resumed.
      progress_interval: seconds between progress lines.
      stream: where progress lines go (default stderr); pass an `io.StringIO()` to silence
        them (e.g. on every process but process 0).

    Returns:
      The final state, its step count and whether `should_stop` ended the loop.
    """
    end = total if stop_after is None else min(total, stop_after)
    label = desc if start == 0 else f"{desc} (resumed at step {start})"
    done, stopped = start, False
    with Progress(total=max(end - start, 0), desc=label, unit="step", interval=progress_interval,
                  stream=stream) as progress:
        for s in range(start, end):
            state, metrics = step(state, batch(s))
            done = s + 1
            shown: dict[str, float] = {}
            if after_step is not None:
                shown.update(after_step(done, state, metrics) or {})
            if log is not None and _due(done, log_every, end):
                shown.update(log(done, state) or {})
            if evaluate is not None and _due(done, eval_every, total):
                shown.update(evaluate(done, state) or {})
            if save is not None and _due(done, checkpoint_every, end):
                save(done, state)
            progress.update(1, **shown)
            if should_stop is not None and should_stop(done, state):
                stopped = done < end
                break
    return LoopResult(state=state, step=done, stopped_early=stopped)
