"""One rank's buffers for a step: the plan's micro-batches this rank takes part in.

A plan (skrull_ext/scheduler/plan.py) runs each micro-batch at a *slot* on a
block of CP groups; each sequence has a rank set of world ranks (world rank =
dp_rank * cp + cp_rank, torchtitan's mesh order with the CP dimension
innermost). Every rank steps through the plan's slots: at a slot where its
block runs a micro-batch it feeds its buffer of it (buffers.set_buffer: local
sequences whole, then its zigzag shard of each sequence whose set holds it),
and at a slot where it runs nothing, or holds nothing of its block's
micro-batch, one ignored pad token (buffers.pad_buffer), so every rank runs
the same number of forward/backward passes (FSDP's collectives need that)
and the ranks sharing a sequence run it at the same pass.

A one-group micro-batch whose sharded sets are all the whole CP group (every
skrull micro-batch) is laid out in the group's ranks, so its K/V exchange
runs over the CP group with the configured transport; any other (skrull-pool's
wide and sub-group sets) in world ranks, point to point among each set.

The loss normaliser is the number of loss tokens of every sequence the plan
keeps (scheduling.py): a sequence whose shards live in several DP groups
counts once, on the ranks holding its labels' shards.
"""

from collections.abc import Sequence

from skrull_ext.data.steps.buffers import MicroBatchBuffer, pad_buffer, pad_to_multiple, set_buffer
from skrull_ext.data.sources.synthetic import Sample
from skrull_ext.scheduler.plan import MicroBatchPlan, Plan

__all__ = ["micro_batch_buffer", "rank_buffers"]


def micro_batch_buffer(plan: Plan, mb: MicroBatchPlan, samples: Sequence[Sample], indices: Sequence[int],
                       dp_rank: int, cp_rank: int) -> MicroBatchBuffer:
    """This rank's buffer of one of the plan's micro-batches (samples and indices by plan order)."""
    cp = plan.cp
    picked = [samples[k] for k in mb.seqs]
    seqs = [indices[k] for k in mb.seqs]
    if mb.groups == 1 and all(n in (1, cp) for n in mb.num_ranks):  # the CP group's own ranks and exchange
        base = mb.first_group * cp
        return set_buffer(picked, mb.lengths, [r - base for r in mb.first_rank], mb.num_ranks, cp_rank, cp,
                          group=True, seqs=seqs)
    return set_buffer(picked, mb.lengths, mb.first_rank, mb.num_ranks, dp_rank * cp + cp_rank, plan.world,
                      seqs=seqs, cp_coords=(cp_rank, cp))


def rank_buffers(plan: Plan, samples: Sequence[Sample], indices: Sequence[int], dp_rank: int, cp_rank: int,
                 free_running: bool = False, multiple: int = 1) -> list[MicroBatchBuffer]:
    """This rank's buffers in slot order: one per slot (``plan.slots``, pads where it idles) on a
    lockstep timeline; under ``free_running`` (DP ranks share no per-pass collective) only its own
    micro-batches, and one pad when it has none, so it still takes part in FSDP's first all-gathers
    and its one gradient reduce-scatter. At DP 1 a step of chunked documents alone needs no pad:
    no other DP rank pairs the reduce-scatters, so its last chunk reduces (train/passes.py), and
    the core's timeline charges none there (timeline.hpp idle_pad). ``multiple``: each buffer
    padded to a multiple of it (the TP degree: buffers.pad_to_multiple)."""
    mine = {mb.slot: micro_batch_buffer(plan, mb, samples, indices, dp_rank, cp_rank)
            for mb in plan.group_micro_batches(dp_rank)}
    if free_running:
        if not mine and plan.dp == 1 and plan.chunked:
            return []
        out = [mine[s] for s in sorted(mine)] or [pad_buffer(cp_rank, plan.cp)]
    else:
        out = [mine[s] if s in mine else pad_buffer(cp_rank, plan.cp) for s in range(plan.slots)]
    return [pad_to_multiple(b, multiple) for b in out]
