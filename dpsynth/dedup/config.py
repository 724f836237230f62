"""`DedupConfig`: how the dedup cuts, declared once for `dpsynth dedup` and the experiment's `dedup:` section."""

from __future__ import annotations

import dataclasses

from dpsynth import binding
from dpsynth.dedup import DEFAULT_MIN_TOKENS


@dataclasses.dataclass(frozen=True)
class DedupConfig:
    """Attributes:
      min_tokens: k, the shortest public sequence shared with the sensitive data that is cut.
      threads: native threads per worker (identical results for any count).
    """

    min_tokens: int = binding.setting(DEFAULT_MIN_TOKENS, help="cut shared sequences of >= K tokens")
    threads: int = binding.setting(1, help="native threads per worker")

    def __post_init__(self):
        for name in ("min_tokens", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise binding.SettingError(name, f"must be an integer >= 1, got {value!r}")
