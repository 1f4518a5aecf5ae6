"""The simulator's policies: name -> SimPolicy. The scheduler's own policies
come from its registry (``POLICIES``: ``SCHEDULER`` here); the others are
labelled sets of their own: ``BASELINES`` (what others run) and ``VARIANTS``
(a scheduler policy on other inputs, and the bound).

Each policy turns one global batch (lengths in dataset order) into a
``Plan`` (so ``Plan.validate()`` and the same metrics apply to all of
them), except ``bound``, which returns a number: a lower bound on the
iteration time. All times come from the core's cost model.

- baseline: what torchtitan / DeepSpeed users run today. DP rank d takes
  samples d, d + DP, d + 2 DP, ... of the global batch (torch's
  DistributedSampler split), packs them in arrival order into
  micro-batches up to the token budget, and shards every sequence over the
  CP group (its communication is not hidden behind local work).
- unpacked: every sequence its own micro-batch, sharded (DeepSpeed-style
  micro-batch size 1 with gradient accumulation; one reading of the
  paper's DeepSpeed baseline, which it does not spell out).
- sorted: LongAlign's sorted batching. It regroups samples *across* global
  batches: sort the whole simulated window by length, cut it into
  consecutive global batches, shuffle their order; then each runs like
  baseline. It changes which samples share an optimizer step (Skrull does
  not), so it is compared on the average over the same samples.
- every policy of skrull_ext.scheduler.config.POLICIES (skrull, skrull-fast,
  skrull-paper, skrull-per-rank, skrull-pool, worstfit), described there; a
  pool policy (skrull-pool) runs on sequences truncated only beyond what the
  DP x CP world holds; skrull-pool-capped: the same planner on the others'
  inputs (capped at what a CP group holds), the like-for-like comparison
  with skrull.
- chunkflow: fixed-size chunks (skrull_ext/sim/chunkflow.py).
- skrull+chunk and chunkflow+whole (``bench simulate --overlength chunk``, not run
  by default): every sequence whole, none cut. skrull+chunk is ``[skrull]
  overlength = "chunk"`` as trained: the sequences a CP group holds planned by
  skrull, each longer one a chunked document priced by chunk_cost and placed
  on one DP rank by the core (cpp/include/skrull/chunked.hpp); chunkflow+whole
  is the ChunkFlow peer on the same whole sequences.
- bound: skrull_ext/sim/bound.py.
- sorted+skrull (not run by default): sorted's regrouping, then skrull.
- skrull+lookaheadW (``bench simulate --lookahead W``, not run by default):
  ``[skrull] lookahead = W`` as trained: each window of W global batches
  regrouped by the core (cpp/include/skrull/lookahead.hpp), then skrull on
  each step; compared on the average over the same samples, like sorted.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from skrull_ext import Scheduler, SchedulerConfig, _core
from skrull_ext._core import CostModel
from skrull_ext.scheduler.config import POLICIES
from skrull_ext.scheduler.plan import Plan
from skrull_ext.sim import bound, chunkflow
from skrull_ext.sim.packing import Shape, all_sharded_plan, pack_sharded

PlanFn = Callable[[Sequence[int], CostModel, Shape, int], "Plan | float"]
RegroupFn = Callable[[list[list[int]], int, CostModel, Shape], list[list[int]]]


@dataclass(frozen=True)
class SimPolicy:
    name: str
    plan: PlanFn
    """(global batch, cost model, shape, seed) -> Plan, or a float (microseconds) for the bound."""
    description: str
    regroup: RegroupFn | None = None
    """Optional (global batches of the run, seed, cost model, shape) -> new global batches, applied before
    planning."""
    world: bool = False
    """Sees sequences truncated only beyond what the whole DP x CP world holds (skrull-pool), not a CP group."""
    pool: bool = False
    """Plans rank sets over the world (skrull-pool): its gap is to ``bound.pool_lower_bound_us``, the
    bound every pool plan obeys (the group bound assumes a sequence sharded over one whole CP group)."""
    whole: bool = False
    """Sees every sequence whole, none cut (``overlength = "chunk"``): those beyond a CP group train in
    chunks; its gap is to the classic bound of the whole sequences."""

    @property
    def is_bound(self) -> bool:
        return self.name == "bound"


def baseline(lengths: Sequence[int], cost: CostModel, shape: Shape, seed: int) -> Plan:
    started = time.perf_counter()
    groups_per_rank = []
    for d in range(shape.dp):
        mine = range(d, len(lengths), shape.dp)
        groups_per_rank.append(pack_sharded(lengths, mine, shape))
    return all_sharded_plan(lengths, groups_per_rank, cost, shape, started)


def unpacked(lengths: Sequence[int], cost: CostModel, shape: Shape, seed: int) -> Plan:
    started = time.perf_counter()
    groups_per_rank = [[[k] for k in range(d, len(lengths), shape.dp)] for d in range(shape.dp)]
    return all_sharded_plan(lengths, groups_per_rank, cost, shape, started)


def sort_window(batches: list[list[int]], seed: int, cost: CostModel | None = None,
                shape: Shape | None = None) -> list[list[int]]:
    """LongAlign regrouping: all samples of the window sorted, cut into batches of the same sizes, shuffled."""
    flat = sorted(s for b in batches for s in b)
    out, start = [], 0
    for b in batches:
        out.append(flat[start : start + len(b)])
        start += len(b)
    random.Random(seed).shuffle(out)
    return out


def core_policy(name: str, **overrides) -> PlanFn:
    """A policy of the scheduler core (skrull_ext.scheduler.config.POLICIES) behind the Scheduler facade."""

    def run(lengths: Sequence[int], cost: CostModel, shape: Shape, seed: int) -> Plan:
        cfg = SchedulerConfig(dp=shape.dp, cp=shape.cp, bucket_size=shape.bucket_size, policy=name,
                              timeline=shape.timeline, **overrides)
        return Scheduler(cfg, cost).schedule(lengths)

    return run


LOOKAHEAD = "skrull+lookahead"
"""Prefix of the look-ahead policies: skrull+lookahead8 is skrull with [skrull] lookahead = 8."""


def lookahead_windows(w: int, policy: str = "skrull") -> RegroupFn:
    """Each window of ``w`` global batches regrouped as the trainer's dataloader does
    (``Scheduler.lookahead``, the job's policy and timeline); a last shorter window as it comes."""

    def regroup(batches: list[list[int]], seed: int, cost: CostModel, shape: Shape) -> list[list[int]]:
        sched = Scheduler(SchedulerConfig(dp=shape.dp, cp=shape.cp, bucket_size=shape.bucket_size, policy=policy,
                                          timeline=shape.timeline), cost)
        out = []
        for first in range(0, len(batches), w):
            window = batches[first : first + w]
            flat = [s for b in window for s in b]
            out += [[flat[q] for q in members] for members in sched.lookahead(window).steps]
        return out

    return regroup


def lookahead_policy(w: int) -> SimPolicy:
    """skrull with ``[skrull] lookahead = w``."""
    return SimPolicy(f"{LOOKAHEAD}{w}", core_policy("skrull"),
                     f"skrull with [skrull] lookahead = {w}: each window of {w} global batches regrouped by the "
                     "core, then skrull on each step", lookahead_windows(w))


def chunkflow_policy(lengths: Sequence[int], cost: CostModel, shape: Shape, seed: int) -> Plan:
    return chunkflow.best_plan(lengths, cost, shape)[0]


def skrull_chunk(lengths: Sequence[int], cost: CostModel, shape: Shape, seed: int) -> Plan:
    """``[skrull] overlength = "chunk"`` as the loader plans a step (data/steps/loader.py
    planned_and_chunked): the sequences within what a CP group holds in the plan's micro-batches,
    the longer ones as its chunked documents, in chunks of that limit."""
    limit = shape.max_length
    cfg = SchedulerConfig(dp=shape.dp, cp=shape.cp, bucket_size=shape.bucket_size, policy="skrull",
                          timeline=shape.timeline, overlength="chunk")
    return Scheduler(cfg, cost).schedule([s for s in lengths if s <= limit], chunked=[s for s in lengths if s > limit])


def bound_policy(lengths: Sequence[int], cost: CostModel, shape: Shape, seed: int) -> float:
    return bound.lower_bound_us(lengths, cost, shape.dp, shape.cp, shape.bucket_size, shape.timeline)


BASELINES: dict[str, SimPolicy] = {
    p.name: p
    for p in (
        SimPolicy("baseline", baseline, "arrival order, packed to the token budget, every sequence sharded"),
        SimPolicy("unpacked", unpacked, "one sequence per micro-batch, sharded (DeepSpeed micro-batch size 1)"),
        SimPolicy("sorted", baseline, "LongAlign sorted batching across the run, then as baseline", sort_window),
        SimPolicy("chunkflow", chunkflow_policy, "ChunkFlow-style fixed-size chunks, sharded, LPT over DP"),
        SimPolicy("chunkflow+whole", chunkflow_policy, "chunkflow on every sequence whole (none cut): those longer "
                  "than a chunk split into consecutive chunks on one DP rank", whole=True),
    )
}
"""What others run, not policies of the scheduler."""

SCHEDULER: dict[str, SimPolicy] = {
    name: SimPolicy(name, core_policy(name), p.description, world=p.pool, pool=p.pool)
    for name, p in POLICIES.items()
}
"""Every policy of the scheduler (skrull_ext.scheduler.config.POLICIES), as trained; a pool policy
sees sequences truncated only beyond what the DP x CP world holds."""

VARIANTS: dict[str, SimPolicy] = {
    p.name: p
    for p in (
        SimPolicy("skrull-pool-capped", core_policy("skrull-pool"),
                  "skrull-pool on the same inputs as the others (capped at C x CP)", pool=True),
        SimPolicy("sorted+skrull", core_policy("skrull"), "LongAlign regrouping, then skrull in each batch",
                  sort_window),
        SimPolicy("skrull+chunk", skrull_chunk, "skrull with overlength = \"chunk\": every sequence whole, those "
                  "longer than a CP group holds trained in chunks, each on the DP rank the core assigns", whole=True),
        SimPolicy("bound", bound_policy, "lower bound on the iteration time"),
    )
}
"""A scheduler policy on other inputs, and the bound."""

SIM_POLICIES: dict[str, SimPolicy] = {**BASELINES, **SCHEDULER, **VARIANTS}

CHUNK = ("skrull+chunk", "chunkflow+whole")
"""The rows of ``bench simulate --overlength chunk``: every sequence whole."""

DEFAULT = [name for name in SIM_POLICIES if name != "sorted+skrull" and name not in CHUNK]
"""What the benchmark runs unless told: every policy but sorted+skrull and the whole-sequence rows."""


def get(name: str) -> SimPolicy:
    if name.startswith(LOOKAHEAD) and name[len(LOOKAHEAD):].isdigit():
        w = int(name[len(LOOKAHEAD):])
        if not 1 <= w <= _core.MAX_LOOKAHEAD:
            raise ValueError(f"{name}: lookahead must be in [1, {_core.MAX_LOOKAHEAD}], got {w}")
        return lookahead_policy(w)
    if name not in SIM_POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose one of {list(SIM_POLICIES)}")
    return SIM_POLICIES[name]
