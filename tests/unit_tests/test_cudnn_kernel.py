"""The ``cudnn`` and ``cudnn-expanded`` kernels (kernels.py, cudnn.py): CUDA-only code, checked three ways.

1. On CPU, the same path through ``dacp_attention`` with cuDNN's op swapped, inside the test only,
   for a float64 stand-in (one causal SDPA per segment, over the offsets it is handed): the layout
   the op receives ([T, H, D], contiguous), the offsets and longest length of the local plan, the
   K/V heads grouped or repeated, the output back in [H, T, D]; outputs and gradients against
   ``dense``. The distributed part goes to ``run_varlen``, swapped for the plan's CPU executor.
2. On CUDA (skipped here), the kernels against ``dense`` in bf16/fp16 and against the float64
   reference through ``dacp_attention``, at varlen's tolerances (test_dacp_kernels.py).
3. A job naming them: accepted where a CUDA device is (faked), refused on CPU with one message.
"""

import types

import pytest
import torch
import torch.nn.functional as F

from skrull_ext.attention import DISTRIBUTED as D, DacpAttention, build_meta, dacp_attention, kernels
from skrull_ext.attention.kernels import KERNELS, resolve_kernel
from skrull_ext.attention.local_only import computes_whole_buffer, local_only_kernel
from skrull_ext.errors import JobFileError
from skrull_ext.train.job.job_checks import check_job
from skrull_ext.train.job.job_file import load_config
from tests.unit_tests.dacp_multiproc import Case
from tests.unit_tests.test_dacp_kernels import (
    _placement, check_cp1_against_reference_on_cuda, check_equals_dense_on_cuda, part_inputs, run_part,
)
from tests.unit_tests.test_job_checks import DEBUG

CUDNN_KERNELS = ("cudnn", "cudnn-expanded")


def stand_in(calls: list):
    """``aten._cudnn_attention_forward`` as a float64 per-segment causal SDPA (top-left, as cuDNN's),
    K/V heads grouped where fewer; records what each call received, and whether the gradient its
    output got back is laid out as the output (cuDNN's ragged backward reads dO at the output's
    offsets)."""
    def op(q, k, v, bias, cu_q, cu_k, max_q, max_k, lse, dropout, causal, debug, *, scale=None):
        calls.append(dict(shapes=(tuple(q.shape), tuple(k.shape), tuple(v.shape)),
                          contiguous=all(x.is_contiguous() for x in (q, k, v)), cu_q=cu_q.tolist(),
                          cu_k=cu_k.tolist(), max=(max_q, max_k), flags=(bias, lse, dropout, causal, debug),
                          scale=scale))
        bounds = cu_q.tolist()
        outs = []
        for a, b in zip(bounds, bounds[1:]):
            qq, kk, vv = (x[a:b].transpose(0, 1).double() for x in (q, k, v))
            outs.append(F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=scale,
                                                       enable_gqa=qq.size(0) != kk.size(0)).transpose(0, 1))
        out = torch.cat(outs).to(q.dtype)
        if out.requires_grad:
            out.register_hook(lambda g: calls[-1].update(grad_as_out=g.stride() == out.stride()))
        return (out, None, cu_q, cu_k, max_q, max_k, None, None, None)

    return op


@pytest.fixture
def on_cpu(monkeypatch):
    """The cudnn kernels runnable on CPU for this test: cuDNN's op the stand-in, varlen the plan's
    CPU executor (the same plan), the CUDA check off. Yields (op calls, varlen calls)."""
    op_calls, varlen_calls = [], []
    monkeypatch.setattr(torch.ops.aten, "_cudnn_attention_forward", stand_in(op_calls))

    def varlen(q, k, v, plan, scale):
        varlen_calls.append(plan)
        return kernels.run_segments(q, k, v, plan, scale)

    monkeypatch.setattr(kernels, "run_varlen", varlen)
    monkeypatch.setattr(kernels, "check_half_cuda", lambda kernel, q: None)
    yield op_calls, varlen_calls


