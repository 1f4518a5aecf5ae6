"""``[comm]``: torchtitan's section plus the heartbeat timeout of the stopped-rank watch.

The section as the job file sets it, which ``JobConfig`` holds; the watch that reads it is
train/watchdog.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torchtitan.config.configs import CommConfig


@dataclass(kw_only=True, slots=True)
class SkrullComm(CommConfig):
    """torchtitan's ``[comm]`` plus the heartbeat timeout."""

    heartbeat_timeout_seconds: float = 30.0
    """A rank whose heartbeat is this many seconds old has stopped answering: the
    first rank to see it names it in one line and ends the job (skrull_ext/train/watchdog.py).
    0 turns the watch off. Keep it below train_timeout_seconds (which fires unnamed)."""

    def __post_init__(self):
        t = self.heartbeat_timeout_seconds
        if not (math.isfinite(t) and (t == 0 or t >= 1)):
            raise ValueError(f"comm.heartbeat_timeout_seconds must be 0 (off) or >= 1, got {t}")
