# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""The inner attention kernels of a DACP buffer's two parts, by name.

DACP attention (dacp.py) runs two independent attentions per layer: the
local part (queries and keys: the local sequences) and the distributed part
(this rank's zigzag queries over the gathered K/V). Both are
document-causal; what differs between kernels is how that structure reaches
the hardware:

- ``dense``: SDPA with the dense [Tq, Tk] bool mask of meta.local_mask /
  meta.dist_mask. Exact and simple, the reference the other kernels are
  tested against, the CPU default and every CPU profile's kernel; O(Tq * Tk)
  mask memory and FLOPs (CPU SDPA skips nothing a mask hides).
- ``tiles``: the segment plan cut into query tiles of at most 64 rows, one
  SDPA per tile with its own small mask (tiles.py): long segments stop paying
  for keys their early queries cannot see, short ones share a call. Alone,
  0.6-0.85x ``dense``'s time over the README job's 256-token buffers and
  0.13-0.59x over buffers of 1024-2048 tokens. In training, side by side:
  2-8% slower a step than ``dense`` in the README job (256 tokens a rank),
  0.91x its step at 512 tokens a rank and 0.71x at 1024 (docs/benchmarks.md,
  section 8). Not what ``auto`` picks: choosing by BucketSize would need
  the profiler to time the kernel chosen, so a CPU job with long buffers
  names it.
- ``segments``: the varlen segment plan (segments.py) run as one SDPA per
  segment with an explicit bottom-right causal mask. It exists so the plan --
  the part this project writes -- is tested on CPU against ``dense``; slow
  for many tiny documents (one SDPA call per document).
- ``varlen``: the same plan on ``torch.nn.attention.varlen.varlen_attn``
  (flash attention; CUDA only, bf16/fp16), called the way torchtitan 0.3.0's
  VarlenAttention calls it (keywords the installed torch lacks, as 2.11's
  ``enable_gqa``/``num_splits``, are left out). No mask is materialised. Run on
  an H200 (docs/results/gpu.md): tests/unit_tests/test_dacp_kernels.py and
  test_dacp_attention.py check it against ``dense`` and the float64
  reference on CUDA; docs/gpu.md has the command.
- ``cudnn``: the LOCAL part on cuDNN's ragged attention
  (``aten._cudnn_attention_forward`` over the same local plan's offsets and
  longest sequence, cudnn.py), its K/V heads grouped as the op receives
  them; ``cudnn-expanded``: the same with K/V repeated to the query heads
  first (for a cuDNN that refuses grouped heads). The local part's segments
  are square (a sequence attends its own tokens), where cuDNN's top-left
  causal mask is flash attention's bottom-right one. The DISTRIBUTED part
  (zigzag query chunks over more gathered keys: bottom-right causal with
  different query and key lengths) runs ``varlen`` under these names. CUDA,
  bf16/fp16 only: a CPU job naming them is refused (job_checks), a CPU
  tensor too (``run``), never replaced by another kernel. They exist
  because GPU run 9 spent half a Skrull step's device time in FA2's kernels;
  tools/attention_backends.py times both against flash attention (its rows
  carry the kernels' names) and tools/gpu_checks.sh trains the winner, if
  one beats flash by 5% (docs/gpu.md). Not traced into a compiled block
  (the op has no fake implementation): under compile they run in DACP's
  opaque op (compiled.py), with its host cost and copies.

``auto`` picks ``varlen`` for bf16/fp16 on CUDA and ``dense`` otherwise:
on the CPU debug job neither ``segments`` nor ``tiles`` trained faster side
by side (section 8); with 512 tokens a rank or more, ``tiles`` did. No GPU
measurement has yet put ``cudnn`` ahead of ``varlen``, so ``auto`` does not
pick it.

A kernel is two functions, so the part's mask or plan can be fetched (and
cached on the meta) on the main stream before the local part forks onto the
side stream: ``prepare(meta, part, device)`` and ``run(q, k, v, prepared,
scale)`` with q [H, Tq, D] and k, v [Hkv, Tk, D] (the part's key source).
"""

import functools
import inspect
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from skrull_ext.attention.cudnn import cudnn_local_call
from skrull_ext.attention.meta import DacpBatchMeta
from skrull_ext.attention.segments import bottom_right_causal_mask, SegmentPlan
from skrull_ext.attention.tiles import build_tile_plan, TILE_ROWS, TilePlan

__all__ = ["AUTO", "KERNELS", "Kernel", "KERNEL_CHOICES", "auto_kernel", "auto_kernel_for", "check_half_cuda",
           "check_kernel", "kernel_name", "resolve_kernel", "varlen_call"]

AUTO = "auto"
PARTS = ("local", "dist")
"""The two attentions of a DACP buffer (dacp.py)."""


@dataclass(frozen=True)
class Kernel:
    name: str
    prepare: Callable[[DacpBatchMeta, str, torch.device], Any]
    """(meta, part, device) -> what ``run`` needs, cached on the meta per micro-batch."""
    run: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any, float | None], torch.Tensor]
    """(q, k, v, prepared, scale) -> [H, Tq, D]."""
    tensors: Callable[[Any], tuple[torch.Tensor, ...]]
    """Device tensors in ``prepared`` (marked as used by the side stream)."""
    needs_cuda: str | None = None
    """What runs it where it needs CUDA (bf16/fp16): the job check's refusal on CPU names it."""
    chunk_varlen: bool = False
    """A chunk of a long document (attention/prefix.py: this rank's queries over the keys up to its
    last one, bottom-right causal) runs as one varlen segment, as this kernel's distributed part
    does, with no mask; False: SDPA with the [queries, keys] bool mask."""


# ---- dense -------------------------------------------------------------------

_MASK = {"local": DacpBatchMeta.local_mask, "dist": DacpBatchMeta.dist_mask}


def _masked_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float | None
) -> torch.Tensor:
    """[H, Tq, D] x [Hkv, Tk, D] -> [H, Tq, D] with a [Tq, Tk] bool mask."""
    out = F.scaled_dot_product_attention(
        q.unsqueeze(0),
        k.unsqueeze(0),
        v.unsqueeze(0),
        attn_mask=mask,
        scale=scale,
        enable_gqa=q.size(0) != k.size(0),
    )
    return out.squeeze(0)


DENSE = Kernel(
    name="dense",
    prepare=lambda meta, part, device: _MASK[part](meta, device),
    run=_masked_sdpa,
    tensors=lambda mask: (mask,),
)


# ---- segment plan: CPU reference executor and CUDA varlen -------------------

_PLAN = {"local": DacpBatchMeta.local_plan, "dist": DacpBatchMeta.dist_plan}


def _prepare_plan(meta: DacpBatchMeta, part: str, device: torch.device) -> SegmentPlan:
    return _PLAN[part](meta, device)


def run_segments(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: SegmentPlan, scale: float | None
) -> torch.Tensor:
    """Reference executor of a segment plan: one masked SDPA per segment."""
    if plan.key_index is not None:
        k, v = k.index_select(1, plan.key_index), v.index_select(1, plan.key_index)
    outs = []
    for s in range(plan.num_segments):
        qa, qb, ka, kb = plan.cu_q[s], plan.cu_q[s + 1], plan.cu_k[s], plan.cu_k[s + 1]
        mask = bottom_right_causal_mask(qb - qa, kb - ka, q.device)
        outs.append(_masked_sdpa(q[:, qa:qb], k[:, ka:kb], v[:, ka:kb], mask, scale))
    return torch.cat(outs, dim=1)


def _batch_invariant_mode() -> bool:
    """torchtitan's batch-invariant switch, read without importing torchtitan:
    it is a global of ``torchtitan.distributed.utils`` that only its trainer
    sets, so while that module is not loaded the mode cannot be on (and the
    attention runs where torchtitan is absent, e.g. a GPU image with another torch)."""
    utils = sys.modules.get("torchtitan.distributed.utils")
    return utils is not None and utils.is_in_batch_invariant_mode()


def _varlen_kwargs(gqa: bool, accepted: Collection[str]) -> dict:
    """As torchtitan 0.3.0's VarlenAttention: num_splits=1 where FA2's automatic
    split-KV is unreliable or batch invariance is asked for (not on ROCm, which
    rejects it); enable_gqa when K/V have fewer heads (``gqa``). Only the keywords in
    ``accepted`` (varlen_attn's parameters) are passed: torch 2.11's varlen_attn
    has neither (GQA then goes to flash attention's native MQA/GQA support, and
    num_splits is chosen by the kernel)."""
    from torch.nn.attention import current_flash_attention_impl

    kwargs: dict[str, Any] = {}
    if (current_flash_attention_impl() in (None, "FA2") or _batch_invariant_mode()) and torch.version.hip is None:
        kwargs["num_splits"] = 1
    if gqa:
        kwargs["enable_gqa"] = True
    return {key: value for key, value in kwargs.items() if key in accepted}


def check_half_cuda(kernel: str, q: torch.Tensor) -> None:
    """The CUDA-only kernels' one runtime check: a ValueError naming ``kernel`` unless q is
    bf16/fp16 on CUDA (a CPU run is refused, never handed to another kernel)."""
    if not q.is_cuda or q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"the {kernel} kernel needs bf16/fp16 CUDA tensors, got {q.dtype} on {q.device}")


