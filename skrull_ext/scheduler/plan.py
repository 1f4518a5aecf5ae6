"""The plan of one global batch, as users and the dataloader see it.

Built from the core's ``Schedule``; the CP-SAT fallback may replace a
micro-batch's placement afterwards (``replace_placement``). ``validate()``
re-checks every invariant with plain arithmetic, independent of the core.
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

DROPPED = _core.DROPPED


class PlanError(ValueError):
    """A plan breaks one of its invariants."""


def _imbalance(values: list[float]) -> float:
    """max / mean (1.0 is perfect balance; 1.0 for nothing at all)."""
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else 1.0


@dataclass
class MicroBatchPlan:
    """One micro-batch of one DP rank on its CP group."""

    dp_rank: int
    index: int
    seqs: list[int]
    """Global indices of the sequences, in buffer order."""
    lengths: list[int]
    """Effective lengths, parallel to seqs."""
    cp_rank: list[int]
    """Placement parallel to seqs: a CP rank, or DISTRIBUTED (-1)."""
    rank_tokens: list[int]
    comm_bytes: float
    time_us: float
    rollbacks: int
    moves: int = 0
    """Refinement moves after DACP (policy 'skrull')."""
    path: str = "heuristic"
    """'heuristic', or 'cpsat' when the exact solver's placement replaced it."""
    heuristic_time_us: float | None = None
    """Predicted time of the heuristic's placement, kept when CP-SAT replaced it."""
    lower_bound_us: float | None = None
    """Lower bound on this micro-batch's time: the cost model's ``micro_batch_lower_bound_us``, set by
    ``Scheduler.schedule`` for the micro-batches it refines (all, or ``dp_rank``'s), raised to CP-SAT's
    proven bound where the fallback ran; None for a plan made without a Scheduler (``from_core``)."""
    rank_flops: list[float] = field(default_factory=list)
    """Attention + linear FLOPs per CP rank (local sequences whole, distributed ones 1/N each)."""

    @property
    def num_local(self) -> int:
        return sum(1 for r in self.cp_rank if r != DISTRIBUTED)

    @property
    def local_tokens(self) -> int:
        return sum(s for s, r in zip(self.lengths, self.cp_rank) if r != DISTRIBUTED)

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def bound_gap(self) -> float | None:
        """Predicted time over the lower bound, minus one (None until the fallback computed a bound)."""
        if self.lower_bound_us is None or self.lower_bound_us <= 0:
            return None
        return self.time_us / self.lower_bound_us - 1.0