def grads_through(q, k, v, meta, kernel, scale, go):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = dacp_attention(q, k, v, meta, kernel=kernel, scale=scale)
    out.backward(go)
    return out.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize("kernel", CUDNN_KERNELS)
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_cudnn_path_equals_dense_on_a_packed_buffer(on_cpu, kernel, heads, kv_heads, scale):
    """CP 1, six local sequences and two distributed ones in one buffer: output and q, k, v gradients
    as ``dense``'s, the op called once with the local plan's offsets and the layout cuDNN takes."""
    op_calls, varlen_calls = on_cpu
    lengths, placement = [5, 13, 7, 1, 9, 22, 11, 4], [0, 0, D, 0, 0, 0, D, 0]
    meta = build_meta(lengths, placement, 0, 1)
    g = torch.Generator().manual_seed(3)
    q, go = (torch.randn(heads, meta.num_tokens, 8, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(kv_heads, meta.num_tokens, 8, generator=g, dtype=torch.float64) for _ in range(2))
    got = grads_through(q, k, v, meta, kernel, scale, go)
    want = grads_through(q, k, v, meta, "dense", scale, go)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10, msg=lambda m: f"{kernel} {name}: {m}")
    plan, n = meta.local_plan(), meta.num_local_tokens
    assert len(op_calls) == 1 and len(varlen_calls) == 1  # the local part on cuDNN, the distributed on varlen
    call = op_calls[0]
    expect_kv = kv_heads if kernel == "cudnn" else heads  # grouped as given, or repeated to the query heads
    assert call["shapes"] == ((n, heads, 8), (n, expect_kv, 8), (n, expect_kv, 8)) and call["contiguous"]
    assert call["cu_q"] == call["cu_k"] == list(plan.cu_q) == [0, 5, 18, 19, 28, 50, 54]
    assert call["max"] == (22, 22) and call["scale"] == scale
    assert call["flags"] == (None, True, 0.0, True, False)  # no bias, log-sum-exp kept, no dropout, causal
    assert call["grad_as_out"]  # dO packed as the output, though DACP's is a transposed slice of the buffer's
    assert varlen_calls[0] is meta.dist_plan()  # the plan the varlen kernel caches


@pytest.mark.parametrize("kernel", CUDNN_KERNELS)
@pytest.mark.parametrize("cp_size", [2, 4])
def test_cudnn_local_part_on_every_rank_equals_dense(on_cpu, kernel, cp_size):
    """Each rank's local part alone (part_inputs: one rank's buffer, no process group), GQA."""
    lengths = [5, 13, 7, 1, 9, 22]
    case = Case("mixed", lengths, _placement("mixed", len(lengths), cp_size), heads=6, kv_heads=2, seed=7)
    for r in range(cp_size):
        meta = build_meta(case.lengths, case.placement, r, cp_size)
        for part, inp in part_inputs(case, cp_size, r).items():
            want, got = run_part("dense", meta, part, inp), run_part(kernel, meta, part, inp)
            for key in ("out", "dq", "dk", "dv"):
                torch.testing.assert_close(got[key], want[key], atol=1e-10, rtol=1e-10,
                                           msg=lambda m: f"rank {r} {part} {key}: {m}")


