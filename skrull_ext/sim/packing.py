"""Plans for the policies the core does not make: grouping helpers and a
Plan builder that scores every micro-batch with the core's cost model.

Every policy of the simulator ends in a ``skrull_ext.scheduler.plan.Plan`` so the same
``Plan.validate()`` and the same metrics apply to all of them; the times in
it come from ``_core.evaluate_placement`` (or, for chunks, the core's
``micro_batch_us``), never from a second cost model.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from skrull_ext import _core
from skrull_ext._core import DISTRIBUTED, CostModel
from skrull_ext.scheduler.capacity import Capacity
from skrull_ext.scheduler.config import TIMELINES
from skrull_ext.scheduler.plan import MicroBatchPlan, Plan


@dataclass(frozen=True)
class Shape:
    """Cluster shape of one simulated job."""

    dp: int
    """Data-parallel ranks (CP groups)."""
    cp: int
    """CP ranks per group (N)."""
    batch_size: int
    """Sequences per DP rank per global batch (the paper's BatchSize)."""
    bucket_size: int
    """BucketSize C: tokens one CP rank can hold."""
    timeline: str = "lockstep"
    """The timeline every policy's plan is timed on (skrull_ext.scheduler.config.TIMELINES): FSDP over
    the DP ranks runs lockstep; ``free`` is the paper's per-rank timeline."""

    def __post_init__(self) -> None:
        for name in ("dp", "cp", "batch_size", "bucket_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.timeline not in TIMELINES:
            raise ValueError(f"timeline must be one of {sorted(TIMELINES)}, got {self.timeline!r}")

    @property
    def global_batch(self) -> int:
        return self.dp * self.batch_size

    def capacity(self, pool: bool = False) -> Capacity:
        """What the shape's ranks hold (``pool``: a sequence may span the DP x CP world)."""
        return Capacity(self.bucket_size, self.cp, self.dp, pool)

    @property
    def max_length(self) -> int:
        """Longest sequence one CP group can hold; longer ones are truncated before any policy runs."""
        return self.capacity().limit


def sharded_tokens(s: int, cp: int) -> int:
    """Tokens one CP rank holds of a sequence sharded over the group (the core's rule)."""
    return _core.shard_tokens(s, cp)


def pack_sharded(lengths: Sequence[int], order: Sequence[int], shape: Shape) -> list[list[int]]:
    """Cut `order` into consecutive groups whose sharded tokens fit one rank's bucket.

    The rule of a CP framework that shards everything: a micro-batch is full
    when the next sequence's shard would push a rank past BucketSize.
    """
    groups: list[list[int]] = []
    cur: list[int] = []
    used = 0
    for k in order:
        need = sharded_tokens(lengths[k], shape.cp)
        if cur and used + need > shape.bucket_size:
            groups.append(cur)
            cur, used = [], 0
        cur.append(k)
        used += need
    if cur:
        groups.append(cur)
    return groups


def micro_batch(cost: CostModel, shape: Shape, dp_rank: int, index: int, seqs: list[int], lengths: Sequence[int],
                cp_rank: list[int]) -> MicroBatchPlan:
    """One micro-batch scored by the core (tokens, bytes, predicted time): slot ``index`` on DP rank ``dp_rank``."""
    lens = [lengths[k] for k in seqs]
    r = _core.evaluate_placement(lens, cp_rank, cost, shape.cp, shape.bucket_size)
    return MicroBatchPlan.placed(dp_rank, index, seqs, lens, cp_rank, shape.cp, r)


def build_plan(lengths: Sequence[int], ranks: list[list[MicroBatchPlan]], shape: Shape, started: float,
               pad_us: float = 0.0) -> Plan:
    """Assemble a Plan from scored micro-batches (per DP rank, in execution order), timed on
    ``shape.timeline`` (a pad pass costs ``pad_us``, the cost model's pad_pass_us())."""
    return Plan.from_groups(lengths, ranks, shape.dp, shape.cp, shape.bucket_size,
                            (time.perf_counter() - started) * 1e6, shape.timeline, pad_us)


def all_sharded_plan(lengths: Sequence[int], groups_per_rank: list[list[list[int]]], cost: CostModel, shape: Shape,
                     started: float) -> Plan:
    """Plan in which every sequence is sharded over its CP group (no local sequences, no overlap).

    With CP = 1 there is nothing to shard over: sequences sit on the one rank and exchange nothing.
    """
    where = DISTRIBUTED if shape.cp > 1 else 0
    ranks = [
        [micro_batch(cost, shape, d, j, g, lengths, [where] * len(g)) for j, g in enumerate(groups)]
        for d, groups in enumerate(groups_per_rank)
    ]
    return build_plan(lengths, ranks, shape, started, cost.pad_pass_us())
