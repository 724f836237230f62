"""A third DP training mechanism defined in tests only: full-batch DP-GD.

It proves the mechanism registry's locality (issue: adding a mechanism touches one file plus
its registry line): nothing in `dpsynth/` knows this class, yet planning, calibration, the
ledger, the reports, the configs and the tuner run it once it is registered.

Every step uses all N units (no subsampling), clips each unit's gradient to C and adds
N(0, sigma^2 C^2) to the sum, divided by N. T steps are the T-fold composition of the Gaussian
mechanism with noise multiplier sigma (sensitivity C under add-or-remove adjacency): the DP
event is `SelfComposed(Gaussian(sigma), T)`, independent of the sampling machinery of DP-SGD.
"""

from __future__ import annotations

import dp_accounting
import numpy as np

from dpsynth.dp import accounting, sampling
from dpsynth.dp.mechanisms import Built, Mechanism
from dpsynth.dp.strategy import DPSGDStrategy


class AllUnits:
    """Every unit at every step, in fixed-shape microbatches (-1 padding)."""

    def __init__(self, num_units: int, microbatch_size: int):
        self.num_units, self.microbatch_size = num_units, microbatch_size

    def microbatches(self, step: int) -> list[np.ndarray]:
        return sampling.pad_microbatches(np.arange(self.num_units), self.microbatch_size)


class FullBatchDPGD(Mechanism):
    name = "dpgd"
    title = "full-batch DP-GD"
    supports_batch_cap = False

    def sampling_probability(self, *, dataset_size, expected_batch_size, steps, cycle_length):
        if expected_batch_size != dataset_size:
            raise accounting.PrivacyConfigError(f"full-batch DP-GD uses every unit: the batch must be N = {dataset_size}")
        return 1.0

    def event(self, entry, compositions=1):
        sigma = float(entry["noise_multiplier"])
        if sigma == 0:
            return dp_accounting.NonPrivateDpEvent()
        return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma),
                                                 int(compositions) * int(entry["steps"]))

    def build(self, plan, *, clip_norm, num_units, microbatch_size, seed, per_user, strategy_cache_dir=None):
        if per_user:
            raise accounting.PrivacyConfigError("this test mechanism is example-level only")
        return Built(strategy=DPSGDStrategy(clip_norm=clip_norm, noise_multiplier=plan.noise_multiplier,
                                            expected_batch_size=plan.expected_batch_size),
                     sampler=AllUnits(num_units, microbatch_size))