def varlen_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seq_q: torch.Tensor, cu_seq_k: torch.Tensor,
                max_q: int, max_k: int, scale: float | None, kwargs: dict) -> torch.Tensor:
    """varlen_attn over [H, T, D] tensors, causal (bottom-right), back as [H, Tq, D]:
    the one call of both the eager kernel and the traced all-local path (local_only.py)."""
    from torch.nn.attention.varlen import varlen_attn

    check_half_cuda("varlen", q)
    out = varlen_attn(q.transpose(0, 1).contiguous(), k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous(),
                      cu_seq_q, cu_seq_k, max_q, max_k, scale=scale, window_size=(-1, 0), **kwargs)
    return out.transpose(0, 1)


@functools.cache
def _varlen_keywords() -> frozenset[str]:
    """varlen_attn's parameter names, read once (run_varlen runs per layer and part)."""
    from torch.nn.attention.varlen import varlen_attn

    return frozenset(inspect.signature(varlen_attn).parameters)


def run_varlen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: SegmentPlan, scale: float | None
) -> torch.Tensor:
    """A segment plan on flash attention's varlen kernel (CUDA, bf16/fp16).

    varlen_attn takes [T, H, D]; window_size (-1, 0) is causal, which flash
    attention aligns bottom-right when a segment has more keys than queries.
    """
    if plan.key_index is not None:
        k, v = k.index_select(1, plan.key_index), v.index_select(1, plan.key_index)
    return varlen_call(q, k, v, plan.cu_seq_q, plan.cu_seq_k, plan.max_q, plan.max_k, scale,
                       _varlen_kwargs(q.size(0) != k.size(0), _varlen_keywords()))


