"""``SchedulerJob``: a job's scheduling, resolved once, the one object the scheduler reads.

A job's ``[skrull]`` section (``SkrullConfig``) and a library user's
``SchedulerConfig`` are plain values, checked once (``SchedulingOptions.check``).
Each resolves them, against the job's DP x CP and its cost model, into one
frozen ``SchedulerJob``: the integer BucketSize, the ``Policy`` object, the
timeline as the core's enum, whether the execution is free-running, the
``Capacity``, the cost model and the core's ``Options``, each made here once.
The ``Scheduler``, its plans and the dataloader's step builder read this
object and nothing else of the config; the trainer settles it once at
start-up (train/settle.py) and takes the policy, BucketSize, timeline and
look-ahead width from it after, reading the ``[skrull]`` section for what the
job does not hold: the attention kernel, the K/V exchange, the plan log, the
plan-hash check, ``defer_grad_sync`` (which micro-batch reduces gradients;
the job holds the timeline it sets), the profile's warnings and the cost
model's name in messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from skrull_ext import _core
from skrull_ext._core import CostModel, Timeline
from skrull_ext.scheduler.capacity import Capacity
from skrull_ext.scheduler.chunk_cost import ChunkRule
from skrull_ext.scheduler.config import LOOKAHEAD_AUTO, Policy, SchedulingOptions, core_options

__all__ = ["SchedulerJob"]


@dataclass(frozen=True)
class SchedulerJob:
    """One job's scheduling, resolved: what every consumer reads, made once (``of``)."""

    dp: int
    """Data-parallel ranks (CP groups) the global batch is split over."""
    cp: int
    """Context-parallel ranks per group (N)."""
    bucket_size: int
    """BucketSize C in tokens (the job's [skrull] bucket_size resolved, or the execution's)."""
    policy: Policy
    """The POLICIES entry, not its name."""
    timeline: Timeline
    """The timeline the job executes (config.job_timeline): what plans are built and timed for."""
    cost_model: CostModel
    """The job's model on its hardware, priced for its execution."""
    overlength: str
    """error, truncate, drop or chunk (config.OVERLENGTH)."""
    cpsat: bool
    cpsat_margin: float
    cpsat_deterministic_time: float
    max_extra_micro_batches: int
    lookahead: int = 1
    """Global batches per look-ahead window (1: none); the dataloader regroups each window
    (``Scheduler.lookahead``)."""
    free_running: bool = False
    """FSDP parameters held unsharded for the step (train/execution.py decides): each DP rank
    builds and runs its own micro-batches only, no pad passes."""
    chunk_rule: ChunkRule | None = field(default=None, compare=False)
    """Under ``overlength = "chunk"``: the chunk each document trains in (scheduler/chunk_cost.py),
    set by start-up from the measured memory model (train/settle.py); None: the group's limit."""
    capacity: Capacity = field(init=False)
    """What the job's ranks hold under this policy, and the longest sequence it trains whole."""
    options: _core.Options = field(init=False, repr=False, compare=False)
    """The core's Options, built once (``core_options``)."""

    def __post_init__(self) -> None:
        # Made from checked values (SchedulingOptions.check, SchedulerConfig's dims or
        # torchtitan's ParallelDims); the core's validate.hpp guards one made by hand.
        # SkrullConfig.check_free_running refuses free_running with a pool policy, for the user.
        assert not (self.free_running and self.policy.pool), "free-running ranks cannot run skrull-pool plans"
        assert not self.free_running or self.timeline == Timeline.FREE_RUNNING, "free-running runs its timeline"
        object.__setattr__(self, "capacity", Capacity(self.bucket_size, self.cp, self.dp, self.policy.pool))
        object.__setattr__(self, "options", core_options(self.dp, self.cp, self.bucket_size, self.policy,
                                                         self.timeline, self.overlength,
                                                         self.max_extra_micro_batches))

    @classmethod
    def of(cls, knobs: SchedulingOptions, *, dp: int, cp: int, timeline: Timeline, cost_model: CostModel,
           bucket_size: int, free_running: bool = False, lookahead: int | None = None) -> SchedulerJob:
        """Resolve checked ``knobs`` (their ``policy_spec`` set by ``check``) for a DP x CP job on
        ``timeline``, priced by ``cost_model``, at the integer ``bucket_size``, with windows of
        ``lookahead`` global batches (default: the knobs' own width). ``lookahead = "auto"`` is
        not a width: whoever priced the data says which (train/settle.py), else ValueError."""
        if lookahead is None:
            if knobs.lookahead == LOOKAHEAD_AUTO:
                raise ValueError('lookahead = "auto" is not settled: pass the width the data was priced at '
                                 "(train/settle.py chooses it for a training job)")
            lookahead = knobs.lookahead
        return cls(dp=dp, cp=cp, bucket_size=bucket_size, policy=knobs.policy_spec, timeline=timeline,
                   cost_model=cost_model, overlength=knobs.overlength, cpsat=knobs.cpsat,
                   cpsat_margin=knobs.cpsat_margin, cpsat_deterministic_time=knobs.cpsat_deterministic_time,
                   max_extra_micro_batches=knobs.max_extra_micro_batches, lookahead=lookahead,
                   free_running=free_running)

    def chunk_for(self, length: int) -> int:
        """The chunk a chunked ``length``-token document trains in: the one the scheduler prices
        (scheduler.chunked_docs) and the trainer runs (train/passes.py)."""
        return self.capacity.group_limit if self.chunk_rule is None else self.chunk_rule.chunk(length)

    @property
    def uses_cpsat(self) -> bool:
        """The one CP-SAT switch: enabled, the policy has a fallback, and there
        is a placement to choose (cp > 1)."""
        return self.cpsat and self.policy.fallback and self.cp > 1
