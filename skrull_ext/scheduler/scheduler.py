"""``Scheduler``: one call per global batch, same plan on every rank.

    sched = Scheduler(SchedulerConfig(dp=4, cp=8, bucket_size=26624), cost_model.preset("qwen2.5-0.5b"))
    plan = sched.schedule(lengths)        # GDS + DACP in C++ (+ CP-SAT with cpsat=True)
    plan.validate()

The C++ core does the heuristics. With ``cpsat=True`` (off by default: on
the measured shapes it saves far less step time than its solver time costs;
``python -m skrull_ext.bench cpsat``, docs/benchmarks.md section 12) and a
policy that allows it, micro-batches predicted more than ``cpsat_margin``
above their lower bound are re-solved exactly by CP-SAT under a
deterministic limit, and the faster of the two placements (both scored by
the C++ cost model) is kept.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import NamedTuple

from skrull_ext import _core
from skrull_ext._core import CostModel
from skrull_ext.scheduler import cost_model as cost_models
from skrull_ext.scheduler.chunk_cost import chunk_cost
from skrull_ext.scheduler.chunk_lockstep import chunk_passes
from skrull_ext.scheduler.config import SchedulerConfig, timeline_of
from skrull_ext.scheduler.cpsat import CpSatResult, solve_dacp
from skrull_ext.scheduler.job import SchedulerJob
from skrull_ext.scheduler.plan import MicroBatchPlan, Plan


def _as_lengths(lengths: Sequence[int]) -> list[int]:
    """The lengths as Python ints in [1, MAX_LENGTH], or a ValueError naming the first bad one.
    Plain ints in range (what the loader passes) take one pass of builtins: the per-item
    checks below cost 3 ms a call at 8,192 sequences, as much as the core's plan."""
    out = list(lengths)
    if not out or set(map(type, out)) == {int} and 1 <= min(out) and max(out) <= _core.MAX_LENGTH:
        return out
    return _checked_lengths(out)


def _checked_lengths(lengths: Sequence[int]) -> list[int]:
    out = []
    for k, s in enumerate(lengths):
        if isinstance(s, bool) or not isinstance(s, int) and not hasattr(s, "__index__"):
            raise ValueError(f"sequence {k} has length {s!r}, which is not an integer")
        s = int(s)
        if not 1 <= s <= _core.MAX_LENGTH:  # also keeps it in int64 for the binding (else TypeError)
            raise ValueError(f"sequence {k} has length {s}, outside [1, {_core.MAX_LENGTH}]")
        out.append(s)
    return out


