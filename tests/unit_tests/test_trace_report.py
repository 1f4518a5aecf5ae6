# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Where a step's time goes, read off a profiler trace (skrull_ext/bench/trace_steps.py, trace_report.py):
exact numbers on a hand-written GPU trace shaped as torch.profiler writes one (kernels on
streams 7 and 13 tied to their host launches by ``correlation``, an idle gap, a
``cudaStreamSynchronize`` under ``.item()`` inside a record_function range), then a real
CPU trace of a tiny model's training steps written by torch.profiler as torchtitan's
profiler names it (no device events: the host's ranges only, no crash)."""

import gzip
import json
import warnings

import pytest
import torch

from skrull_ext.bench import __main__ as bench
from skrull_ext.bench.trace_overlap import load_events
from skrull_ext.bench.trace_report import PHASE_PREFIX, report, trace_files
from skrull_ext.bench.trace_steps import analyze, family_of
from skrull_ext.errors import UserError

PID, MAIN, AUTOGRAD, DEVICE, STREAM, NCCL_STREAM = 100, 1, 2, 0, 7, 13


def host(name, ts, dur, cat="cpu_op", tid=MAIN, **args):
    return dict(ph="X", cat=cat, name=name, pid=PID, tid=tid, ts=ts, dur=dur, args=args)


def launch(ts, corr, name="cudaLaunchKernel", cat="cuda_runtime"):
    return host(name, ts, 5, cat=cat, correlation=corr)


def device(name, ts, dur, corr, cat="kernel", stream=STREAM):
    return dict(ph="X", cat=cat, name=name, pid=DEVICE, tid=stream, ts=ts, dur=dur,
                args=dict(device=0, stream=stream, correlation=corr))


GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>"
TRITON = "triton_poi_fused_add_mul_0"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
MEMCPY = "Memcpy DtoH (Device -> Pageable)"
ADAM = "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>"


def gpu_trace() -> dict:
    """One step of 1,000 us on the host. The GPU is busy 100-400 (a GEMM, an elementwise and a
    triton kernel on stream 7 back to back, an NCCL all-reduce on stream 13 under the GEMM),
    700-720 (the copy of ``.item()``) and 820-880 (the fused AdamW): 380 us busy, 620 idle
    in 4 gaps, the largest 400-700 while the host ran ``aten::copy_`` (420-600) inside
    ``skrull/micro_batch_0`` (in the trainer's phase ``mb``) and, on autograd's thread, an FSDP hook."""
    events = [
        host("ProfilerStep#3", 0, 1000, cat="user_annotation"),
        host("skrull/phase_mb", 5, 606, cat="user_annotation"),
        host("skrull/micro_batch_0", 10, 600, cat="user_annotation"),
        host("FSDP::post_backward_reduce (layers.0)", 520, 60, cat="user_annotation", tid=AUTOGRAD),
        host("aten::mm", 20, 30), launch(25, 1),
        host("aten::add", 60, 20), launch(65, 2), launch(70, 6),
        host("triton_poi_fused_add_mul_0", 88, 10), launch(90, 3, "cuLaunchKernelEx", "cuda_driver"),
        host("aten::copy_", 420, 180),
        host("skrull/phase_checks", 612, 150, cat="user_annotation"),
        host("aten::item", 615, 130), host("aten::_local_scalar_dense", 616, 128),
        launch(620, 4, "cudaMemcpyAsync"), host("cudaStreamSynchronize", 626, 100, cat="cuda_runtime"),
        host("Optimizer.step#AdamW.step", 800, 100, cat="user_annotation"), launch(810, 5),
        device(GEMM, 100, 200, 1), device(ELEMENTWISE, 300, 50, 2), device(TRITON, 350, 50, 3),
        device(NCCL, 150, 100, 6, stream=NCCL_STREAM), device(MEMCPY, 700, 20, 4, cat="gpu_memcpy"),
        device(ADAM, 820, 60, 5),
        # the device's mirror of a host range: not work on the stream
        dict(ph="X", cat="gpu_user_annotation", name="skrull/micro_batch_0", pid=DEVICE, tid=STREAM, ts=100,
             dur=600, args={}),
    ]
    meta = [dict(ph="M", name="process_name", pid=DEVICE, tid=0, args=dict(name="GPU 0")),
            dict(ph="s", id=1, pid=PID, tid=MAIN, ts=25, cat="ac2g", name="ac2g")]
    return dict(schemaVersion=1, traceEvents=meta + events, traceName="rank0")


def write(path, trace):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    return path


def test_gpu_step_exact(tmp_path):
    path = write(tmp_path / "profiling/traces/iteration_4/rank0_trace.json.gz", gpu_trace())
    (step,) = analyze(load_events(path))
    assert step.name == "ProfilerStep#3" and step.device
    assert step.span_ms == pytest.approx(1.0) and step.host_ms == pytest.approx(1.0)
    assert step.busy_ms == pytest.approx(0.38) and step.idle_ms == pytest.approx(0.62)
    assert [(g.start, g.end) for g in step.gaps] == [(400, 700), (880, 1000), (0, 100), (720, 820)]
    assert step.long_gaps(0.11) == (2, pytest.approx(0.42))  # 300 and 120 us
    big = step.gaps[0]
    assert big.ranges == "skrull/phase_mb > skrull/micro_batch_0 ; FSDP::post_backward_reduce (layers.0)"
    assert big.op == "aten::copy_ (60%)"  # 180 of the gap's 300 us; aten::item covers 85
    assert (step.gaps[2].ranges, step.gaps[2].op) == ("skrull/phase_mb > skrull/micro_batch_0", "aten::mm (30%)")
    assert (step.gaps[3].ranges, step.gaps[3].op) == ("-", "aten::item (25%)")  # 720-820: no range open at 770
    assert step.families == pytest.approx({"memcpy/memset": 0.02, "nccl": 0.1, "optimizer/foreach": 0.06,
                                           "triton": 0.05, "gemm": 0.2, "elementwise/reduction": 0.05})
    assert list(step.families)[:3] == ["gemm", "nccl", "optimizer/foreach"]  # largest first
    assert step.kernels[0][:3] == (GEMM, "gemm", 1) and step.kernels[0][3] == pytest.approx(0.2)
    ranges = {r[0]: r[1:] for r in step.ranges}
    assert ranges.keys() == {"skrull/phase_mb", "skrull/micro_batch_0", "FSDP::post_backward_reduce (layers.*)",
                             "skrull/phase_checks", "Optimizer.step#AdamW.step"}
    # GPU time launched while each range was open: 200 + 50 + 50 + 100 (the NCCL launch at 70)
    assert ranges["skrull/micro_batch_0"] == pytest.approx((1, 0.6, 0.4))
    assert ranges["skrull/phase_mb"] == pytest.approx((1, 0.606, 0.4))
    assert ranges["FSDP::post_backward_reduce (layers.*)"] == pytest.approx((1, 0.06, 0.0))  # nothing launched
    assert ranges["skrull/phase_checks"] == pytest.approx((1, 0.15, 0.02))
    assert ranges["Optimizer.step#AdamW.step"] == pytest.approx((1, 0.1, 0.06))
    assert step.syncs == [("cudaStreamSynchronize", "skrull/phase_checks / aten::item > aten::_local_scalar_dense",
                           1, pytest.approx(0.1))]


def test_report_text(tmp_path):
    write(tmp_path / "profiling/traces/iteration_4/rank0_trace.json.gz", gpu_trace())
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe/rank0.json").write_text("[]")  # not a trace file: not read
    text = report(tmp_path)
    assert ("ProfilerStep#3: span 1.0 ms (host 1.0), GPU busy 0.4 ms; GPU idle 62.0% of the step (0.6 ms in 4 gaps, "
            "0.6 ms of it in the 4 of >= 0.1 ms); biggest: 0.30 ms under skrull/phase_mb > skrull/micro_batch_0 ; "
            "FSDP::post_backward_reduce (layers.0), host op "
            "aten::copy_ (60%); 1 host syncs, 0.1 ms") in text
    assert "| 0.300 | 0.400 | skrull/phase_mb > skrull/micro_batch_0 ; FSDP::post_backward_reduce (layers.0) | " \
           "aten::copy_ (60%) |" in text
    assert "| gemm | 0.200 | 41.7% |" in text  # of the step's 0.48 ms of device time
    assert "  GPU ms by family: gemm 0.2, nccl 0.1, optimizer/foreach 0.1, " in text
    assert "  phases, host ms/GPU ms launched: mb 0.6/0.4, checks 0.1/0.0" in text
    assert main_out(tmp_path, "--gaps", "1", "--top", "1").count("more kernels not shown") == 1


def main_out(*argv) -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert bench.main(["trace-report", *map(str, argv)]) == 0
    return buf.getvalue()


def test_phase_ranges_are_the_trainers():
    from skrull_ext.train.step_phases import RANGE

    assert RANGE.format(key="mb") == PHASE_PREFIX + "mb"


def test_families():
    assert family_of("kernel", "void flash_fwd_kernel<cutlass::bfloat16_t>") == "attention"  # not gemm
    assert family_of("kernel", "nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT") == "gemm"
    assert family_of("kernel", "triton_red_fused__to_copy_mul_rsqrt_0") == "triton"
    assert family_of("gpu_memset", "Memset (Device)") == "memcpy/memset"
    assert family_of("kernel", "some_custom_kernel") == "other"


def test_files_in_iteration_order(tmp_path):
    for it in (10, 4):
        for rank in (1, 0):
            write(tmp_path / f"profiling/traces/iteration_{it}/rank{rank}_trace.json.gz", gpu_trace())
    (tmp_path / "zz_broken_trace.json").write_text("{not json")
    names = [str(p.relative_to(tmp_path)) for p in trace_files(tmp_path)]
    assert names[:4] == [f"profiling/traces/iteration_{i}/rank{r}_trace.json.gz" for i in (4, 10) for r in (0, 1)]
    assert "skipped 1 file(s) that are not Chrome traces" in report(tmp_path)
    with pytest.raises(UserError, match="no such file or folder"):
        report(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no \\*trace\\*.json"):
        report(tmp_path / "empty")


@pytest.fixture(scope="session")
def cpu_trace_dir(tmp_path_factory):
    """Three steps of a tiny model under torch.profiler (CPU only), the last two recorded, written as
    torchtitan's profiler names them (iteration_<step>/rank0_trace.json.gz)."""
    out = tmp_path_factory.mktemp("cpu_trace")
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters())

    def save(prof):
        path = out / f"profiling/traces/iteration_{prof.step_num}/rank0_trace.json.gz"
        path.parent.mkdir(parents=True)
        prof.export_chrome_trace(str(path))

    schedule = torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1)
    with warnings.catch_warnings():  # torch 2.11 warns at a process's first profiler start (test_real_trace_on_cuda)
        warnings.filterwarnings("ignore", ".*Profiler clears events at the end of each cycle", UserWarning)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule,
                                    on_trace_ready=save, record_shapes=True) as prof:
            for _ in range(3):
                with torch.profiler.record_function("skrull/micro_batch_0"):
                    model(torch.randn(8, 16)).square().mean().backward()
                opt.step()
                opt.zero_grad()
                prof.step()
    return out


