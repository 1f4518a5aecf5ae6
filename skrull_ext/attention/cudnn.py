# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""cuDNN's ragged attention over a DACP buffer's local part: the call of the
``cudnn`` and ``cudnn-expanded`` kernels (kernels.py).

``aten._cudnn_attention_forward`` with cumulative sequence offsets is the
ragged layout ``varlen_attn`` itself would call if its ``_should_use_cudnn``
did not return False (torch 2.11-2.13). Its causal mask is aligned
top-left; flash attention's (``varlen``) bottom-right. The two are the same
mask where a segment has as many keys as queries, which is every segment of
the local part: a local sequence's queries attend its own tokens
(``meta.local_plan``: one segment per sequence, ``cu_seq_q == cu_seq_k``, no
key index). The distributed part (zigzag query chunks over more keys) is not
such a plan, so the kernels leave it to ``varlen``.

The op takes K/V heads grouped (fewer than the query heads: GQA) in some
cuDNN builds and not in others; ``grouped`` False repeats them to the query
heads first, which any cuDNN takes, at the cost of the repeat and of dK/dV
summed back through it by autograd. tools/attention_backends.py times both
against flash attention on the GPU (rows ``cudnn`` and ``cudnn-expanded``,
the kernels' names), each after an agreement check against a float64 oracle.

The op's own derivative (``_cudnn_attention_backward``) is the backward.
Its ragged form reads the output's gradient at the output's offsets (in
PyTorch's aten/src/ATen/native/cudnn/MHA.cpp as read here, the offsets are
the cumulative lengths times the output's token stride, whatever dO's
strides), so the gradient is handed to it packed as the output is
(``_PackedGrad``): the gradient DACP gives back is a transposed slice of the
buffer's. It has no CPU kernel and no fake (meta) implementation, so the compiled trainer
cannot trace it into a block (local_only.py keeps ``varlen``/``dense`` only):
under compile these kernels run inside DACP's opaque op (compiled.py).
"""

import torch

__all__ = ["cudnn_local_call"]


class _PackedGrad(torch.autograd.Function):
    """The identity; backward passes the gradient on contiguous, in the layout of the tensor it was
    applied to (cuDNN's packed [T, H, D] output)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def cudnn_local_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int,
                     scale: float | None, grouped: bool) -> torch.Tensor:
    """Causal attention of each segment over itself: q [H, T, D], k and v [Hkv, T, D] (the same
    tokens), ``cu_seqlens`` int32 [S+1] on q's device, ``max_len`` the longest segment; back as
    [H, T, D]. ``grouped`` False: K/V repeated to H heads before the call. No device or dtype
    check here (the kernel's run checks): a CPU test swaps the op for a stand-in."""
    heads = q.size(0)
    if not grouped and k.size(0) != heads:
        k, v = (x.repeat_interleave(heads // x.size(0), dim=0) for x in (k, v))
    # [T, H, D] packed, the layout the ragged offsets index (as varlen_attn's).
    q, k, v = (x.transpose(0, 1).contiguous() for x in (q, k, v))
    out = torch.ops.aten._cudnn_attention_forward(
        q, k, v, None, cu_seqlens, cu_seqlens, max_len, max_len,
        True,  # compute_log_sumexp: the backward needs it
        0.0,  # dropout_p
        True,  # is_causal (top-left, the bottom-right mask of a square segment)
        False,  # return_debug_mask
        scale=scale,
    )[0]
    return _PackedGrad.apply(out).transpose(0, 1)
