"""The ``[skrull]`` section of a job: how Skrull schedules each global batch.

Kept local to the integration branch until the scheduler core's
``SchedulerConfig`` lands; the trainer maps this section onto it. Values are
checked here, so a bad TOML or CLI value fails before any process group or
model is built, naming the field and what it allows.
"""

from dataclasses import dataclass, fields
from typing import get_args, Literal

Policy = Literal["skrull", "worst_fit"]
"""Skrull's GDS+DACP, or the paper's round-robin baseline (really worst-fit)."""
POLICIES = get_args(Policy)

Overlength = Literal["error", "truncate", "drop"]
"""What to do with a sequence longer than a CP group holds (bucket_size * cp)."""
OVERLENGTH_POLICIES = get_args(Overlength)


@dataclass(kw_only=True, slots=True)
class SkrullSection:
    enable: bool = True
    """Schedule global batches with Skrull; False runs torchtitan's own batching."""

    policy: Policy = "skrull"
    """Scheduling policy."""

    bucket_size: int = 26624
    """Tokens one CP rank may hold per micro-batch (the paper's BucketSize C)."""

    cost_model: str = "qwen2.5-0.5b"
    """Cost-model preset name, or path to a profile file."""

    cpsat_time_limit_ms: int = 0
    """OR-Tools CP-SAT time budget per step in milliseconds; 0 disables it."""

    overlength: Overlength = "error"
    """Over-length sequences: fail, cut to what fits, or leave out of the step."""

    check_plan_hash: bool = False
    """Debug: all-gather the plan digest every step and fail on any mismatch."""

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"skrull.policy: {self.policy!r} is not one of {list(POLICIES)}")
        if self.overlength not in OVERLENGTH_POLICIES:
            raise ValueError(
                f"skrull.overlength: {self.overlength!r} is not one of {list(OVERLENGTH_POLICIES)}"
            )
        if self.bucket_size < 1:
            raise ValueError(f"skrull.bucket_size: must be >= 1, got {self.bucket_size}")
        if self.cpsat_time_limit_ms < 0:
            raise ValueError(
                f"skrull.cpsat_time_limit_ms: must be >= 0, got {self.cpsat_time_limit_ms}"
            )
        if not self.cost_model:
            raise ValueError("skrull.cost_model: must name a preset or a profile file")

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
