"""The micro-batch fixed cost measured twice (profile/micro_batch.py): on short steps and where
each micro-batch is device-bound. A fake job model records what each step runs and a fake timer
prices it with a synthetic truth: a micro-batch costs max(host, device), its host work ``layers *
h + f_host`` (h: the compute ladder's host floor), its device work ``layers * (a F + b) + f_dev``.
Short micro-batches are host-bound, so the short figure is f_host; long ones are device-bound,
so the device-bound figure is f_dev, and with a floor the scheduler gets it."""

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull_ext._core import ModelShape
from skrull_ext.profile.compute import ComputeResult, Timing, flops_of, priced_docs
from skrull_ext.profile.fit import HostFloor, PolyFit
from skrull_ext.profile.micro_batch import (choose_fixed, device_bound_length, device_bound_split, priced_calls_us,
                                            profile_micro_batch)
from skrull_ext.profile.options import ProfileOptions

SHAPE = ModelShape(4, 256, 64, 2)
LADDER = (256, 512, 1024, 2048)
A, B = 1e-6, 100.0  # the line: a layer at 512 tokens 1073 us, at 1024 2583 us
H, F_HOST, F_DEV, STEP = 1500.0, 8000.0, 5000.0, 1000.0


class FakeModel:
    def __init__(self):
        self.calls: list[tuple[int, ...]] = []

    def __call__(self, tokens, positions, masks):
        self.calls.append(tokens)

    def zero_grad(self, set_to_none=True):
        pass


class FakeJob:
    """What profile_micro_batch reads of a JobModel; a buffer is its documents."""

    def __init__(self, max_len=1 << 20):
        self.model, self.shape, self.max_len = FakeModel(), SHAPE, max_len
        self.config, self.device = SimpleNamespace(), torch.device("cpu")

    def buffer(self, docs, seed=0):
        return {"tokens": tuple(docs), "labels": None, "positions": None, "attention_masks": None}

    @staticmethod
    def loss_fn(out, labels):
        return SimpleNamespace(backward=lambda: None), None


def _truth(host_us: float, f_host: float, f_dev: float, whole: bool):
    def mb_us(docs) -> float:
        device = SHAPE.layers * (A * flops_of(SHAPE, priced_docs(docs, whole)) + B) + f_dev
        return max(SHAPE.layers * host_us + f_host, device)
    return mb_us


def _run(floor: HostFloor | None, whole: bool = False, limit=None, repeats: int = 3, f_host: float = F_HOST,
         f_dev: float = F_DEV):
    job = FakeJob()
    mb_us = _truth(floor.us if floor else 0.0, f_host if floor else 0.0, f_dev, whole)
    timed = []

    def timer(fn, device, before=None):
        before()
        job.model.calls.clear()
        fn()
        timed.append(list(job.model.calls))
        us = STEP + sum(mb_us(c) for c in job.model.calls)
        return us, 0.5 * us

    points = [Timing((n,), flops_of(SHAPE, [n]), 0.0, 0.0) for n in LADDER]
    compute = ComputeResult(PolyFit((B, A, 0.0), 1.0, 0.0), points, [], [], SHAPE.layers, "wall", "", 1.0,
                            whole_buffer=whole, floor=floor)
    opts = ProfileOptions(warmup=1, micro_batch_repeats=repeats)
    ticks = []
    return profile_micro_batch(job, opts, compute, ticks.append, limit=limit, timer=timer), timed, ticks


def test_with_a_floor_the_scheduler_gets_the_device_bound_figure():
    floor = HostFloor(H, 2)  # 256 and 512 on the floor (the line: 519, 1073 us), 1024 above it (2583 us)
    res, timed, ticks = _run(floor)
    # Short steps: 128 tokens of 32-token documents, each micro-batch host-bound (at most 4 * (180 +
    # 100) + 5,000 = 6,121 us of device work against 6,000 + 8,000 of host work): slope = 4 h + f_host,
    # less 4 layer calls at the floor.
    assert res.counts == (1, 2, 4) and res.calls_us == SHAPE.layers * H
    assert res.fit.slope == pytest.approx(SHAPE.layers * H + F_HOST, rel=1e-12)
    assert res.short_fixed_us == pytest.approx(F_HOST, rel=1e-9)
    # Device-bound steps: two documents of 1,024 (the first ladder length above the floor), as one
    # micro-batch and as two; the difference is one more b a layer plus f_dev.
    b = res.device_bound
    assert b.length == 1024 and b.calls_us == pytest.approx(SHAPE.layers * B, rel=1e-9)
    assert b.us[1] - b.us[0] == pytest.approx(SHAPE.layers * B + F_DEV, rel=1e-9)
    assert b.fixed_us == pytest.approx(F_DEV, rel=1e-9) and b.cpu_us == tuple(0.5 * u for u in b.us)
    assert res.floor and res.fixed_from == "device-bound" and res.fixed_us == b.fixed_us
    # Each round times every step once, short ones first; warmup 1 + repeats 3.
    steps = [[(32, 32, 32, 32)], [(32, 32), (32, 32)], [(32,)] * 4, [(1024, 1024)], [(1024,), (1024,)]]
    assert timed == steps * 4
    assert ticks[:5] == ["micro-batches x1 (1/4)", "micro-batches x2 (1/4)", "micro-batches x4 (1/4)",
                         "micro-batches x1 device-bound (1/4)", "micro-batches x2 device-bound (1/4)"]


