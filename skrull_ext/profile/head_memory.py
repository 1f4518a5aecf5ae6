"""The profile's memory of the head and loss run in chunks (train/head_loss.py).

What one token of a chunk takes at its peak, measured on the head module alone from hidden states
made beforehand, and the chunk the job's loss then runs; ``profile_memory`` (memory.py) prices its
ladder with them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule

from skrull_ext.profile.fit import PolyFit, fit_poly
from skrull_ext.profile.model import JobModel
from skrull_ext.profile.options import ProfileOptions
from skrull_ext.profile.ranks import reduce_floats, sync

__all__ = ["chunk_head", "measure_head"]


def measure_head(jm: JobModel, tokens: Sequence[int], meter: Any, seed: int = 0) -> PolyFit:
    """Peak bytes of the head and the job's per-chunk loss over ``tokens`` tokens in one chunk,
    fwd+bwd from hidden states made beforehand, as the job's chunks run (``head_backward``):
    recompute, the head's logits, their float32 copy and gradients (and the hidden states'
    gradient); in forward (train/head_grad.py), the logits and the float32 log-softmax that
    becomes their gradient, the hidden states' gradient, and the float32 weight gradient (the
    intercept). The slope is what one token of a chunk takes."""
    from skrull_ext.train.head_grad import head_loss_in_forward

    loss, head = jm.loss_fn.loss_fn, jm.model.lm_head
    in_forward = jm.loss_fn.head_backward == "in_forward"
    g = torch.Generator().manual_seed(seed)
    dim = jm.shape.hidden

    apply = jm.loss_fn.head_apply  # the head module passes the hidden states through (model.py)
    # The head's FSDP unit groups it with the final norm (and a tied embedding). Before torch 2.13 a
    # group's pre-forward (its unshard) runs only at the first of its modules to run in a pass, and its
    # post-forward (a reshard) only when none is left to run. A lone head call leaves the norm "to run",
    # so the next lone call skipped the pre-forward and ran in the state the last backward left: sharded
    # (GPU run 9, torch 2.11: "mixed torch.Tensor and DTensor"), or the all-gather outside the meter for
    # some calls and inside for others (torch 2.11 on CPU: a slope of 8,237 bytes a token, not 18,440).
    # So each call starts with no pass open (torch 2.13 runs the pre-forward at every module anyway),
    # and FSDP's unshard (a no-op where the hook ran) before and after the call covers a pre-forward
    # skipped and a post-forward that resharded.
    unit = head if isinstance(head, FSDPModule) else None

    def once(n: int) -> float:
        h = torch.randn(1, n, dim, generator=g).to(jm.device, jm.dtype).requires_grad_()
        labels = torch.randint(0, jm.vocab_size, (1, n), generator=g).to(jm.device)
        if unit is not None:
            _close_pass(unit)
        meter.start()
        if unit is not None:
            unit.unshard()
        out = head(h)  # the module, as the model's forward calls it
        if unit is not None:
            unit.unshard()
        if in_forward:
            out = head_loss_in_forward(out, head.weight, head.bias, labels, None, n, jm.loss_fn.chunk_step)
        else:
            out, _ = loss(out if apply is None else apply(head, out), labels)
        out.backward()
        sync(jm.device)
        return meter.peak()

    once(min(tokens))  # the head's weight gradient allocated before the measured passes
    peaks = reduce_floats([once(n) for n in tokens], "max", jm.device)
    if unit is not None:  # a gradient left on an unsharded parameter (no post-backward ran) goes with it
        for p in head.parameters():
            p.grad = None
        unit.reshard()
        # and no pass of the group left open, where torch 2.11 would skip the next pass's pre-forward
        _close_pass(unit)
    jm.model.zero_grad(set_to_none=True)
    return fit_poly([float(n) for n in tokens], peaks, 1)


def _close_pass(unit: FSDPModule) -> None:
    """Forget the modules of ``unit``'s FSDP group left "to run" by a lone call, so the next call of
    any of them runs the group's pre-forward as the first of a pass (torch < 2.13 skips it otherwise)."""
    getattr(unit._get_fsdp_state(), "_modules_to_run_forward", set()).clear()


def chunk_head(jm: JobModel, opts: ProfileOptions, meter: Any,
                tick: Callable[[str], None]) -> tuple[float, int, float]:
    """(peak bytes a token of the head and loss, the job's chunk, the in-forward head's weight
    gradient held to backward) when the job's loss runs the head in chunks (train/head_loss.py),
    else (0, 0, 0). The ladder then runs in chunks of an eighth of its shortest buffer, so its
    slope holds no logits and its intercept one such chunk's (an overcount of at most that chunk:
    conservative) and, in forward, the weight gradient; the later stages run the job's chunk."""
    from skrull_ext.train.head_loss import ChunkedHeadLoss, HeadChunking, head_grad_bytes, resolve_chunking

    if not isinstance(jm.loss_fn, ChunkedHeadLoss):
        return 0.0, 0, 0.0
    tick("memory head")
    mode = jm.loss_fn.head_backward
    per_token = max(measure_head(jm, sorted(set(opts.memory_lengths))[:3], meter, opts.seed).slope, 1.0)
    chunking = resolve_chunking(jm.config.loss, jm.vocab_size, jm.dtype.itemsize, measured=per_token,
                                head_backward=mode)
    ladder = max(1, min(opts.memory_lengths) // 8)
    jm.loss_fn.set_chunking(HeadChunking(ladder, per_token, "the memory ladder's"))
    held = head_grad_bytes(jm.model.lm_head) if mode == "in_forward" else 0.0
    return per_token, chunking.chunk_tokens, held
