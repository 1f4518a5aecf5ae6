"""Profiler fits on synthetic points with known coefficients: exact recovery,
agreement with the scheduler's own evaluation of the written table, and the
BucketSize arithmetic with a quadratic memory term."""

import math
import os

import pytest
import torch

from skrull_ext._core import CommModel, CostModel, ModelShape
from skrull_ext.profile.fit import fit_line_nonneg, fit_piecewise, fit_poly, quality
from skrull_ext.profile.memory import CpuTensorPeak, fit_memory
from skrull_ext.profile.options import ProfileOptions, parse_bytes, parse_ints
from skrull_ext.scheduler.profile_memory import derive_bucket_size


def close(a, b, rel=1e-9):
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def test_line_recovered_exactly():
    a, b = 4.4e-5, 17.0  # us per FLOP, us
    x = [1e8 * k for k in (1, 2, 3, 5, 8, 13, 21)]
    fit = fit_poly(x, [a * v + b for v in x], 1)
    assert close(fit.slope, a) and close(fit.intercept, b)
    assert close(fit.r2, 1.0) and fit.max_rel_error < 1e-9


def test_quadratic_recovered_exactly_despite_scale():
    a, b, c = 1.473e5, 4.0, 24.0  # bytes per token, fixed bytes, bytes per token^2
    x = [128, 256, 512, 1024, 1536, 2048]
    fit = fit_poly(x, [b + a * n + c * n * n for n in x], 2)
    assert close(fit.slope, a, 1e-7) and close(fit.quadratic, c, 1e-7) and abs(fit.intercept - b) < 1e-3


def test_through_origin_and_relative_weighting():
    x = [1.0, 10.0, 100.0]
    fit = fit_poly(x, [2.0 * v for v in x], 1, intercept=False)
    assert fit.intercept == 0.0 and close(fit.slope, 2.0)
    # Relative weights: a 10% miss on the smallest point counts as much as on the largest.
    noisy = fit_poly(x, [2.2, 20.0, 200.0], 1)
    assert noisy.max_rel_error < 0.1


def test_line_nonneg_pins_whichever_coefficient_comes_out_negative():
    x = [1.0, 2.0, 4.0, 8.0]
    free, pinned = fit_line_nonneg(x, [3.0 + 2.0 * v for v in x])
    assert pinned == "" and close(free.slope, 2.0) and close(free.intercept, 3.0)
    # Time that falls as the work grows (a loaded CPU timing a tiny model): a
    # constant, the relative least-squares one: sum(1/y) / sum(1/y^2).
    flat, pinned = fit_line_nonneg([1.0, 4.0], [12.0, 6.0])
    assert pinned == "slope" and flat.slope == 0.0 and close(flat.intercept, 0.25 / (5 / 144))
    # Faster than proportional growth: through the origin.
    origin, pinned = fit_line_nonneg(x, [2.0 * v - 0.5 for v in x])
    assert pinned == "intercept" and origin.intercept == 0.0 and origin.slope > 0


def test_fit_memory_picks_the_model_the_points_need():
    n = [128, 256, 512, 1024, 2048, 4096]
    linear = fit_memory(n, [1000.0 + 500.0 * v for v in n])
    assert linear.quadratic == 0.0 and close(linear.slope, 500.0)
    quad = fit_memory(n, [1000.0 + 500.0 * v + 2.0 * v * v for v in n])
    assert close(quad.quadratic, 2.0, 1e-7)


def test_piecewise_recovered_exactly_and_matches_the_scheduler():
    floor, a, b = 50.0, 0.01, 40.0  # line meets the floor at 1000 bytes
    x = [100.0, 200.0, 400.0, 800.0, 1600.0, 3200.0, 6400.0, 12800.0]
    y = [floor if v < 1000 else a * v + b for v in x]
    fit = fit_piecewise(x, y)
    assert close(fit.floor_us, floor) and close(fit.a_us_per_byte, a) and close(fit.b_us, b)
    assert close(fit.threshold_bytes, 1000.0)
    assert fit.max_rel_error < 1e-9
    xs, us = fit.table(x)
    cm = CostModel(ModelShape(1, 1, 1, 1), 0.0, 0.0,
                   CommModel(xs, us, threshold_bytes=fit.threshold_bytes, floor_us=fit.floor_us))
    assert cm.comm_is_monotone()
    for v in (1.0, 150.0, 999.0, 1000.0, 1200.0, 5000.0, 50000.0):
        assert close(cm.collective_us(v), fit(v)), v


def test_piecewise_step_between_points_goes_to_the_geometric_midpoint():
    x = [100.0, 200.0, 400.0, 800.0, 1600.0]
    y = [50.0, 50.0, 260.0, 460.0, 860.0]  # line 0.5 x + 60 is above the floor already at 200
    fit = fit_piecewise(x, y)
    assert close(fit.floor_us, 50.0) and close(fit.a_us_per_byte, 0.5) and close(fit.b_us, 60.0)
    assert close(fit.threshold_bytes, math.sqrt(200.0 * 400.0)) and fit.max_rel_error < 1e-9


