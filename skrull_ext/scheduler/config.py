"""Scheduler configuration: the knobs that shape a plan.

Policies are a registry (name -> core options), not an if-chain: a new policy
is one entry in ``POLICIES``. A config resolves its policy name once, when it
is made (``SchedulingOptions.policy_spec``); everything downstream reads that
``Policy``, never the registry again. Each knob's default is written here
once, except that a job's ``[skrull] lookahead`` defaults to "auto"
(skrull_config.py; a SchedulerConfig's stays 1). The C++ ``Options``
defaults serve C++ callers only; ``core_options`` sets every field declared
here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar, Literal

from skrull_ext import _core
from skrull_ext._core import DacpSearch, MicroBatchCount, Overlength, Placement, Rollback


@dataclass(frozen=True)
class Policy:
    """How the core places sequences and picks micro-batch counts."""

    name: str
    """Its key in POLICIES (what ``[skrull] policy`` names)."""
    placement: Placement
    rollback: Rollback
    micro_batch_count: MicroBatchCount
    refine: bool  # time-driven local search after DACP (cpp/include/skrull/refine.hpp)
    fallback: bool  # CP-SAT may replace a micro-batch's placement
    description: str
    dacp_search: DacpSearch = DacpSearch.HEURISTIC  # SHARD_SWEEP: also try sharding the k longest
    pool: bool = False  # plan the DP x CP world as one pool (cpp/include/skrull/pool.hpp)
    slot_gds: bool = True  # on a lockstep timeline, GDS balances each micro-batch slot (cpp/include/skrull/slots.hpp)


POLICIES: dict[str, Policy] = {p.name: p for p in (
    # This project's best: Algorithm 1 with longest-first roll-back plus a
    # time-driven refinement, or the shard sweep, whichever predicts faster;
    # the micro-batch count chosen by predicted time; CP-SAT where it pays.
    Policy(
        "skrull", Placement.LEAST_LOAD, Rollback.LONGEST, MicroBatchCount.PREDICTED_TIME, True, True,
        "least-load DACP + refinement or shard sweep, longest-first roll-back, micro-batch count by predicted "
        "time, CP-SAT fallback",
        DacpSearch.SHARD_SWEEP,
    ),
    # The same without the shard sweep: Algorithm 1 + refinement only. Less
    # core time (docs/latency.md), slower simulated iterations, and with the
    # CP-SAT fallback on more scheduling time than skrull: measured in
    # docs/benchmarks.md, section 3.
    Policy(
        "skrull-fast", Placement.LEAST_LOAD, Rollback.LONGEST, MicroBatchCount.PREDICTED_TIME, True, True,
        "least-load DACP + refinement, longest-first roll-back, micro-batch count by predicted time, "
        "CP-SAT fallback",
    ),
    # Algorithms 1 + 2 as published, with the roll-back's accounting fixed.
    Policy(
        "skrull-paper", Placement.LEAST_LOAD, Rollback.SHORTEST, MicroBatchCount.SMALLEST_FEASIBLE, False, False,
        "paper's Algorithms 1+2, corrected roll-back, smallest feasible micro-batch count",
        slot_gds=False,
    ),
    # skrull's placement with the paper's per-rank GDS on every timeline: what
    # skrull planned before the slot GDS, kept to measure what the slots buy on
    # a lockstep job (docs/benchmarks.md; python -m skrull_ext.bench cp).
    Policy(
        "skrull-per-rank", Placement.LEAST_LOAD, Rollback.LONGEST, MicroBatchCount.PREDICTED_TIME, True, True,
        "skrull with the per-rank GDS (each DP rank's share split on its own), whatever the job's timeline",
        DacpSearch.SHARD_SWEEP, slot_gds=False,
    ),
    # One pool: skrull, plus sequences sharded over aligned blocks
    # of CP groups when their own group would straggle or cannot hold them
    # (up to bucket_size x dp x cp tokens); skrull's plan kept when it
    # predicts no slower; then a one-group micro-batch's sharded sequence
    # moves to an aligned part of its group where that predicts it faster.
    # Measured in docs/benchmarks.md, section 10.
    Policy(
        "skrull-pool", Placement.LEAST_LOAD, Rollback.LONGEST, MicroBatchCount.PREDICTED_TIME, True, True,
        "skrull over the DP x CP world as one pool: long sequences sharded over blocks of CP groups, "
        "skrull's plan where it predicts no slower",
        DacpSearch.SHARD_SWEEP, pool=True,
    ),
    # The paper's "round-robin" (Algorithm 4), really worst-fit.
    Policy(
        "worstfit", Placement.WORST_FIT, Rollback.SHORTEST, MicroBatchCount.SMALLEST_FEASIBLE, False, False,
        "paper's Algorithm 4: worst-fit placement, smallest feasible micro-batch count",
        slot_gds=False,
    ),
)}


def resolve_policy(name: str) -> Policy:
    """The Policy called ``name``: the one lookup of a policy name (ValueError naming the choices)."""
    policy = POLICIES.get(name) if isinstance(name, str) else None
    if policy is None:
        raise ValueError(f"policy must be one of {sorted(POLICIES)}, got {name!r}")
    return policy


OVERLENGTH: dict[str, Overlength] = {
    "error": Overlength.ERROR,
    "truncate": Overlength.TRUNCATE,
    "drop": Overlength.DROP,
    # Longer samples train whole in chunks (skrull_ext/train/chunked.py), outside the micro-batches:
    # the loader gives them to the plan as chunked documents (Scheduler.schedule's chunked), so the
    # core's micro-batches meet none.
    "chunk": Overlength.ERROR,
}


def _check_range(name: str, value, lo, hi) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value!r}")


def check_int(name: str, value, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    _check_range(name, value, lo, hi)


PolicyName = Literal[tuple(POLICIES)]  # pyrefly: ignore[invalid-literal]
OverlengthMode = Literal[tuple(OVERLENGTH)]  # pyrefly: ignore[invalid-literal]

FROM_PROFILE = "profile"
"""``bucket_size = "profile"``: BucketSize is the measured profile's ``[memory] bucket_size``
(a job's ``[skrull]`` section resolves it: ``SkrullConfig.resolved_bucket_size``)."""

BucketSize = int | Literal["profile"]

LOOKAHEAD_AUTO = "auto"
"""``lookahead = "auto"``: the trainer picks the width its cost model predicts pays on the
job's first global batches (data/steps/lookahead_choice.py)."""

Lookahead = int | Literal["auto"]


def check_bucket_size(value, from_profile: bool) -> None:
    """The one check of ``bucket_size`` (the core's guard is validate.hpp): an integer in
    [1, MAX_BUCKET_SIZE], or ``"profile"`` where ``from_profile`` (a config that names a
    profile can resolve it). Raises ValueError naming the key, the value and the limit."""
    if from_profile and value == FROM_PROFILE:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _core.MAX_BUCKET_SIZE:
        also = f' or "{FROM_PROFILE}" (the measured profile\'s BucketSize)' if from_profile else ""
        raise ValueError(f"bucket_size must be in [1, {_core.MAX_BUCKET_SIZE}]{also}, got {value!r}")


@dataclass(kw_only=True, slots=True)
class SchedulingOptions:
    """The knobs that shape a plan, whatever the job shape: shared by
    ``SchedulerConfig`` (the core's config) and the job file's ``[skrull]``
    section (``skrull_ext.train.job.skrull_config.SkrullConfig``), declared once here
    (lookahead excepted: the section's defaults to "auto")."""

    bucket_size: BucketSize = 26624
    """BucketSize C: tokens one CP rank can hold (from the profiler; the paper's 26K for 0.5B).
    In a job's [skrull] section, "profile" takes the measured profile's [memory] bucket_size;
    a SchedulerConfig holds the integer."""
    policy: PolicyName = "skrull"
    """One of POLICIES: skrull, skrull-fast, skrull-paper, skrull-per-rank, skrull-pool, worstfit."""
    overlength: OverlengthMode = "error"
    """Sequences longer than bucket_size x cp (x dp under skrull-pool): error, truncate (to the
    longest that fits), drop, or chunk (trained whole in chunks, each by the DP rank the plan
    assigns, outside its micro-batches: docs/design/chunked.md). In training also those longer than dataloader.max_len; the
    dataloader applies it before the scheduler and counts each sample (data/steps/accounting.py)."""
    cpsat: bool = False
    """Allow the CP-SAT fallback (used only by policies that enable it). Off by default:
    on the shipped shapes the step time it saves is far smaller than the solver wall time
    it costs (measured by ``python -m skrull_ext.bench cpsat``: docs/benchmarks.md, section
    12). A micro-batch no heuristic can place still goes to CP-SAT
    (``Scheduler.schedule_micro_batch``)."""
    cpsat_margin: float = 0.10
    """Try CP-SAT on a micro-batch predicted more than this fraction above its lower bound."""
    cpsat_deterministic_time: float = 0.005
    """CP-SAT limit in deterministic seconds (not wall time, so every rank gets the same answer)."""
    max_extra_micro_batches: int = 1
    """How many micro-batch counts above the smallest feasible one 'skrull' compares
    (docs/benchmarks.md measures what more would buy)."""
    lookahead: Lookahead = 1
    """Global batches read ahead and regrouped together (cpp/include/skrull/lookahead.hpp,
    docs/design/lookahead.md): the samples of each window of this many steps are assigned to
    the window's steps so that its predicted time is least, each step keeping its sample
    count and no sample trained more than lookahead - 1 steps from the step it arrived in.
    1: every step trains its own global batch (no look-ahead). In a job's [skrull] section,
    "auto" takes the width the job's cost model predicts pays on its first global batches
    (2, 4 or 8; 1 if none is predicted 5% faster), said in the log."""
    policy_spec: Policy = field(init=False, repr=False, compare=False)
    """``policy`` resolved (``resolve_policy``), once, by ``check`` when the config is made."""

    BUCKET_FROM_PROFILE: ClassVar[bool] = False
    """Whether ``bucket_size = "profile"`` is accepted (a config that names a profile)."""
    LOOKAHEAD_FROM_DATA: ClassVar[bool] = False
    """Whether ``lookahead = "auto"`` is accepted (a job's section: the trainer has the data)."""

    def check(self) -> None:
        """Raise ValueError naming the first bad value and its limit; resolve ``policy``."""
        check_bucket_size(self.bucket_size, self.BUCKET_FROM_PROFILE)
        self.policy_spec = resolve_policy(self.policy)
        if self.overlength not in OVERLENGTH:
            raise ValueError(f"overlength must be one of {sorted(OVERLENGTH)}, got {self.overlength!r}")
        if not isinstance(self.cpsat, bool):
            raise ValueError(f"cpsat must be true or false, got {self.cpsat!r}")
        _check_range("cpsat_margin", self.cpsat_margin, 0.0, 100.0)
        _check_range("cpsat_deterministic_time", self.cpsat_deterministic_time, 0.0, 3600.0)
        check_int("max_extra_micro_batches", self.max_extra_micro_batches, 0, 1024)
        w = self.lookahead
        if not (self.LOOKAHEAD_FROM_DATA and w == LOOKAHEAD_AUTO):
            try:
                check_int("lookahead", w, 1, _core.MAX_LOOKAHEAD)
            except ValueError:  # one message for both failures, naming "auto" where it is accepted
                also = f' or "{LOOKAHEAD_AUTO}" (chosen from the data)' if self.LOOKAHEAD_FROM_DATA else ""
                quoted = (f" (a quoted number is a string in TOML: write lookahead = {w.strip()} without quotes)"
                          if isinstance(w, str) and w.strip().isdigit() else "")
                raise ValueError(f"lookahead must be an integer in [1, {_core.MAX_LOOKAHEAD}]{also}, "
                                 f"got {w!r}{quoted}") from None

    def options(self) -> dict:
        """The knobs as keyword arguments (for SchedulerConfig), as written."""
        return {f.name: getattr(self, f.name) for f in fields(SchedulingOptions) if f.init}


TIMELINES: dict[str, _core.Timeline] = {
    "lockstep": _core.Timeline.LOCKSTEP,
    "free": _core.Timeline.FREE_RUNNING,
}
"""How the DP ranks of a step run their micro-batches (docs/design/cost_model.md, "Timelines"),
by the names a human writes. lockstep: FSDP gathers every layer's parameters per micro-batch over
the whole shard mesh, so every rank runs micro-batch slot j at the same time (a rank with fewer
runs pad passes); the step is the sum over slots of the slowest rank in each. free: ranks share
no collective until the step's gradient reduction, so the step is the slowest rank's sum.
Everything past ``timeline_of`` holds the core's enum."""

TimelineName = Literal[tuple(TIMELINES)]  # pyrefly: ignore[invalid-literal]


def timeline_of(value: str | _core.Timeline) -> _core.Timeline:
    """The one conversion of a timeline's name ("lockstep", "free") to the core's enum (an enum
    passes through); ValueError naming the choices."""
    if isinstance(value, _core.Timeline):
        return value
    timeline = TIMELINES.get(value) if isinstance(value, str) else None
    if timeline is None:
        raise ValueError(f"timeline must be one of {sorted(TIMELINES)}, got {value!r}")
    return timeline


def timeline_name(timeline: _core.Timeline) -> str:
    """The name a human writes for ``timeline`` (logs, reports)."""
    return next(k for k, v in TIMELINES.items() if v == timeline)


def job_timeline(dp_shard: int, dp_replicate: int, free_running: bool, defer_grad_sync: bool) -> _core.Timeline:
    """The timeline a job executes, from its parallelism (not a flag of its own).

    Free-running only where no collective spans DP ranks between the step's
    first forward and its gradient reduction: the ``free_running`` mode (FSDP
    parameters held unsharded for the whole step, gradients reduced once), a
    single DP rank, or replicate-only DP (no FSDP shard mesh over DP ranks)
    whose gradient all-reduce is deferred to the last micro-batch. Anything
    else runs lockstep."""
    if free_running or dp_shard * dp_replicate <= 1:
        return _core.Timeline.FREE_RUNNING
    if dp_shard == 1 and defer_grad_sync:
        return _core.Timeline.FREE_RUNNING
    return _core.Timeline.LOCKSTEP


def core_options(dp: int, cp: int, bucket_size: int, policy: Policy, timeline: _core.Timeline, overlength: str,
                 max_extra_micro_batches: int) -> _core.Options:
    """The core's Options: every field Python declares is set here (the C++ defaults serve C++
    callers); sweep_margin and pool_widen keep the core's own. The slot GDS runs on a lockstep
    timeline only (what follows from the timeline, decided here)."""
    opt = _core.Options()
    opt.dp, opt.cp, opt.bucket_size = dp, cp, bucket_size
    opt.placement = policy.placement
    opt.rollback = policy.rollback
    opt.micro_batch_count = policy.micro_batch_count
    opt.refine = policy.refine
    opt.dacp_search = policy.dacp_search
    opt.max_extra_micro_batches = max_extra_micro_batches
    opt.overlength = OVERLENGTH[overlength]
    opt.timeline = timeline
    opt.slot_gds = policy.slot_gds and timeline == _core.Timeline.LOCKSTEP
    return opt


@dataclass(kw_only=True, slots=True)
class SchedulerConfig(SchedulingOptions):
    """A scheduler built from plain values, for library users, the simulator and tests: the
    knobs, the job shape and the timeline by name. Checked as a job's [skrull] section is
    (``SchedulingOptions.check``, the one check of the knobs); ``Scheduler(config, cost_model)``
    resolves it into the ``SchedulerJob`` it runs on (job.py), which checks the dims."""

    dp: int = 1
    """Data-parallel ranks the global batch is split over."""
    cp: int = 1
    """Context-parallel ranks per group (N)."""
    timeline: TimelineName = "lockstep"
    """The timeline the job executes, by name (``timeline_of``)."""

    def __post_init__(self) -> None:
        # The dims' one Python check: a job's come from torchtitan's ParallelDims, and the
        # core's validate.hpp guards a SchedulerJob made by hand.
        check_int("dp", self.dp, 1, _core.MAX_RANKS)
        check_int("cp", self.cp, 1, _core.MAX_RANKS)
        self.check()
        timeline_of(self.timeline)  # a bad name fails here, naming the choices

    def core_options(self) -> _core.Options:
        """The core's Options for these values (``core_options``), for a caller of the core itself."""
        return core_options(self.dp, self.cp, self.bucket_size, self.policy_spec, timeline_of(self.timeline),
                            self.overlength, self.max_extra_micro_batches)
