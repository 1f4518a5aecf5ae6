"""ChunkFlow-style plans (arXiv 2503.02356), as a peer to compare against.

Sequences are reorganised into fixed-size chunks: short ones are packed
together (first-fit decreasing), a sequence longer than a chunk is split
into consecutive chunks that run in order on one DP rank. Each chunk is one
micro-batch sharded over the CP group (ChunkFlow has no local/distributed
split). Units (a packed chunk, or a long sequence's chain of chunks) go to
DP ranks longest-processing-time first by predicted time.

Modelling choices, all in ChunkFlow's favour under this cost model:
- ChunkSize is picked per global batch by predicted time among the CP
  group's budget (the longest sequence it holds) halved 0..4 times
  (``CHUNK_HALVINGS``). ChunkFlow tunes it once per job; per batch is its
  best case. Big chunks mean few calls, small ones let DP balance;
- chunk i of a split sequence costs flops(end) - flops(start) (its queries
  attend to the whole prefix) and exchanges only its own K/V: the prefix's
  gathered K/V is assumed kept from the previous chunk, its memory not
  charged.

The Plan's "sequences" are the pieces (a whole short sequence, or one chunk
of a long one), so ``Plan.validate()`` checks memory and exactly-once per
piece; ``pieces`` maps each back to (sequence, offset).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence
from dataclasses import replace

from skrull_ext import _core
from skrull_ext._core import DISTRIBUTED, CostModel
from skrull_ext.scheduler.first_fit import FirstFit
from skrull_ext.scheduler.plan import MicroBatchPlan, Plan
from skrull_ext.sim.packing import Shape, build_plan, sharded_tokens


def split_pieces(lengths: Sequence[int], chunk: int) -> list[tuple[int, int, int]]:
    """(sequence, start, length) pieces: whole sequences up to `chunk` tokens, else chunk-sized cuts."""
    pieces = []
    for k, s in enumerate(lengths):
        for start in range(0, s, chunk):
            pieces.append((k, start, min(chunk, s - start)))
    return pieces


def _chunk_micro_batch(cost: CostModel, shape: Shape, pieces: list[tuple[int, int, int]], ids: list[int]
                       ) -> MicroBatchPlan:
    """One chunk of `ids` pieces, sharded, scored; placed on DP rank 0 at slot 0 (``plan`` moves it)."""
    lens = [pieces[i][2] for i in ids]
    where = DISTRIBUTED if shape.cp > 1 else 0  # CP = 1: one rank, nothing exchanged
    scored = _core.evaluate_placement(lens, [where] * len(ids), cost, shape.cp, shape.bucket_size)
    # A chunk's FLOPs include attention to its prefix: flops(end) - flops(start).
    flops = sum(cost.flops(pieces[i][1] + pieces[i][2]) - cost.flops(pieces[i][1]) for i in ids)
    most = max(scored.rank_tokens)  # the head's tokens: every piece's shard, or all on the one rank
    if shape.cp > 1:
        time_us = cost.micro_batch_us([0.0] * shape.cp, flops / shape.cp, scored.comm_bytes, most)
    else:
        time_us = cost.micro_batch_us([flops], 0.0, 0.0, most)
    return MicroBatchPlan.placed(0, 0, ids, lens, [where] * len(ids), shape.cp, scored, time_us=time_us)


CHUNK_HALVINGS = 5


def best_plan(lengths: Sequence[int], cost: CostModel, shape: Shape) -> tuple[Plan, list]:
    """The fastest predicted ChunkFlow plan over the candidate chunk sizes (ties to the larger)."""
    started = time.perf_counter()
    best = None
    for i in range(CHUNK_HALVINGS):
        chunk = max(1, shape.max_length >> i)
        cand = plan(lengths, cost, shape, chunk)
        if best is None or cand[0].makespan_us < best[0].makespan_us:
            best = cand
    best[0].scheduler_us = (time.perf_counter() - started) * 1e6
    return best


def plan(lengths: Sequence[int], cost: CostModel, shape: Shape, chunk: int | None = None) -> tuple[Plan, list]:
    """ChunkFlow plan of one global batch with `chunk`-token chunks (default: the CP group's
    budget); returns (plan over pieces, pieces)."""
    started = time.perf_counter()
    chunk = chunk or shape.max_length
    if sharded_tokens(chunk, shape.cp) > shape.bucket_size:
        raise ValueError(f"chunk of {chunk} tokens does not fit {shape.cp} ranks x {shape.bucket_size} tokens")
    pieces = split_pieces(lengths, chunk)
    chains: dict[int, list[int]] = {}
    short: list[int] = []
    for i, (k, _, _) in enumerate(pieces):
        if lengths[k] > chunk:
            chains.setdefault(k, []).append(i)
        else:
            short.append(i)
    # First-fit decreasing of the short pieces into chunks (by tokens per rank).
    per_chunk = sharded_tokens(chunk, shape.cp)  # tokens per rank of a full chunk
    fit = FirstFit(len(short), per_chunk)  # a piece needs at most per_chunk: one bin a piece at worst
    bins: list[list[int]] = [[] for _ in short]
    for i in sorted(short, key=lambda i: (-pieces[i][2], i)):
        bins[fit.place(sharded_tokens(pieces[i][2], shape.cp))].append(i)
    del bins[fit.opened:]
    units = [[ids] for ids in bins] + [[[i] for i in ids] for ids in chains.values()]
    # LPT over DP ranks by predicted time of each unit.
    scored_units = []  # each unit's micro-batches placed on DP rank 0, then moved to the rank LPT gives it
    for unit in units:
        mbs = [_chunk_micro_batch(cost, shape, pieces, ids) for ids in unit]
        scored_units.append((sum(mb.time_us for mb in mbs), mbs))
    scored_units.sort(key=lambda t: -t[0])
    least = [(0.0, d) for d in range(shape.dp)]  # (load, rank): the least loaded, lowest rank on a tie
    per_rank: list[list[MicroBatchPlan]] = [[] for _ in range(shape.dp)]
    for t, mbs in scored_units:
        load, d = heapq.heappop(least)
        per_rank[d].extend(mbs)
        heapq.heappush(least, (load + t, d))
    # Moved to rank d: its rank sets shift by d groups (plan.placement_sets: group x cp + CP rank).
    ranks = [[replace(mb, slot=j, first_group=d, first_rank=[r + d * shape.cp for r in mb.first_rank])
              for j, mb in enumerate(mbs)] for d, mbs in enumerate(per_rank)]
    return build_plan([p[2] for p in pieces], ranks, shape, started, cost.pad_pass_us()), pieces
