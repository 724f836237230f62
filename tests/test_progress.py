"""dpsynth.progress: lines with counts, rate and ETA; a brief reporter is silent for a short stage."""

import io

import numpy as np

from dpsynth import progress as progress_lib


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _run(monkeypatch, steps, seconds_per_step, **kw):
    clock = Clock()
    monkeypatch.setattr(progress_lib.time, "monotonic", clock)
    out = io.StringIO()
    with progress_lib.Progress(total=steps, desc="stage", unit="example", interval=10.0, stream=out, **kw) as p:
        for _ in range(steps):
            clock.now += seconds_per_step
            p.update(1)
    return out.getvalue().splitlines()


def test_lines_carry_the_count_rate_and_eta(monkeypatch):
    lines = _run(monkeypatch, 10, 4.0)
    assert lines[0] == "stage: 3/10 example (30.0%), 0.25 example/s, ETA 28s"  # first after 10 s
    assert lines[-1].startswith("stage: 10/10 example (100.0%)")


def test_a_brief_reporter_is_silent_for_a_short_stage_and_reports_a_long_one(monkeypatch):
    assert _run(monkeypatch, 5, 0.1, brief=True) == []
    assert _run(monkeypatch, 5, 0.1) == ["stage: 5/5 example (100.0%), 10 example/s, ETA 0s"]
    long = _run(monkeypatch, 10, 4.0, brief=True)
    assert len(long) == 4 and long[-1].startswith("stage: 10/10 example (100.0%)")


def test_the_tuners_validation_loss_shows_progress_when_long(monkeypatch, capsys):
    from dpsynth.train import tune_model

    clock = Clock()
    monkeypatch.setattr(progress_lib.time, "monotonic", clock)

    def eval_fn(params, frozen, batch):
        clock.now += 6.0
        return float(np.sum(batch["x"] * batch["mask"]))

    arrays = {"x": np.arange(10, dtype=np.float32)}
    monkeypatch.setattr(tune_model.sampling, "gather",
                        lambda a, idx: {"x": a["x"][np.maximum(idx, 0)], "mask": (idx >= 0).astype(np.float32)})
    loss = tune_model.evaluate_loss(eval_fn, None, None, arrays, 4, desc="dp-tune[lora]: valid loss")
    assert loss == np.arange(10).sum() / 10
    err = capsys.readouterr().err.splitlines()
    assert err and all(e.startswith("dp-tune[lora]: valid loss: ") for e in err) and "10/10 example" in err[-1]