class Scheduler:
    """Plans global batches for one resolved job (``SchedulerJob``: DP x CP, BucketSize,
    policy, timeline, cost model, the core's options)."""

    def __init__(self, job: SchedulerJob | SchedulerConfig, cost_model: CostModel | None = None) -> None:
        """``job``: the job's resolved scheduling; or, for library users and tests, a
        ``SchedulerConfig`` of plain values resolved here on ``cost_model`` (default: the
        default preset)."""
        if isinstance(job, SchedulerConfig):
            job = SchedulerJob.of(job, dp=job.dp, cp=job.cp, timeline=timeline_of(job.timeline),
                                  cost_model=cost_model if cost_model is not None else cost_models.preset(),
                                  bucket_size=job.bucket_size)
        elif cost_model is not None:
            raise ValueError("a SchedulerJob holds its cost model; pass cost_model with a SchedulerConfig only")
        self.job = job

    @property
    def cost_model(self) -> CostModel:
        return self.job.cost_model

    def schedule(self, lengths: Sequence[int], dp_rank: int | None = None, chunked: Sequence[int] = (),
                 chunk: int | None = None) -> Plan:
        """Plan one global batch (lengths in dataset order). Empty batch -> empty plan.

        ``chunked``: the lengths of the step's documents that ``overlength = "chunk"`` trains
        whole in chunks of ``chunk`` tokens (default: ``job.chunk_for``, what the trainer runs). Each
        is one work item of ``chunk_cost`` on one DP rank's CP group; the core assigns them
        (``plan.chunked_group``: LPT, longest first) and balances the samples around them
        (cpp/include/skrull/chunked.hpp). Under ``skrull-pool`` they are assigned the same way
        after the pool's plan, which does not balance around them.

        With ``dp_rank`` set, the CP-SAT fallback refines only that DP rank's
        micro-batches: a training rank needs exact placements for its own
        micro-batches only, and every rank of its CP group asks for the same
        ones, so they still agree without talking. Other DP ranks keep the
        heuristic's placements (``plan.refined_dp_rank`` records this). CP-SAT
        places on one CP group, so it refines one-group micro-batches only
        (under ``skrull-pool`` a wide one keeps the core's sets).
        """
        lengths = _as_lengths(lengths)
        c = self.job
        if dp_rank is not None and not (isinstance(dp_rank, int) and 0 <= dp_rank < c.dp):
            raise ValueError(f"dp_rank must be in [0, {c.dp}), got {dp_rank!r}")
        chunked = _as_lengths(chunked)
        docs = chunked_docs(c, chunked, chunk)
        if c.policy.pool:
            core = _core.schedule_pool(lengths, c.cost_model, c.options)
        else:
            core = _core.to_plan(_core.schedule(lengths, c.cost_model, c.options, docs.us, docs.passes, chunked,
                                                docs.last),
                                 c.cost_model, c.options)
        plan = Plan.from_core(core, lengths, c, chunked)
        plan.chunked_chunk = docs.chunk
        if c.policy.pool and chunked:
            plan.chunked_us, plan.chunked_group = docs.us, _core.assign_chunked(docs.us, c.dp)
            plan.chunked_pad_us = _core.lockstep_pad_us(chunked, docs.passes, docs.last, plan.chunked_group, c.dp,
                                                        c.cp, c.cost_model)
            plan.retime()
        mbs = [mb for mb in plan.micro_batches if mb.groups == 1 and (dp_rank is None or mb.first_group == dp_rank)]
        plan.refined_dp_rank = dp_rank
        for mb in mbs:  # every micro-batch's gap to its bound (skrull/mean_bound_gap); CP-SAT may raise it
            mb.lower_bound_us = self.cost_model.micro_batch_lower_bound_us(mb.lengths, c.cp)
        if c.uses_cpsat:
            start = time.perf_counter()
            for mb in mbs:
                self._maybe_improve(plan, mb)
            plan.fallback_us = (time.perf_counter() - start) * 1e6
        return plan

    def chunked_us(self, chunked: Sequence[int], chunk: int | None = None) -> list[float]:
        """Each chunked document's predicted time on one CP group (``chunk_cost``), in chunks of
        ``chunk`` tokens (default: ``job.chunk_for``, what the trainer chunks by)."""
        return chunked_docs(self.job, chunked, chunk).us

    def lookahead(self, batches: Sequence[Sequence[int]],
                  chunked: Sequence[Sequence[int]] | None = None) -> _core.Lookahead:
        """``plan_window`` of this scheduler's job."""
        return plan_window(self.job, batches, chunked)

    def _worth_cpsat(self, time_us: float, lower_bound_us: float) -> bool:
        """The one CP-SAT decision (with ``job.uses_cpsat``): a placement
        predicted more than ``cpsat_margin`` above its lower bound."""
        return time_us > (1.0 + self.job.cpsat_margin) * lower_bound_us

    def _decide_with(self) -> CostModel | None:
        """The model placements are chosen with when it is not the cost model: every exchange
        at ``comm.plan_margin`` x its price (cpp/include/skrull/hedge.hpp); None when unhedged.
        CP-SAT solves and compares under it too, or it would undo the core's hedge; what it
        keeps is priced with the cost model, as the core's plans are."""
        return self.cost_model.planning_model() if self.cost_model.comm.plan_margin != 1.0 else None

    def _cpsat_placement(self, lengths: list[int], cp_rank: list[int], current_rank: list[int] | None,
                         current_us: float, decide: CostModel | None) -> _core.DacpResult | None:
        """CP-SAT's placement scored with the cost model, if it fits and beats the current one
        (``current_rank``, None when there is none) under the model placements are chosen with."""
        c = self.job
        if decide is None:
            scored = _core.evaluate_placement(lengths, cp_rank, self.cost_model, c.cp, c.bucket_size)
            ok = scored.status == _core.Status.OK and (current_rank is None or scored.time_us < current_us)
            return scored if ok else None
        planned = _core.evaluate_placement(lengths, cp_rank, decide, c.cp, c.bucket_size)
        if planned.status != _core.Status.OK or current_rank is not None and not planned.time_us < \
                _core.evaluate_placement(lengths, current_rank, decide, c.cp, c.bucket_size).time_us:
            return None
        return _core.evaluate_placement(lengths, cp_rank, self.cost_model, c.cp, c.bucket_size)

    def _maybe_improve(self, plan: Plan, mb: MicroBatchPlan) -> CpSatResult | None:
        c = self.job
        mb.lower_bound_us = self.cost_model.micro_batch_lower_bound_us(mb.lengths, c.cp)
        if not self._worth_cpsat(mb.time_us, mb.lower_bound_us):
            return None
        decide = self._decide_with()
        if decide is not None and any(k not in (1, c.cp) for k in mb.num_ranks):
            return None  # sub-group sets: no cp_rank prices them under the planning model
        res = solve_dacp(mb.lengths, decide or self.cost_model, c.cp, c.bucket_size, c.cpsat_deterministic_time,
                         hint=mb.cp_rank)
        if decide is None:  # the solver's bound is one on the model it solved with
            mb.lower_bound_us = max(mb.lower_bound_us, res.bound_us)
        if res.cp_rank is not None and (
                scored := self._cpsat_placement(mb.lengths, res.cp_rank, mb.cp_rank, mb.time_us, decide)):
            plan.replace_placement(mb, scored, "cpsat")
        return res

    def schedule_micro_batch(self, lengths: Sequence[int]) -> tuple[_core.DacpResult, str]:
        """DACP for one micro-batch: the heuristic, then CP-SAT if the heuristic
        cannot place it or (policy permitting) predicts far above the bound.

        Returns the result and which path produced it ('heuristic' or 'cpsat').
        Raises ValueError when no placement fits in memory.
        """
        lengths = _as_lengths(lengths)
        c = self.job
        r = _core.dacp_for(lengths, self.cost_model, c.options)
        ok = r.status == _core.Status.OK
        if ok and not (c.uses_cpsat and
                       self._worth_cpsat(r.time_us, self.cost_model.micro_batch_lower_bound_us(lengths, c.cp))):
            return r, "heuristic"
        decide = self._decide_with()
        res = solve_dacp(lengths, decide or self.cost_model, c.cp, c.bucket_size, c.cpsat_deterministic_time,
                         hint=list(r.cp_rank) if ok else None)
        if res.cp_rank is not None and (scored := self._cpsat_placement(
                lengths, res.cp_rank, list(r.cp_rank) if ok else None, r.time_us, decide)):
            return scored, "cpsat"
        if ok:
            return r, "heuristic"
        raise ValueError(
            f"micro-batch of {len(lengths)} sequences ({sum(lengths)} tokens) does not fit {c.cp} CP ranks x "
            f"{c.bucket_size} tokens (CP-SAT: {res.status})"
        )


