"""One rank's buffers for a step planned by policy ``skrull-pool``.

A pool plan (skrull_ext/scheduler/pool_plan.py) runs each micro-batch at a *slot* on a
block of CP groups; each sequence has a rank set of world ranks (world rank =
dp_rank * cp + cp_rank, torchtitan's mesh order with the CP dimension
innermost). Every rank steps through the plan's slots: at a slot where its
block runs a micro-batch it feeds its buffer of it (pool_layout.py: local
sequences whole, then its zigzag shard of each sequence whose set holds it),
and at a slot where it runs nothing, or holds nothing of its block's
micro-batch, one ignored pad token (buffers.pad_buffer), so every rank runs
the same number of forward/backward passes (FSDP's collectives need that)
and the ranks sharing a sequence run it at the same pass.

The loss normaliser is the number of loss tokens of every sequence the plan
keeps, as for skrull's plans: a sequence whose shards live in several DP
groups counts once, on the ranks holding its labels' shards.
"""

from collections.abc import Sequence

import torch

from skrull_ext.attention.meta import padded_length
from skrull_ext.attention.pool_layout import build_pool_meta, shard_pool_buffer
from skrull_ext.data.buffers import MicroBatchBuffer, _pad, pad_buffer
from skrull_ext.data.synthetic import IGNORE_INDEX, Sample
from skrull_ext.scheduler.pool_plan import PoolPlan

__all__ = ["pool_buffer", "pool_rank_buffers"]


def pool_buffer(
    samples: Sequence[Sample],
    lengths: Sequence[int],
    first_rank: Sequence[int],
    num_ranks: Sequence[int],
    rank: int,
    world: int,
    cp_rank: int,
    cp_size: int,
    seqs: Sequence[int] = (),
) -> MicroBatchBuffer:
    """World rank ``rank``'s buffer of one pool micro-batch (samples in ``.seqs`` order).

    Sharded sequences are padded to a multiple of 2k (k: their set's size) with
    id 0, label IGNORE_INDEX and positions continuing past the end, as skrull's.
    ``cp_rank``/``cp_size`` are this rank's CP coordinates, for the pad buffer
    when it holds nothing.
    """
    if not samples:
        raise ValueError("a micro-batch needs at least one sequence")
    inputs, labels, positions = [], [], []
    for s, n, k in zip(samples, lengths, num_ranks, strict=True):
        lp = padded_length(n, k) if k > 1 else n
        inputs.append(_pad(s.input[:n], lp, 0))
        labels.append(_pad(s.labels[:n], lp, IGNORE_INDEX))
        positions.append(torch.arange(lp))
    parts = [shard_pool_buffer(x, first_rank, num_ranks, rank, world) for x in (inputs, labels, positions)]
    meta = build_pool_meta(lengths, first_rank, num_ranks, rank, world)
    if meta.num_tokens == 0:
        return pad_buffer(cp_rank, cp_size, seqs)
    return MicroBatchBuffer(*(t.unsqueeze(0) for t in parts), meta=meta, seqs=list(seqs))


def pool_rank_buffers(
    plan: PoolPlan, samples: Sequence[Sample], indices: Sequence[int], dp_rank: int, cp_rank: int
) -> list[MicroBatchBuffer]:
    """This rank's ``plan.slots`` buffers, one per slot in slot order (pads where it idles)."""
    rank, world = dp_rank * plan.cp + cp_rank, plan.world
    by_slot = {}
    for mb in plan.micro_batches:
        if mb.first_group <= dp_rank < mb.first_group + mb.groups:
            by_slot[mb.slot] = pool_buffer(
                [samples[k] for k in mb.seqs], mb.lengths, mb.first_rank, mb.num_ranks,
                rank, world, cp_rank, plan.cp, seqs=[indices[k] for k in mb.seqs],
            )
    return [by_slot[s] if s in by_slot else pad_buffer(cp_rank, plan.cp) for s in range(plan.slots)]
