# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""An all-local micro-batch under torch.compile: its attention traced into the block.

A DACP micro-batch with no distributed sequence exchanges nothing: its
attention is one document-causal attention over the rank's buffer, the
call torchtitan's own varlen attention makes. Under compile the general
DACP call is an opaque custom op whose eager body (private copies of q, k,
v, an autograd tape, ``autograd.grad`` in backward: compiled.py) costs host
time on every layer. On an H200 a compiled Qwen2.5-0.5B block took 4.7 ms
at 128 tokens through it against 2.2 ms with torchtitan's varlen attention
(docs/results/gpu.md): ~60 ms a micro-batch over 24 layers, on a GPU that
was host-bound below ~8K tokens.

So for such a micro-batch the trainer hands the blocks a
:class:`LocalOnlyBatch` instead of the meta: tensors and ints that dynamo
traces (as torchtitan's ``VarlenMetadata``), and the kernel's own call
(``varlen_attn``, or SDPA with the dense mask) is compiled into the block.
The same kernel, plan and mask as the eager DACP call's local part: only
who calls it changes. Eager runs keep the meta (nothing to gain, and the
exact code every eager test runs), and so does the ``segments`` kernel (a
Python loop over segments, which a trace would unroll per micro-batch); the
``tiles`` kernel's all-local micro-batches trace the dense mask (TRACED_CALL).

The counters (stats.py) of a layer cannot be bumped inside a compiled
graph: :func:`attention_input` counts the micro-batch's forward calls when
it builds the batch, one per DACP layer, and under full activation
checkpointing the recomputation of each (every block re-runs whole);
selective AC's recomputation is torchtitan's op-level policy and goes
uncounted here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from skrull_ext.attention.dacp import count_call
from skrull_ext.attention.kernels import (
    _masked_sdpa, _varlen_keywords, _varlen_kwargs, AUTO, auto_kernel_for, varlen_call,
)
from skrull_ext.attention.meta import DacpBatchMeta

__all__ = ["LOCAL_ONLY_KERNELS", "LocalOnlyBatch", "TRACED_CALL", "attention_input", "local_only_kernel"]

TRACED_CALL = {"dense": "dense", "tiles": "dense", "varlen": "varlen"}
"""Per kernel, the call an all-local micro-batch traces: one op over the whole
buffer. ``tiles`` (a Python loop over tiles, which a trace would unroll per
document layout, a recompile per micro-batch) traces the dense mask's SDPA:
the same attention, without the tiles' saving."""

LOCAL_ONLY_KERNELS = tuple(dict.fromkeys(TRACED_CALL.values()))
"""The traced calls: ``dense`` and ``varlen``."""


@dataclass(frozen=True)
class LocalOnlyBatch:
    """The attention input of a micro-batch whose sequences are all local on this rank."""

    kernel: str
    """``dense`` or ``varlen`` (resolved: never ``auto``)."""
    mask: torch.Tensor | None
    """dense: the [T, T] bool document-causal mask (meta.local_mask)."""
    cu_seqlens: torch.Tensor | None
    """varlen: int32 [S+1] sequence starts (meta.local_plan's cu_seq_q, which equals its cu_seq_k)."""
    max_len: int
    """varlen: the longest sequence (dense: 0)."""
    varlen_options: tuple[tuple[str, object], ...] = ()
    """varlen: keywords of the installed varlen_attn but enable_gqa (kernels._varlen_kwargs)."""
    gqa_keyword: bool = False
    """varlen: the installed varlen_attn takes ``enable_gqa``."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor:
        """(1, L, N, H) in and out, as DacpAttention's call."""
        q, k, v = (x[0].transpose(0, 1) for x in (q, k, v))  # [heads, tokens, head_dim]
        if self.kernel == "dense":
            out = _masked_sdpa(q, k, v, self.mask, scale)
        else:
            kwargs = dict(self.varlen_options)
            if self.gqa_keyword and q.size(0) != k.size(0):
                kwargs["enable_gqa"] = True
            out = varlen_call(q, k, v, self.cu_seqlens, self.cu_seqlens, self.max_len, self.max_len, scale, kwargs)
        return out.transpose(0, 1).unsqueeze(0)


def local_only_kernel(kernel: str, compiled: bool, device: torch.device, dtype: torch.dtype) -> str | None:
    """The call an all-local micro-batch traces for ``[skrull] attention_kernel``
    resolved for the device and compute dtype (TRACED_CALL), or None: the job is
    not compiled, or its kernel has no traced call (``segments``)."""
    if not compiled:
        return None
    name = auto_kernel_for(device, dtype) if kernel == AUTO else kernel
    return TRACED_CALL.get(name)


def computes_whole_buffer(kernel: str, compiled: bool, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether DACP's attention computes each buffer whole, one masked SDPA over all its
    documents (``dense``, ``auto``'s choice but on CUDA in bf16/fp16, or the call an all-local
    buffer traces when compiled): the work a profile's ``[compute] whole_buffer`` prices
    (docs/design/cost_model.md). The profiler writes it from here and a job checks its profile
    against it, so the two cannot name the kernel's work differently."""
    traced = local_only_kernel(kernel, compiled, device, dtype)
    return (traced or (auto_kernel_for(device, dtype) if kernel == AUTO else kernel)) == "dense"


def attention_input(meta: DacpBatchMeta, kernel: str | None, device: torch.device,
                    stats: Iterable | None = None, full_ac: bool = False,
                    cu_seqlens: torch.Tensor | None = None) -> DacpBatchMeta | LocalOnlyBatch:
    """What a micro-batch's blocks receive as ``attention_masks``: a
    :class:`LocalOnlyBatch` when ``kernel`` (the resolved kernel of a compiled
    job, None otherwise) is one of LOCAL_ONLY_KERNELS and ``meta`` has no
    distributed sequence, the meta itself otherwise. ``stats``: the layers'
    counters, bumped here for the calls the compiled graph will make.
    ``cu_seqlens``: the varlen starts already built on the host (pinned:
    ``MicroBatchBuffer.staged``), copied without waiting for the device."""
    if kernel not in LOCAL_ONLY_KERNELS or meta.dist_lens or not meta.local_lens:
        return meta
    for s in stats or ():
        count_call(s, meta, recompute=False)
        if full_ac:
            count_call(s, meta, recompute=True)
    if kernel == "dense":
        return LocalOnlyBatch(kernel, meta.local_mask(device), None, 0)  # 0: no int for dynamo to guard on
    keywords = _varlen_keywords()
    cu = (cu_seqlens.to(device, non_blocking=True) if cu_seqlens is not None  # pinned: staged
          else meta.local_plan(device).cu_seq_q)  # built once per micro-batch and device (meta.memo)
    return LocalOnlyBatch(kernel, None, cu, max(meta.local_lens),
                          tuple(_varlen_kwargs(False, keywords).items()), "enable_gqa" in keywords)
