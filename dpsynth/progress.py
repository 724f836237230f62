"""Periodic progress log lines with rate and ETA, for every long-running stage.

Usage:
    with Progress(total=steps, desc="pretrain", unit="step") as progress:
        for ...:
            progress.update(1, loss=float(loss))

Prints at most every `interval` seconds (and at the end), e.g.
`pretrain: 120/500 step (24.0%) 3.1 step/s, ETA 2m03s | loss=3.2100`. Only counts and the
metrics passed in are printed; callers must never pass private text.
"""

from __future__ import annotations

import logging
import sys
import time

logger = logging.getLogger("dpsynth")


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


class Progress:
    """A progress reporter that writes one line per `interval` seconds to `stream`."""

    def __init__(self, total: int | None, desc: str, unit: str = "it", interval: float = 5.0, stream=None, *,
                 brief: bool = False):
        self.total, self.desc, self.unit, self.interval = total, desc, unit, interval
        self.brief, self.shown = brief, False  # brief: a stage shorter than `interval` prints nothing
        self.stream = stream if stream is not None else sys.stderr
        self.count = 0
        self.start = self._last = time.monotonic()
        self.metrics: dict[str, float] = {}

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, n: int = 1, **metrics: float) -> None:
        self.count += n
        self.metrics.update(metrics)
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self._emit(now)

    def line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        elapsed = max(now - self.start, 1e-9)
        rate = self.count / elapsed
        parts = [f"{self.desc}: {self.count}"]
        if self.total:
            parts[0] += f"/{self.total} {self.unit} ({100.0 * self.count / self.total:.1f}%)"
        else:
            parts[0] += f" {self.unit}"
        parts.append(f"{rate:.3g} {self.unit}/s")
        if self.total and rate > 0:
            parts.append(f"ETA {format_duration((self.total - self.count) / rate)}")
        else:
            parts.append(f"elapsed {format_duration(elapsed)}")
        text = ", ".join(parts)
        if self.metrics:
            text += " | " + " ".join(f"{k}={v:.4g}" for k, v in self.metrics.items())
        return text

    def _emit(self, now: float) -> None:
        self.shown = True
        print(self.line(now), file=self.stream, flush=True)

    def close(self) -> None:
        """The last line (always; `brief` reporters: only when an earlier line was shown)."""
        if not self.brief or self.shown:
            self._emit(time.monotonic())
