"""The compute fit's host floor (profile/compute.py): exact fits on synthetic ladders with and
without a floor, and the shipped H200 profile (GPU run 9) re-fitted from its recorded timings."""

import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull_ext._core import ModelShape
from skrull_ext.profile.compute import fit_compute, flops_of, split_flops
from skrull_ext.profile.fit import HostFloor, fit_line_nonneg, host_floors
from skrull_ext.profile.micro_batch import call_us
from skrull_ext.scheduler import profile_file
from tests.unit_tests.tool_module import load_tool

ROOT = Path(__file__).resolve().parents[2]
SHAPE = ModelShape(4, 256, 64, 2)
LADDER = [256, 512, 1024, 2048, 4096, 8192]


def test_a_floor_is_the_flat_prefix_up_to_the_rise():
    x = [1e10 * 2**k for k in range(6)]
    y = [max(1000.0, 1e-8 * v + 50.0) for v in x]  # 1000 x4 (the line: 150..850), then 1650, 3250
    assert host_floors(x, y, keep=2) == [HostFloor(pytest.approx(1000.0), 4)]
    # A shorter prefix is no floor: its next point does not rise above it.
    assert host_floors(x, y, keep=3) == []
    assert host_floors(x, [1e-8 * v + 50.0 for v in x]) == []  # the time grows from the first point
    assert host_floors(x, [1000.0] * 6) == []  # flat throughout: nothing above it to fit


@settings(max_examples=50, deadline=None)
@given(a=st.floats(1e-9, 1e-6), share=st.floats(0.0, 1.0), n=st.integers(3, 8))
def test_a_device_bound_ladder_has_no_floor(a, share, n):
    """Doubling the FLOPs of T = a F + b with b <= a F_0 multiplies T by 1.5 or more."""
    x = [1e9 * 2**k for k in range(n)]
    b = share * a * x[0]
    assert host_floors(x, [a * v + b for v in x]) == []


def test_one_rate_above_a_floor_is_exact():
    a, b, floor = 2e-6, 40.0, 3000.0
    us = [max(floor, a * flops_of(SHAPE, [n]) + b) for n in LADDER]
    on = sum(u == floor for u in us)
    assert on >= 2 and us[on] > 1.1 * floor
    cf = fit_compute(SHAPE, list(zip(LADDER, us)), [])
    assert cf.floor == HostFloor(pytest.approx(floor), on) and cf.attention_weight == 1.0 and cf.pinned == ""
    assert cf.fit.slope == pytest.approx(a, rel=1e-9) and cf.fit.intercept == pytest.approx(b, rel=1e-6)
    assert cf.fit.max_rel_error < 1e-9 and all(cf(flops_of(SHAPE, [n])) == pytest.approx(u) for n, u in zip(LADDER, us))


def test_without_a_floor_the_fit_is_todays():
    a, b = 2e-6, 40.0
    us = [a * flops_of(SHAPE, [n]) + b for n in LADDER]
    cf = fit_compute(SHAPE, list(zip(LADDER, us)), [])
    want, pinned = fit_line_nonneg([flops_of(SHAPE, [n]) for n in LADDER], us)
    assert cf.floor is None and cf.fit == want and cf.pinned == pinned == ""


def test_two_rates_above_a_floor_are_exact():
    """Ladder points and two packed buffers above the floor: both rates and the intercept exactly."""
    a, w, b, floor = 2e-6, 0.5, 40.0, 3000.0

    def t(docs):
        lin, att = split_flops(SHAPE, docs)
        return max(floor, a * (lin + w * att) + b)

    packed = [((4096, 4096), t((4096, 4096))), ((1024,) * 8, t((1024,) * 8))]
    on = sum(t([n]) == floor for n in LADDER)
    assert on >= 2 and all(u > 1.1 * floor for _, u in packed)
    cf = fit_compute(SHAPE, [(n, t([n])) for n in LADDER], packed)
    assert cf.floor == HostFloor(pytest.approx(floor), on)
    assert cf.attention_weight == pytest.approx(w, rel=1e-9) and cf.fit.slope == pytest.approx(a, rel=1e-9)
    assert cf.fit.intercept == pytest.approx(b, rel=1e-6) and cf.fit.max_rel_error < 1e-9