def _prepare_tiles(meta: DacpBatchMeta, part: str, device: torch.device) -> TilePlan:
    key = (part, "tiles", torch.device(device or "cpu"))
    return meta.memo(key, lambda: build_tile_plan(_PLAN[part](meta, device), TILE_ROWS, device))


def run_tiles(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tiles: TilePlan, scale: float | None) -> torch.Tensor:
    """A tile plan (tiles.py): one masked SDPA per tile of at most TILE_ROWS queries."""
    if tiles.key_index is not None:
        k, v = k.index_select(1, tiles.key_index), v.index_select(1, tiles.key_index)
    outs = [_masked_sdpa(q[:, qa:qb], k[:, ka:kb], v[:, ka:kb], mask, scale)
            for (qa, qb, ka, kb), mask in zip(tiles.bounds, tiles.masks)]
    return torch.cat(outs, dim=1) if len(outs) != 1 else outs[0]


# ---- cuDNN's ragged attention for the local part, varlen for the distributed one ----


@dataclass(frozen=True)
class CudnnPart:
    """A part's segment plan and whether cuDNN runs it (the local part) or varlen (the distributed one)."""

    plan: SegmentPlan
    local: bool


def _prepare_cudnn(meta: DacpBatchMeta, part: str, device: torch.device) -> CudnnPart:
    def build() -> CudnnPart:
        plan = _PLAN[part](meta, device)
        local = part == "local"
        if local and (plan.key_index is not None or plan.cu_q != plan.cu_k):  # cuDNN's mask is top-left
            raise ValueError("the cudnn kernel needs a local plan of square segments (each sequence over itself)")
        return CudnnPart(plan, local)

    return meta.memo((part, "cudnn", torch.device(device or "cpu")), build)


