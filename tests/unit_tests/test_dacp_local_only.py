# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""An all-local micro-batch under compile (attention/local_only.py): what the
blocks receive, the traced attention against the eager DACP call and the
float64 reference, and the counters the trainer bumps in its place.

The compiled case runs dynamo + AOTAutograd (``aot_eager``), as
test_dacp_compiled.py; under inductor: test_inductor_cpu.py.
The varlen case needs CUDA (docs/gpu.md runs it).
"""

import pytest
import torch

from skrull_ext.attention import build_meta, DacpAttention, DacpStats
from skrull_ext.attention.local_only import attention_input, local_only_kernel, LocalOnlyBatch
from skrull_ext.attention.meta import DacpBatchMeta, document_causal_mask
from tests.unit_tests.test_dacp_compiled import Block, DIM, HEADS, HEAD_DIM, KV_HEADS  # the same toy block

pytestmark = pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")

LENS = [5, 7, 3]


def _local(lens):
    return build_meta(lens, [0] * len(lens), 0, 1)


def test_which_micro_batches_are_traced():
    cpu = torch.device("cpu")
    local = _local(LENS)
    # a meta with a distributed sequence keeps the opaque op (its exchange is a collective)
    dist = DacpBatchMeta(cp_rank=0, cp_size=2, local_lens=[4], dist_lens=[8])
    assert isinstance(attention_input(local, "dense", cpu), LocalOnlyBatch)
    assert attention_input(dist, "dense", cpu) is dist
    assert attention_input(local, None, cpu) is local  # eager, or a kernel without a traced call
    assert attention_input(local, "segments", cpu) is local
    b = attention_input(local, "dense", cpu)
    assert b.mask.shape == (15, 15) and torch.equal(b.mask, local.local_mask(cpu)) and b.max_len == 0
    v = attention_input(local, "varlen", cpu)  # the plan is built anywhere; the kernel runs on CUDA
    assert v.mask is None and v.cu_seqlens.tolist() == [0, 5, 12, 15] and v.max_len == 7
    assert v.cu_seqlens.dtype == torch.int32


def test_local_only_kernel_resolution():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert local_only_kernel("auto", False, cuda, torch.bfloat16) is None  # eager: the meta always
    assert local_only_kernel("auto", True, cuda, torch.bfloat16) == "varlen"
    assert local_only_kernel("auto", True, cuda, torch.float32) == "dense"
    assert local_only_kernel("auto", True, cpu, torch.bfloat16) == "dense"
    assert local_only_kernel("tiles", True, cpu, torch.float32) == "dense"
    assert local_only_kernel("segments", True, cpu, torch.float32) is None
    assert local_only_kernel("dense", True, cuda, torch.bfloat16) == "dense"


@pytest.mark.parametrize("full_ac", [False, True])
def test_counters_are_the_eager_calls(full_ac):
    """What the trainer counts for a traced micro-batch is what eager DACP counts per layer."""
    meta = _local(LENS)
    stats = [DacpStats(), DacpStats()]
    attention_input(meta, "dense", torch.device("cpu"), stats, full_ac)
    for s in stats:
        assert (s.calls, s.local_seqs, s.local_tokens, s.dist_seqs, s.dist_tokens) == (1, 3, 15, 0, 0)
        assert s.recomputes == (1 if full_ac else 0) and s.all_gathers == 0


def _reference(q, k, v, lens):
    """float64 per-token softmax attention with the document-causal mask, GQA by repetition."""
    meta = _local(lens)
    d, p = meta.local_doc_positions()
    mask = document_causal_mask(d, p, d, p)
    q, k, v = (x[0].transpose(0, 1).double() for x in (q, k, v))
    k, v = (x.repeat_interleave(q.size(0) // x.size(0), 0) for x in (k, v))
    s = (q @ k.transpose(1, 2)) / q.size(-1) ** 0.5
    s = s.masked_fill(~mask, float("-inf"))
    return (s.softmax(-1) @ v).transpose(0, 1).unsqueeze(0)


def _qkv(seed=0, device="cpu", dtype=torch.float32, head_dim=HEAD_DIM):
    g = torch.Generator().manual_seed(seed)
    t = sum(LENS)
    return [torch.randn(1, t, h, head_dim, generator=g).to(device, dtype).requires_grad_()
            for h in (HEADS, KV_HEADS, KV_HEADS)]


def test_dense_attend_equals_eager_dacp_and_the_reference():
    meta = _local(LENS)
    q, k, v = _qkv()
    got = attention_input(meta, "dense", torch.device("cpu")).attend(q, k, v, None)
    eager = DacpAttention(None, kernel="dense")(q, k, v, attention_masks=meta)
    torch.testing.assert_close(got, eager, rtol=0, atol=0)
    torch.testing.assert_close(got.double(), _reference(q, k, v, LENS), rtol=1e-5, atol=1e-6)
    ga = torch.autograd.grad(got.square().sum(), (q, k, v))
    gb = torch.autograd.grad(eager.square().sum(), (q, k, v))
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def _step(block, masks, lens):
    x = torch.randn(1, sum(lens), DIM, generator=torch.Generator().manual_seed(len(lens))).requires_grad_()
    y = block(x, masks)
    y.square().sum().backward()
    return y.detach(), [p.grad.clone() for p in block.parameters()]


def test_compiled_block_traces_the_local_attention():
    traces_the_local_attention("aot_eager")


def traces_the_local_attention(backend: str) -> None:
    """fullgraph compile over a LocalOnlyBatch: no graph break, the opaque op never
    runs (the layer's own counters stay 0), outputs and gradients those of the eager
    block over the meta; two micro-batches of other lengths reuse the dynamic graph."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = Block()
    torch.manual_seed(0)
    compiled = Block()
    compiled.compile(backend=backend, fullgraph=True)
    for lens in (LENS, [9, 2], [4, 4, 4, 1]):
        meta = _local(lens)
        for p in (*eager.parameters(), *compiled.parameters()):
            p.grad = None
        want, want_g = _step(eager, meta, lens)
        got, got_g = _step(compiled, attention_input(_local(lens), "dense", torch.device("cpu")), lens)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        for a, b in zip(got_g, want_g):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert compiled.attn.stats.calls == 0 and eager.attn.stats.calls == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="varlen_attn needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_varlen_attend_on_cuda_equals_dense_and_the_reference(dtype):
    meta = _local(LENS)
    cuda = torch.device("cuda")
    # flash attention takes head sizes in multiples of 8 (the toy block's 4 is refused); the models' are 64-128
    q, k, v = _qkv(device=cuda, dtype=dtype, head_dim=64)
    got = attention_input(meta, "varlen", cuda).attend(q, k, v, None)
    dense = attention_input(meta, "dense", cuda).attend(q, k, v, None)
    torch.testing.assert_close(got, dense, rtol=0, atol=3e-2)
    torch.testing.assert_close(got.double().cpu(), _reference(q.cpu(), k.cpu(), v.cpu(), LENS), rtol=0, atol=3e-2)
    for a, b in zip(torch.autograd.grad(got.float().square().sum(), (q, k, v)),
                    torch.autograd.grad(dense.float().square().sum(), (q, k, v))):
        torch.testing.assert_close(a.float(), b.float(), rtol=3e-2, atol=5e-2)


def test_staged_starts_are_the_plans_own():
    """A staged micro-batch hands its host-built varlen starts (MicroBatchBuffer.staged) in place
    of the plan's; the blocks receive the same tensor either way."""
    cpu = torch.device("cpu")
    local = _local(LENS)
    staged = attention_input(local, "varlen", cpu, cu_seqlens=torch.tensor([0, 5, 12, 15], dtype=torch.int32))
    plain = attention_input(_local(LENS), "varlen", cpu)
    assert torch.equal(staged.cu_seqlens, plain.cu_seqlens) and staged.cu_seqlens.dtype == torch.int32
    assert staged.max_len == plain.max_len == 7


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (pinned memory)")
def test_staged_buffer_is_pinned_and_unchanged_cuda():
    from skrull_ext.data.steps.buffers import set_buffer
    from skrull_ext.data.sources.synthetic import Sample

    samples = [Sample(input=torch.arange(n), labels=torch.arange(n)) for n in LENS]
    mb = set_buffer(samples, LENS, [0, 0, 0], [1, 1, 1], rank=0, world=1, group=True)
    st = mb.staged()
    assert all(t.is_pinned() for t in (st.input, st.labels, st.positions, st.cu_seqlens))
    assert torch.equal(st.input, mb.input) and torch.equal(st.positions, mb.positions)
    assert st.cu_seqlens.tolist() == [0, 5, 12, 15]
    dev = attention_input(st.meta, "varlen", torch.device("cuda"), cu_seqlens=st.cu_seqlens)
    assert dev.cu_seqlens.device.type == "cuda" and dev.cu_seqlens.tolist() == [0, 5, 12, 15]