def test_a_line_over_the_floor_at_its_last_point_is_no_floor():
    """Two flat points, then a line that runs above them: they were not host-bound."""
    x = [flops_of(SHAPE, [n]) for n in LADDER[:4]]
    us = [1000.0, 1000.0, 3000.0, 3100.0]
    cf = fit_compute(SHAPE, list(zip(LADDER[:4], us)), [])
    assert host_floors(x, us, keep=2) == [HostFloor(pytest.approx(1000.0), 2)]
    assert cf.floor is None and (cf.fit, cf.pinned) == fit_line_nonneg(x, us)


def test_a_micro_batch_calls_its_layers_at_the_floor():
    assert call_us(3027.0) == 3027.0 and call_us(547.0, HostFloor(4341.0, 3)) == 4341.0
    assert call_us(5000.0, HostFloor(4341.0, 3)) == 5000.0


def _refit_tool():
    return load_tool("refit_compute")


def test_run_9s_profile_refits_above_its_floor():
    """GPU run 9's ladder (4.17, 4.51, 4.38, 9.48 ms a layer at 2K-16K tokens) and its two packed
    buffers: the floor is the three short lengths, the line through the rest misses the held-out
    12,288 by -2.7% (the line through all of them: +18.8%), and the micro-batch's layers are called
    at the floor, which leaves no fixed cost. Its none mode recorded no packed buffers, so nothing is
    re-fitted but with ``partial`` (selective alone would skew the modes' comparison)."""
    d = tomllib.loads((ROOT / "profiles" / "h200-qwen2.5-0.5b.toml").read_text())
    shipped = tomllib.loads((ROOT / "profiles" / "h200-qwen2.5-0.5b.toml").read_text())
    tool = _refit_tool()
    assert tool.refit(d).startswith("kept: none cannot be re-fitted") and d == shipped
    shape = ModelShape(24, 896, 128, 2)
    line = tool.refit(d, partial=True)
    raw = d["meta"]["compute"]
    assert raw["host_floor_points"] == 3 and raw["host_floor_us"] == pytest.approx(4340.67, abs=0.01)
    assert raw["held_out_rel_error"] == [pytest.approx(-0.0274, abs=1e-4)]
    assert d["compute"]["held_out_max_rel_error"] < 0.15 and d["compute"]["attention_weight"] == pytest.approx(0.508, abs=1e-3)
    assert d["micro_batch"]["fixed_us"] == 0.0 and d["micro_batch"]["calls_us"] == pytest.approx(24 * raw["host_floor_us"])
    assert d["activation_checkpoint"]["selective"]["b_us"] == d["compute"]["b_us"]
    # The floor is priced: [compute] and the measured mode carry it, and the scheduler reads it.
    assert d["compute"]["host_floor_us"] == raw["host_floor_us"] == d["activation_checkpoint"]["selective"]["host_floor_us"]
    assert profile_file.from_dict(d).host_floor_us == raw["host_floor_us"]
    assert "host_floor_us" not in shipped["compute"]
    assert d["activation_checkpoint"]["none"] == shipped["activation_checkpoint"]["none"] and "none kept" in line
    # The long points lie on the line, the short ones on the floor.
    cf = fit_compute(shape, list(zip(raw["lengths"], raw["us"])), list(zip(raw["packed_docs"], raw["packed_us"])))
    assert cf(flops_of(shape, [16384], cf.attention_weight)) == pytest.approx(raw["us"][3], rel=1e-9)
    assert cf(flops_of(shape, [2048], cf.attention_weight)) == raw["host_floor_us"]


def test_the_summary_says_the_floor():
    from skrull_ext.profile.writer import floor_line

    pts = [SimpleNamespace(tokens=n, flops=float(n), us=u) for n, u in ((1024, 4100.0), (2048, 4300.0), (4096, 9000.0))]
    cp = SimpleNamespace(points=pts, floor=HostFloor(4200.0, 2), fit=lambda f: 2.0 * f + 100.0)
    assert floor_line(cp) == ("  floor    4.20 ms a layer from 1024 to 2048 tokens (4.10, 4.30 ms): the host's launch work, "
                              "not the FLOPs; the line is fitted above it and the scheduler prices T = max(floor, line) "
                              "(the line alone: -49% at 1024 tokens)")
