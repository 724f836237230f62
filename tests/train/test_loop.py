"""The outer training loop on a trivial fake step (a counter), without JAX."""

import io

import pytest

from dpsynth.train import loop


def _step(state, batch):
    """The fake step: the state is the list of batches seen so far."""
    return state + [batch], {"loss": float(batch)}


def _run(calls, **kwargs):
    def hook(name, shown=None):
        def f(done, *args):
            calls.append((name, done))
            return shown
        return f

    defaults = dict(start=0, total=6, batch=lambda s: (calls.append(("batch", s)), s)[1], step=_step,
                    after_step=hook("after_step"), log=hook("log"), evaluate=hook("evaluate"), save=hook("save"),
                    progress_interval=1e9, stream=io.StringIO())
    defaults.update(kwargs)
    return loop.run_loop([], **defaults)


def test_hooks_run_in_order_at_their_cadence():
    calls = []
    result = _run(calls, log_every=2, eval_every=3, checkpoint_every=4)
    assert result.state == [0, 1, 2, 3, 4, 5] and result.step == 6 and not result.stopped_early
    per_step = {}
    for name, s in calls:
        per_step.setdefault(s + 1 if name == "batch" else s, []).append(name)
    assert per_step[1] == ["batch", "after_step"]
    assert per_step[2] == ["batch", "after_step", "log"]
    assert per_step[3] == ["batch", "after_step", "evaluate"]
    assert per_step[4] == ["batch", "after_step", "log", "save"]
    assert per_step[6] == ["batch", "after_step", "log", "evaluate", "save"]  # the end: log, evaluate, save


def test_resume_continues_at_the_start_step():
    calls = []
    result = _run(calls, start=4, total=6, checkpoint_every=2)
    assert result.state == [4, 5] and result.step == 6
    assert [s for name, s in calls if name == "batch"] == [4, 5]
    assert [s for name, s in calls if name == "save"] == [6]


def test_stop_after_ends_with_a_checkpoint_and_evaluates_only_at_total():
    calls = []
    result = _run(calls, stop_after=3, checkpoint_every=2, eval_every=None, log_every=None)
    assert result.state == [0, 1, 2] and result.step == 3 and not result.stopped_early
    assert [s for name, s in calls if name == "save"] == [2, 3]  # cadence, then the stop-after step
    assert [s for name, s in calls if name == "log"] == [3]
    assert not [s for name, s in calls if name == "evaluate"]  # step 3 is not the end of the run
    resumed = _run([], start=3, checkpoint_every=2)
    assert resumed.state == [3, 4, 5]  # together: the steps of an uninterrupted run


def test_stop_after_past_the_total_and_nothing_left_to_run():
    assert _run([], stop_after=100).step == 6
    calls = []
    result = _run(calls, start=6)
    assert result.state == [] and result.step == 6 and calls == []


def test_should_stop_ends_early():
    calls = []
    result = _run(calls, eval_every=2, should_stop=lambda done, state: done == 4)
    assert result.step == 4 and result.stopped_early and result.state == [0, 1, 2, 3]
    assert not _run([], should_stop=lambda done, state: done == 6).stopped_early


@pytest.mark.parametrize("start", [0, 2])
def test_progress_lines_have_rate_eta_and_hook_metrics(start):
    stream = io.StringIO()
    _run([], start=start, total=5, stream=stream, progress_interval=0.0, desc="fake",
         after_step=lambda done, state, metrics: {"loss": metrics["loss"]},
         evaluate=lambda done, state: {"valid": 0.5}, eval_every=2)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 5 - start + 1  # one per step (interval 0) and one at the end
    label = "fake" if start == 0 else f"fake (resumed at step {start})"
    assert lines[0].startswith(f"{label}: 1/{5 - start} step (")
    assert all("step/s" in line and "ETA" in line for line in lines)
    assert "loss=4" in lines[-1] and "valid=0.5" in lines[-1]


def test_progress_interval_limits_the_lines():
    stream = io.StringIO()
    _run([], total=50, stream=stream, progress_interval=1e9)
    lines = stream.getvalue().splitlines()
    assert lines == [lines[-1]] and lines[-1].startswith("train: 50/50 step (100.0%)")
