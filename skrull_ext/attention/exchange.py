# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Asynchronous, autograd-aware all-gather of the distributed part's K/V.

How the bytes travel (one all-gather, or point-to-point sends) is the
exchange's :class:`~skrull_ext.attention.transport.Transport`; this module
is the autograd around it and is the same for both.

The gather is split into two autograd nodes so that independent work can sit
between them in both directions:

    forward:  start_exchange (issue, async)  ...local attention...  wait_exchange
    backward: wait node issues the reduce-scatter of dK/dV (async)
              ...local attention backward...
              start node waits for it and hands each rank its own shard's gradient

The wait node returns K and V in attention layout ([Hkv, N*Td, D], rank-major
tokens) and does the inverse layout in backward, so that the tensors the
distributed attention saves are its outputs and can be kept for activation
checkpointing (replay.py). An exchange built with ``replay=`` (the K/V a
forward kept) is a recomputation: both nodes skip the collective and the
wait node returns those K/V, while the graph keeps the same nodes.

The backward of an all-gather is a reduce-scatter (SUM): rank r's K/V was
used by every rank's queries, so its gradient is the sum of their
contributions to its slice. The in-between ordering in backward comes from
the autograd engine running ready nodes with the highest sequence number
first: the wait node and the distributed attention were created after the
local attention, the start node before it. Correctness never depends on that
order, only the overlap does.

An exchange with ``routes`` (skrull-pool: sequences sharded over their own
rank sets, routes.py) moves each peer's shared tokens point to point instead;
the gathered K/V are then the peers' blocks in rank order, of unequal sizes,
and the backward sends each block's gradient back to its owner. The two
nodes and the overlap are the same.
"""

import time

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from skrull_ext.attention.replay import KeptKV
from skrull_ext.attention.routes import block_sizes, routed_gather, routed_scatter_sum, Routes
from skrull_ext.attention.stats import DacpStats
from skrull_ext.attention.transport import Transport, TRANSPORTS

__all__ = ["KVExchange", "start_exchange", "wait_exchange"]


class KVExchange:
    """State shared by the start and wait nodes of one all-gather (one layer).

    It holds the in-flight work handles and the tensors those collectives
    read or write, which must stay alive until the matching wait.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        stats: DacpStats | None = None,
        replay: tuple[torch.Tensor, torch.Tensor] | None = None,
        transport: Transport = TRANSPORTS["all_gather"],
        routes: Routes | None = None,
    ) -> None:
        self.group = group
        self.transport = transport
        self.routes = routes
        """Set: a rank-set exchange (routes.py) over ``group``, ``transport`` unused."""
        self.world_size = dist.get_world_size(group)
        self.stats = stats
        self._work = None
        self._send: torch.Tensor | None = None
        self._grad_work = None
        self._grad_in: torch.Tensor | None = None
        self._grad_out: torch.Tensor | None = None
        self.replay = replay
        """K/V a forward kept for this recomputation: no collective is issued."""
        self.kept: KeptKV | None = None
        """This forward's K/V kept for a recomputation; closed by the wait node's backward."""
        self.shard_shape: torch.Size | None = None


class _StartExchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard: torch.Tensor, ex: KVExchange) -> torch.Tensor:
        ctx.ex, ctx.shape = ex, shard.shape
        ex.shard_shape = shard.shape
        if ex.replay is not None:  # a recomputation: the wait node hands back the kept K/V
            if ex.stats is not None:
                ex.stats.replays += 1
            return shard.new_empty(0)
        # Flat buffers: the concatenation form is the one every backend accepts.
        send = shard.contiguous().view(-1)
        if ex.routes is not None:
            sizes = block_sizes(ex.routes, 2 * shard.size(1) * shard.size(3))
            out = send.new_empty(sum(sizes))
            ex._work = routed_gather(out, send.view(shard.shape), ex.routes, ex.group)
            moved = sum(sizes) - send.numel()  # every block but this rank's own
        else:
            out = send.new_empty(ex.world_size * send.numel())
            ex._work = ex.transport.gather(out, send, ex.group)
            moved = (ex.world_size - 1) * send.numel()
        ex._send = send
        if ex.stats is not None:
            ex.stats.all_gathers += 1
            ex.stats.fwd_bytes += moved * send.element_size()
        # Flat, not a view: a view of a buffer the collective writes into would trip
        # autograd's view+in-place guard for custom Functions.
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, _grad_passthrough: torch.Tensor) -> tuple[torch.Tensor, None]:
        ex: KVExchange = ctx.ex
        t0 = time.perf_counter()
        ex._grad_work.wait()
        if ex.stats is not None:
            ex.stats.bwd_wait_s += time.perf_counter() - t0
        grad = ex._grad_out.view(ctx.shape)
        ex._grad_work = ex._grad_in = ex._grad_out = None
        return grad, None


