"""The plan of one global batch: the one plan type, as users, the dataloader
and the simulator see it.

The world is DP x CP ranks, global rank = dp_rank * cp + cp_rank (torchtitan's
mesh order, CP innermost). Each micro-batch sits at a *slot* on a block of CP
groups (DP ranks); every rank of the block runs it at that slot, and a rank
runs its micro-batches in slot order. Each sequence of a micro-batch has a
*rank set*, the contiguous global ranks ``[first_rank, first_rank +
num_ranks)`` inside the block: one rank (local, whole), or k >= 2 ranks
(sharded, zigzag over the k). A set is stored once, on its micro-batch
(``MicroBatchPlan.first_rank``, ``num_ranks``); the plan's per-sequence view
of the sets (``Plan.first_rank``, ``num_ranks``) is read from there.

Policy ``skrull``'s plans are the one-group case: micro-batch j of DP rank i
is slot j on group i alone, and each set is one rank or the whole group (the
core's ``to_plan``). ``skrull-pool`` (``pool=True``) also has sub-group sets
of one group and sets over an aligned block of several groups
(cpp/include/skrull/pool.hpp).

Built from the core's ``Plan``; the CP-SAT fallback may replace a one-group
micro-batch's placement afterwards (``replace_placement``). ``validate()``
re-checks coverage, rank sets and memory with plain arithmetic, and the
times with the core's slot replay.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from skrull_ext import _core
from skrull_ext._core import DISTRIBUTED
from skrull_ext.scheduler.capacity import Capacity
from skrull_ext.scheduler.chunk_lockstep import chunk_passes
from skrull_ext.scheduler.config import TIMELINES, timeline_of
from skrull_ext.scheduler.plan_check import PlanError, check_plan

if TYPE_CHECKING:
    from skrull_ext.scheduler.job import SchedulerJob

DROPPED = _core.DROPPED


def _imbalance(values: list[float]) -> float:
    """max / mean (1.0 is perfect balance; 1.0 for nothing at all)."""
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else 1.0


def placement_sets(cp_rank: Sequence[int], group: int, cp: int) -> tuple[list[int], list[int]]:
    """A DACP placement on CP group ``group`` as rank sets (first ranks, sizes): a CP rank is
    that one global rank, DISTRIBUTED the whole group (the core's to_plan rule)."""
    base = group * cp
    return ([base if r == DISTRIBUTED else base + r for r in cp_rank],
            [cp if r == DISTRIBUTED else 1 for r in cp_rank])


@dataclass
class MicroBatchPlan:
    """One micro-batch: a slot on the CP groups [first_group, first_group + groups)."""

    slot: int
    first_group: int
    groups: int
    seqs: list[int]
    """Global indices of the sequences, in buffer order."""
    lengths: list[int]
    """Effective lengths, parallel to seqs."""
    first_rank: list[int]
    """Per sequence: the first global rank of its rank set."""
    num_ranks: list[int]
    """Per sequence: ranks in its set (1 = local)."""
    rank_tokens: list[int]
    """Tokens per rank of the block, in global rank order."""
    comm_bytes: float
    time_us: float
    start_us: float = 0.0
    """Predicted start on the plan's timeline."""
    rollbacks: int = 0
    moves: int = 0
    """Refinement moves after DACP (policy 'skrull')."""
    path: str = "heuristic"
    """'heuristic', or 'cpsat' when the exact solver's placement replaced it."""
    heuristic_time_us: float | None = None
    """Predicted time of the heuristic's placement, kept when CP-SAT replaced it."""
    lower_bound_us: float | None = None
    """Lower bound on this micro-batch's time: the cost model's ``micro_batch_lower_bound_us``, set by
    ``Scheduler.schedule`` for the one-group micro-batches it refines (all, or ``dp_rank``'s), raised to
    CP-SAT's proven bound where the fallback ran; None for a plan made without a Scheduler."""
    rank_flops: list[float] = field(default_factory=list)
    """Attention + linear FLOPs per rank of the block (a sequence's split evenly over its set)."""

    @classmethod
    def placed(cls, group: int, slot: int, seqs: Sequence[int], lengths: Sequence[int], cp_rank: Sequence[int],
               cp: int, scored: _core.DacpResult, time_us: float | None = None) -> MicroBatchPlan:
        """A one-group micro-batch from a DACP placement (per sequence a CP rank, or DISTRIBUTED
        over the whole group) and the core's scoring of it; ``time_us`` overrides the score's."""
        first_rank, num_ranks = placement_sets(cp_rank, group, cp)
        return cls(
            slot=slot, first_group=group, groups=1, seqs=list(seqs), lengths=list(lengths),
            first_rank=first_rank, num_ranks=num_ranks,
            rank_tokens=list(scored.rank_tokens), comm_bytes=scored.comm_bytes,
            time_us=scored.time_us if time_us is None else time_us, rollbacks=scored.rollbacks,
            moves=scored.moves, rank_flops=list(scored.rank_flops),
        )

    @property
    def cp_of_block(self) -> int:
        return len(self.rank_tokens) // self.groups

    @property
    def block(self) -> range:
        """Global ranks that run this micro-batch."""
        return range(self.first_group * self.cp_of_block, (self.first_group + self.groups) * self.cp_of_block)

    @property
    def cp_rank(self) -> list[int]:
        """For a one-group micro-batch: the DACP placement view (CP rank or DISTRIBUTED; a
        sub-group set shows as DISTRIBUTED, e.g. in CP-SAT's hint)."""
        cp = self.cp_of_block
        return [DISTRIBUTED if n > 1 else r - self.first_group * cp for r, n in zip(self.first_rank, self.num_ranks)]

    @property
    def num_local(self) -> int:
        return sum(1 for n in self.num_ranks if n == 1)

    @property
    def local_tokens(self) -> int:
        return sum(s for s, n in zip(self.lengths, self.num_ranks) if n == 1)

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def bound_gap(self) -> float | None:
        """Predicted time over the lower bound, minus one (None until a bound is set)."""
        if self.lower_bound_us is None or self.lower_bound_us <= 0:
            return None
        return self.time_us / self.lower_bound_us - 1.0


@dataclass
class Plan:
    """Every sequence's micro-batch and rank set for one step."""

    dp: int
    cp: int
    bucket_size: int
    lengths: list[int]
    """Effective lengths in the caller's order (truncated ones shortened)."""
    input_lengths: list[int]
    micro_batch: list[int]
    """Per sequence: index into micro_batches, -1 if dropped."""
    micro_batches: list[MicroBatchPlan]
    """By slot, then first group; each holds its sequences' rank sets (the one copy of them)."""
    slots: int
    group_time_us: list[float]
    """Each CP group's micro-batches back to back (its free-running finish)."""
    makespan_us: float
    """Predicted step time on ``timeline``."""
    dropped: list[int]
    truncated: list[int]
    scheduler_us: float
    """Wall time of the C++ scheduler call (its own clock)."""
    pool: bool = False
    """Rank sets may leave their CP group (policy skrull-pool): the length limit is then the world's."""
    widened: int = 0
    """Sequences sharded over more than one CP group."""
    narrowed: int = 0
    """Sequences sharded over a sub-block of 2 <= k < cp ranks of their CP group."""
    skrull_plan: bool = True
    """skrull's own micro-batches (under skrull-pool: kept because they predicted no slower; with
    ``narrowed`` > 0 some of their sharded sequences then moved to sub-group sets)."""
    fallback_us: float = 0.0
    """Wall time spent in the CP-SAT fallback."""
    rollbacks: int = 0
    refined_dp_rank: int | None = None
    """When set, the CP-SAT fallback looked only at this DP rank's micro-batches."""
    timeline: _core.Timeline = _core.Timeline.LOCKSTEP
    """The timeline the step runs on (the job's): lockstep slots or free-running groups."""
    pad_us: float = 0.0
    """Time of a pad pass (an idle lockstep slot; free-running at DP > 1, a rank with no micro-batch; a
    pad chunk costs more: ``chunked_pad_us``): the cost model's
    ``pad_pass_us()``, one token a CP rank through every layer, not its fixed cost alone."""
    step_us: float = 0.0
    """Time the step pays once whatever its micro-batches: the cost model's step_fixed_us."""
    chunked: list[int] = field(default_factory=list)
    """Lengths of the step's chunked documents (``overlength = "chunk"``, in the step's order): longer
    than ``limit``, outside ``lengths``; each trained whole, in chunks, by one CP group after its
    micro-batches (train/chunked.py)."""
    chunked_us: list[float] = field(default_factory=list)
    """Each chunked document's predicted time on its group (scheduler/chunk_cost.py)."""
    chunked_group: list[int] = field(default_factory=list)
    """Each chunked document's CP group (DP rank): the core's assignment (cpp/include/skrull/chunked.hpp)."""
    chunked_pad_us: list[float] = field(default_factory=list)
    """Per CP group (DP rank): what the pad chunks it runs on a lockstep timeline cost (the core's
    ``lockstep_pad_us``: each a chunk of one token a CP rank after its document's tokens, its K/V
    gathered, recomputed but at its position's last pass); empty where not priced (a plan built by hand)."""
    chunked_chunk: list[int] = field(default_factory=list)
    """Each chunked document's chunk, in tokens: what ``chunked_us`` priced and the trainer runs
    (``SchedulerJob.chunk_for``: the largest that fits a rank's memory model, at most the limit)."""

    @classmethod
    def from_core(cls, s: _core.Plan, input_lengths: Sequence[int], job: SchedulerJob,
                  chunked: Sequence[int] = ()) -> Plan:
        """The core's plan (``_core.to_plan`` or ``_core.schedule_pool``, the same type for every
        policy) as this type: each micro-batch in one comprehension over the core's, the rest
        as it comes. Plain dataclasses rather than a view over the core object, because a plan
        is changed after the core: CP-SAT swaps a micro-batch's placement (``replace_placement``)
        and the simulator builds plans with no core object at all (``from_groups``); a view
        would need an override for each such field. The shape, timeline and costs are ``job``'s
        (the resolved job the Scheduler ran): a pad pass costs its cost model's
        ``pad_pass_us()``, the step its ``step_fixed_us``. ``chunked``: the lengths of the
        chunked documents the core was given the times of."""
        lengths = list(s.lengths)
        mbs = [
            MicroBatchPlan(
                slot=mb.slot, first_group=mb.first_group, groups=mb.groups, seqs=list(mb.seqs),
                lengths=[lengths[k] for k in mb.seqs], first_rank=list(mb.first_rank), num_ranks=list(mb.num_ranks),
                rank_tokens=list(mb.rank_tokens), rank_flops=list(mb.rank_flops), comm_bytes=mb.comm_bytes,
                start_us=mb.start_us, time_us=mb.time_us, rollbacks=mb.rollbacks, moves=mb.moves,
            )
            for mb in s.micro_batches
        ]
        return cls(
            dp=job.dp, cp=job.cp, bucket_size=job.bucket_size, lengths=lengths, input_lengths=list(input_lengths),
            micro_batch=list(s.micro_batch), micro_batches=mbs, slots=s.slots, group_time_us=list(s.group_time_us), makespan_us=s.makespan_us,
            dropped=list(s.dropped), truncated=list(s.truncated), scheduler_us=s.elapsed_us, pool=job.policy.pool,
            widened=s.widened, narrowed=s.narrowed, skrull_plan=s.skrull_plan, rollbacks=s.rollbacks,
            timeline=job.timeline, pad_us=job.cost_model.pad_pass_us(), step_us=job.cost_model.step_fixed_us,
            chunked=list(chunked), chunked_us=list(s.chunked_us), chunked_group=list(s.chunked_group),
            chunked_pad_us=list(s.chunked_pad_us),
        )

    @classmethod
    def from_groups(cls, lengths: Sequence[int], groups: list[list[MicroBatchPlan]], dp: int, cp: int,
                    bucket_size: int, scheduler_us: float, timeline: str | _core.Timeline = "lockstep",
                    pad_us: float = 0.0) -> Plan:
        """A plan of one-group micro-batches listed per CP group in slot order (the simulator's
        baselines), nothing dropped or truncated; timed by the core's slot replay on ``timeline``
        (by name or the core's enum)."""
        n = len(lengths)
        mbs = sorted((mb for g in groups for mb in g), key=lambda mb: (mb.slot, mb.first_group))
        plan = cls(
            dp=dp, cp=cp, bucket_size=bucket_size, lengths=list(lengths), input_lengths=list(lengths),
            micro_batch=[-1] * n, micro_batches=mbs,
            slots=max((mb.slot + 1 for mb in mbs), default=0), group_time_us=[0.0] * dp, makespan_us=0.0,
            dropped=[], truncated=[], scheduler_us=scheduler_us, timeline=timeline_of(timeline), pad_us=pad_us,
        )
        for m, mb in enumerate(mbs):
            for k in mb.seqs:
                plan.micro_batch[k] = m
        plan.retime()
        return plan

    # ------------------------------------------------------------------ views
    @property
    def world(self) -> int:
        return self.dp * self.cp

    def rank_sets(self) -> tuple[list[int], list[int]]:
        """Per sequence: its rank set as (first ranks, sizes), read from the micro-batch that
        stores it; (0, 0) for a dropped one. O(sequences): call once, not per sequence."""
        n = len(self.lengths)
        first, num = [0] * n, [0] * n
        for mb in self.micro_batches:
            for k, r, c in zip(mb.seqs, mb.first_rank, mb.num_ranks):
                if 0 <= k < n:  # validate() names one outside
                    first[k], num[k] = r, c
        return first, num

    @property
    def first_rank(self) -> list[int]:
        """Per sequence: the first global rank of its set (0 if dropped); ``rank_sets``."""
        return self.rank_sets()[0]

    @property
    def num_ranks(self) -> list[int]:
        """Per sequence: ranks in its set, 1 = local (0 if dropped); ``rank_sets``."""
        return self.rank_sets()[1]

    @property
    def dp_rank(self) -> list[int]:
        """Per sequence: the CP group holding (the first rank of) its set, or DROPPED."""
        return [r // self.cp if m >= 0 else DROPPED for r, m in zip(self.first_rank, self.micro_batch)]

    @property
    def cp_rank(self) -> list[int]:
        """Per sequence: its CP rank when local, else DISTRIBUTED (also for a dropped one)."""
        return [r % self.cp if c == 1 else DISTRIBUTED for r, c in zip(*self.rank_sets())]

    @property
    def slot(self) -> list[int]:
        """Per sequence: the slot of its micro-batch (under skrull, its index within its DP
        rank's micro-batches), -1 if dropped."""
        return [self.micro_batches[m].slot if m >= 0 else -1 for m in self.micro_batch]

    @property
    def ranks(self) -> list[list[MicroBatchPlan]]:
        """Per CP group (DP rank), the micro-batches it runs in slot order; a wide
        micro-batch appears in every group it spans."""
        out: list[list[MicroBatchPlan]] = [[] for _ in range(self.dp)]
        for mb in self.micro_batches:
            for g in range(mb.first_group, mb.first_group + mb.groups):
                out[g].append(mb)
        return out

    def group_micro_batches(self, dp_rank: int) -> list[MicroBatchPlan]:
        """Micro-batches one CP group (DP rank) runs, in slot order."""
        if not 0 <= dp_rank < self.dp:
            raise ValueError(f"dp_rank must be in [0, {self.dp}), got {dp_rank}")
        return [mb for mb in self.micro_batches if mb.first_group <= dp_rank < mb.first_group + mb.groups]

    def rank_slots(self, rank: int) -> list[tuple[int, int, list[tuple[int, int, int]]]]:
        """What one global rank runs: per slot it takes part in, (slot, micro-batch
        index, [(sequence, first_rank, num_ranks) for each sequence it holds all or
        a shard of]), in slot order. Its buffer per slot: local sequences whole,
        and its zigzag shard of each sharded one (position rank - first_rank)."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank must be in [0, {self.world}), got {rank}")
        out = []
        for m, mb in enumerate(self.micro_batches):
            if rank in mb.block:
                out.append((mb.slot, m, [(k, r, n) for k, r, n in zip(mb.seqs, mb.first_rank, mb.num_ranks)
                                         if r <= rank < r + n]))
        return out

    def chunked_load(self) -> list[float]:
        """Per CP group (DP rank): the predicted time of the chunked documents it runs."""
        out = [0.0] * self.dp
        for g, t in zip(self.chunked_group, self.chunked_us):
            out[g] += t
        return out

    def chunked_passes(self) -> list[int] | None:
        """Each chunked document's chunk passes in the chunk ``chunked_chunk`` priced, or None where
        that is not set (a plan built by hand: its lockstep pads are then not priced)."""
        if len(self.chunked_chunk) != len(self.chunked):
            return None
        return [chunk_passes(n, c) for n, c in zip(self.chunked, self.chunked_chunk)]

    def chunked_pads(self) -> list[int]:
        """Per CP group (DP rank): the pad chunks it runs on a lockstep timeline at DP > 1, its chunked
        documents padded to the other groups' pass counts and all-pad ones where it has none
        (the core's rule, cpp/include/skrull/chunked.hpp; ``chunked_passes``); zeros otherwise."""
        passes = self.chunked_passes()
        if self.dp <= 1 or not self.chunked or passes is None:
            return [0] * self.dp
        return _core.lockstep_pads(passes, self.chunked_group, self.dp)

    def chunked_of(self, dp_rank: int) -> list[int]:
        """Positions (in ``chunked``) of the chunked documents DP rank ``dp_rank`` trains, in order."""
        return [k for k, g in enumerate(self.chunked_group) if g == dp_rank]

    @property
    def num_sequences(self) -> int:
        return len(self.lengths)

    @property
    def trained(self) -> list[int]:
        """The sequences the plan trains, by position: the one answer to which they are (a
        dropped one has micro-batch -1); the loader's loss tokens and token counts read it."""
        return [k for k, m in enumerate(self.micro_batch) if m >= 0]

    @property
    def trained_lengths(self) -> list[int]:
        """The effective lengths of the sequences the plan trains (``trained``)."""
        return [self.lengths[k] for k in self.trained]

    @property
    def limit(self) -> int:
        """The longest sequence the plan's ranks may hold: a CP group's, or under skrull-pool the world's."""
        return Capacity(self.bucket_size, self.cp, self.dp, pool=self.pool).limit

    def summary(self) -> dict[str, float]:
        """Per-step figures for logging: what ran local, what was sharded, balance."""
        live = self.trained
        num_ranks = self.num_ranks
        tok = sum(self.lengths[k] for k in live)
        mean = sum(self.group_time_us) / len(self.group_time_us) if self.group_time_us else 0.0
        rank_tokens = [t for mb in self.micro_batches for t in mb.rank_tokens]
        gaps = [g for g in (mb.bound_gap for mb in self.micro_batches) if g is not None]
        return {
            "sequences": len(live),
            "micro_batches": len(self.micro_batches),
            "max_micro_batches": self.slots,
            "local_seq_share": sum(num_ranks[k] == 1 for k in live) / len(live) if live else 0.0,
            "local_token_share": sum(self.lengths[k] for k in live if num_ranks[k] == 1) / tok if tok else 0.0,
            "widened": self.widened,
            "narrowed": self.narrowed,
            "skrull_plan": float(self.skrull_plan),
            "rollbacks": self.rollbacks,
            "refine_moves": sum(mb.moves for mb in self.micro_batches),
            "cpsat_used": sum(1 for mb in self.micro_batches if mb.path == "cpsat"),
            "mean_bound_gap": sum(gaps) / len(gaps) if gaps else float("nan"),
            "dropped": len(self.dropped),
            "truncated": len(self.truncated),
            "chunked": len(self.chunked),
            "chunked_us": sum(self.chunked_us),
            "scheduler_us": self.scheduler_us,
            "fallback_us": self.fallback_us,
            "predicted_us": self.makespan_us,
            **{f"predicted_{name}_us": self.step_time_us(t) for name, t in TIMELINES.items()},
            "dp_imbalance": self.makespan_us / mean if mean > 0 else 1.0,
            "max_rank_tokens": max(rank_tokens, default=0),
            "rank_token_imbalance": _imbalance(self.rank_totals()),
            # NaN only for micro-batches built by hand without per-rank FLOPs.
            "rank_flop_imbalance": (_imbalance(self.rank_totals("rank_flops"))
                                    if all(mb.rank_flops for mb in self.micro_batches) else float("nan")),
        }

    def rank_totals(self, what: str = "rank_tokens") -> list[float]:
        """Per global rank (DP-major), ``what`` ('rank_tokens' or 'rank_flops') summed over its micro-batches."""
        out = [0.0] * self.world
        for mb in self.micro_batches:
            for i, t in enumerate(getattr(mb, what)):
                out[mb.first_group * self.cp + i] += t
        return out

    # ---------------------------------------------------------------- updates
    def replace_placement(self, mb: MicroBatchPlan, result: _core.DacpResult, path: str) -> None:
        """Swap in another DACP placement of a one-group micro-batch (e.g. CP-SAT's) and re-time the plan."""
        if mb.groups != 1 or len(result.cp_rank) != len(mb.seqs):
            raise PlanError("replace_placement takes a one-group micro-batch and one placement per sequence")
        mb.heuristic_time_us = mb.time_us if mb.heuristic_time_us is None else mb.heuristic_time_us
        mb.first_rank, mb.num_ranks = placement_sets(result.cp_rank, mb.first_group, self.cp)
        mb.rank_tokens = list(result.rank_tokens)
        mb.rank_flops = list(result.rank_flops)
        mb.comm_bytes = result.comm_bytes
        mb.time_us = result.time_us
        mb.path = path
        # CP-SAT places on whole groups: sub-group sets it replaced are gone.
        self.narrowed = sum(1 for k, m in zip(self.num_ranks, self.micro_batch) if m >= 0 and 1 < k < self.cp)
        self.retime()

    def retime(self) -> None:
        """Each group's finish, each micro-batch's start and the step, from the micro-batch times."""
        self.group_time_us, starts, self.makespan_us = self._timeline()
        for m, s in zip(self.micro_batches, starts):
            m.start_us = s

    def step_time_us(self, timeline: _core.Timeline | None = None) -> float:
        """The step on ``timeline`` (default: the plan's own), from its slots (the core's timeline function)."""
        timeline = self.timeline if timeline is None else timeline
        return _core.plan_step_time_us(self._slot_times(), self.dp, timeline, self.pad_us, self.step_us,
                                       self._after_us(timeline))

    def _after_us(self, timeline: _core.Timeline) -> list[float]:
        """What each group runs besides its micro-batches (its chunked documents, run before them), or [] for
        none; on a lockstep timeline with the pad chunks it runs (``chunked_pads``) at ``chunked_pad_us``
        (the core's ``chunked_after``, as the core's own plans price it)."""
        if not self.chunked_us:
            return []
        return _core.chunked_after(self.chunked_us, self.chunked_group, self.dp, timeline, self.chunked_pad_us)

    def _slot_times(self) -> list[_core.SlotTime]:
        return [_core.SlotTime(mb.slot, mb.first_group, mb.groups, mb.time_us) for mb in self.micro_batches]

    def _timeline(self) -> tuple[list[float], list[float], float]:
        """The core's replay of the slots (timeline.hpp): each group's free-running finish,
        each micro-batch's start on the plan's timeline, and the step on it."""
        step, group_free, starts = _core.plan_timeline(self._slot_times(), self.dp, self.timeline, self.pad_us,
                                                       self.step_us, self._after_us(self.timeline))
        return group_free, starts, step

    # ------------------------------------------------------------- invariants
    def validate(self, dp_rank: int | None = None) -> None:
        """Raise PlanError naming the first broken invariant (plan_check.py lists them);
        with ``dp_rank``, other ranks' micro-batches for exactly-once and times only."""
        check_plan(self, dp_rank)

    def digest(self) -> str:
        """Hash of everything that decides what each rank computes; equal on every rank."""
        h = hashlib.sha256()
        h.update(struct.pack("<3q", self.dp, self.cp, self.bucket_size))
        for arr in (self.lengths, self.micro_batch, *self.rank_sets()):
            h.update(struct.pack(f"<{len(arr)}q", *arr))
        for mb in self.micro_batches:
            h.update(struct.pack(f"<3q{len(mb.seqs)}q", mb.slot, mb.first_group, mb.groups, *mb.seqs))
        if self.chunked:  # a plan without chunked documents hashes as before they existed
            for arr in (self.chunked, self.chunked_group):
                h.update(struct.pack(f"<q{len(arr)}q", len(arr), *arr))
        return h.hexdigest()


__all__ = ["DROPPED", "MicroBatchPlan", "Plan", "PlanError"]
