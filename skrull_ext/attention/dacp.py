# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""DACP attention over one CP rank's buffer (docs/design/method.md, "Executing a DACP
micro-batch"; layout in docs/design/buffer_layout.md).

    buffer = [local sequences, whole] + [zigzag shards of distributed sequences]

1. issue the async all-gather of the distributed part's K/V over the CP group
   (one collective, or point-to-point sends: transport.py);
2. attend the local part (document-masked causal) meanwhile, on a side stream
   on CUDA, inline on CPU while gloo's thread moves the bytes;
3. wait, then attend this rank's distributed queries over the gathered K/V with
   the mask built from true (zigzag) positions;
4. write both outputs back in buffer order.

Backward mirrors it through autograd: the reduce-scatter of dK/dV is issued
before the local part's backward and waited on after it (see exchange.py).

Under activation checkpointing the layer runs again inside backward. Given a
``replay`` (one per layer, DacpAttention holds it), that recomputation reuses
the K/V its forward gathered instead of gathering again; the reduce-scatter
of dK/dV still runs once, in the original graph's backward (see replay.py).

Profiler traces show the parts as ``dacp/local``, ``dacp/kv_wait`` and
``dacp/distributed``.

Only K/V heads travel, so GQA moves n_kv_heads/n_heads of the MHA bytes.

Under skrull-pool (``meta.dist_sets``) each distributed sequence has its own
rank set of the world: ``group`` is then the world group, the exchange goes
point to point to the ranks this one shares a sequence with (routes.py), and
only those ranks need to call this for the micro-batch to complete.

