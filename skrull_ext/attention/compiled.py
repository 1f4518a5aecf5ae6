# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""DACP attention as a custom op, so torchtitan's per-block
``torch.compile(fullgraph=True)`` can hold it.

Dynamo cannot trace what a DACP call does: an asynchronous K/V exchange
inside two autograd Functions whose state outlives the call (exchange.py),
host timers and counters (stats.py), the K/V kept for activation
checkpointing (replay.py), masks cached on the meta. None of that is worth
tracing: the attention is two SDPA calls around a collective. So under
compile the call is one opaque operator, ``skrull::dacp_attention``, and
the eager code runs unchanged inside it (timing and statistics included,
outside the compiled region):

- forward: the op runs the eager DACP attention with autograd on, over
  private copies of q, k, v, keeps that small graph (its "tape") on the
  micro-batch's meta, and returns a copy of the output;
- backward (``skrull::dacp_attention_backward``): takes the tape back and
  runs ``torch.autograd.grad`` through it, which issues the dK/dV
  reduce-scatter and overlaps it with the local part's backward as in eager;
- fake (meta) implementations give the shapes: the output has q's shape,
  the gradients q's and k's, all contiguous.

The meta (``DacpBatchMeta``) and the layer (:class:`DacpLayer`) are opaque
reference objects (``torch._library.opaque_object``): graph inputs that
dynamo guards by type only, so one compiled block serves every layer and
every micro-batch without a recompile.

Why the copies: inductor owns its buffers and reuses one as soon as the
compiled graph no longer reads it. The tape's saved tensors (SDPA keeps q,
k, v and its output for backward) must not be such buffers, so the op
attends copies of its inputs and returns a copy of its output. That is one
extra [tokens, heads * head_dim] copy of q, k, v and the output per layer.

Tapes are a stack per layer on the meta: a micro-batch's backward runs its
layers in reverse, and each backward takes the last forward of its layer.
A forward under ``no_grad`` (validation) keeps no tape. Under activation
checkpointing the compiled backward re-runs the op before the layer's
backward; that call finds the layer's tape still there and returns its
output again (``_replay``): the attention is neither recomputed nor
exchanged a second time, and the tape's own graph is the one backward runs.
The cost: under compile, AC does not free the attention's own activations
(the copies and what SDPA saves) between a layer's forward and backward;
the rest of the block is checkpointed as usual.

``torch.compiler.is_compiling()`` selects this path (module.py): an eager
run never goes through the op and is exactly the code it was.
"""

import weakref

import torch
from torch._library.opaque_object import register_opaque_type
from torch._opaque_base import OpaqueBase

from skrull_ext.attention.meta import DacpBatchMeta
from skrull_ext.attention.replay import in_backward

__all__ = ["DacpLayer", "dacp_attention_op"]

register_opaque_type(DacpBatchMeta, typ="reference")


class DacpLayer(OpaqueBase):
    """One DacpAttention layer as the op sees it: a weak reference to the
    module, whose ``attend`` is the eager DACP call."""

    def __init__(self, module) -> None:
        self._module = weakref.ref(module)

    @property
    def module(self):
        module = self._module()
        if module is None:
            raise RuntimeError("the DacpAttention layer of this compiled call no longer exists")
        return module


register_opaque_type(DacpLayer, typ="reference")


def _autograd_on():
    """Autograd back on inside an op's implementation. The dispatcher runs a
    custom op's kernel below the autograd keys (they are in the thread's
    exclude set), where no graph is recorded even under ``enable_grad``; this
    lifts that exclusion for the body, as torch's own leaf functions do."""
    key = torch._C.DispatchKey
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for k in (key.AutogradFunctionality, key.AutogradOther, key.AutogradNestedTensor):
        exclude = exclude.remove(k)
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)


def _tapes(meta: DacpBatchMeta, layer: DacpLayer) -> list:
    """``layer``'s tapes on ``meta``. Kept in the instance dict, not a dataclass
    field: FSDP2's pre-forward walks the dataclass fields of a block's inputs
    and would try to rebuild the meta around the tapes' grad-requiring tensors."""
    return meta.__dict__.setdefault("_dacp_tapes", {}).setdefault(id(layer), [])


@torch.library.custom_op("skrull::dacp_attention", mutates_args=())
def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: DacpBatchMeta, layer: DacpLayer,
             scale: float | None, train: bool) -> torch.Tensor:
    """q [B, L, H, D], k and v [B, L, Hkv, D] -> [B, L, H, D] (contiguous)."""
    module = layer.module
    if not train:
        return module.attend(q, k, v, meta, scale).contiguous()
    if in_backward() and _tapes(meta, layer):  # activation checkpointing re-running the layer
        return _replay(meta, layer, module.stats)
    with _autograd_on(), torch.enable_grad():
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        out = module.attend(*leaves, meta, scale)
    _tapes(meta, layer).append((leaves, out))
    return out.detach().clone(memory_format=torch.contiguous_format)


def _replay(meta: DacpBatchMeta, layer: DacpLayer, stats) -> torch.Tensor:
    """The forward's output again, from its tape, which the coming backward
    takes: nothing is recomputed and no K/V travel (the compiled twin of
    replay.py), counted as eager AC's replayed recomputation is."""
    stats.recomputes += 1
    if meta.held() and meta.cp_size > 1:
        stats.replays += 1
    return _tapes(meta, layer)[-1][1].detach().clone(memory_format=torch.contiguous_format)


@_forward.register_fake
def _(q, k, v, meta, layer, scale, train):
    return q.new_empty(q.shape)


@torch.library.custom_op("skrull::dacp_attention_backward", mutates_args=())
def _backward_op(grad: torch.Tensor, meta: DacpBatchMeta, layer: DacpLayer,
                 kv_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tapes = _tapes(meta, layer)
    if not tapes:
        raise RuntimeError("DACP attention backward without its forward (was the forward run under no_grad?)")
    leaves, out = tapes.pop()
    with _autograd_on():
        grads = torch.autograd.grad(out, leaves, grad, allow_unused=True)
    return tuple((g if g is not None else torch.zeros_like(x)).contiguous() for g, x in zip(grads, leaves))


@_backward_op.register_fake
def _(grad, meta, layer, kv_heads):
    b, n, _, d = grad.shape
    return grad.new_empty(grad.shape), grad.new_empty(b, n, kv_heads, d), grad.new_empty(b, n, kv_heads, d)


def _setup_context(ctx, inputs, output) -> None:
    ctx.meta, ctx.layer, ctx.kv_heads = inputs[3], inputs[4], inputs[1].shape[2]


def _backward(ctx, grad):
    dq, dk, dv = _backward_op(grad.contiguous(), ctx.meta, ctx.layer, ctx.kv_heads)
    return dq, dk, dv, None, None, None, None


_forward.register_autograd(_backward, setup_context=_setup_context)


def dacp_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: DacpBatchMeta,
                      layer: DacpLayer, scale: float | None) -> torch.Tensor:
    """The op as a compiled block calls it: (B, L, N, H) in and out, keeping a
    tape only where a backward can follow (grad mode on, an input requiring grad)."""
    train = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return _forward(q, k, v, meta, layer, scale, train)