@settings(max_examples=40, deadline=None)
@given(f_dev=st.floats(0.0, 50_000.0), share=st.floats(0.0, 1.0))
def test_each_figure_recovers_its_truth(f_dev, share):
    """Any host and device fixed costs for which the short micro-batches stay host-bound and the
    long ones device-bound: the short figure is f_host, the device-bound one f_dev, and the
    scheduler gets f_dev. Short: at most 4 * (180 + 100) + f_dev of device work against 6,000 +
    f_host of host work; long: 4 * 2,583 + f_dev against the same host work."""
    short_device = SHAPE.layers * (A * flops_of(SHAPE, [32] * 4) + B) + f_dev
    long_device = SHAPE.layers * (A * flops_of(SHAPE, [1024]) + B) + f_dev
    lo, hi = max(0.0, short_device - SHAPE.layers * H), long_device - SHAPE.layers * H
    f_host = lo + share * (hi - lo)
    res, _, _ = _run(HostFloor(H, 2), f_host=f_host, f_dev=f_dev)
    assert res.short_fixed_us == pytest.approx(f_host, rel=1e-9, abs=1e-6)
    assert res.device_bound.fixed_us == pytest.approx(f_dev, rel=1e-9, abs=1e-6)
    assert res.fixed_from == "device-bound" and res.fixed_us == res.device_bound.fixed_us


def test_without_a_floor_both_agree_and_the_short_fit_is_kept():
    res, timed, _ = _run(None)
    # Device-bound throughout: one more micro-batch costs layers * b + f_dev at any size.
    assert res.short_fixed_us == pytest.approx(F_DEV, rel=1e-9)
    assert res.device_bound.length == 256 and res.device_bound.fixed_us == pytest.approx(F_DEV, rel=1e-9)
    assert not res.floor and res.fixed_from == "short" and res.fixed_us == res.short_fixed_us
    assert timed[3:5] == [[(256, 256)], [(256,), (256,)]]


def test_a_whole_buffer_kernel_is_priced_as_it_attends():
    """The dense kernel attends over each buffer whole: one buffer of 2 x 256 tokens does more
    attention than two of 256; the priced calls take it out, so the figure is still f_dev."""
    res, _, _ = _run(None, whole=True)
    calls = SHAPE.layers * (2 * (A * flops_of(SHAPE, [256]) + B) - (A * flops_of(SHAPE, [512]) + B))
    assert res.device_bound.calls_us == pytest.approx(calls, rel=1e-9) and calls < SHAPE.layers * B
    assert res.device_bound.fixed_us == pytest.approx(F_DEV, rel=1e-9)


def test_steps_over_the_limit_are_not_run_and_say_why():
    floor = HostFloor(H, 2)
    res, timed, _ = _run(floor, limit=2048)  # 2 x 1024 fits: the first length above the floor
    assert res.device_bound.length == 1024
    res, timed, _ = _run(floor, limit=2047)  # 2 x 1024 does not fit, nor would any longer one
    assert res.device_bound is None and all(len(t) and max(map(sum, t)) <= 128 for t in timed)
    assert res.device_bound_note == ("no ladder length above the floor's 2 points fits two documents in 2047 tokens "
                                     "(ladder 256, 512, 1024, 2048)")
    assert res.fixed_from == "short" and res.fixed_us == res.short_fixed_us


