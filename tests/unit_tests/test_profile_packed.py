"""The profiler's packed check prices a buffer as its kernel computes it (skrull_ext/profile/compute.py).

The CPU's ``dense`` kernel (``auto`` on CPU) is one masked SDPA over the whole buffer: 4 x 256 tokens
cost what one 1,024-token document costs (docs/profile.md), so against the scheduler's sum of
per-document FLOPs every CPU profile missed by 30-36% and exited 1, a miss no fit can close. Here a
stand-in kernel's times are exact functions of the FLOPs it computes: the check then reads 0 and the
scheduler's per-document miss is given beside it, exactly; a per-document kernel keeps the sum as its
prediction and the two-rate fit."""

from types import SimpleNamespace

import pytest
import torch

from skrull_ext._core import ModelShape
from skrull_ext.profile import compute
from skrull_ext.profile.cli import failures
from skrull_ext.profile.compute import flops_of, priced_docs, profile_compute, whole_buffer
from skrull_ext.profile.options import ProfileOptions

SHAPE = ModelShape(6, 256, 256, 4)  # the llama3 debug model (skrull_ext/jobs/debug_cpu.toml)
A, B = 4e-5, 870.0  # us per FLOP, us per call: the CPU profile's fit, rounded
OPTS = ProfileOptions(lengths=(64, 128, 256, 512, 1024), held_out=(384,), packed=((256,) * 4, (512, 384, 128)),
                      clock="wall")


def _job_model(kernel: str = "auto", compiled: bool = False, dacp: bool = True, device: str = "cpu",
               dtype: torch.dtype = torch.float32, model=None):
    config = SimpleNamespace(skrull=SimpleNamespace(attention_kernel=kernel),
                             compile=SimpleNamespace(enable=compiled, components=["model"]))
    return SimpleNamespace(config=config, dacp=dacp, device=torch.device(device), dtype=dtype, shape=SHAPE,
                           layers=[None] * 6, model=model)


@pytest.mark.parametrize("kernel, compiled, device, dtype, whole", [
    ("auto", False, "cpu", torch.float32, True),  # auto on CPU: dense
    ("dense", False, "cpu", torch.float32, True),
    ("tiles", False, "cpu", torch.float32, False),  # a query tile's keys: per document
    ("tiles", True, "cpu", torch.float32, True),  # compiled: an all-local buffer traces the dense mask
    ("segments", False, "cpu", torch.float32, False),  # one SDPA per document
    ("auto", False, "cuda", torch.bfloat16, False),  # auto on CUDA in bf16: varlen
    ("auto", True, "cuda", torch.bfloat16, False),
])
def test_which_dacp_kernels_attend_over_the_buffer_whole(kernel, compiled, device, dtype, whole):
    assert whole_buffer(_job_model(kernel, compiled, device=device, dtype=dtype)) is whole


def test_torchtitans_attention_is_whole_but_for_flex_and_varlen():
    """Skrull off: torchtitan's attention; on CPU torchtitan_patches swaps in a dense-mask SDPA
    (a FlexAttention by class) that computes the whole buffer."""
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention

    from torchtitan_patches.dense_attention import DenseMaskAttention

    for cls, whole in ((DenseMaskAttention, True), (ScaledDotProductAttention, True), (FlexAttention, False)):
        torch.nn.Module.__init__(module := cls.__new__(cls))  # the class is what is asked, not a built one
        jm = _job_model(dacp=False, model=torch.nn.Sequential(module))
        assert whole_buffer(jm) is whole, cls


def _times(whole: bool):
    """A stand-in kernel: each buffer costs exactly A x the FLOPs it computes + B, per layer."""
    def time_buffers(jm, buffers, opts, tick):
        us = [A * flops_of(SHAPE, priced_docs(docs, whole)) + B for docs in buffers]
        return us, us
    return time_buffers


