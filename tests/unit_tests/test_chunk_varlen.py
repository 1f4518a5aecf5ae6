"""A chunk of a long document on flash attention's varlen kernel (attention/prefix.py ``_varlen``).

Where the job's kernel runs its distributed part on varlen (``varlen``, ``auto`` on CUDA in
bf16/fp16, the cudnn kernels: ``Kernel.chunk_varlen``), a chunk's attention is one varlen
segment, this rank's queries over the keys up to its last one, bottom-right causal, with no
mask: SDPA's [queries, keys] bool mask grew with the document's prefix (a chunk of 16K queries
over 200K keys: 3.2 GB), which bounded memory cannot afford. varlen_attn runs on CUDA only, so
on CPU a stand-in takes its place: one segment, bottom-right causal SDPA over the first
``max_k`` keys (flash attention's alignment where keys outnumber queries, which DACP's
distributed part relies on and tests/unit_tests/test_dacp_kernels.py checks on CUDA), and it
records what it was handed. Checked:

- each CP rank's call (ranks 0..2 of 3, a prefix before the chunk) equals the masked SDPA of
  the same queries, with the key count the stand-in received;
- the debug llama3's 251-token document in 8 chunks through the varlen path equals it in one
  pass (test_chunked.py's tolerances), each chunk's segment [0, 32] over [0, end of chunk];
- traced through compiled blocks (aot_eager): the same, and an 8-chunk document after a 4-chunk
  one compiles no graph, the key count symbolic from the sizes;
- on CUDA (when a GPU is lent): the chunks on the real kernel in bf16 against the dense kernel.
"""

import pytest
import torch
import torch.nn.functional as F

from skrull_ext.attention import kernels
from skrull_ext.attention.prefix import ChunkAttention
from skrull_ext.train.chunked import chunked_loss
from tests.unit_tests.test_chunked import _close, _document, _grads, _loss, _model, CHUNK, LENGTH, one_pass
from torchtitan_patches.dacp_attention import install_dacp_attention

pytestmark = pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")


@pytest.fixture
def stand_in(monkeypatch):
    """varlen_attn on CPU: one bottom-right causal segment; the calls' (cu_q, cu_k, max_q, max_k)
    recorded where they can be read (eager)."""
    from torch.nn.attention import varlen

    calls = []

    def varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=None, enable_gqa=None, **_):
        assert tuple(window_size) == (-1, 0)  # causal
        # GQA: asked for where varlen_attn takes enable_gqa (torch >= 2.13), else flash attention's
        # native GQA, read from the head counts (2.11's, which the product passes no keyword: kernels.py)
        assert enable_gqa in (None, k.size(1) != q.size(1)), (enable_gqa, q.shape, k.shape)
        enable_gqa = k.size(1) != q.size(1)
        if not torch.compiler.is_compiling():
            calls.append((cu_q.tolist(), cu_k.tolist(), max_q, max_k))
        q, k, v = (x.transpose(0, 1)[None] for x in (q, k[:max_k], v[:max_k]))  # [1, H, T, D]
        mask = torch.arange(max_k)[None, :] <= torch.arange(max_q)[:, None] + (max_k - max_q)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
        return out[0].transpose(0, 1)

    monkeypatch.setattr(varlen, "varlen_attn", varlen_attn)
    monkeypatch.setattr(kernels, "check_half_cuda", lambda kernel, q: None)
    return calls


