# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""DACP attention as a drop-in for torchtitan's inner attention.

torchtitan 0.3.0's ``GQAttention`` calls ``inner_attention(xq, xk, xv,
attention_masks=..., scale=..., enable_gqa=...)`` with (B, L, N, H) tensors
and passes the per-batch ``attention_masks`` to every layer. A Skrull run
passes the micro-batch's :class:`DacpBatchMeta` there, so the meta reaches
each layer the same way a BlockMask would, with no new plumbing.

Each instance is one layer and keeps that layer's gathered K/V for
activation checkpointing (replay.py), so a recomputation under torchtitan's
full or selective AC does not gather again.

Under ``torch.compile`` (torchtitan's per-block ``fullgraph=True``) the
call is the opaque custom op of compiled.py, which runs :meth:`attend`, this
same eager code, at run time; a micro-batch with no distributed sequence
arrives instead as a :class:`LocalOnlyBatch`, whose kernel call is traced
into the block (local_only.py).

Under tensor parallelism q, k and v arrive as DTensors whose heads (dim 2)
are sharded over the TP mesh: the call runs on this rank's heads, exchanging
their K/V over ``group`` (the CP group of this TP rank), and returns a DTensor
of the same placements, as torchtitan's ``local_map`` around its own inner
attention does (skrull_ext/train/job/tensor_parallel.py).

Wiring it into a model (Config/build, the CP group from the device mesh,
replacing torchtitan's CP wrapper) belongs to the torchtitan integration.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from skrull_ext.attention.compiled import dacp_attention_op, DacpLayer
from skrull_ext.attention.dacp import dacp_attention
from skrull_ext.attention.kernels import AUTO, KERNELS, Kernel, check_kernel, resolve_kernel
from skrull_ext.attention.local_only import LocalOnlyBatch
from skrull_ext.attention.meta import DacpBatchMeta
from skrull_ext.attention.prefix import ChunkAttention
from skrull_ext.attention.replay import KVReplay
from skrull_ext.attention.stats import DacpStats
from skrull_ext.attention.transport import Transport, check_exchange, resolve_transport

__all__ = ["DacpAttention"]


class DacpAttention(nn.Module):
    """Inner attention over a DACP buffer: (1, L, N, H) in, (1, L, N, H) out."""

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        stats: DacpStats | None = None,
        kernel: str = AUTO,
        exchange: str = "auto",
    ) -> None:
        super().__init__()
        self.group = group
        self.kernel = check_kernel(kernel)  # a bad name fails here, not at the first step
        """Inner attention kernel, a name of kernels.KERNELS or ``auto`` (from the first call's q)."""
        self.exchange = check_exchange(exchange)
        """How K/V travel, a name of transport.TRANSPORTS or ``auto`` (by the group's backend)."""
        # Resolved once: the transport from the group now, ``auto``'s kernel at
        # the first call (it depends on the device and dtype of q).
        self._kernel: Kernel | None = None if kernel == AUTO else KERNELS[kernel]
        self._transport: Transport | str = exchange if group is None else resolve_transport(exchange, group)
        self.stats = stats if stats is not None else DacpStats()
        self.replay = KVReplay()
        self.layer = DacpLayer(self)
        """This layer as the compiled op's opaque argument (compiled.py)."""
        self.chunk_prefix: torch.Tensor | None = None
        """A traced chunk's prefix K/V for this layer, joined (attention/prefix.py); None outside one."""
        self.chunk_kept: torch.Tensor | None = None
        """A traced chunk's own K/V for this layer, set by its forward, taken by train/chunked.py."""

    def forward(
        self,
        q_BLNH: torch.Tensor,
        k_BLNH: torch.Tensor,
        v_BLNH: torch.Tensor,
        *,
        attention_masks: DacpBatchMeta,
        scale: float | None = None,
        enable_gqa: bool = False,  # implied by the head counts; kept for the call signature
        **kwargs,
    ) -> torch.Tensor:
        # Two checks, not one with a tuple: under compile the meta is an opaque object, which
        # dynamo matches against its own registered class only.
        if (not isinstance(attention_masks, LocalOnlyBatch) and not isinstance(attention_masks, DacpBatchMeta)
                and not isinstance(attention_masks, ChunkAttention)):
            raise TypeError(
                f"DacpAttention needs attention_masks to be a DacpBatchMeta, LocalOnlyBatch or ChunkAttention, got "
                f"{type(attention_masks)}"
            )
        if isinstance(q_BLNH, DTensor):  # TP: this rank's heads, back as the same placements
            placements = q_BLNH.placements
            if k_BLNH.placements != placements or v_BLNH.placements != placements:
                raise TypeError(f"DacpAttention: q, k, v placements differ ({placements}, "
                                f"{k_BLNH.placements}, {v_BLNH.placements})")
            out = self._local(q_BLNH.to_local(), k_BLNH.to_local(), v_BLNH.to_local(), attention_masks, scale)
            return DTensor.from_local(out, q_BLNH.device_mesh, placements, run_check=False)
        return self._local(q_BLNH, k_BLNH, v_BLNH, attention_masks, scale)

    def _local(self, q_BLNH, k_BLNH, v_BLNH, meta: DacpBatchMeta | LocalOnlyBatch | ChunkAttention,
               scale: float | None) -> torch.Tensor:
        if isinstance(meta, ChunkAttention):  # a chunk of a chunked document (prefix.py), on this rank's heads
            return meta.attend(self, q_BLNH, k_BLNH, v_BLNH, scale)
        if isinstance(meta, LocalOnlyBatch):  # all local, compiled: the kernel traced in (local_only.py)
            return meta.attend(q_BLNH, k_BLNH, v_BLNH, scale)
        if torch.compiler.is_compiling():
            return dacp_attention_op(q_BLNH, k_BLNH, v_BLNH, meta, self.layer, scale)
        return self.attend(q_BLNH, k_BLNH, v_BLNH, meta, scale)

    def attend(self, q_BLNH: torch.Tensor, k_BLNH: torch.Tensor, v_BLNH: torch.Tensor,
               meta: DacpBatchMeta, scale: float | None) -> torch.Tensor:
        """The eager DACP call, (B, L, N, H) in and out: what ``forward`` runs
        outside torch.compile and the compiled op runs inside."""
        if self._kernel is None:
            self._kernel = resolve_kernel(AUTO, q_BLNH)
        out_BNLH = dacp_attention(
            q_BLNH.transpose(1, 2),
            k_BLNH.transpose(1, 2),
            v_BLNH.transpose(1, 2),
            meta,
            # skrull-pool's metas name world ranks: their exchange is over the world group.
            self.group if meta.dist_sets is None else None,
            scale=scale,
            stats=self.stats,
            replay=self.replay,
            kernel=self._kernel,
            exchange=self._transport,
        )
        return out_BNLH.transpose(1, 2)