@dataclass
class Plan:
    """Every sequence's DP rank, micro-batch and CP placement for one step."""

    dp: int
    cp: int
    bucket_size: int
    lengths: list[int]
    """Effective lengths in the caller's order (truncated ones shortened)."""
    input_lengths: list[int]
    dp_rank: list[int]
    micro_batch: list[int]
    cp_rank: list[int]
    ranks: list[list[MicroBatchPlan]]
    dropped: list[int]
    truncated: list[int]
    scheduler_us: float
    """Wall time of the C++ scheduler call (its own clock)."""
    fallback_us: float = 0.0
    """Wall time spent in the CP-SAT fallback."""
    rollbacks: int = 0
    dp_time_us: list[float] = field(default_factory=list)
    """Each DP rank's micro-batches back to back."""
    makespan_us: float = 0.0
    """Predicted step time on ``timeline`` (``step_time_us``)."""
    refined_dp_rank: int | None = None
    """When set, the CP-SAT fallback looked only at this DP rank's micro-batches."""
    timeline: str = "lockstep"
    """The timeline the step runs on (config.TIMELINES): lockstep slots or free-running ranks."""
    pad_us: float = 0.0
    """Time of a pad pass on a lockstep timeline: the cost model's micro_batch_fixed_us."""

    @classmethod
    def from_core(cls, s: _core.Schedule, input_lengths: list[int], dp: int, cp: int, bucket_size: int,
                  timeline: str = "lockstep", pad_us: float = 0.0) -> Plan:
        lengths = list(s.lengths)
        ranks: list[list[MicroBatchPlan]] = [[] for _ in range(dp)]
        for mb in s.micro_batches:
            d = mb.dacp
            seqs = list(mb.seqs)
            ranks[mb.dp_rank].append(
                MicroBatchPlan(
                    dp_rank=mb.dp_rank, index=mb.index, seqs=seqs, lengths=[lengths[k] for k in seqs],
                    cp_rank=list(d.cp_rank), rank_tokens=list(d.rank_tokens), comm_bytes=d.comm_bytes,
                    time_us=d.time_us, rollbacks=d.rollbacks, moves=d.moves, rank_flops=list(d.rank_flops),
                )
            )
        return cls(
            dp=dp, cp=cp, bucket_size=bucket_size, lengths=lengths, input_lengths=list(input_lengths),
            dp_rank=list(s.dp_rank), micro_batch=list(s.micro_batch), cp_rank=list(s.cp_rank), ranks=ranks,
            dropped=list(s.dropped), truncated=list(s.truncated), scheduler_us=s.elapsed_us,
            rollbacks=s.rollbacks, dp_time_us=list(s.dp_time_us), makespan_us=s.makespan_us,
            timeline=timeline, pad_us=pad_us,
        )

    def step_time_us(self, timeline: str | None = None) -> float:
        """The step on ``timeline`` (default: the plan's own), from its micro-batch times (the core's
        timeline function)."""
        return _core.step_time_us([[mb.time_us for mb in rank] for rank in self.ranks],
                                  TIMELINES[timeline or self.timeline], self.pad_us)

    # ------------------------------------------------------------------ views
    def micro_batches(self, dp_rank: int) -> list[MicroBatchPlan]:
        """Micro-batches of one DP rank, in execution order."""
        if not 0 <= dp_rank < self.dp:
            raise ValueError(f"dp_rank must be in [0, {self.dp}), got {dp_rank}")
        return self.ranks[dp_rank]

    def all_micro_batches(self) -> list[MicroBatchPlan]:
        return [mb for rank in self.ranks for mb in rank]

    @property
    def num_micro_batches(self) -> int:
        """Most micro-batches of any DP rank (FSDP ranks must step together)."""
        return max((len(r) for r in self.ranks), default=0)

    @property
    def num_sequences(self) -> int:
        return len(self.lengths)

    def summary(self) -> dict[str, float]:
        """Per-step figures for logging: what ran local, what was sharded, balance."""
        mbs = self.all_micro_batches()
        live = [k for k in range(len(self.lengths)) if self.dp_rank[k] != DROPPED]
        n_local = sum(mb.num_local for mb in mbs)
        tok = sum(self.lengths[k] for k in live)
        tok_local = sum(mb.local_tokens for mb in mbs)
        rank_tokens = [t for mb in mbs for t in mb.rank_tokens]
        mean_dp = sum(self.dp_time_us) / len(self.dp_time_us) if self.dp_time_us else 0.0
        gaps = [g for g in (mb.bound_gap for mb in mbs) if g is not None]
        return {
            "sequences": len(live),
            "micro_batches": len(mbs),
            "max_micro_batches": self.num_micro_batches,
            "local_seq_share": n_local / len(live) if live else 0.0,
            "local_token_share": tok_local / tok if tok else 0.0,
            "rollbacks": self.rollbacks,
            "refine_moves": sum(mb.moves for mb in mbs),
            "cpsat_used": sum(1 for mb in mbs if mb.path == "cpsat"),
            "mean_bound_gap": sum(gaps) / len(gaps) if gaps else float("nan"),
            "dropped": len(self.dropped),
            "truncated": len(self.truncated),
            "scheduler_us": self.scheduler_us,
            "fallback_us": self.fallback_us,
            "predicted_us": self.makespan_us,
            **{f"predicted_{t}_us": self.step_time_us(t) for t in TIMELINES},
            "dp_imbalance": self.makespan_us / mean_dp if mean_dp > 0 else 1.0,
            "max_rank_tokens": max(rank_tokens, default=0),
            "rank_token_imbalance": _imbalance(self.rank_totals("rank_tokens")),
            "rank_flop_imbalance": _imbalance(self.rank_totals("rank_flops")),
        }

    def rank_totals(self, what: str) -> list[float]:
        """Per (DP rank, CP rank), ``what`` ('rank_tokens' or 'rank_flops') summed
        over its micro-batches; DP-major."""
        out = []
        for rank in self.ranks:
            totals = [0.0] * self.cp
            for mb in rank:
                for c, v in enumerate(getattr(mb, what)):
                    totals[c] += v
            out += totals
        return out

    def describe(self, max_seqs: int = 12) -> str:
        """A readable listing: per DP rank and micro-batch, each sequence's index,
        length and placement ('D' = distributed), tokens per CP rank, predicted time."""
        lines = [
            f"plan: {self.num_sequences} sequences, dp={self.dp} cp={self.cp} bucket_size={self.bucket_size}, "
            f"predicted {self.makespan_us / 1e3:.2f} ms, scheduled in {self.scheduler_us:.0f} us"
            + (f" (+{self.fallback_us / 1e3:.1f} ms CP-SAT)" if self.fallback_us else "")
        ]
        if self.dropped or self.truncated:
            lines.append(f"  over-length: {len(self.dropped)} dropped {self.dropped}, "
                         f"{len(self.truncated)} truncated {self.truncated}")
        for d, rank in enumerate(self.ranks):
            lines.append(f"  DP {d}: {len(rank)} micro-batches, {self.dp_time_us[d] / 1e3:.2f} ms")
            for mb in rank:
                seqs = [f"{k}:{s}@{'D' if r == DISTRIBUTED else r}" for k, s, r in zip(mb.seqs, mb.lengths, mb.cp_rank)]
                more = f" ... (+{len(seqs) - max_seqs})" if len(seqs) > max_seqs else ""
                lines.append(
                    f"    mb {mb.index} [{mb.path}] {mb.time_us / 1e3:.2f} ms, tokens/CP rank {list(mb.rank_tokens)}: "
                    + " ".join(seqs[:max_seqs]) + more
                )
        return "\n".join(lines)

    # ---------------------------------------------------------------- updates
    def replace_placement(self, mb: MicroBatchPlan, result: _core.DacpResult, path: str) -> None:
        """Swap in another placement of the same micro-batch (e.g. CP-SAT's)."""
        if len(result.cp_rank) != len(mb.seqs):
            raise PlanError(f"placement has {len(result.cp_rank)} entries for {len(mb.seqs)} sequences")
        mb.heuristic_time_us = mb.time_us if mb.heuristic_time_us is None else mb.heuristic_time_us
        mb.cp_rank = list(result.cp_rank)
        mb.rank_tokens = list(result.rank_tokens)
        mb.rank_flops = list(result.rank_flops)
        mb.comm_bytes = result.comm_bytes
        mb.time_us = result.time_us
        mb.path = path
        for k, r in zip(mb.seqs, mb.cp_rank):
            self.cp_rank[k] = r
        self.dp_time_us[mb.dp_rank] = sum(m.time_us for m in self.ranks[mb.dp_rank])
        self.makespan_us = self.step_time_us()

    # ------------------------------------------------------------- invariants
    def validate(self) -> None:
        """Raise PlanError naming the first broken invariant.

        Checks: per-sequence arrays agree with the micro-batches; every
        sequence not dropped sits in exactly one micro-batch of its DP rank;
        placements are DISTRIBUTED or a CP rank; each rank's tokens (local
        whole, distributed as a zigzag shard) recomputed here match and stay
        within bucket_size; over-length handling is complete; times add up.
        """
        k_total = len(self.input_lengths)
        for name in ("lengths", "dp_rank", "micro_batch", "cp_rank"):
            if len(getattr(self, name)) != k_total:
                raise PlanError(f"plan.{name} has {len(getattr(self, name))} entries for {k_total} sequences")
        if len(self.ranks) != self.dp:
            raise PlanError(f"plan has {len(self.ranks)} DP ranks, expected {self.dp}")
        limit = Capacity(self.bucket_size, self.cp, self.dp).limit
        dropped = set(self.dropped)
        truncated = set(self.truncated)
        if len(dropped) != len(self.dropped) or len(truncated) != len(self.truncated):
            raise PlanError("dropped or truncated lists repeat an index")
        for k in range(k_total):
            s_in, s = self.input_lengths[k], self.lengths[k]
            if k in dropped:
                if self.dp_rank[k] != DROPPED:
                    raise PlanError(f"sequence {k} is listed as dropped but placed on DP rank {self.dp_rank[k]}")
                if s_in <= limit:
                    raise PlanError(f"sequence {k} (length {s_in}) was dropped though it fits (limit {limit})")
                continue
            if k in truncated:
                if not (s_in > limit and s == limit):
                    raise PlanError(f"sequence {k} truncated from {s_in} to {s}, expected to the limit {limit}")
            elif s != s_in:
                raise PlanError(f"sequence {k} length changed from {s_in} to {s} without truncation")
            if s > limit:
                raise PlanError(f"sequence {k} has length {s} > limit {limit}")
            if not 0 <= self.dp_rank[k] < self.dp:
                raise PlanError(f"sequence {k} has DP rank {self.dp_rank[k]}, outside [0, {self.dp})")
            if not (self.cp_rank[k] == DISTRIBUTED or 0 <= self.cp_rank[k] < self.cp):
                raise PlanError(f"sequence {k} has CP rank {self.cp_rank[k]}, neither DISTRIBUTED nor in [0, {self.cp})")
        seen = [0] * k_total
        for d, rank in enumerate(self.ranks):
            total = 0.0
            for j, mb in enumerate(rank):
                where = f"DP rank {d} micro-batch {j}"
                if mb.dp_rank != d or mb.index != j:
                    raise PlanError(f"{where} is labelled DP rank {mb.dp_rank} micro-batch {mb.index}")
                if not mb.seqs:
                    raise PlanError(f"{where} is empty")
                if not (len(mb.seqs) == len(mb.cp_rank) == len(mb.lengths)):
                    raise PlanError(f"{where}: seqs, lengths and cp_rank differ in length")
                tokens = [0] * self.cp
                for k, s, r in zip(mb.seqs, mb.lengths, mb.cp_rank):
                    if not 0 <= k < k_total:
                        raise PlanError(f"{where} holds sequence {k}, outside [0, {k_total})")
                    seen[k] += 1
                    if self.dp_rank[k] != d or self.micro_batch[k] != j or self.cp_rank[k] != r:
                        raise PlanError(
                            f"sequence {k}: arrays say DP {self.dp_rank[k]} micro-batch {self.micro_batch[k]} "
                            f"CP {self.cp_rank[k]}, {where} says CP {r}"
                        )
                    if s != self.lengths[k]:
                        raise PlanError(f"{where}: sequence {k} has length {s}, plan.lengths says {self.lengths[k]}")
                    if r == DISTRIBUTED:
                        shard = s if self.cp == 1 else 2 * -(-s // (2 * self.cp))
                        for c in range(self.cp):
                            tokens[c] += shard
                    else:
                        tokens[r] += s
                if tokens != list(mb.rank_tokens):
                    raise PlanError(f"{where}: rank tokens {list(mb.rank_tokens)} but placement gives {tokens}")
                for c, t in enumerate(tokens):
                    if t > self.bucket_size:
                        raise PlanError(f"{where}: CP rank {c} holds {t} tokens > bucket_size {self.bucket_size}")
                if not (math.isfinite(mb.time_us) and mb.time_us >= 0):
                    raise PlanError(f"{where}: predicted time {mb.time_us} is not a finite non-negative number")
                total += mb.time_us
            if not math.isclose(total, self.dp_time_us[d], rel_tol=1e-9, abs_tol=1e-6):
                raise PlanError(f"DP rank {d}: micro-batch times sum to {total}, plan says {self.dp_time_us[d]}")
        for k in range(k_total):
            want = 0 if k in dropped else 1
            if seen[k] != want:
                raise PlanError(f"sequence {k} appears in {seen[k]} micro-batches, expected {want}")
        # The step on its timeline, restated: lockstep, slot j lasts as long as its slowest
        # rank (a pad pass where a rank has no j-th micro-batch); free, the slowest rank.
        if self.timeline == "free":
            want = max(self.dp_time_us, default=0.0)
        else:
            slots = max((len(r) for r in self.ranks), default=0)
            want = sum(max(r[j].time_us if j < len(r) else self.pad_us for r in self.ranks) for j in range(slots))
        if not math.isclose(self.makespan_us, want, rel_tol=1e-9, abs_tol=1e-6):
            raise PlanError(f"makespan {self.makespan_us} is not the {self.timeline} step time {want} of its "
                            "micro-batches")

    def digest(self) -> str:
        """Hash of everything that decides what each rank computes; equal on every rank."""
        h = hashlib.sha256()
        h.update(struct.pack("<3q", self.dp, self.cp, self.bucket_size))
        for arr in (self.lengths, self.dp_rank, self.micro_batch, self.cp_rank):
            h.update(struct.pack(f"<{len(arr)}q", *arr))
        for mb in self.all_micro_batches():
            h.update(struct.pack(f"<2q{len(mb.seqs)}q", mb.dp_rank, mb.index, *mb.seqs))
        return h.hexdigest()
