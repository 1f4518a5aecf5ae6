# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""A rank's DACP buffer and meta for a micro-batch of any plan.

A plan's micro-batch (skrull_ext/scheduler/plan.py) gives each sequence a rank
set, ``[first_rank, first_rank + num_ranks)``: one rank (local, whole) or
k >= 2 ranks (sharded). The buffer layout is the CP-group one (meta.py,
docs/design/buffer_layout.md) with k in place of the CP size per sequence:

    buffer of rank r = [sequences whose set is {r}, whole, in micro-batch order]
                     + [for each sequence whose k-rank set holds r, in order:
                        its zigzag shard r - first_rank of k, padded to a multiple of 2k]

Every rank of the micro-batch's block builds its meta from the same lists, so
``dist_lens``/``dist_sets`` (all sharded sequences) agree on every rank.

Ranks are numbered in one of two spaces, and the meta says which: *world*
ranks (``dist_sets`` names each sequence's set, and the exchange runs point
to point among them over the world), or, when every sharded set is one whole
CP group (skrull's micro-batches, and skrull-pool's one-group ones without
sub-group sets), that *group*'s ranks (``dist_sets`` None: the exchange takes
the CP group's own transport). ``meta.build_meta`` is the group case written
as placements (a CP rank, or DISTRIBUTED).
"""

from collections.abc import Sequence

import torch

from skrull_ext.attention.meta import DacpBatchMeta, pad_and_shard, padded_length, zigzag_unshard

__all__ = ["build_set_meta", "shard_set_buffer", "unshard_set_buffer"]


def _check(n: int, first_rank: Sequence[int], num_ranks: Sequence[int], world: int) -> None:
    if not len(first_rank) == len(num_ranks) == n:
        raise ValueError(f"{n} sequences but {len(first_rank)} first ranks and {len(num_ranks)} rank counts")
    for a, k in zip(first_rank, num_ranks):
        if not (k >= 1 and 0 <= a and a + k <= world):
            raise ValueError(f"rank set [{a}, {a + k}) is not a non-empty range of [0, {world})")


def build_set_meta(
    lengths: Sequence[int], first_rank: Sequence[int], num_ranks: Sequence[int], rank: int, world: int,
    group: bool = False,
) -> DacpBatchMeta:
    """Meta of rank ``rank`` for a micro-batch's sequences in buffer (``.seqs``) order.

    Args:
        lengths: true length of each sequence of the micro-batch.
        first_rank, num_ranks: each sequence's rank set, ranks of [0, world).
        group: [0, world) is one CP group and every sharded set is all of it:
            the meta leaves ``dist_sets`` out, so the exchange takes the group's transport.
    """
    _check(len(lengths), first_rank, num_ranks, world)
    sharded = [(n, a, k) for n, a, k in zip(lengths, first_rank, num_ranks) if k > 1]
    if group and any((a, k) != (0, world) for _, a, k in sharded):
        raise ValueError(f"group=True needs every sharded set to be the whole group [0, {world}), "
                         f"got {[(a, a + k) for _, a, k in sharded]}")
    return DacpBatchMeta(
        cp_rank=rank,
        cp_size=world,
        local_lens=[n for n, a, k in zip(lengths, first_rank, num_ranks) if k == 1 and a == rank],
        dist_lens=[padded_length(n, k) for n, _, k in sharded],
        dist_sets=None if group else [(a, k) for _, a, k in sharded],
    )


def shard_set_buffer(
    seqs: Sequence[torch.Tensor],
    first_rank: Sequence[int],
    num_ranks: Sequence[int],
    rank: int,
    world: int,
    dim: int = 0,
    pad_value: float = 0,
) -> torch.Tensor:
    """World rank ``rank``'s buffer from a micro-batch's whole sequences (tokens on ``dim``).

    Sharded sequences shorter than their padded length are padded with
    ``pad_value``; pass them already padded to control the pad content.
    """
    if not seqs:
        raise ValueError("a micro-batch needs at least one sequence")
    _check(len(seqs), first_rank, num_ranks, world)
    local = [s for s, a, k in zip(seqs, first_rank, num_ranks) if k == 1 and a == rank]
    shards = []
    for s, a, k in zip(seqs, first_rank, num_ranks):
        if k == 1 or not a <= rank < a + k:
            continue
        shards.append(pad_and_shard(s, rank - a, k, dim, pad_value))
    parts = local + shards
    return torch.cat(parts, dim=dim) if parts else seqs[0].narrow(dim, 0, 0)


def unshard_set_buffer(
    buffers: Sequence[torch.Tensor],
    lengths: Sequence[int],
    first_rank: Sequence[int],
    num_ranks: Sequence[int],
    dim: int = 0,
) -> list[torch.Tensor]:
    """Inverse of :func:`shard_set_buffer`: ``buffers[r]`` is world rank r's buffer.

    Returns the micro-batch's sequences in order, cut to true length.
    """
    world = len(buffers)
    metas = [build_set_meta(lengths, first_rank, num_ranks, r, world) for r in range(world)]
    local_next = [0] * world
    held_next = [0] * world  # index of the next held shard per rank
    out = []
    for n, a, k in zip(lengths, first_rank, num_ranks):
        if k == 1:
            off = metas[a].local_offsets[local_next[a]]
            local_next[a] += 1
            out.append(buffers[a].narrow(dim, off, n))
            continue
        shards = []
        for r in range(a, a + k):
            j = held_next[r]
            held_next[r] += 1
            shards.append(buffers[r].narrow(dim, metas[r].dist_offsets[j], metas[r].shard_lens[j]))
        out.append(zigzag_unshard(shards, dim).narrow(dim, 0, n))
    return out
