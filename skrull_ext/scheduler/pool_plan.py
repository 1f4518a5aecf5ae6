"""The plan of one global batch under policy ``skrull-pool``.

The world is DP x CP ranks, global rank = dp_rank * cp + cp_rank. Each
micro-batch sits at a *slot* on a block of CP groups (DP ranks); every rank
of the block runs it at that slot, and a rank runs its micro-batches in slot
order. Each sequence of a micro-batch has a *rank set*, the contiguous
global ranks ``[first_rank, first_rank + num_ranks)`` inside the block:
one rank (local, whole), an aligned sub-block of one CP group (2 <= k <
cp ranks, k a power of two, at a multiple of k inside the group: a
one-group micro-batch's sequence narrowed where that predicts faster), one
CP group (sharded as skrull shards), or the whole block of groups (sharded
wider, zigzag over ``num_ranks`` ranks).

A rank's buffers per slot come from ``rank_slots(rank)``. Built from the
core's ``PoolSchedule`` (cpp/include/skrull/pool.hpp); ``validate()``
re-checks coverage, rank sets, memory and times with plain arithmetic.
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass, field

from skrull_ext import _core
from skrull_ext._core import DISTRIBUTED
from skrull_ext.scheduler.capacity import Capacity
from skrull_ext.scheduler.config import TIMELINES
from skrull_ext.scheduler.plan import PlanError, _imbalance


def _shard(s: int, k: int) -> int:
    """Tokens one of k ranks holds of a sequence of s tokens (the core's zigzag rule)."""
    return s if k <= 1 else 2 * -(-s // (2 * k))


def _rank_flops(mb: PoolMicroBatchPlan, cost: _core.CostModel) -> list[float]:
    """Per-layer forward FLOPs of each rank of the block (the core's DacpResult
    rule: a local sequence's on its rank, a sharded one's 1/k on each of its k)."""
    base = mb.first_group * mb.cp_of_block
    out = [0.0] * len(mb.rank_tokens)
    for s, r, n in zip(mb.lengths, mb.first_rank, mb.num_ranks):
        f = cost.flops(s) / n
        for i in range(r - base, r - base + n):
            out[i] += f
    return out


@dataclass
class PoolMicroBatchPlan:
    """One micro-batch: a slot on the CP groups [first_group, first_group + groups)."""

    slot: int
    first_group: int
    groups: int
    seqs: list[int]
    lengths: list[int]
    first_rank: list[int]
    """Per sequence: the first global rank of its rank set."""
    num_ranks: list[int]
    """Per sequence: ranks in its set (1 = local)."""
    rank_tokens: list[int]
    """Tokens per rank of the block, in global rank order."""
    comm_bytes: float
    start_us: float
    time_us: float
    rollbacks: int = 0
    moves: int = 0
    path: str = "heuristic"
    heuristic_time_us: float | None = None
    lower_bound_us: float | None = None
    rank_flops: list[float] = field(default_factory=list)

    @property
    def block(self) -> range:
        """Global ranks that run this micro-batch."""
        return range(self.first_group * self.cp_of_block, (self.first_group + self.groups) * self.cp_of_block)

    @property
    def cp_of_block(self) -> int:
        return len(self.rank_tokens) // self.groups

    @property
    def cp_rank(self) -> list[int]:
        """For a one-group micro-batch: skrull's placement view (CP rank or DISTRIBUTED;
        a sub-group set shows as DISTRIBUTED, e.g. in CP-SAT's hint)."""
        cp = self.cp_of_block
        return [DISTRIBUTED if n > 1 else r - self.first_group * cp for r, n in zip(self.first_rank, self.num_ranks)]

    @property
    def num_local(self) -> int:
        return sum(1 for n in self.num_ranks if n == 1)

    @property
    def local_tokens(self) -> int:
        return sum(s for s, n in zip(self.lengths, self.num_ranks) if n == 1)


@dataclass
class PoolPlan:
    """Every sequence's micro-batch and rank set for one step (policy skrull-pool)."""

    dp: int
    cp: int
    bucket_size: int
    lengths: list[int]
    input_lengths: list[int]
    micro_batch: list[int]
    """Per sequence: index into micro_batches, -1 if dropped."""
    first_rank: list[int]
    num_ranks: list[int]
    micro_batches: list[PoolMicroBatchPlan]
    """By slot, then first group."""
    slots: int
    group_time_us: list[float]
    makespan_us: float
    dropped: list[int]
    truncated: list[int]
    widened: int
    """Sequences sharded over more than one CP group."""
    skrull_plan: bool
    """True when the core kept skrull's micro-batches (it predicted no slower); with
    ``narrowed`` > 0 some of their sharded sequences then moved to sub-group sets."""
    scheduler_us: float
    narrowed: int = 0
    """Sequences sharded over a sub-block of 2 <= k < cp ranks of their CP group."""
    fallback_us: float = 0.0
    rollbacks: int = 0
    refined_dp_rank: int | None = None
    timeline: str = "lockstep"
    """The timeline the step runs on (config.TIMELINES); ``makespan_us`` and ``start_us`` are on it."""
    pad_us: float = 0.0
    """Time of a pad pass on a lockstep timeline (the cost model's micro_batch_fixed_us)."""

    @classmethod
    def from_core(cls, s: _core.PoolSchedule, input_lengths: list[int], dp: int, cp: int, bucket_size: int,
                  cost: _core.CostModel | None = None, timeline: str = "lockstep") -> PoolPlan:
        """With ``cost``, each micro-batch's ``rank_flops`` is filled as skrull's
        DACP result fills it (a sequence's FLOPs split evenly over its rank set)."""
        lengths = list(s.lengths)
        mbs = [
            PoolMicroBatchPlan(
                slot=mb.slot, first_group=mb.first_group, groups=mb.groups, seqs=list(mb.seqs),
                lengths=[lengths[k] for k in mb.seqs], first_rank=list(mb.first_rank), num_ranks=list(mb.num_ranks),
                rank_tokens=list(mb.rank_tokens), comm_bytes=mb.comm_bytes, start_us=mb.start_us, time_us=mb.time_us,
                rollbacks=mb.rollbacks, moves=mb.moves,
            )
            for mb in s.micro_batches
        ]
        if cost is not None:
            for mb in mbs:
                mb.rank_flops = _rank_flops(mb, cost)
        return cls(
            dp=dp, cp=cp, bucket_size=bucket_size, lengths=lengths, input_lengths=list(input_lengths),
            micro_batch=list(s.micro_batch), first_rank=list(s.first_rank), num_ranks=list(s.num_ranks),
            micro_batches=mbs, slots=s.slots, group_time_us=list(s.group_time_us), makespan_us=s.makespan_us,
            dropped=list(s.dropped), truncated=list(s.truncated), widened=s.widened, skrull_plan=s.skrull_plan,
            scheduler_us=s.elapsed_us, narrowed=s.narrowed, rollbacks=s.rollbacks, timeline=timeline,
            pad_us=cost.micro_batch_fixed_us if cost is not None else 0.0,
        )

    # ------------------------------------------------------------------ views
    @property
    def world(self) -> int:
        return self.dp * self.cp

    @property
    def dp_time_us(self) -> list[float]:
        """Predicted finish of each CP group (the name Plan uses)."""
        return self.group_time_us

    @property
    def ranks(self) -> list[list[PoolMicroBatchPlan]]:
        """Per CP group (DP rank), the micro-batches it runs in slot order; a wide
        micro-batch appears in every group it spans."""
        out: list[list[PoolMicroBatchPlan]] = [[] for _ in range(self.dp)]
        for mb in self.micro_batches:
            for g in range(mb.first_group, mb.first_group + mb.groups):
                out[g].append(mb)
        return out

    def all_micro_batches(self) -> list[PoolMicroBatchPlan]:
        return list(self.micro_batches)

    @property
    def num_micro_batches(self) -> int:
        """Slots: every rank steps through them together (empty slots idle)."""
        return self.slots

    @property
    def num_sequences(self) -> int:
        return len(self.lengths)

    def rank_slots(self, rank: int) -> list[tuple[int, int, list[tuple[int, int, int]]]]:
        """What one global rank runs: per slot it takes part in, (slot, micro-batch
        index, [(sequence, first_rank, num_ranks) for each sequence it holds all or
        a shard of]), in slot order. Its buffer per slot: local sequences whole,
        and its zigzag shard of each sharded one (position rank - first_rank)."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank must be in [0, {self.world}), got {rank}")
        out = []
        for m, mb in enumerate(self.micro_batches):
            if not mb.first_group * self.cp <= rank < (mb.first_group + mb.groups) * self.cp:
                continue
            mine = [(k, r, n) for k, r, n in zip(mb.seqs, mb.first_rank, mb.num_ranks) if r <= rank < r + n]
            out.append((mb.slot, m, mine))
        return out

    def summary(self) -> dict[str, float]:
        live = [k for k in range(len(self.lengths)) if self.micro_batch[k] >= 0]
        tok = sum(self.lengths[k] for k in live)
        mean = sum(self.group_time_us) / len(self.group_time_us) if self.group_time_us else 0.0
        rank_tokens = [t for mb in self.micro_batches for t in mb.rank_tokens]
        gaps = [mb.time_us / mb.lower_bound_us - 1.0 for mb in self.micro_batches
                if mb.lower_bound_us is not None and mb.lower_bound_us > 0]
        return {
            "sequences": len(live),
            "micro_batches": len(self.micro_batches),
            "max_micro_batches": self.slots,
            "local_seq_share": sum(self.num_ranks[k] == 1 for k in live) / len(live) if live else 0.0,
            "local_token_share": sum(self.lengths[k] for k in live if self.num_ranks[k] == 1) / tok if tok else 0.0,
            "widened": self.widened,
            "narrowed": self.narrowed,
            "skrull_plan": float(self.skrull_plan),
            "rollbacks": self.rollbacks,
            "refine_moves": sum(mb.moves for mb in self.micro_batches),
            "cpsat_used": sum(1 for mb in self.micro_batches if mb.path == "cpsat"),
            "mean_bound_gap": sum(gaps) / len(gaps) if gaps else float("nan"),
            "dropped": len(self.dropped),
            "truncated": len(self.truncated),
            "scheduler_us": self.scheduler_us,
            "fallback_us": self.fallback_us,
            "predicted_us": self.makespan_us,
            **{f"predicted_{t}_us": self.step_time_us(t) for t in TIMELINES},
            "dp_imbalance": self.makespan_us / mean if mean > 0 else 1.0,
            "max_rank_tokens": max(rank_tokens, default=0),
            "rank_token_imbalance": _imbalance(self.rank_totals()),
            # NaN only for a plan built without a cost model (from_core's ``cost``).
            "rank_flop_imbalance": (_imbalance(self.rank_totals("rank_flops"))
                                    if all(mb.rank_flops for mb in self.micro_batches) else float("nan")),
        }

    def rank_totals(self, what: str = "rank_tokens") -> list[float]:
        """Per global rank, ``what`` ('rank_tokens' or 'rank_flops') summed over its micro-batches."""
        out = [0.0] * self.world
        for mb in self.micro_batches:
            for i, t in enumerate(getattr(mb, what)):
                out[mb.first_group * self.cp + i] += t
        return out

    def describe(self, max_seqs: int = 12) -> str:
        lines = [f"pool plan: {self.num_sequences} sequences, dp={self.dp} cp={self.cp} bucket_size={self.bucket_size}, "
                 f"{self.slots} slots, {self.widened} widened, {self.narrowed} narrowed, predicted {self.makespan_us / 1e3:.2f} ms"
                 + (" (skrull's plan)" if self.skrull_plan else "")]
        for mb in self.micro_batches:
            seqs = [f"{k}:{s}@{r}+{n}" for k, s, r, n in zip(mb.seqs, mb.lengths, mb.first_rank, mb.num_ranks)]
            more = f" ... (+{len(seqs) - max_seqs})" if len(seqs) > max_seqs else ""
            lines.append(f"  slot {mb.slot} groups {mb.first_group}..{mb.first_group + mb.groups - 1} "
                         f"{mb.start_us / 1e3:.2f}+{mb.time_us / 1e3:.2f} ms: " + " ".join(seqs[:max_seqs]) + more)
        return "\n".join(lines)

    # ---------------------------------------------------------------- updates
    def replace_placement(self, mb: PoolMicroBatchPlan, result: _core.DacpResult, path: str) -> None:
        """Swap in another DACP placement of a one-group micro-batch (e.g. CP-SAT's) and re-time the plan."""
        if mb.groups != 1 or len(result.cp_rank) != len(mb.seqs):
            raise PlanError("replace_placement takes a one-group micro-batch and one placement per sequence")
        base = mb.first_group * self.cp
        mb.heuristic_time_us = mb.time_us if mb.heuristic_time_us is None else mb.heuristic_time_us
        mb.first_rank = [base if r == DISTRIBUTED else base + r for r in result.cp_rank]
        mb.num_ranks = [self.cp if r == DISTRIBUTED and self.cp > 1 else 1 for r in result.cp_rank]
        mb.rank_tokens = list(result.rank_tokens)
        mb.rank_flops = list(result.rank_flops)
        mb.comm_bytes = result.comm_bytes
        mb.time_us = result.time_us
        mb.path = path
        for k, r, n in zip(mb.seqs, mb.first_rank, mb.num_ranks):
            self.first_rank[k], self.num_ranks[k] = r, n
        # CP-SAT places on whole groups: sub-group sets it replaced are gone.
        self.narrowed = sum(1 for k, m in zip(self.num_ranks, self.micro_batch) if m >= 0 and 1 < k < self.cp)
        self.group_time_us, starts, self.makespan_us = self._timeline()
        for m, s in zip(self.micro_batches, starts):
            m.start_us = s

    def step_time_us(self, timeline: str | None = None) -> float:
        """The step on ``timeline`` (default: the plan's own), from its slots (the core's timeline function)."""
        return _core.pool_step_time_us(self._slot_times(), self.dp, TIMELINES[timeline or self.timeline], self.pad_us)

    def _slot_times(self) -> list[_core.SlotTime]:
        return [_core.SlotTime(mb.slot, mb.first_group, mb.groups, mb.time_us) for mb in self.micro_batches]

    def _timeline(self) -> tuple[list[float], list[float], float]:
        """The core's replay of the slots (timeline.hpp): each group's free-running finish,
        each micro-batch's start on the plan's timeline, and the step on it."""
        step, group_free, starts = _core.pool_timeline(self._slot_times(), self.dp, TIMELINES[self.timeline],
                                                       self.pad_us)
        return group_free, starts, step

    # ------------------------------------------------------------- invariants
    def validate(self) -> None:
        """Raise PlanError naming the first broken invariant.

        Checks: every sequence not dropped is in exactly one micro-batch, the
        per-sequence arrays agree with it; rank sets are one rank, an aligned
        power-of-two sub-block of one CP group, one whole CP group, or the
        whole block of an aligned power-of-two (or all-dp) run of groups,
        inside the micro-batch's block; each rank's tokens
        (local whole, sharded as a zigzag shard over its set) match and stay
        within bucket_size; a group runs at most one micro-batch per slot;
        only sequences beyond bucket_size x dp x cp are truncated or dropped;
        the slot timeline gives the plan's times.
        """
        n = len(self.input_lengths)
        for name in ("lengths", "micro_batch", "first_rank", "num_ranks"):
            if len(getattr(self, name)) != n:
                raise PlanError(f"plan.{name} has {len(getattr(self, name))} entries for {n} sequences")
        limit = Capacity(self.bucket_size, self.cp, self.dp, pool=True).limit
        dropped, truncated = set(self.dropped), set(self.truncated)
        for k in range(n):
            s_in, s = self.input_lengths[k], self.lengths[k]
            if k in dropped:
                if s_in <= limit or self.micro_batch[k] != -1:
                    raise PlanError(f"sequence {k} (length {s_in}) dropped though the world holds {limit}, or placed")
                continue
            if k in truncated:
                if not (s_in > limit and s == limit):
                    raise PlanError(f"sequence {k} truncated from {s_in} to {s}, expected to the world limit {limit}")
            elif s != s_in:
                raise PlanError(f"sequence {k} length changed from {s_in} to {s} without truncation")
        seen = [0] * n
        busy: set[tuple[int, int]] = set()
        for m, mb in enumerate(self.micro_batches):
            where = f"micro-batch {m} (slot {mb.slot}, groups {mb.first_group}+{mb.groups})"
            if not (mb.groups >= 1 and 0 <= mb.first_group and mb.first_group + mb.groups <= self.dp):
                raise PlanError(f"{where} spans groups outside [0, {self.dp})")
            if mb.groups > 1 and not (mb.groups == self.dp or
                                      (mb.groups & (mb.groups - 1) == 0 and mb.first_group % mb.groups == 0)):
                raise PlanError(f"{where}: a block of groups must be aligned, a power of two, or all {self.dp}")
            for g in range(mb.first_group, mb.first_group + mb.groups):
                if (g, mb.slot) in busy:
                    raise PlanError(f"{where}: group {g} already runs a micro-batch at slot {mb.slot}")
                busy.add((g, mb.slot))
            lo, hi = mb.first_group * self.cp, (mb.first_group + mb.groups) * self.cp
            if not mb.seqs or not (len(mb.seqs) == len(mb.lengths) == len(mb.first_rank) == len(mb.num_ranks)):
                raise PlanError(f"{where} is empty or its per-sequence lists differ in length")
            tokens = [0] * (hi - lo)
            for k, s, r, c in zip(mb.seqs, mb.lengths, mb.first_rank, mb.num_ranks):
                if not 0 <= k < n:
                    raise PlanError(f"{where} holds sequence {k}, outside [0, {n})")
                seen[k] += 1
                if (self.micro_batch[k], self.first_rank[k], self.num_ranks[k], self.lengths[k]) != (m, r, c, s):
                    raise PlanError(f"sequence {k}: the plan's arrays disagree with {where}")
                whole_group = c == self.cp and (r - lo) % self.cp == 0
                whole_block = c == hi - lo and r == lo
                at = (r - lo) % self.cp  # offset inside its CP group
                sub_group = 2 <= c < self.cp and c & (c - 1) == 0 and at % c == 0 and at + c <= self.cp
                if not (c == 1 or sub_group or whole_group or whole_block) or not lo <= r < r + c <= hi:
                    raise PlanError(f"{where}: sequence {k} has rank set [{r}, {r + c}), not one rank, an aligned "
                                    f"power-of-two part of a CP group, a CP group or the block [{lo}, {hi})")
                for i in range(r - lo, r - lo + c):
                    tokens[i] += _shard(s, c)
            if tokens != list(mb.rank_tokens):
                raise PlanError(f"{where}: rank tokens {list(mb.rank_tokens)} but its rank sets give {tokens}")
            if max(tokens) > self.bucket_size:
                raise PlanError(f"{where}: a rank holds {max(tokens)} tokens > bucket_size {self.bucket_size}")
            if not (math.isfinite(mb.time_us) and mb.time_us >= 0):
                raise PlanError(f"{where}: predicted time {mb.time_us} is not finite and non-negative")
        for k in range(n):
            want = 0 if k in dropped else 1
            if seen[k] != want:
                raise PlanError(f"sequence {k} appears in {seen[k]} micro-batches, expected {want}")
        clock, starts, step = self._timeline()
        for m, (mb, s) in enumerate(zip(self.micro_batches, starts)):
            if not math.isclose(mb.start_us, s, rel_tol=1e-9, abs_tol=1e-6):
                raise PlanError(f"micro-batch {m} starts at {mb.start_us}, its slots say {s}")
        for g, (a, b) in enumerate(zip(clock, self.group_time_us)):
            if not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6):
                raise PlanError(f"group {g}: its micro-batches finish at {a}, the plan says {b}")
        if not math.isclose(self.makespan_us, step, rel_tol=1e-9, abs_tol=1e-6):
            raise PlanError(f"makespan {self.makespan_us} is not the {self.timeline} step time {step} of its slots")

    def digest(self) -> str:
        """Hash of everything that decides what each rank computes; equal on every rank."""
        h = hashlib.sha256()
        h.update(struct.pack("<3q", self.dp, self.cp, self.bucket_size))
        for arr in (self.lengths, self.micro_batch, self.first_rank, self.num_ranks):
            h.update(struct.pack(f"<{len(arr)}q", *arr))
        for mb in self.micro_batches:
            h.update(struct.pack(f"<3q{len(mb.seqs)}q", mb.slot, mb.first_group, mb.groups, *mb.seqs))
        return h.hexdigest()
