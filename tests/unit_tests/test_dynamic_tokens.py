"""A compiled block's token dimension dynamic from its first call (train/dynamic_tokens.py).

Without the marks dynamo compiles a block's first micro-batch with static
sizes and compiles again, dynamic, when the length first changes: one graph
used once. With ``mark_tokens`` before each block the first graph is the
dynamic one. Checked on test_dacp_compiled.py's toy blocks (DACP's compiled
op, ``aot_eager``): two micro-batches of different lengths and a no_grad
pass compile 2 graphs marked (3 unmarked, as that test counts), with the
eager outputs and gradients. The head's compiled chunk step
(head_grad.py): micro-batches of two lengths, whose balanced chunks differ
in size, compile one graph, the unchunked step's loss and gradients.
Which tensors are marked, per attention input: exact, below.
"""

import pytest
import torch
import torch.nn.functional as F

from skrull_ext.attention import build_meta
from skrull_ext.attention.local_only import LocalOnlyBatch
from skrull_ext.attention.prefix import ChunkAttention
from skrull_ext.train.dynamic_tokens import ATTENTION_DIMS, mark_tokens, settle
from skrull_ext.train.head_grad import head_loss_in_forward, linear_cross_entropy_grad
from tests.unit_tests.test_dacp_compiled import _model, _run, BATCHES

pytestmark = pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")


def _dynamic(t: torch.Tensor) -> set[int]:
    return set(getattr(t, "_dynamo_weak_dynamic_indices", set()))


def test_mark_tokens_marks_what_grows_with_the_micro_batch():
    base = torch.zeros(1, 12, 8)
    x, positions = base[:, :10], torch.arange(10)[None]  # a view, as FSDP hands a block its input
    mark_tokens(None, (x, build_meta([4, 6], [0, 0], 0, 1), positions))
    assert _dynamic(x) == {1} and _dynamic(base) == {1} and _dynamic(positions) == {1}

    mask, cu = torch.ones(10, 10, dtype=torch.bool), torch.tensor([0, 4, 10], dtype=torch.int32)
    mark_tokens(None, (torch.zeros(1, 10, 8), LocalOnlyBatch("dense", mask, None, 0), None))
    mark_tokens(None, (torch.zeros(1, 10, 8), LocalOnlyBatch("varlen", None, cu, 6)))  # no positions
    assert _dynamic(mask) == {0, 1} and _dynamic(cu) == {0}

    q_pos = torch.arange(4, 8)
    mark_tokens(None, (torch.zeros(1, 4, 8), ChunkAttention(q_pos, [], []), torch.arange(4, 8)[None]))
    assert _dynamic(q_pos) == {0}
    assert set(ATTENTION_DIMS) == {ChunkAttention, LocalOnlyBatch}  # the DACP meta: opaque, nothing to mark


def test_settle_hands_every_block_a_view_and_nothing_else_changes():
    """What needs grad reaches a block as a view (FSDP's forward hands one; a chunk's checkpointed
    recompute did not): the same values, its gradient flows back whole. A view, or a tensor that needs
    no grad (validation's, LoRA's frozen embedding's), is handed on as it is; mark_tokens returns the
    args only where settle replaced the hidden states. The DTensor cases (a collective not yet waited,
    torch 2.11's strides) need a TP group: test_chunk_dp_run.py's compiled TP 2 run bounds its graphs."""
    leaf = torch.randn(1, 6, 4, requires_grad=True)
    x = leaf * 2  # a block input: an activation, not a view
    got = settle(x)
    assert got is not x and got._base is x and torch.equal(got, x)
    got.sum().backward()
    assert torch.equal(leaf.grad, torch.full_like(leaf, 2.0))
    view = x.view(x.shape)
    assert settle(view) is view
    frozen = torch.randn(1, 6, 4)
    assert settle(frozen) is frozen
    positions = torch.arange(6)[None]
    args = mark_tokens(None, (x, None, positions))
    assert args[0]._base is x and args[1:] == (None, positions)
    assert mark_tokens(None, (view, None, positions)) is None


def _graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.mark.slow
@pytest.mark.parametrize("marked, graphs", [(True, 2), (False, 3)])
def test_marked_blocks_compile_one_graph_for_every_length(marked, graphs):
    """Slow: it compiles (aot_eager), a few seconds."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    eager, compiled = _model(), _model()
    for block in compiled:
        if marked:
            block.register_forward_pre_hook(mark_tokens)
        block.compile(backend="aot_eager", fullgraph=True)
    for lens in BATCHES:
        want, got = _run(eager, lens)[0], _run(compiled, lens)[0]
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    _run(compiled, BATCHES[0], grad=False)
    assert _graphs() == graphs  # marked: the dynamic graph and no_grad's; unmarked: the first shape's too
    for p, r in zip(compiled.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_compiled_head_chunk_step_compiles_once_for_every_chunk_size():
    """Micro-batches of 50 and 37 tokens in chunks of at most 16: balanced chunks of 13/12 and
    13/12 tokens (head_grad.balanced_chunks), sizes a static trace would compile for again."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    step = torch.compile(linear_cross_entropy_grad, backend="aot_eager", fullgraph=True)
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 8, generator=gen, requires_grad=True)
    for n in (50, 37):
        h = torch.randn(n, 8, generator=gen, requires_grad=True)
        labels = torch.randint(0, 64, (n,), generator=gen)
        loss = head_loss_in_forward(h, weight, None, labels, None, 16, step)
        loss.backward()
        ref_h = h.detach().clone().requires_grad_()
        ref_w = weight.detach().clone().requires_grad_()
        ref = F.cross_entropy(F.linear(ref_h, ref_w), labels, reduction="sum")
        ref.backward()
        torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(h.grad, ref_h.grad, rtol=1e-5, atol=1e-6)
        weight.grad = None
    assert _graphs() == 1
