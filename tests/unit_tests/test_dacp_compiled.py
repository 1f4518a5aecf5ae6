# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""DACP attention under torch.compile(fullgraph=True): the custom op of
attention/compiled.py, in one process (CP 1), on dynamo + AOTAutograd
(``aot_eager``: the op's fake and autograd registrations, without inductor's
C++ build; the same checks under inductor: test_inductor_cpu.py).

Two layers of toy blocks, compiled, against the same blocks eager: outputs
and gradients equal, one compiled graph for every layer (the layer and the
meta are opaque inputs), every layer's tape taken by its backward, none kept
under no_grad, and the layers' DACP counters those of eager.
"""

import pytest
import torch
from torch import nn

from skrull_ext.attention import build_meta, DacpAttention

# dynamo reads each input's .grad while tracing; the second block's input is not a leaf.
pytestmark = pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")

DIM, HEADS, KV_HEADS, HEAD_DIM = 16, 4, 2, 4
BATCHES = ([5, 7], [3, 9, 4])  # local sequence lengths of two micro-batches


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq = nn.Linear(DIM, HEADS * HEAD_DIM)
        self.wk = nn.Linear(DIM, KV_HEADS * HEAD_DIM)
        self.wv = nn.Linear(DIM, KV_HEADS * HEAD_DIM)
        self.attn = DacpAttention(None, kernel="dense")

    def forward(self, x: torch.Tensor, attention_masks) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, HEADS, HEAD_DIM)
        k = self.wk(x).view(b, t, KV_HEADS, HEAD_DIM)
        v = self.wv(x).view(b, t, KV_HEADS, HEAD_DIM)
        return x + self.attn(q, k, v, attention_masks=attention_masks).flatten(2)


def _model() -> nn.ModuleList:
    torch.manual_seed(0)
    return nn.ModuleList([Block() for _ in range(2)])


def _run(model, lens, grad=True):
    meta = build_meta(lens, [0] * len(lens), 0, 1)
    x = torch.randn(1, sum(lens), DIM, generator=torch.Generator().manual_seed(len(lens)))
    x.requires_grad_(grad)  # as every block's input, so no layer traces apart for it
    with torch.set_grad_enabled(grad):
        y = x
        for block in model:
            y = block(y, meta)
        if grad:
            y.square().sum().backward()
    return y.detach(), meta


def compiled_runs(backend: str):
    """The toy blocks eager and compiled by ``backend`` over BATCHES (and once under no_grad)."""
    torch._dynamo.reset()  # dynamo's caches and its graph counter are process-wide: another
    torch._dynamo.utils.counters.clear()  # test's compile before this one must not count here
    eager, compiled = _model(), _model()
    for block in compiled:
        block.compile(backend=backend, fullgraph=True)
    out = {"eager": [_run(eager, lens) for lens in BATCHES], "compiled": [_run(compiled, lens) for lens in BATCHES]}
    out["no_grad"] = _run(compiled, BATCHES[0], grad=False)
    out["graphs"] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    return eager, compiled, out


@pytest.fixture(scope="module")
def runs():
    return compiled_runs("aot_eager")


def test_compiled_op_matches_eager(runs):
    matches_eager(runs)


def test_compiled_op_leaves_no_tape_and_counts_like_eager(runs):
    leaves_no_tape_and_counts_like_eager(runs)


def matches_eager(runs) -> None:
    eager, compiled, out = runs
    for (a, _), (b, _) in zip(out["compiled"], out["eager"]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for p, r in zip(compiled.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-6, atol=1e-6)


def leaves_no_tape_and_counts_like_eager(runs) -> None:
    eager, compiled, out = runs
    # One graph per (first shape, dynamic shape, no_grad), whichever layer: not one per layer.
    assert out["graphs"] == 3, out["graphs"]
    for _, meta in out["compiled"]:
        assert all(not tapes for tapes in meta.__dict__["_dacp_tapes"].values())
    assert "_dacp_tapes" not in out["no_grad"][1].__dict__
    for c, e in zip(compiled, eager):
        assert c.attn.stats.calls == e.attn.stats.calls + 1  # the no_grad pass
        assert c.attn.stats.local_tokens == e.attn.stats.local_tokens + sum(BATCHES[0])