def test_a_whole_buffer_kernels_packed_buffers_are_priced_as_it_computes_them(monkeypatch):
    monkeypatch.setattr(compute, "time_buffers", _times(whole=True))
    r = profile_compute(_job_model("dense"), OPTS, lambda _: None)
    assert r.whole_buffer and r.attention_weight == 1.0  # nothing to fit two rates on
    assert r.fit.slope == pytest.approx(A, rel=1e-9) and r.fit.intercept == pytest.approx(B, rel=1e-6)
    assert r.packed_max_rel_error == pytest.approx(0.0, abs=1e-9)
    assert failures(r, None, 0.15, 0.15) == []
    (line,) = failures(SimpleNamespace(held_out_max_rel_error=0.0, packed_max_rel_error=0.075, whole_buffer=True),
                       None, 0.15, 0.05)
    assert line == ("compute fit: a packed buffer misses by 7.5%, more than --max-packed-error 5% (a buffer priced "
                    "as one sequence of its length, as the kernel computes it)")
    whole = A * flops_of(SHAPE, [1024]) + B
    for t in r.packed:  # both buffers are 1,024 tokens: the scheduler's sum misses by what the cross terms cost
        assert t.flops == flops_of(SHAPE, [1024]) and t.sum_flops == flops_of(SHAPE, t.docs)
        assert r.sum_rel_error(t) == pytest.approx((A * flops_of(SHAPE, t.docs) + B - whole) / whole, rel=1e-6)
    assert [round(100 * r.sum_rel_error(t), 1) for t in r.packed] == [-29.8, -23.6]  # 4 x 256 and 512 + 384 + 128 tokens


def test_the_old_comparison_fails_the_same_timings(monkeypatch):
    """The comparison this replaces: a whole-buffer kernel's times against the per-document sum."""
    monkeypatch.setattr(compute, "time_buffers", _times(whole=True))
    monkeypatch.setattr(compute, "whole_buffer", lambda jm: False)
    r = profile_compute(_job_model("dense"), OPTS, lambda _: None)
    (line,) = failures(r, None, 0.15, 0.15)
    assert "the scheduler predicts a micro-batch as the sum of its documents" in line


def test_a_per_document_kernel_keeps_the_sum_and_the_two_rates(monkeypatch):
    monkeypatch.setattr(compute, "time_buffers", _times(whole=False))
    r = profile_compute(_job_model("tiles"), OPTS, lambda _: None)
    assert not r.whole_buffer and r.attention_weight == pytest.approx(1.0, rel=1e-6)  # fitted with the packed
    assert all(t.flops == pytest.approx(t.sum_flops) for t in r.packed)
    assert r.packed_max_rel_error == pytest.approx(0.0, abs=1e-6)


def test_the_profile_file_and_report_say_both(monkeypatch, tmp_path):
    """[meta.compute] keeps the scheduler's miss beside the check's (packed_sum_rel_error), and the
    plot and tools/refit_compute.py read the buffers the same way."""
    from skrull_ext.profile.writer import _raw
    from tests.unit_tests.tool_module import load_tool

    refit_compute = load_tool("refit_compute")
    monkeypatch.setattr(compute, "time_buffers", _times(whole=True))
    r = profile_compute(_job_model("dense"), OPTS, lambda _: None)
    static = SimpleNamespace(fsdp_degree=1, tp_degree=1, params=0, grads=0, optimizer=0)
    raw = _raw(SimpleNamespace(compute=r, memory=SimpleNamespace(points=[], static=static), comm=None, check=None,
                               micro_batch=None, modes={}, head=None))["compute"]
    assert raw["packed_whole_buffer"] is True
    assert [round(e, 3) for e in raw["packed_sum_rel_error"]] == [-0.298, -0.236]
    d = {"model": {"layers": 6, "hidden": 256, "kv_width": 256, "bytes_per_elem": 4},
         "compute": {"a_us_per_flop": A, "b_us": B}, "meta": {"compute": raw}}
    assert refit_compute.refit(d).startswith("kept: the kernel attends over each buffer whole")
