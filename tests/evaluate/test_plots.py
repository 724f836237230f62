"""Tests for dpsynth.evaluate.plots: the axes of the report's plots (the PNGs themselves are
checked on a full report in test_report.py)."""

import math

from dpsynth.evaluate import plots


def test_epsilon_axis_is_nominal_and_lengths_are_clipped():
    pos, ticks = plots.epsilon_axis([3.0, 1.0, math.inf, 3.0, 10.0])
    assert pos == {1.0: 0, 3.0: 1, 10.0: 2, math.inf: 3} and ticks[:3] == ["1", "3", "10"] and ticks[3].startswith("inf")
    edges, hi = plots.clipped_edges(list(range(100)) + [100000], [5, 6], bins=10)
    assert hi < 1000 and len(edges) == 11 and edges[-1] == hi  # one very long text does not set the range