class _Layer:
    kernel = "varlen"


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_each_cp_ranks_segment_equals_the_masked_attention(stand_in, rank):
    """Rank ``rank`` of 3, a 40-token prefix, a 12-token chunk (4 queries a rank), GQA 4:2."""
    prefix, per, n = 40, 4, 3
    gen = torch.Generator().manual_seed(rank)
    q = torch.randn(1, per, 4, 8, generator=gen)
    kv = torch.randn(2, 2, prefix + n * per, 8, generator=gen)
    lo = prefix + rank * per
    q_pos = torch.arange(lo, lo + per)
    cu = torch.tensor([[0, per], [0, lo + per]], dtype=torch.int32)
    ctx = ChunkAttention(q_pos, [], [], None, cu)
    ctx.after = n - 1 - rank  # as a CP group of n gives it (the constructor reads the group)
    got = ctx._varlen(q, kv, None)
    mask = torch.arange(kv.size(2))[None, :] <= q_pos[:, None]
    want = F.scaled_dot_product_attention(q.transpose(1, 2), kv[0][None], kv[1][None], attn_mask=mask,
                                          enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert stand_in == [([0, per], [0, lo + per], per, lo + per)]


def _varlen_model(ac: bool = False):
    model = _model(ac=ac)
    install_dacp_attention([model], None, kernel="varlen")  # replaces the dense layers, same weights
    return model


def test_chunks_on_varlen_equal_one_pass(stand_in):
    model = _varlen_model()
    tokens, labels = _document()
    out = chunked_loss(model, tokens, labels, CHUNK, _loss)
    out.loss.backward()
    _close((out.loss.item(), _grads(model)), one_pass())
    layers = len(model.layers)
    ends = [min(a + CHUNK, LENGTH) for a in range(0, LENGTH, CHUNK)]
    seen = [(c[1][1], c[3]) for c in stand_in]
    # each chunk's segment, every layer, forward then (but the last chunk) its recomputation
    assert sorted(set(seen)) == [(e, e) for e in ends]
    assert len(stand_in) == layers * (2 * len(ends) - 1)
    assert all(c[0] == [0, c[2]] for c in stand_in)


@pytest.mark.slow
def test_traced_chunks_on_varlen_equal_one_pass_graphs_bounded(stand_in):
    """Slow: it compiles a model (aot_eager)."""
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    model = _varlen_model(ac=True)
    inputs = []

    def backend(gm, example_inputs):  # aot_eager, the graph's inputs noted
        inputs.append([n.name for n in gm.graph.nodes if n.op == "placeholder"])
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    for block in model.layers.values():
        block.compile(backend=backend, fullgraph=True)
    graphs = []
    for length in (4 * CHUNK - 5, LENGTH):
        model.zero_grad(set_to_none=True)
        before = counters["stats"]["unique_graphs"]
        tokens, labels = _document(length)
        out = chunked_loss(model, tokens, labels, CHUNK, _loss, traced=True)
        out.loss.backward()
        graphs.append(counters["stats"]["unique_graphs"] - before)
    print(f"graphs, 4 chunks then 8: {graphs}")
    # the varlen call traced: the graphs read the chunk's cu, never the query positions the mask is built from
    assert inputs and all(any("cu" in n for n in names) and not any("q_pos" in n for n in names) for names in inputs)
    assert 1 <= graphs[0] <= 2 and graphs[1] == 0, graphs
    _close((out.loss.item(), _grads(model)), one_pass(ac=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="varlen_attn needs CUDA")
def test_chunks_on_cuda_varlen_equal_dense():
    """The real kernel, bf16 on CUDA: the chunked document's loss and gradients against the dense
    kernel's (the masked path) in the same dtype."""
    runs = {}
    for kernel in ("varlen", "dense"):
        model = _model()
        install_dacp_attention([model], None, kernel=kernel)
        model = model.to("cuda", torch.bfloat16)
        tokens, labels = (t.cuda() for t in _document())
        out = chunked_loss(model, tokens, labels, CHUNK, _loss)
        out.loss.backward()
        runs[kernel] = (out.loss.item(), _grads(model))
    (loss, grads), (ref_loss, ref_grads) = runs["varlen"], runs["dense"]
    assert abs(loss - ref_loss) <= 1e-2 * abs(ref_loss), (loss, ref_loss)
    for name, g in ref_grads.items():
        err = float((grads[name].float() - g.float()).norm() / g.float().norm().clamp_min(1e-30))
        assert err <= 3e-2, f"{name}: relative error {err:.2e}"