def test_real_cpu_trace(cpu_trace_dir):
    (path,) = trace_files(cpu_trace_dir)
    assert path.name == "rank0_trace.json.gz" and path.parent.name == "iteration_3"
    steps = analyze(load_events(path))
    assert [s.name for s in steps] == ["ProfilerStep#1", "ProfilerStep#2"]
    for s in steps:
        assert not s.device and s.busy_ms == 0 and not s.gaps and not s.families and not s.syncs
        ranges = {r[0]: r[1] for r in s.ranges}
        assert ranges["skrull/micro_batch_0"] == 1 and ranges["Optimizer.step#AdamW.step"] == 1
        assert s.span_ms >= next(r[2] for r in s.ranges if r[0] == "skrull/micro_batch_0") > 0
    text = main_out(cpu_trace_dir)
    assert text.count("no device events in this trace (a CPU trace)") == 4  # the summary's and each step's
    assert "| skrull/micro_batch_0 | 1 |" in text


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
# torch 2.11's profiler warns on its first start in a process ("Profiler clears events at the end of
# each cycle ..."; torch >= 2.13 only on a second cycle), which the suite's filterwarnings = error
# turned into this test's failure on GPU run 9: one cycle is recorded here, so it says nothing.
@pytest.mark.filterwarnings("ignore:.*Profiler clears events at the end of each cycle:UserWarning")
def test_real_trace_on_cuda(tmp_path):
    """A real CUDA trace holds what the report reads (run by tools/gpu_checks.sh's stage 3' before the
    traced training run): kernels tied to their launches inside a range, a GEMM named as one, and
    ``.item()``'s ``cudaStreamSynchronize`` under its range. No timing is asserted."""
    path = tmp_path / "rank0_trace.json.gz"
    model = torch.nn.Linear(512, 512, device="cuda")
    x = torch.randn(256, 512, device="cuda")
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1)
    with torch.profiler.profile(activities=activities, schedule=schedule,
                                on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(2):
            with torch.profiler.record_function("skrull/micro_batch_0"):
                loss = model(x).relu().sum()
                loss.backward()
                loss.item()  # a host sync inside the range
            prof.step()
    (step,) = analyze(load_events(path))
    kernels = [k[0] for k in step.kernels]
    assert step.device and 0 < step.busy_ms <= step.span_ms, step
    assert "gemm" in step.families, kernels  # a new cuBLAS name would land in "other": FAMILIES needs it
    ranges = {r[0]: r for r in step.ranges}
    assert ranges["skrull/micro_batch_0"][3] > 0, step.ranges  # GPU time launched inside, by correlation
    assert any(call == "cudaStreamSynchronize" and where.startswith("skrull/micro_batch_0")
               for call, where, _, _ in step.syncs), step.syncs
