"""The head and the cross-entropy with their gradients computed in forward (``[loss] head_backward``).

``ChunkedHeadLoss``'s other way to run its chunks (train/head_loss.py). Under checkpointing a
chunk's head runs its forward matmul twice (once more in backward's recompute) and the logits go
through the loss's elementwise work twice: four matmuls a chunk (forward, recompute, grad_h,
grad_W). Here each chunk, in the loss's forward, computes

    logits = h_c @ W^T (+ b)
    loss_c = sum over its valid tokens of logsumexp(logits) - logits[label]   (float32)
    dlogits = (softmax(logits) - onehot(label)) / divisor   (float32, then the compute dtype;
                                                              ignore_index rows zero)
    grad_h[c] = dlogits @ W,  grad_W += dlogits^T @ h_c,  grad_b += sum_rows dlogits

and the logits are dropped: three matmuls a chunk, one elementwise pass. This is what
liger-kernel's fused linear cross-entropy and torchtitan 0.3.0's ``ChunkedLossWrapper`` do, but
here as one ``torch.autograd.Function`` whose forward is all of it and whose backward returns
what forward kept, times the upstream ``grad_output`` (a loss scaled after this one scales every
gradient; 1, the trainer's, multiplies exactly). So autograd's order stays its own: the head's
weight gradient lands in its ``AccumulateGrad`` when the backward reaches this node, before the
FSDP unit of the final norm and head runs its post-backward (its reduce-scatter), as it does for
the checkpointed chunks; ``skrull.defer_grad_sync`` and free-running are untouched.

The loss is torchtitan's ``cross_entropy_loss`` (0.3.0, components/loss.py): the logits in float32
(``log_softmax(..., dtype=float32)`` is ``.float()`` then ``log_softmax``), the sum over the
tokens whose label is not ``IGNORE_INDEX`` (-100), divided by ``global_valid_tokens`` outside the
sum; the gradient is autograd's for it (``nll_loss`` then ``log_softmax``'s backward: the softmax
times the scale, the scale taken off at the label, rounded once to the compute dtype). Where the
job compiles its loss (``compile.components`` holds "loss"), the per-chunk step is compiled too.

Kept from forward to backward: the hidden states' gradient (tokens x dim, the compute dtype; the
checkpointed chunks keep the hidden states themselves, the same bytes) and the weight's gradient
accumulated in float32 (vocab x dim x 4 bytes: 545 MB for Qwen2.5-0.5B's 151,936 x 896, which
the memory model counts in ``[memory] head_grad_bytes``), the bias's if any. On CUDA the
accumulation is cuBLAS's addmm into the float32 buffer from compute-dtype operands
(``out_dtype``), one rounding a chunk; elsewhere each chunk's product is rounded to the compute
dtype first, as autograd's per-chunk gradient is (then summed in float32, not in the parameter's
dtype as autograd's ``AccumulateGrad`` sums a bf16 parameter's chunks). A torch whose CUDA addmm
refuses a float32 accumulator with bf16 operands gets each product in float32 then added
(``_Float32Sum``).

The peak of a chunk is the logits and the float32 log-softmax (``elem + 4`` bytes a vocabulary
entry and token), against the checkpointed chunk's logits, their float32 copy, the log-softmax and
its gradient; a compiled step fuses the elementwise work and holds less (the profile measures it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torchtitan.components.loss import IGNORE_INDEX

from skrull_ext.train.dynamic_tokens import mark_dynamic

__all__ = ["ChunkStep", "balanced_chunks", "head_loss_in_forward", "linear_cross_entropy_grad"]

ChunkStep = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor],
                     tuple[torch.Tensor, torch.Tensor]]
"""(h_c, weight, bias, labels, scale) -> (the chunk's loss sum in float32, d(loss x scale)/d(logits))."""


def linear_cross_entropy_grad(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                              labels: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk: the sum of torchtitan's cross-entropy over its valid tokens (float32) and the
    gradient of ``sum x scale`` with respect to the logits, in the logits' dtype. ``h`` [n, dim],
    ``labels`` [n], ``scale`` a float32 scalar tensor (1 / the step's loss tokens)."""
    logits = F.linear(h, weight, bias)
    dtype = logits.dtype
    logp = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
    del logits  # the float32 log-softmax holds what is needed from here
    valid = labels != IGNORE_INDEX
    safe = torch.where(valid, labels, 0)[:, None]
    loss = -torch.where(valid, logp.gather(-1, safe)[:, 0], 0.0).sum()
    w = torch.where(valid, scale, 0.0)[:, None]
    grad = logp.exp_().mul_(w)  # softmax x scale, in place of the log-softmax
    grad.scatter_add_(-1, safe, -w)  # - scale at the label (ignored rows: w = 0)
    return loss, grad.to(dtype)


class _Float32Sum:
    """A float32 buffer that sums products ``a @ b`` of compute-dtype operands: in one GEMM where the
    operands are float32, or on CUDA with cuBLAS's addmm into it (``out_dtype``, one rounding a
    product); where that addmm takes no float32 ``self`` (torch versions whose ``_addmm_dtype_out_cuda``
    checks "self and mat2 must have the same dtype"), the product in float32 (``mm`` with
    ``out_dtype``) then added, from the first refusal on; off CUDA, each product rounded to the
    operands' dtype first, then added."""

    def __init__(self, shape: torch.Size, device: torch.device) -> None:
        self.buf = torch.zeros(shape, dtype=torch.float32, device=device)
        self.fused = self.buf.is_cuda

    def add(self, a: torch.Tensor, b: torch.Tensor) -> None:
        buf = self.buf
        if a.dtype == buf.dtype:
            buf.addmm_(a, b)
        elif self.fused:
            try:
                torch.addmm(buf, a, b, out_dtype=buf.dtype, out=buf)
            except RuntimeError:
                self.fused = False
                buf.add_(torch.mm(a, b, out_dtype=buf.dtype))
        elif buf.is_cuda:
            buf.add_(torch.mm(a, b, out_dtype=buf.dtype))
        else:
            buf.add_(torch.mm(a, b))


def balanced_chunks(n: int, chunk: int) -> list[tuple[int, int]]:
    """``n`` tokens in ceil(n / chunk) chunks as even as can be (sizes differ by one at most, none over
    ``chunk``): [start, end) of each. A compiled chunk step then never meets a 1-token last chunk,
    which torch.compile specialises and compiles for again (GPU run 9: a recompile after warm-up)."""
    count = -(-n // chunk)
    base, extra = divmod(n, count) if count else (0, 0)
    bounds, a = [], 0
    for i in range(count):
        z = a + base + (i < extra)
        bounds.append((a, z))
        a = z
    return bounds


def _compute_dtype(h: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype the head's matmul runs in: autocast's where it is on (torchtitan's single-device
    mixed precision), else the parameter's (FSDP's unsharded ``mixed_precision_param``)."""
    device = h.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(h.dtype, weight.dtype)


class _HeadLossInForward(torch.autograd.Function):
    """Forward: the loss and every gradient (module docstring); backward: those times grad_output."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
                divisor: torch.Tensor | None, chunk: int, step: ChunkStep) -> torch.Tensor:
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        want_b = bias is not None and ctx.needs_input_grad[2]
        dtype = _compute_dtype(h, weight)
        one = torch.ones((), dtype=torch.float32, device=h.device)
        scale = one / divisor if divisor is not None else one  # autograd's DivBackward: grad / divisor
        with torch.autocast(h.device.type, enabled=False):
            w = weight.to(dtype)
            b = bias.to(dtype) if bias is not None else None
            grad_h = torch.empty(h.shape, dtype=dtype, device=h.device) if want_h else None
            grad_w = _Float32Sum(weight.shape, h.device) if want_w else None
            grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=h.device) if want_b else None
            total = torch.zeros((), dtype=torch.float32, device=h.device)
            for a, z in balanced_chunks(h.shape[0], chunk):
                # copies at offset 0 (a chunk's hidden states, a few MB against its logits' GBs): a slice's
                # storage offset is guarded too, 0 specialised, so the first chunk compiled again
                h_c, labels_c = h[a:z].to(dtype, copy=True), labels[a:z].clone()
                mark_dynamic((h_c, 0), (labels_c, 0))  # a compiled step: one graph for every chunk size
                loss, dlogits = step(h_c, w, b, labels_c, scale)
                total += loss
                if grad_h is not None:
                    torch.mm(dlogits, w, out=grad_h[a:z])
                if grad_w is not None:
                    grad_w.add(dlogits.t(), h_c)
                if grad_b is not None:
                    grad_b += dlogits.sum(0, dtype=torch.float32)
                del dlogits
        ctx.save_for_backward(grad_h, grad_w.buf if grad_w is not None else None, grad_b)
        ctx.dtypes = h.dtype, weight.dtype, bias.dtype if bias is not None else None
        return total / divisor if divisor is not None else total

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        h_dtype, w_dtype, b_dtype = ctx.dtypes
        # In place on the float32 accumulators (a retained graph's second backward then fails on
        # their version, rather than scaling them twice); grad_h in its own dtype, rounded once.
        out_h = (grad_h * grad_output).to(h_dtype) if grad_h is not None else None
        out_w = grad_w.mul_(grad_output).to(w_dtype) if grad_w is not None else None
        out_b = grad_b.mul_(grad_output).to(b_dtype) if grad_b is not None else None
        return out_h, out_w, out_b, None, None, None, None


def head_loss_in_forward(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
                         divisor: torch.Tensor | None, chunk: int,
                         step: ChunkStep = linear_cross_entropy_grad) -> torch.Tensor:
    """The summed cross-entropy of ``F.linear(h, weight, bias)`` against ``labels`` over chunks of
    ``chunk`` tokens (divided by ``divisor`` where given), its gradients computed here and handed
    to autograd in backward. ``h`` [..., dim] and ``labels`` [...] are flattened to tokens."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1 token, got {chunk}")
    return _HeadLossInForward.apply(h.reshape(-1, h.shape[-1]), weight, bias, labels.reshape(-1), divisor,
                                    chunk, step)