def test_cudnn_prepares_the_plans_the_varlen_kernel_caches():
    meta = build_meta([5, 13, 7], [0, D, 0], 0, 2)
    local, dist = (KERNELS["cudnn"].prepare(meta, part, None) for part in ("local", "dist"))
    assert local.local and local.plan is meta.local_plan() and not dist.local and dist.plan is meta.dist_plan()
    assert KERNELS["cudnn-expanded"].prepare(meta, "local", None) is local  # once per micro-batch
    assert KERNELS["cudnn"].tensors(dist) == meta.dist_plan().tensors


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_cudnn_under_compile_runs_in_dacps_opaque_op(on_cpu):
    """The compiled trainer's path for these kernels (no traced call: local_only_kernel is None):
    blocks compiled fullgraph (aot_eager) hand the meta to DACP's custom op, which runs the kernel
    eagerly; outputs and parameter gradients as the same blocks on ``dense``, uncompiled."""
    from tests.unit_tests.test_dacp_compiled import _model, _run, BATCHES

    op_calls, _ = on_cpu
    torch._dynamo.reset()
    dense, cudnn = _model(), _model()
    for block in cudnn:
        block.attn = DacpAttention(None, kernel="cudnn")
        block.compile(backend="aot_eager", fullgraph=True)
    for lens in BATCHES:
        want, _ = _run(dense, lens)
        got, _ = _run(cudnn, lens)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for p, r in zip(cudnn.parameters(), dense.parameters()):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-4, atol=1e-5)  # float32, the stand-in in float64
    assert len(op_calls) == 2 * len(BATCHES)  # each layer's forward, once: the op, not a trace of it
    torch._dynamo.reset()


@pytest.mark.parametrize("kernel", CUDNN_KERNELS)
def test_cudnn_refuses_cpu_tensors(kernel):
    """Never replaced by another kernel: a CPU (or float32) run is an error naming the kernel."""
    m = build_meta([5, 3], [0, 0], 0, 1)
    for q in (torch.randn(2, 8, 8, dtype=torch.bfloat16), torch.randn(2, 8, 8)):
        with pytest.raises(ValueError, match=rf"^the {kernel} kernel needs bf16/fp16 CUDA tensors, got "):
            dacp_attention(q, q, q, m, kernel=kernel)


# ---- a job naming the kernel ---------------------------------------------------------------


@pytest.mark.parametrize("kernel", CUDNN_KERNELS)
def test_a_job_naming_cudnn_resolves_to_it_on_a_gpu_and_is_refused_on_cpu(kernel):
    argv = ["--config-file", DEBUG, "--skrull.attention_kernel", kernel]
    config = load_config(argv, world_size=1, check=False)
    assert config.skrull.attention_kernel == kernel
    check_job(config, world_size=1, on_cpu=False)  # a CUDA device (faked): accepted
    cuda, bf16 = torch.device("cuda"), torch.bfloat16
    q = types.SimpleNamespace(is_cuda=True, dtype=bf16)
    assert resolve_kernel(kernel, q) is KERNELS[kernel] and resolve_kernel("auto", q) is KERNELS["varlen"]
    assert DacpAttention(kernel=kernel)._kernel is KERNELS[kernel]
    assert kernels.kernel_name(kernel, cuda, bf16) == kernel
    # compiled: no traced call (DACP's opaque op runs it); a per-document kernel for the profile's pricing
    assert local_only_kernel(kernel, True, cuda, bf16) is None and not computes_whole_buffer(kernel, True, cuda, bf16)
    says = (f"skrull.attention_kernel = '{kernel}': cuDNN's attention needs a CUDA device (this machine has none); "
            "use 'auto', 'tiles', 'dense' or 'segments'")
    with pytest.raises(JobFileError) as e:
        check_job(config, world_size=1, on_cpu=True)
    assert str(e.value) == says
    if not torch.cuda.is_available():  # this machine: the command line itself is refused
        with pytest.raises(JobFileError, match="cuDNN's attention needs a CUDA device"):
            load_config(argv, world_size=1)


# ---- CUDA (not run in a CPU-only session) ----------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kernel", CUDNN_KERNELS)
@pytest.mark.parametrize("cp_size", [1, 2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cudnn_equals_dense_on_cuda(kernel, cp_size, dtype):
    """As test_varlen_equals_dense_on_cuda: each part of each rank, GQA, bf16/fp16, 3e-2."""
    check_equals_dense_on_cuda(kernel, cp_size, dtype)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kernel", CUDNN_KERNELS)
def test_cp1_cudnn_through_dacp_attention_on_cuda(kernel):
    """bf16 against the float64 single-process reference, as test_cp1_varlen_through_dacp_attention_on_cuda."""
    check_cp1_against_reference_on_cuda(kernel)
