# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Point-to-point K/V exchange among rank sets (policy ``skrull-pool``).

Under skrull-pool each distributed sequence is sharded over its own set of
world ranks (meta.py, ``dist_sets``), so a rank shares sequences with some
*peers* and not with others, and with each peer a different subset. The
exchange is then point to point over the world group, with no process group
per rank set (rank sets change every step; creating groups is a collective
over the world and costs far more than the exchange):

- forward, to each peer this rank sends its tokens of the sequences both
  hold, and receives the peer's tokens of the same sequences. The gathered
  K/V are the peers' blocks in ascending rank order (this rank's own block,
  its whole distributed part, among them), the layout
  ``DacpBatchMeta.gathered_doc_positions`` describes;
- backward, each peer's block of the gradient goes back to that peer, and
  this rank sums what it receives into its own tokens (index_add in peer
  order: the same sum on every run).

Both ends derive the same routes from the same meta (sequences in buffer
order, shard lengths Lp/k equal on every rank of a set), so a block's size
is known to both without a message. A rank that shares nothing sends
nothing; there is no collective, so the ranks of other rank sets (or of no
set) need not take part.

The routes are plain index data, cached on the meta per device like the
masks (every layer of the micro-batch shares them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from skrull_ext.attention.meta import DacpBatchMeta
from skrull_ext.attention.transport import Pending

__all__ = ["Routes", "block_sizes", "routed_gather", "routed_scatter_sum", "routes_for"]


@dataclass(frozen=True)
class Routes:
    """Who this rank exchanges which tokens with, for one micro-batch."""

    me: int
    """This rank (a rank of the exchange's group)."""
    peers: tuple[int, ...]
    """Ranks sharing a sequence with this one, ascending, ``me`` included."""
    counts: tuple[int, ...]
    """Per peer: tokens of its block in the gathered K/V (= tokens shared with it)."""
    index: tuple[torch.Tensor, ...]
    """Per peer: this rank's distributed-part tokens it shares with that peer (int64, on the device)."""


def routes_for(meta: DacpBatchMeta, device: torch.device | None = None) -> Routes:
    """The routes of ``meta``'s rank, built on first use per device and cached on the meta."""
    key = ("routes", torch.device(device or "cpu"))
    if key not in meta._masks:
        held = meta.held()
        start, off = {}, 0
        for i, n in zip(held, meta.shard_lens):
            start[i] = (off, n)
            off += n
        peers, counts, index = [], [], []
        for q in meta.peers:
            idx = [t for i in meta.shared_with(q) for t in range(start[i][0], start[i][0] + start[i][1])]
            peers.append(q)
            counts.append(len(idx))
            index.append(torch.tensor(idx, dtype=torch.long, device=device))
        meta._masks[key] = Routes(meta.cp_rank, tuple(peers), tuple(counts), tuple(index))
    return meta._masks[key]


def block_sizes(routes: Routes, row: int) -> list[int]:
    """Elements of each peer's block in the flat gathered buffer (``row``: elements per token)."""
    return [n * row for n in routes.counts]


def _blocks(flat: torch.Tensor, routes: Routes, shape: torch.Size) -> list[torch.Tensor]:
    """Per-peer [2, Hkv, n, D] views into a flat gathered buffer (``shape``: the shard's)."""
    _, hkv, _, d = shape
    parts = flat.split(block_sizes(routes, 2 * hkv * d))
    return [p.view(2, hkv, n, d) for p, n in zip(parts, routes.counts)]


def routed_gather(out: torch.Tensor, shard: torch.Tensor, routes: Routes, group) -> Pending:
    """``out`` (flat, sum(counts) tokens) gets every peer's block; ``shard`` is this
    rank's distributed part [2, Hkv, Td, D]. Asynchronous: valid after ``wait()``."""
    ops, sends = [], []
    for peer, idx, blk in zip(routes.peers, routes.index, _blocks(out, routes, shard.shape)):
        if peer == routes.me:
            blk.copy_(shard)
            continue
        s = shard.index_select(2, idx)
        sends.append(s)
        ops.append(dist.P2POp(dist.isend, s, group=group, group_peer=peer))
        ops.append(dist.P2POp(dist.irecv, blk, group=group, group_peer=peer))
    return Pending(dist.batch_isend_irecv(ops) if ops else [], keep=sends)


def routed_scatter_sum(out: torch.Tensor, full: torch.Tensor, routes: Routes, group) -> Pending:
    """``out`` ([2, Hkv, Td, D], this rank's shard) gets its own block of ``full`` (flat,
    gathered layout) plus, per peer, the gradient block that peer sends back."""
    blocks = _blocks(full, routes, out.shape)
    ops, received = [], []
    for peer, blk in zip(routes.peers, blocks):
        if peer == routes.me:
            continue
        r = torch.empty_like(blk)
        received.append(r)
        ops.append(dist.P2POp(dist.isend, blk, group=group, group_peer=peer))
        ops.append(dist.P2POp(dist.irecv, r, group=group, group_peer=peer))

    def total() -> None:
        out.copy_(blocks[routes.peers.index(routes.me)])
        got = iter(received)
        for peer, idx in zip(routes.peers, routes.index):
            if peer != routes.me:
                out.index_add_(2, idx, next(got))

    return Pending(dist.batch_isend_irecv(ops) if ops else [], then=total, keep=blocks)
