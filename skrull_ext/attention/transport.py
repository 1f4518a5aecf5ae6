# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""How the K/V shards of the distributed sequences travel over the CP group.

DACP needs, per layer, every rank's shard on every rank (forward) and, per
rank, the sum of every rank's gradient for its shard (backward). Two ways
to move those bytes, both asynchronous (issue, compute, then wait):

- ``all_gather``: one all-gather forward, one reduce-scatter backward, the
  collectives torchtitan's CP uses; the natural choice on NCCL.
- ``p2p``: every rank sends its shard to each other rank at once
  (``batch_isend_irecv``) and, backward, each rank's slice of the gradient to
  its owner, which sums what it receives. On gloo it measured faster than
  the collectives at every size (docs/benchmarks.md, section 7), so ``auto``
  picks it there; gloo's reduce-scatter is moreover an all-reduce of the whole
  buffer, each rank keeping its slice.

The byte count is the same either way: (N - 1) shards in, (N - 1) out.
``auto`` picks by the group's backend (``AUTO_BY_BACKEND``); every rank of a
group sees the same backend, so every rank picks the same transport.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["AUTO_BY_BACKEND", "TRANSPORT_CHOICES", "TRANSPORTS", "Transport", "all_gather_single", "check_exchange",
           "p2p_gather", "p2p_scatter_sum", "reduce_scatter_single", "resolve_transport"]

# torch >= 2.12 renamed the tensor-in/tensor-out collectives (the old names warn
# FutureWarning on every call); fall back for older. Every caller in the package
# takes them from here.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class Pending:
    """In-flight work: ``wait()`` blocks until every part has landed, then runs
    ``then`` (the p2p reduce-scatter's sum), once. ``keep``: tensors the work reads
    (send buffers made for it) held alive until then."""

    def __init__(self, works: list, then: Callable[[], None] | None = None, keep: list | None = None) -> None:
        self._works, self._then, self._keep = works, then, keep

    def wait(self) -> None:
        for w in self._works:
            w.wait()
        self._works = []
        self._keep = None
        if self._then is not None:
            then, self._then = self._then, None
            then()


@dataclass(frozen=True)
class Transport:
    """``gather(out, shard)``: out (flat, N x shard) gets every rank's shard,
    rank-major. ``scatter_sum(out, full)``: out (one shard) gets the sum over
    ranks of their slice ``rank`` of ``full`` (flat, N x shard). Both return
    a :class:`Pending`; the buffers must stay alive until it is waited on."""

    name: str
    gather: Callable[[torch.Tensor, torch.Tensor, dist.ProcessGroup | None], Pending]
    scatter_sum: Callable[[torch.Tensor, torch.Tensor, dist.ProcessGroup | None], Pending]


def _collective_gather(out: torch.Tensor, shard: torch.Tensor, group) -> Pending:
    return Pending([all_gather_single(out, shard, group=group, async_op=True)])


def _collective_scatter_sum(out: torch.Tensor, full: torch.Tensor, group) -> Pending:
    return Pending([reduce_scatter_single(out, full, group=group, async_op=True)])


def _p2p(ops: list[dist.P2POp]) -> list:
    return dist.batch_isend_irecv(ops) if ops else []


def p2p_gather(out: torch.Tensor, shard: torch.Tensor, group) -> Pending:
    n, me = dist.get_world_size(group), dist.get_rank(group)
    parts = out.view(n, -1)
    parts[me].copy_(shard)
    ops = []
    for peer in range(n):
        if peer != me:
            ops.append(dist.P2POp(dist.isend, shard, group=group, group_peer=peer))
            ops.append(dist.P2POp(dist.irecv, parts[peer], group=group, group_peer=peer))
    return Pending(_p2p(ops))


def p2p_scatter_sum(out: torch.Tensor, full: torch.Tensor, group) -> Pending:
    n, me = dist.get_world_size(group), dist.get_rank(group)
    parts = full.view(n, -1)
    received = full.new_empty(n, out.numel())
    ops = []
    for peer in range(n):
        if peer != me:
            ops.append(dist.P2POp(dist.isend, parts[peer], group=group, group_peer=peer))
            ops.append(dist.P2POp(dist.irecv, received[peer], group=group, group_peer=peer))
    received[me].copy_(parts[me])

    def total() -> None:
        torch.sum(received, dim=0, out=out)  # in rank order: the same sum on every run

    return Pending(_p2p(ops), then=total)


# FSDP's collectives on gloo use the two p2p functions directly
# (torchtitan_patches/fsdp_gloo.py), not through TRANSPORTS: the K/V exchange
# is what TRANSPORTS routes, and what `bench cp`'s probe counts there.
TRANSPORTS: dict[str, Transport] = {
    "all_gather": Transport("all_gather", _collective_gather, _collective_scatter_sum),
    "p2p": Transport("p2p", p2p_gather, p2p_scatter_sum),
}

TRANSPORT_CHOICES = ("auto", *TRANSPORTS)
"""What ``[skrull] kv_exchange`` accepts."""

AUTO_BY_BACKEND: dict[str, str] = {"gloo": "p2p"}
"""``auto`` on these backends; any other (NCCL) takes ``all_gather``."""


def check_exchange(name: str) -> str:
    """``name`` if it is one of TRANSPORT_CHOICES, else a ValueError naming the key and the choices:
    the one check of a K/V exchange name (``[skrull] kv_exchange``, DacpAttention, resolve_transport)."""
    if name not in TRANSPORT_CHOICES:
        raise ValueError(f"kv_exchange: {name!r} is not one of {list(TRANSPORT_CHOICES)}")
    return name


def resolve_transport(name: str, group: dist.ProcessGroup | None) -> Transport:
    """The transport ``name`` names; ``auto``: by ``group``'s backend."""
    if check_exchange(name) == "auto":
        name = AUTO_BY_BACKEND.get(str(dist.get_backend(group)), "all_gather")
    return TRANSPORTS[name]