def test_the_device_bound_length_exactly():
    assert device_bound_length([2048, 4096, 8192, 16384], HostFloor(4341.0, 3), 133119) == (16384, "")
    assert device_bound_length([1024, 64, 128], None, 10**6) == (64, "")
    assert device_bound_length([64, 128, 1024], HostFloor(1.0, 2), 2000)[0] is None
    assert device_bound_split(16384) == {1: [[16384, 16384]], 2: [[16384], [16384]]}


def test_priced_calls_above_a_floor_are_one_more_b_a_layer():
    """Run 9's re-fit (a 1.176e-8 us/FLOP, b 546.8 us, floor 4,341 us, attention weight 0.508):
    16,384 tokens lie on the line (9.5 ms a layer), so one more micro-batch of them is priced 24 b."""
    shape, floor = ModelShape(24, 896, 128, 2), HostFloor(4341.0, 3)
    split = device_bound_split(16384)

    def layer(f):
        return max(floor.us, 1.176e-8 * f + 546.8)
    assert priced_calls_us(layer, 0.508, shape, split[1], split[2], False) == pytest.approx(24 * 546.8, rel=1e-9)
    # Under the floor (two documents of 2,048: 1.0 ms on the line) each micro-batch is priced the floor.
    small = device_bound_split(2048)
    assert priced_calls_us(layer, 0.508, shape, small[1], small[2], False) == pytest.approx(24 * 4341.0, rel=1e-12)


def test_the_choice():
    assert choose_fixed(0.0, 12_000.0, True) == (12_000.0, "device-bound")
    assert choose_fixed(0.0, None, True) == (0.0, "short")
    assert choose_fixed(86_800.0, 80_000.0, False) == (86_800.0, "short")


def test_a_refit_prices_the_device_bound_steps_with_the_new_line():
    """Run 9's profile as if it had timed the device-bound steps (two documents of 16,384 tokens:
    800 and 830 ms, made up): the re-fit finds the floor, and the scheduler's fixed cost becomes
    their difference less 24 layer calls at the new b (546.8 us), not the short slope's 0."""
    import tomllib
    from pathlib import Path

    from tests.unit_tests.tool_module import load_tool

    d = tomllib.loads((Path(__file__).resolve().parents[2] / "profiles" / "h200-qwen2.5-0.5b.toml").read_text())
    d["meta"]["micro_batch"].update(device_bound_docs=[16384, 16384], device_bound_counts=[1, 2],
                                    device_bound_step_us=[800_000.0, 830_000.0])
    line = load_tool("refit_compute").refit(d, partial=True)
    raw, b = d["meta"]["micro_batch"], d["compute"]["b_us"]
    assert raw["device_bound_calls_us"] == pytest.approx(24 * b, rel=1e-9) and b == pytest.approx(546.8, abs=0.1)
    assert d["micro_batch"]["fixed_us"] == raw["device_bound_fixed_us"] == pytest.approx(30_000.0 - 24 * b, rel=1e-9)
    assert raw["short_fixed_us"] == 0.0 and raw["fixed_from"] == "device-bound"
    assert "micro-batch fixed 2.91e+04 -> 1.688e+04 us, the device-bound steps' (device-bound: difference 3e+04" in line


def test_the_summary_says_which_figure_and_why():
    from skrull_ext.profile.writer import _device_bound_line, _device_bound_meta

    res, _, _ = _run(HostFloor(H, 2))
    line = _device_bound_line(res)
    assert line.startswith("  device-b fixed 5000 us per micro-batch = step difference 5400 us - priced calls 400 us "
                           "(2 documents of 1024 tokens in 1, 2 micro-batches: ")
    assert line.endswith("the scheduler gets the device-bound one, 5000 us (the compute ladder has a host floor, "
                         "which prices the short steps' host work; the planner's micro-batches are long)")
    meta = _device_bound_meta(res)
    assert meta["fixed_from"] == "device-bound" and meta["short_fixed_us"] == pytest.approx(F_HOST, rel=1e-9)
    assert meta["device_bound_docs"] == [1024, 1024] and meta["device_bound_counts"] == [1, 2]
    res, _, _ = _run(HostFloor(H, 2), limit=2047)
    assert _device_bound_line(res) == (
        "  device-b not measured: no ladder length above the floor's 2 points fits two documents in 2047 tokens "
        "(ladder 256, 512, 1024, 2048); the scheduler gets the short one, 8000 us (the device-bound steps were not "
        "measured)")
    assert _device_bound_meta(res) == {"short_fixed_us": res.short_fixed_us, "fixed_from": "short",
                                       "device_bound_note": res.device_bound_note}
