# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""The overlap read off a profiler trace (skrull_ext/bench/trace_overlap.py):
exact numbers on hand-written traces of both kinds (host ranges on CPU, GPU
kernels tied to their launches), then one real profiled run over gloo whose
trace must hold what the analysis reads (no timing is asserted)."""

import json

import pytest

from skrull_ext.bench import overlap as overlap_bench
from skrull_ext.bench.trace_overlap import (analyze, intersection, ISSUE_GRAD, KV_WAIT, LOCAL, load_events, merge,
                                            WAIT_GRAD)

MAIN, GLOO, AUTOGRAD = 1, 2, 3


def ev(name, ts, dur, tid=MAIN, cat="user_annotation", **args):
    return dict(ph="X", name=name, ts=ts, dur=dur, pid=0, tid=tid, cat=cat, args=args)


def test_interval_arithmetic():
    assert merge([(5, 7), (0, 2), (1, 3), (7, 8), (9, 9)]) == [(0, 3), (5, 8)]
    assert intersection([(0, 10), (20, 30)], [(5, 25)]) == 10
    assert intersection([(0, 10)], [(2, 3), (2.5, 4), (12, 15)]) == 2
    assert intersection([], [(0, 1)]) == 0


def test_cpu_trace():
    events = [
        ev(LOCAL, 0, 10), ev(KV_WAIT, 10, 2), ev(LOCAL, 20, 10), ev(KV_WAIT, 30, 1),
        ev("gloo:all_gather", 5, 20, tid=GLOO),
        ev("gloo:barrier", 0, 100, tid=GLOO),  # not the exchange
        # backward: the reduce-scatter is issued by the wait node, waited on by the start node
        ev(ISSUE_GRAD, 40, 2, cat="cpu_op"), ev(WAIT_GRAD, 50, 1, cat="cpu_op"),
        ev("gloo:all_reduce", 41, 19, tid=GLOO),
    ]
    o = analyze(events)
    assert o.source == "cpu"
    assert (o.fwd_compute_ms, o.bwd_compute_ms) == pytest.approx((20e-3, 8e-3))
    assert (o.exchange_ms, o.fwd_overlap_ms, o.bwd_overlap_ms) == pytest.approx((39e-3, 10e-3, 8e-3))
    assert (o.kv_wait_ms, o.grad_wait_ms) == pytest.approx((3e-3, 1e-3))
    assert o.hidden == pytest.approx(18 / 39)
    assert o.exchange_kinds == ("gloo:all_gather", "gloo:all_reduce")


def test_backward_window_is_per_thread_and_closes_at_the_first_wait():
    events = [
        ev(ISSUE_GRAD, 0, 1, tid=AUTOGRAD, cat="cpu_op"), ev(ISSUE_GRAD, 3, 1, tid=AUTOGRAD, cat="cpu_op"),
        ev(WAIT_GRAD, 6, 1, tid=MAIN, cat="cpu_op"),  # another thread: closes nothing
        ev(WAIT_GRAD, 10, 1, tid=AUTOGRAD, cat="cpu_op"), ev(WAIT_GRAD, 12, 1, tid=AUTOGRAD, cat="cpu_op"),
    ]
    assert analyze(events).bwd_compute_ms == pytest.approx(9e-3)  # (1, 10)


def test_gpu_trace_reads_the_kernels_launched_in_the_window():
    events = [
        ev(LOCAL, 0, 10),
        ev("cudaLaunchKernel", 2, 1, cat="cuda_runtime", correlation=7),  # inside dacp/local
        ev("cudaLaunchKernel", 12, 1, cat="cuda_runtime", correlation=8),  # after it
        ev("flash_fwd_kernel", 100, 50, tid=20, cat="kernel", correlation=7),
        ev("distributed_kernel", 160, 40, tid=7, cat="kernel", correlation=8),
        ev(LOCAL, 100, 50, tid=20, cat="gpu_user_annotation"),  # not a host range
        ev("ncclDevKernel_AllGather_RING_LL(ncclDevComm*)", 120, 60, tid=30, cat="kernel", correlation=9),
    ]
    o = analyze(events)
    assert o.source == "gpu"
    assert (o.fwd_compute_ms, o.exchange_ms, o.fwd_overlap_ms) == pytest.approx((50e-3, 60e-3, 30e-3))
    assert o.hidden == pytest.approx(0.5)
    assert o.exchange_kinds == ("ncclDevKernel_AllGather_RING_LL",)


@pytest.mark.slow  # spawns two processes
def test_profiled_run_over_gloo(tmp_path, capsys):
    """Two real ranks, one layer, one step: each trace holds the local ranges on
    the main thread and gloo's ranges on its worker threads, and the table says so."""
    out = tmp_path / "ov"
    assert overlap_bench.main(["--cp", "2", "--out", str(out), "--lengths", "300", "40", "60", "20", "90",
                               "--local-max", "100", "--layers", "2", "--steps", "1", "--warmup", "1",
                               "--heads", "4", "--kv-heads", "2", "--head-dim", "16"]) == 0
    text = capsys.readouterr().out
    assert "| rank | local/all tokens |" in text and "exchange hidden under local attention" in text
    summary = json.loads((out / "overlap.json").read_text())
    assert summary["placement"][0] == -1 and all(p >= 0 for p in summary["placement"][1:])
    for r, rank in enumerate(summary["ranks"]):
        events = load_events(out / f"rank{r}.trace.json.gz")
        local = [e for e in events if e["name"] == LOCAL]
        gloo = [e for e in events if e["name"] in ("gloo:all_gather", "gloo:all_reduce")]
        assert len(local) == 2 and len(gloo) == 4  # 2 layers: 2 gathers, 2 reduce-scatters (gloo: all_reduce)
        assert {e["tid"] for e in gloo}.isdisjoint({e["tid"] for e in local})
        o = rank["overlap"]
        assert o["source"] == "cpu" and o["exchange_ms"] > 0 and o["fwd_compute_ms"] > 0
        assert o["fwd_overlap_ms"] + o["bwd_overlap_ms"] <= o["exchange_ms"] + 1e-9
        assert rank["stats"]["all_gathers"] == 2 and rank["stats"]["reduce_scatters"] == 2
    assert (out / "overlap.png").stat().st_size > 0


def test_bad_arguments_name_the_limit(capsys):
    with pytest.raises(SystemExit):
        overlap_bench.main(["--cp", "1"])
    assert "--cp 1: the exchange needs a CP group of at least 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        overlap_bench.main(["--heads", "6", "--kv-heads", "4"])
    assert "--heads 6 must be a multiple of --kv-heads 4" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="needs local and distributed sequences"):
        overlap_bench.main(["--lengths", "10", "20", "--local-max", "100"])


def test_cpu_ranks_are_forks_unless_this_process_holds_a_group(tmp_path, monkeypatch):
    """A fork on CPU (no second import of torch), a spawn where the caller holds a process group:
    a fork would inherit it initialised and fail ("trying to initialize the default process group
    twice", CI 2026-11-30, after another test of the same worker left one: this worker may hold one
    already, so the held case uses it or a world of one made here)."""
    import torch.distributed as dist

    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert overlap_bench.start_method("cpu") == "spawn"
    finally:
        if made:
            dist.destroy_process_group()
    monkeypatch.setattr(overlap_bench.dist, "is_initialized", lambda: False)  # a process that holds none
    assert overlap_bench.start_method("cpu") == "fork" and overlap_bench.start_method("cuda") == "spawn"