class ChunkedDocs(NamedTuple):
    """A step's chunked documents as ``job`` trains them, each in the step's order."""

    chunk: list[int]
    """Its chunk in tokens: ``chunk``, else ``job.chunk_for(n)``, the trainer's chunk."""
    us: list[float]
    """Its predicted time whole, in those chunks, sharded over its CP group (scheduler/chunk_cost.py)."""
    passes: list[int]
    """Its chunk passes in them (``chunk_passes``), what lockstep ranks pad to (chunk_lockstep.py)."""
    last: list[int]
    """Its last chunk's tokens (recomputed where lockstep pads follow it: the core's lockstep_pad_us)."""


def chunked_docs(job: SchedulerJob, chunked: Sequence[int], chunk: int | None = None) -> ChunkedDocs:
    """``chunked`` (lengths) priced as ``job`` trains them: the one place a document's chunk is
    chosen for the plans, so its time and its pass count are of the same chunk."""
    chunks = [job.chunk_for(n) if chunk is None else chunk for n in chunked]
    passes = [chunk_passes(n, k) for n, k in zip(chunked, chunks)]
    return ChunkedDocs(chunks, [chunk_cost(job.cost_model, n, k, job.cp).us for n, k in zip(chunked, chunks)],
                       passes, [n - (p - 1) * k for n, k, p in zip(chunked, chunks, passes)])


def plan_window(job: SchedulerJob, batches: Sequence[Sequence[int]],
                chunked: Sequence[Sequence[int]] | None = None) -> _core.Lookahead:
    """The window ``batches`` (each a global batch's lengths, in arrival order) regrouped over
    its steps by the core (cpp/include/skrull/lookahead.hpp): each step priced as ``job`` plans
    it (its policy, pool or not, its timeline; the CP-SAT fallback is not run). Pure function of
    the lengths: every rank gets the same regrouping. A function of the job, not of a Scheduler:
    start-up prices windows to settle the job before its one Scheduler is built (train/settle.py).
    ``chunked``: per batch, the lengths of its chunked documents (``overlength = "chunk"``), which
    stay at their step and are priced with it, so the regrouping moves samples around them."""
    docs = [] if chunked is None else [chunked_docs(job, _as_lengths(c)) for c in chunked]
    return _core.lookahead([_as_lengths(b) for b in batches], job.cost_model, job.options, pool=job.policy.pool,
                           chunked=[d.us for d in docs], chunked_chunks=[d.passes for d in docs],
                           chunked_lengths=[] if chunked is None else [_as_lengths(c) for c in chunked],
                           chunked_last_chunk=[d.last for d in docs])