The inner attention of both parts is a named kernel (kernels.py): ``dense``
(SDPA with the dense bool masks, O(T^2) mask memory and work; the CPU
default), ``tiles`` (the segment plan cut into query tiles, one small masked
SDPA each, tiles.py), ``varlen`` (flash attention's
varlen kernel over a segment plan cached on the meta, segments.py; chosen by
``auto`` for bf16/fp16 on CUDA, checked against ``dense`` on a GPU by
docs/gpu.md's tests), ``segments`` (the same plan as a per-segment SDPA
loop, the CPU reference that tests the plan against ``dense``) and ``cudnn``
/ ``cudnn-expanded`` (the local part on cuDNN's ragged attention, the
distributed part on varlen; CUDA only, cudnn.py).
"""

import time

import torch
import torch.distributed as dist
from torch.profiler import record_function

from skrull_ext.attention.exchange import KVExchange, start_exchange, wait_exchange
from skrull_ext.attention.kernels import AUTO, Kernel, resolve_kernel
from skrull_ext.attention.meta import DacpBatchMeta
from skrull_ext.attention.replay import in_backward, KVReplay
from skrull_ext.attention.routes import routes_for
from skrull_ext.attention.stats import DacpStats
from skrull_ext.attention.stream import SideStream, side_stream_for
from skrull_ext.attention.transport import Transport, resolve_transport

__all__ = ["count_call", "dacp_attention"]


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: DacpBatchMeta, group) -> None:
    if not (q.dim() == k.dim() == v.dim() == 3):
        raise ValueError(f"q, k, v must be [heads, tokens, head_dim], got {q.shape}, {k.shape}, {v.shape}")
    if k.shape != v.shape or q.size(2) != k.size(2):
        raise ValueError(f"incompatible q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.size(0) % k.size(0):
        raise ValueError(f"q heads ({q.size(0)}) must be a multiple of kv heads ({k.size(0)})")
    if q.size(1) != meta.num_tokens or k.size(1) != meta.num_tokens:
        raise ValueError(
            f"buffer has {q.size(1)} tokens but meta describes {meta.num_tokens} "
            f"(local {meta.local_lens}, distributed {meta.dist_lens} on cp_size {meta.cp_size})"
        )
    if meta.cp_size > 1:
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        if (size, rank) != (meta.cp_size, meta.cp_rank):
            raise ValueError(
                f"meta is for cp_rank {meta.cp_rank}/{meta.cp_size} but the group gives {rank}/{size}"
            )


def count_call(stats: DacpStats, meta: DacpBatchMeta, recompute: bool) -> None:
    """One layer's attention call over ``meta``: a forward, or activation
    checkpointing re-running it (``recompute``: inside backward)."""
    if recompute:
        stats.recomputes += 1
        return
    stats.calls += 1
    stats.local_seqs += len(meta.local_lens)
    stats.local_tokens += meta.num_local_tokens
    stats.dist_seqs += meta.num_held
    stats.dist_tokens += meta.num_dist_tokens


def dacp_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: DacpBatchMeta,
    group: dist.ProcessGroup | None = None,
    *,
    scale: float | None = None,
    stats: DacpStats | None = None,
    side_stream: SideStream | None = None,
    replay: KVReplay | None = None,
    exchange: str | Transport = "auto",
    kernel: str | Kernel = AUTO,
) -> torch.Tensor:
    """Document-masked causal attention of one CP rank's DACP buffer.

    Args:
        q: [H, T, D] or [1, H, T, D] queries of this rank's buffer (T = meta.num_tokens).
        k, v: same layout with Hkv heads (H % Hkv == 0, GQA when fewer).
        meta: this rank's :class:`DacpBatchMeta`.
        group: the CP process group (size meta.cp_size); unused when cp_size is 1.
            With ``meta.dist_sets`` (skrull-pool), the group whose ranks the sets
            name: the world group (None: the default group).
        scale: softmax scale, default 1/sqrt(D).
        stats: counters to add this call to.
        side_stream: where the local part runs; default the device's shared one.
        replay: this layer's kept K/V: a forward records into it, an activation
            checkpointing recomputation (inside backward) takes from it.
        exchange: how K/V travel, a Transport or its name (transport.TRANSPORTS,
            or "auto": by the group's backend); every rank must pass the same.
        kernel: inner attention of both parts, a Kernel or its name
            (kernels.KERNELS, or ``auto``: varlen for bf16/fp16 on CUDA, else
            dense). DacpAttention passes both resolved, once per layer.

    Returns:
        Output in q's layout and buffer order. Every CP rank of the group must
        call this with the same ``dist_lens`` (it is a collective); with
        ``dist_sets``, every rank sharing a sequence with this one.
    """
    batched = q.dim() == 4
    if batched:
        if q.size(0) != 1 or k.size(0) != 1 or v.size(0) != 1:
            raise ValueError(f"batched input must have batch size 1, got {q.size(0)}")
        q, k, v = q[0], k[0], v[0]
    _check(q, k, v, meta, group)
    kern = kernel if isinstance(kernel, Kernel) else resolve_kernel(kernel, q)
    side_stream = side_stream or side_stream_for(q.device)
    n_loc = meta.num_local_tokens
    has_local, has_dist = n_loc > 0, meta.num_held > 0

    # 1. Issue the exchange first so it runs under the local part.
    ex = None
    if has_dist and meta.cp_size > 1:
        recompute = replay is not None and in_backward()
        if meta.dist_sets is not None:  # rank sets: point to point, whatever the transport
            ex = KVExchange(group, stats, replay=replay.take(meta) if recompute else None,
                            routes=routes_for(meta, q.device))
        else:
            ex = KVExchange(group, stats, replay=replay.take(meta) if recompute else None,
                            transport=exchange if isinstance(exchange, Transport)
                            else resolve_transport(exchange, group))
        kv = torch.stack([k[:, n_loc:], v[:, n_loc:]])  # [2, Hkv, Td, D]
        gathered = start_exchange(kv, ex)  # flat [N * 2 * Hkv * Td * D], not valid yet

    # 2. Local part.
    out_loc = None
    if has_local:
        t0 = time.perf_counter()
        prep = kern.prepare(meta, "local", q.device)
        ql, kl, vl = q[:, :n_loc], k[:, :n_loc], v[:, :n_loc]
        with side_stream.fork(ql, kl, vl, *kern.tensors(prep)), record_function("dacp/local"):
            out_loc = kern.run(ql, kl, vl, prep, scale)
        if stats is not None:
            stats.local_s += time.perf_counter() - t0

    # 3. Distributed part over the gathered K/V (rank-major token order).
    out_dist = None
    if has_dist:
        qd = q[:, n_loc:]
        if ex is None:  # cp_size 1: nothing to exchange
            kd, vd = k[:, n_loc:], v[:, n_loc:]
        else:
            with record_function("dacp/kv_wait"):
                kd, vd = wait_exchange(gathered, ex)
            if replay is not None and not recompute and torch.is_grad_enabled():
                ex.kept = replay.record(meta, kd, vd)
        with record_function("dacp/distributed"):
            out_dist = kern.run(qd, kd, vd, kern.prepare(meta, "dist", q.device), scale)

    # 4. Back in buffer order.
    if out_loc is not None:
        side_stream.join(out_loc)
    parts = [o for o in (out_loc, out_dist) if o is not None]
    if not parts:  # an empty buffer; clone keeps the graph connected
        out = q.clone()
    else:
        out = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]

    if stats is not None:
        count_call(stats, meta, in_backward())
    return out.unsqueeze(0) if batched else out