def run_cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prepared: CudnnPart, scale: float | None,
              grouped: bool = True) -> torch.Tensor:
    """The local part on cuDNN (cudnn.py), the distributed part on varlen; CUDA bf16/fp16 only."""
    check_half_cuda("cudnn" if grouped else "cudnn-expanded", q)
    if not prepared.local:
        return run_varlen(q, k, v, prepared.plan, scale)
    return cudnn_local_call(q, k, v, prepared.plan.cu_seq_q, prepared.plan.max_q, scale, grouped)


SEGMENTS = Kernel(name="segments", prepare=_prepare_plan, run=run_segments, tensors=lambda p: p.tensors)
TILES = Kernel(name="tiles", prepare=_prepare_tiles, run=run_tiles, tensors=lambda t: t.tensors)
VARLEN = Kernel(name="varlen", prepare=_prepare_plan, run=run_varlen, tensors=lambda p: p.tensors,
                needs_cuda="flash attention", chunk_varlen=True)
CUDNN = Kernel(name="cudnn", prepare=_prepare_cudnn, run=functools.partial(run_cudnn, grouped=True),
               tensors=lambda p: p.plan.tensors, needs_cuda="cuDNN's attention", chunk_varlen=True)
CUDNN_EXPANDED = Kernel(name="cudnn-expanded", prepare=_prepare_cudnn, run=functools.partial(run_cudnn, grouped=False),
                        tensors=lambda p: p.plan.tensors, needs_cuda="cuDNN's attention", chunk_varlen=True)

KERNELS: dict[str, Kernel] = {k.name: k for k in (DENSE, TILES, SEGMENTS, VARLEN, CUDNN, CUDNN_EXPANDED)}
KERNEL_CHOICES = (AUTO, *KERNELS)
"""What ``dacp_attention(kernel=...)`` and ``[skrull] attention_kernel`` accept."""


def auto_kernel(q: torch.Tensor) -> str:
    """``varlen`` where flash attention runs (CUDA, bf16/fp16), else ``dense``."""
    return _auto(q.is_cuda, q.dtype)


def auto_kernel_for(device: torch.device, dtype: torch.dtype) -> str:
    """``auto_kernel`` before any q exists: by the device and the compute dtype."""
    return _auto(torch.device(device).type == "cuda", dtype)


def kernel_name(kernel: str, device: torch.device, dtype: torch.dtype) -> str:
    """``kernel`` as a log line says it: ``auto`` with what it resolves to (``auto (dense)``)."""
    return f"{AUTO} ({auto_kernel_for(device, dtype)})" if kernel == AUTO else kernel


def _auto(cuda: bool, dtype: torch.dtype) -> str:
    return "varlen" if cuda and dtype in (torch.bfloat16, torch.float16) else "dense"


def check_kernel(name: str) -> str:
    """``name`` if it is one of KERNEL_CHOICES, else a ValueError naming the key and the choices:
    the one check of a kernel name (``[skrull] attention_kernel``, DacpAttention, dacp_attention)."""
    if name not in KERNEL_CHOICES:
        raise ValueError(f"attention_kernel: {name!r} is not one of {list(KERNEL_CHOICES)}")
    return name


def resolve_kernel(name: str, q: torch.Tensor) -> Kernel:
    """The kernel called ``name`` (``auto``: chosen for q's device and dtype)."""
    check_kernel(name)
    return KERNELS[auto_kernel(q) if name == AUTO else name]