class _WaitExchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gathered: torch.Tensor, ex: KVExchange) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.ex = ex
        if ex.replay is not None:
            k, v = ex.replay
            ex.replay = None
            return k, v
        t0 = time.perf_counter()
        ex._work.wait()
        if ex.stats is not None:
            ex.stats.fwd_wait_s += time.perf_counter() - t0
        ex._work = ex._send = None
        if ex.routes is not None:  # per-peer blocks [2, Hkv, n_peer, D], peers in rank order
            parts = gathered.split(block_sizes(ex.routes, 2 * ex.shard_shape[1] * ex.shard_shape[3]))
            blocks = [p.view(2, ex.shard_shape[1], n, ex.shard_shape[3]) for p, n in zip(parts, ex.routes.counts)]
            return torch.cat([b[0] for b in blocks], dim=1), torch.cat([b[1] for b in blocks], dim=1)
        n, (_, hkv, td, d) = ex.world_size, ex.shard_shape
        g = gathered.view(n, 2, hkv, td, d)
        k = g[:, 0].transpose(0, 1).reshape(hkv, n * td, d)
        v = g[:, 1].transpose(0, 1).reshape(hkv, n * td, d)
        return k, v

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_k: torch.Tensor, grad_v: torch.Tensor) -> tuple[torch.Tensor, None]:
        ex: KVExchange = ctx.ex
        if ex.kept is not None:  # past this layer: no recomputation will take it now
            ex.kept.close()
        if ex.routes is not None:  # back to the per-peer blocks; each goes to its owner
            ends = torch.tensor(ex.routes.counts).cumsum(0).tolist()
            grad_in = torch.cat([
                torch.stack([grad_k[:, b - n : b], grad_v[:, b - n : b]]).reshape(-1)
                for n, b in zip(ex.routes.counts, ends)
            ])
            grad_out = grad_in.new_empty(ex.shard_shape)
            ex._grad_work = routed_scatter_sum(grad_out, grad_in, ex.routes, ex.group)
            ex._grad_in, ex._grad_out = grad_in, grad_out
            if ex.stats is not None:
                ex.stats.reduce_scatters += 1
                ex.stats.bwd_bytes += (grad_in.numel() - grad_out.numel()) * grad_out.element_size()
            return grad_in, None
        n, (_, hkv, td, d) = ex.world_size, ex.shard_shape
        # Back to the gathered layout [N, 2, Hkv, Td, D], rank-major.
        grad = torch.stack([grad_k.reshape(hkv, n, td, d), grad_v.reshape(hkv, n, td, d)], dim=1)
        grad_in = grad.permute(2, 1, 0, 3, 4).contiguous().view(-1)
        grad_out = grad_in.new_empty(grad_in.numel() // ex.world_size)
        ex._grad_work = ex.transport.scatter_sum(grad_out, grad_in, ex.group)
        ex._grad_in, ex._grad_out = grad_in, grad_out
        if ex.stats is not None:
            ex.stats.reduce_scatters += 1
            ex.stats.bwd_bytes += (ex.world_size - 1) * grad_out.numel() * grad_out.element_size()
        # The start node ignores this and returns the reduce-scattered shard; passing
        # ``grad_in`` only keeps the two nodes connected in the graph.
        return grad_in, None


def start_exchange(shard: torch.Tensor, ex: KVExchange) -> torch.Tensor:
    """Issue the all-gather of ``shard`` ([2, Hkv, Td, D]: K and V) over ``ex.group``;
    returns a flat buffer, valid only after :func:`wait_exchange`."""
    return _StartExchange.apply(shard, ex)


def wait_exchange(gathered: torch.Tensor, ex: KVExchange) -> tuple[torch.Tensor, torch.Tensor]:
    """Block until the all-gather lands; returns the whole group's K and V,
    each [Hkv, N*Td, D] with tokens rank-major."""
    return _WaitExchange.apply(gathered, ex)
