"""``Capacity``: what a job's ranks hold, and the longest sequence a plan trains whole.

One object instead of (bucket_size, cp, dp, pool) passed around loose: the
over-length limit of a Skrull run (``data/steps/overlength.py``), the plans' own
check (``plan_check.py``) and the simulator read it here. The
arithmetic is the core's (``_core.max_sequence_length``, cost_model.hpp);
the ranks are those the core's entry point shards a sequence over:
``schedule`` its CP group, ``schedule_pool`` the DP x CP world.
"""

from __future__ import annotations

from dataclasses import dataclass

from skrull_ext import _core


@dataclass(frozen=True)
class Capacity:
    """BucketSize tokens per rank over ``cp`` ranks per CP group and ``dp`` groups;
    ``pool``: a sequence may span the whole DP x CP world (skrull-pool)."""

    bucket_size: int
    cp: int = 1
    dp: int = 1
    pool: bool = False

    @property
    def ranks(self) -> int:
        """The most ranks one sequence is sharded over."""
        return self.dp * self.cp if self.pool else self.cp

    @property
    def limit(self) -> int:
        """The longest sequence a plan holds whole (longer ones are over-length)."""
        return _core.max_sequence_length(self.bucket_size, self.ranks)

    @property
    def group_limit(self) -> int:
        """The longest sequence one CP group holds."""
        return _core.max_sequence_length(self.bucket_size, self.cp)

    @property
    def holder(self) -> str:
        """What holds ``limit`` tokens, in words."""
        return "the pool" if self.pool else "a CP group"

    @property
    def label(self) -> str:
        """Where ``limit`` comes from, in the job's keys: ``bucket_size B x cp N`` (``x dp D`` for the pool)."""
        dp = f" x dp {self.dp}" if self.pool else ""
        return f"bucket_size {self.bucket_size}{dp} x cp {self.cp}"