def test_piecewise_without_a_floor():
    x = [1e3, 1e4, 1e5, 1e6]
    fit = fit_piecewise(x, [5.0 + 1e-3 * v for v in x])
    assert fit.threshold_bytes == 0.0 and close(fit.a_us_per_byte, 1e-3) and close(fit.b_us, 5.0)


@pytest.mark.parametrize(
    "call, msg",
    [
        (lambda: fit_poly([1, 2], [1.0], 1), "differ in length"),
        (lambda: fit_poly([1, 2, 3], [1.0, 0.0, 2.0], 1), "must be > 0"),
        (lambda: fit_poly([1], [1.0], 1), "at least 2 points"),
        (lambda: fit_poly([1, 2, 3], [1.0, 2.0, math.nan], 1), "finite"),
        (lambda: fit_piecewise([1, 1, 2], [1.0, 1.0, 2.0]), "distinct"),
        (lambda: fit_poly([1, 2, 3], [1.0, 2.0, 3.0], 3), "degree"),
    ],
)
def test_bad_points_rejected(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


def test_quality():
    assert quality([1.0, 2.0], [1.0, 2.0]) == (1.0, 0.0)
    r2, worst = quality([1.0, 2.0, 3.0], [1.1, 2.0, 3.0])
    assert r2 < 1 and close(worst, 0.1)


def test_bucket_size_with_quadratic_term_is_the_largest_that_fits():
    usable, static, a, b, c, m = 2**30, 60e6, 1.473e5, 4.0, 24.0, 0.21
    n = derive_bucket_size(usable, static, a, b, m, c)
    free = (usable - static - b) * (1 - m)
    assert a * n + c * n * n <= free < a * (n + 1) + c * (n + 1) ** 2
    assert derive_bucket_size(usable, static, a, b, m) > n  # the quadratic term costs tokens
    with pytest.raises(ValueError, match="c_bytes_per_token2"):
        derive_bucket_size(usable, static, a, b, m, -1.0)


def test_cpu_tensor_peak_is_the_exact_live_tensor_high_water_mark():
    # 4 MB live from before (not counted), then +8 MB, +16 MB, free 8 MB, +4 MB:
    # the peak above the start level is 24 MB, whatever the process's RSS does.
    before = torch.empty(2**20, dtype=torch.float32)
    meter = CpuTensorPeak()
    meter.start()
    a = torch.empty(2 * 2**20, dtype=torch.float32)
    b = torch.empty(4 * 2**20, dtype=torch.float32)
    del a
    c = torch.empty(2**20, dtype=torch.float32)
    del before
    assert meter.peak() == 24 * 2**20
    del b, c
    meter.start()  # a fresh window: nothing allocated in it
    assert meter.peak() == 0.0


def test_options_parsing_and_derived_ladders():
    assert parse_bytes("1GiB") == 2**30 and parse_bytes("512MiB") == 2**29 and parse_bytes("80GB") == 80e9
    assert parse_ints("128:1024") == (128, 256, 512, 1024) and parse_ints("4KiB,8KiB") == (4096, 8192)
    with pytest.raises(ValueError, match="not a byte size"):
        parse_bytes("lots")
    o = ProfileOptions().for_job(512, 131072)
    assert max(o.lengths) == 1024 and not set(o.held_out) & set(o.lengths)
    assert min(o.held_out) > min(o.lengths) and max(o.held_out) < max(o.lengths)  # interpolation only
    assert max(o.memory_lengths) == 2048
    assert max(ProfileOptions().for_job(32768, 32768).lengths) == 32768  # capped at the model's context
    with pytest.raises(ValueError, match="--held-out"):
        ProfileOptions(lengths=(128, 256), held_out=(256,))
    with pytest.raises(ValueError, match="--margin"):
        ProfileOptions(margin=1.0)


def test_bucket_size_at_cp_counts_what_a_shard_keeps():
    """At cp > 1 a rank may hold C tokens of sharded sequences: K/V gathered from
    cp - 1 ranks and cp times the keys per query. The bucket is the largest C
    with (a + (cp-1) kv) C + cp c C^2 within the budget; cp 1 is unchanged."""
    usable, static, a, b, m, c, kv = 1 << 30, 60 << 20, 147268.0, 4.0, 0.27, 24.0, 12288.0
    one = derive_bucket_size(usable, static, a, b, m, c)
    assert derive_bucket_size(usable, static, a, b, m, c, 1, kv) == one
    two = derive_bucket_size(usable, static, a, b, m, c, 2, kv)
    free = (usable - static - b) * (1 - m)
    cost = lambda n: (a + kv) * n + 2 * c * n * n  # noqa: E731
    assert cost(two) <= free < cost(two + 1)
    assert two < one
    assert derive_bucket_size(usable, static, a, b, m, 0.0, 8, 0.0) == derive_bucket_size(usable, static, a, b, m)
    with pytest.raises(ValueError, match="cp must be an integer >= 1, got 0"):
        derive_bucket_size(usable, static, a, b, m, c, 0, kv)


def test_comm_table_never_falls_below_the_floor_at_the_crossing():
    """The threshold is where the line meets the floor; line(threshold) can round
    one ulp under the floor (these numbers do), which made the written [comm]
    table non-monotone and the profiler's gloo run fail now and then."""
    from skrull_ext.profile.fit import PiecewiseFit

    floor, a, b = 91.12847118503352, 3.155939305051998e-05, -48.60047764535965
    cross = (floor - b) / a
    assert a * cross + b < floor  # the rounding this guards against
    fit = PiecewiseFit(floor, cross, a, b, cross, 1.0, 0.0)
    xs, us = fit.table([cross * 2, cross * 4])
    cm = CostModel(ModelShape(1, 1, 1, 1), 1.0, 0.0, CommModel(xs, us, cross, floor, 2.0))
    assert us[0] == floor and cm.comm_is_monotone()


def _ladder(path):
    import tomllib
    from types import SimpleNamespace

    with open(path, "rb") as f:
        d = tomllib.load(f)["meta"]["compute"]
    return SimpleNamespace(points=[SimpleNamespace(flops=f, us=u, tokens=t)
                                   for f, u, t in zip(d["flops"], d["us"], d["lengths"])])


def test_a_flat_ladder_is_reported_host_bound():
    from skrull_ext.profile.writer import host_bound_note

    profiles = os.path.join(os.path.dirname(__file__), "..", "..", "profiles")
    # The H100's eager ladder: 12.1-14.3 ms a layer for x25 the FLOPs.
    note = host_bound_note(_ladder(os.path.join(profiles, "h100-qwen2.5-0.5b.toml")))
    assert note is not None and "12.1-14.3 ms from 2048 to 16384 tokens (x25 the FLOPs): host-bound" in note
    # The CPU's ladder grows with the work: no note.
    assert host_bound_note(_ladder(os.path.join(profiles, "cpu-debug-gloo2.toml"))) is None


def test_two_rates_recover_the_linear_and_attention_rates():
    """T = a (linear + w attention) + b, exactly, from buffers whose mixes tell the two apart
    (single documents and packed ones); the fit reports the weight and its line in weighted FLOPs."""
    from skrull_ext.profile.fit import fit_two_rates

    a, w, b = 2e-9, 0.5, 300.0
    flops = [(1e11, 5e10), (2e11, 2e11), (4e11, 8e11), (8e11, 3.2e12), (1.6e12, 3.2e12), (8e11, 1.2e12)]
    y = [a * (lin + w * att) + b for lin, att in flops]
    fit, weight = fit_two_rates(flops, y)
    assert weight == pytest.approx(w, rel=1e-9) and fit.slope == pytest.approx(a, rel=1e-9)
    assert fit.intercept == pytest.approx(b, rel=1e-6) and fit.max_rel_error < 1e-9
    # A rate below 0 (the time falls as attention grows) or fewer than 4 buffers: no two-rate fit.
    assert fit_two_rates(flops, [a * lin - 1e-10 * att + b for lin, att in flops]) is None
    with pytest.raises(ValueError, match="need at least 4 points"):
        fit_two_rates(flops[:3], y[:3])


def test_a_profiles_attention_weight_round_trips_and_defaults_to_one():
    from skrull_ext.scheduler.profile_file import from_dict, to_dict

    d = {"model": {"layers": 2, "hidden": 64, "kv_width": 16, "bytes_per_elem": 2},
         "compute": {"a_us_per_flop": 1e-9, "b_us": 10.0}, "comm": {"bytes": [1.0], "us": [1.0]}}
    assert from_dict(d).attention_weight == 1.0 and "attention_weight" not in to_dict(from_dict(d))["compute"]
    d["compute"]["attention_weight"] = 0.55
    cm = from_dict(d)
    assert cm.attention_weight == 0.55 and to_dict(cm)["compute"]["attention_weight"] == 0.55
    assert cm.flops(100) == pytest.approx(20 * 64 * 64 * 100 + 4 * 64 * 16 * 100 + 0.55 * 4 * 64 * 100 * 100)
    d["compute"]["attention_weight"] = 5.0
    with pytest.raises(ValueError, match=r"attention_weight must be finite and in \(0, 4\], got 5"):
        from_dict(d, where="p.toml")


def test_fit_memory_never_gives_negative_bytes_at_no_tokens():
    """A ladder whose line crosses zero above N = 0 (a short ladder under checkpointing fitted
    b = -0.6 MB, which the profile file refuses) is fitted through the origin."""
    n = [128, 256, 512, 1024]
    fit = fit_memory(n, [-1000.0 + 500.0 * v for v in n])
    assert fit.intercept == 0.0 and fit.quadratic == 0.0
    assert 490.0 < fit.slope < 500.0  # the line through the origin, pulled under 500 by the points' -1000
