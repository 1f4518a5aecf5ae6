# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""A compiled block's token dimension dynamic from its first call.

torchtitan compiles each TransformerBlock; dynamo traces its first call
with static sizes and, when a later call's sizes differ, compiles again with
them dynamic (automatic dynamic shapes). A Skrull micro-batch is of variable
length, so every compiled Skrull job compiled each of its graphs twice: the
first micro-batch's, used once, then the dynamic one every later
micro-batch runs. On an H200 (docs/results/gpu.md, run 9) that second
compile made step 2 take 4.8 s against 0.3 s a step after it.

So a pre-hook on each block marks the token dimension of what the block
receives dynamic (``maybe_mark_dynamic``) before dynamo sees it: the hidden
states ``[1, L, D]`` and positions ``[1, L]`` (each with the tensor it views:
FSDP's pre-forward hands the block a view), and the tensors of the
attention input that grow with the micro-batch (``ATTENTION_DIMS``): a
traced chunk's query positions (train/chunked.py), an all-local
micro-batch's dense mask or varlen starts (attention/local_only.py). The
DACP meta is an opaque object, guarded by type alone (attention/compiled.py).
``maybe``: a one-token input (a lockstep pad pass, a document's last token)
is still specialised to 1, a graph of its own, as dynamo does any size 1.
Ints (varlen's longest sequence) cannot be marked: they turn dynamic after
their first change, as before. The job's compiled loss and the head's
compiled chunk step (train/head_loss.py, head_grad.py) vary with the
micro-batch too: their callers mark the token dimension (``mark_dynamic``).

Under TP the hidden states are a DTensor. The first block's come from the
embedding's reduce-scatter, in eager: their local tensor is an
``AsyncCollectiveTensor`` (not yet waited), while every later block gets a
compiled block's output, a plain tensor. Dynamo guards on that type, so
every graph was compiled twice, once for block 0 and once for the rest (the
TP 2 debug job: 10 block graphs where 5 do). The hook waits for the
collective first (``settle``), as block 0's first op would: the same graphs
for every block, and nothing overlapped is lost. Torch 2.11 splits them
another way: a compiled block's output DTensor [1, L, D] has the stride
(L, D, 1), the embedding's (L x D, D, 1), and dynamo guards on it (13
graphs on 2.11 where 2.13 had 6), so a DTensor with other than contiguous
strides is re-wrapped with them, an identity in autograd. Under FSDP a
chunk's recompute got a block input that is not a view where its forward
got one, which dynamo guards on too: the hook hands every block a view
(train/chunked.py), the TP 2 chunked debug job 4 graphs where it had 6.

torchtitan's batchings train one row shape, and an uncompiled job has
nothing to trace: the trainer marks only a compiled Skrull job's blocks.
"""

from collections.abc import Callable, Iterable

import torch
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor
from torch.utils.hooks import RemovableHandle

from skrull_ext.attention.local_only import LocalOnlyBatch
from skrull_ext.attention.prefix import ChunkAttention

__all__ = ["ATTENTION_DIMS", "mark_blocks", "mark_dynamic", "mark_tokens", "settle"]

ATTENTION_DIMS: dict[type, Callable[[object], list[tuple[torch.Tensor | None, int]]]] = {
    ChunkAttention: lambda c: [(c.q_pos, 0)],
    LocalOnlyBatch: lambda b: [(b.mask, 0), (b.mask, 1), (b.cu_seqlens, 0)],
}
"""Per attention input type: its (tensor, dimension) pairs that vary with the micro-batch (None:
a tensor that input does not have). A type not here (the DACP meta) has none dynamo sees."""


def mark_dynamic(*dims: tuple[torch.Tensor | None, int]) -> None:
    """Each (tensor, dimension) dynamic at the next compile that meets the tensor, and the same
    dimension of the tensor it views; None and non-tensors skipped. Outside a trace: on the
    host, before a compiled function's call."""
    for t, dim in dims:
        if not isinstance(t, torch.Tensor):
            continue
        torch._dynamo.maybe_mark_dynamic(t, dim)
        if t._base is not None:
            torch._dynamo.maybe_mark_dynamic(t._base, dim - (t.dim() - t._base.dim()))


def settle(x: object) -> object:
    """``x``, or a DTensor that every block receives in the same form (module docstring): its local
    tensor, if a collective not yet waited (an ``AsyncCollectiveTensor``), swapped in place for the
    waited one (the same data and the same autograd node, the DTensor's); and where its strides are
    not the contiguous ones (torch 2.11 gives a compiled block's output DTensor the stride (L, D, 1)
    for [1, L, D], the embedding's is (L x D, D, 1)), re-wrapped with them (``to_local`` and
    ``from_local``: an identity in autograd, no communication). And any input that needs grad, a
    view: FSDP's pre-forward hands a block its input as one (the autograd function its post-backward
    hook hangs on) but not in a chunk's checkpointed recompute (it returns early in backward), and
    dynamo guards on whether an input is a view: two more chunk graphs, and the recompute met
    another graph than its forward ran."""
    for t in (x, getattr(x, "_base", None)):
        local = getattr(t, "_local_tensor", None)
        if isinstance(local, AsyncCollectiveTensor):
            t._local_tensor = local.trigger_wait()
    if isinstance(x, DTensor):
        contiguous = tuple(torch._prims_common.make_contiguous_strides_for(x.shape))
        if x.stride() != contiguous:
            x = DTensor.from_local(x.to_local(), x.device_mesh, x.placements, run_check=False, shape=x.shape,
                                   stride=contiguous).view(x.shape)  # a view, as FSDP hands every block
    if isinstance(x, torch.Tensor) and x._base is None and x.requires_grad:
        x = x.view(x.shape)  # a chunk's recompute: FSDP hands a view in the forward only
    return x


@torch._dynamo.disable  # a hook is a frame of its own: run eagerly, it may mark what the block's frame gets
def mark_tokens(block, args) -> tuple | None:
    """Before a compiled block's frame (``register_forward_pre_hook``): its hidden states settled
    (``settle``) and the dimensions of its inputs that vary with the micro-batch dynamic (module
    docstring). Args: (hidden states, attention input, positions), torchtitan's
    TransformerBlock.forward; returns them with the settled hidden states where ``settle`` re-wrapped
    them (None: unchanged, as the hook protocol reads it)."""
    x, ctx = args[:2]
    positions = args[2] if len(args) > 2 else None
    settled = settle(x)
    mark_dynamic((settled, 1), (positions, 1), *ATTENTION_DIMS.get(type(ctx), lambda _: [])(ctx))
    return None if settled is x else (settled, *args[1:])


def mark_blocks(model_parts: Iterable[torch.nn.Module]) -> list[RemovableHandle]:
    """``mark_tokens`` before every block of each part's ``layers``; the handles remove them."""
    handles = []
    for part in model_parts:
        blocks = getattr(part, "layers", None)
        handles += [b.register_forward_pre_hook(mark_tokens) for b in (blocks.values() if blocks is not None else ())]
    return handles
