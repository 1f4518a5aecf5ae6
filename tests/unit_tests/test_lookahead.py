"""The look-ahead window (cpp/include/skrull/lookahead.hpp) through its binding:
an exact small case, errors, invariants on random windows (every sample
once, at most W-1 steps from its arrival, each step's count kept, never
slower than arrival order, deterministic, within its budgets) and equality
with its plain-Python restatement (skrull_ext/bench/reference_lookahead.py)."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skrull_ext import SchedulerConfig, _core, lengths
from skrull_ext.bench import reference_lookahead as ref
from skrull_ext.scheduler import cost_model as cm

REAL = lengths.load("mix_sharegpt_conv95+longbench_en5")


def options(dp: int, cp: int, bucket: int, timeline: str = "lockstep", policy: str = "skrull") -> _core.Options:
    return SchedulerConfig(dp=dp, cp=cp, bucket_size=bucket, timeline=timeline, policy=policy).core_options()


def test_exact_small_case():
    # DP 2 x CP 1, lockstep: two steps, each a long (4,000) and a short (100) sequence. Arrival order
    # makes each step one DP rank's long sequence while the other waits; the window pairs the long ones.
    cost = cm.preset()
    opt = options(2, 1, 8192)
    a = _core.lookahead([[4000, 100], [100, 4000]], cost, opt)
    assert a.offsets == [0, 2, 4]
    assert a.step == [0, 1, 1, 0]
    assert a.steps == [[0, 3], [1, 2]]
    assert (a.moved, a.max_delay, a.long_fraction, a.long_steps) == (2, 1, 1.0, 2)
    # The long-first candidates equal arrival order here: only the sort is screened and planned,
    # then the swap search screens 4 swaps by the estimate and plans none of them.
    assert (a.screened, a.candidates, a.swaps, a.swap_trials, a.planned) == (1, 2, 0, 4, 8)
    by_step = [_core.schedule(x, cost, opt).makespan_us for x in ([4000, 100], [100, 4000], [4000, 4000], [100, 100])]
    assert a.arrival_us == by_step[:2] and a.arrival_window_us == pytest.approx(sum(by_step[:2]))
    assert a.step_us == by_step[2:] and a.window_us == pytest.approx(sum(by_step[2:]))
    assert a.window_us < a.arrival_window_us


def test_one_batch_is_arrival_order():
    a = _core.lookahead([[5, 9, 1]], cm.preset(), options(2, 1, 64))
    assert a.step == [0, 0, 0] and a.steps == [[0, 1, 2]] and a.candidates == 1 and a.moved == 0
    assert (a.screened, a.swap_trials, a.planned) == (0, 0, 3)
    assert a.window_us == a.arrival_window_us


@pytest.mark.parametrize("batches, message", [
    ([], "lookahead window must hold 1 to 1024 global batches, got 0"),
    ([[1]] * 1025, "lookahead window must hold 1 to 1024 global batches, got 1025"),
    ([[1], [0]], r"lookahead window, global batch 1: sequence 0 has length 0"),
])
def test_bad_windows_raise(batches, message):
    with pytest.raises(ValueError, match=message):
        _core.lookahead(batches, cm.preset(), options(1, 1, 64))


def window(seed: int, w: int, per_step: int, bucket: int, cp: int) -> list[list[int]]:
    rng = random.Random(seed)
    limit = _core.max_sequence_length(bucket, cp)
    scale = rng.choice([0.05, 0.2, 1.0])
    return [[max(1, min(limit, int(rng.choice(REAL) * scale * bucket / 26624))) for _ in range(rng.randint(0, per_step))]
            for _ in range(w)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.integers(1, 9), st.integers(0, 40), st.sampled_from([1, 2, 4]),
       st.sampled_from([1, 2, 3]), st.sampled_from([256, 4096]), st.sampled_from(["lockstep", "free"]),
       st.sampled_from(["skrull", "skrull-paper", "skrull-pool"]))
def test_window_invariants(seed, w, per_step, dp, cp, bucket, timeline, policy):
    batches = window(seed, w, per_step, bucket, cp)
    cost = cm.preset()
    opt = options(dp, cp, bucket, "free" if policy == "skrull-pool" else timeline, policy)
    pool = policy == "skrull-pool"
    a = _core.lookahead(batches, cost, opt, pool=pool)
    flat = [s for b in batches for s in b]
    arrival = [b for b, x in enumerate(batches) for _ in x]
    assert a.offsets == [sum(map(len, batches[:b])) for b in range(w + 1)]
    # Every sample exactly once, in a step of the window, each step in arrival order.
    assert sorted(q for s in a.steps for q in s) == list(range(len(flat)))
    assert all(s == sorted(s) for s in a.steps)
    assert all(a.step[q] == s for s, members in enumerate(a.steps) for q in members)
    # Each step keeps its sequence count; no sample more than W-1 steps from its arrival.
    assert [len(s) for s in a.steps] == [len(b) for b in batches]
    delays = [abs(a.step[q] - arrival[q]) for q in range(len(flat))]
    assert a.max_delay == max(delays, default=0) <= w - 1
    assert a.moved == sum(d > 0 for d in delays)
    # Priced by the step planner; never slower than arrival order.
    plan = _core.schedule_pool if pool else _core.schedule
    assert a.step_us == [plan([flat[q] for q in s], cost, opt).makespan_us if s else 0.0 for s in a.steps]
    assert a.window_us == pytest.approx(sum(a.step_us)) and a.window_us <= a.arrival_window_us
    if a.moved == 0:
        assert a.window_us == a.arrival_window_us
    # Within its budgets: arrival order and one finalist, then at most the plan budget more.
    n = len(flat)
    assert a.planned <= 2 * n + ref.LOOKAHEAD_PLAN_WORK and a.swap_trials <= ref.LOOKAHEAD_SCREEN_WORK
    assert a.candidates <= 1 + a.screened
    # Deterministic: the same answer again.
    b = _core.lookahead(batches, cost, opt, pool=pool)
    assert (b.step, b.step_us, b.long_fraction, b.long_steps) == (a.step, a.step_us, a.long_fraction, a.long_steps)


def test_simulated_lookahead_trains_the_same_samples_window_by_window():
    from skrull_ext.sim import policies as P
    from skrull_ext.sim.packing import Shape

    shape = Shape(2, 2, 8, 4096, "lockstep")
    rng = random.Random(3)
    batches = [[rng.choice(REAL) % 8000 + 1 for _ in range(16)] for _ in range(7)]
    out = P.get("skrull+lookahead3").regroup(batches, 0, cm.preset(), shape)
    assert [len(b) for b in out] == [len(b) for b in batches]
    for first in range(0, 7, 3):  # windows 0-2, 3-5 and the last, shorter one
        assert sorted(sum(out[first : first + 3], [])) == sorted(sum(batches[first : first + 3], []))
    with pytest.raises(ValueError, match=r"lookahead must be in \[1, 1024\], got 0"):
        P.get("skrull+lookahead0")


def test_bench_simulate_lookahead_flag(tmp_path, capsys):
    from skrull_ext.bench import simulate

    rc = simulate.main(["--datasets", "mix_sharegpt_conv95+longbench_en5", "--models", "qwen2.5-0.5b", "--dp", "2",
                        "--cp", "2", "--batch-size", "8", "--iterations", "4", "--policies", "skrull",
                        "--lookahead", "2", "--out", str(tmp_path), "--no-plots", "--quiet"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| skrull+lookahead2 | yes |" in printed  # a job runs it: policy skrull, lookahead = 2
    assert '[skrull] policy = "skrull", lookahead = 2' in printed
    with pytest.raises(SystemExit):
        simulate.main(["--lookahead", "0", "--out", str(tmp_path)])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.integers(1, 6), st.integers(0, 30), st.sampled_from([1, 2, 4]),
       st.sampled_from([1, 2]), st.sampled_from(["lockstep", "free"]), st.sampled_from([256, 4096]))
def test_the_core_equals_the_python_reference(seed, w, per_step, dp, cp, timeline, bucket):
    batches = window(seed, w, per_step, bucket, cp)
    cost, opt = cm.preset(), options(dp, cp, bucket, timeline)
    a = _core.lookahead(batches, cost, opt)
    r = ref.lookahead(batches, cost, dp, cp, bucket, lambda l: _core.schedule(l, cost, opt).makespan_us)
    assert (a.step, a.steps, a.long_fraction, a.long_steps) == (r["step"], r["steps"], r["long_fraction"], r["long_steps"])
    assert (a.candidates, a.screened, a.swaps, a.swap_trials, a.planned) == (
        r["candidates"], r["screened"], r["swaps"], r["swap_trials"], r["planned"])
    assert a.step_us == r["step_us"] and a.arrival_us == r["arrival_us"]
    assert a.window_us == pytest.approx(r["window_us"], rel=1e-12)


def test_budgets_bound_a_large_window():
    # 8 steps of 2,048 samples at DP 32: every candidate but the first finalist must fit in the
    # plan budget, so at most arrival order, one finalist and the budget are planned in full,
    # and the swap search stops at its screening budget.
    rng = random.Random(5)
    limit = _core.max_sequence_length(26624, 8)
    batches = [[min(limit, rng.choice(REAL)) for _ in range(2048)] for _ in range(8)]
    cost, opt = cm.preset(), options(32, 8, 26624)
    a = _core.lookahead(batches, cost, opt)
    n = 8 * 2048
    assert a.planned <= 2 * n + ref.LOOKAHEAD_PLAN_WORK
    # Arrival order, the best-estimated candidate, then as many finalists as the budget holds (a
    # finalist plans at least one step of 2,048): a few of the screened ones.
    assert 2 <= a.candidates <= 2 + ref.LOOKAHEAD_PLAN_WORK // 2048 < a.screened
    assert a.window_us <= a.arrival_window_us and sorted(q for s in a.steps for q in s) == list(range(n))


def test_the_estimate_equals_the_python_reference():
    # step_estimate.hpp through the core's grouping of a window: the reference's estimate, summed over
    # the core's own steps, ranks the same finalist first (the exact operations are checked above).
    cost = cm.preset()
    est = ref.Estimator(cost, 2, 2, 4)
    s = ref.Sketch()
    for c, length in ((6.0, 10), (3.0, 5), (2.0, 4)):
        est.add(s, c, length)
    per_mb = cost.micro_batch_fixed_us + cost.shape.layers * cost.b_us
    assert est.us(s) == max(11.0 / 2, 6.0, 3.0 + 2.0) + 2 * per_mb + cost.token_us / 4.0 * 19.0 + cost.step_fixed_us
    assert ref.kth_after_swap([9.0, 7.0, 5.0, 3.0], 2, 0, 4.0) == 4.0


def test_the_core_equals_the_python_reference_where_the_budget_binds():
    # 8 steps of 1,200 samples: the plan budget (2^15 sequences) stops the finalists after a few
    # of the screened candidates and leaves too little for the swap search (64 checks of two steps).
    rng = random.Random(11)
    limit = _core.max_sequence_length(26624, 8)
    batches = [[min(limit, rng.choice(REAL)) for _ in range(1200)] for _ in range(8)]
    cost, opt = cm.preset(), options(16, 8, 26624)
    a = _core.lookahead(batches, cost, opt)
    r = ref.lookahead(batches, cost, 16, 8, 26624, lambda l: _core.schedule(l, cost, opt).makespan_us)
    assert 2 < a.candidates < 1 + a.screened and a.swap_trials == 0
    assert (a.step, a.long_fraction, a.long_steps, a.candidates, a.planned) == (
        r["step"], r["long_fraction"], r["long_steps"], r["candidates"], r["planned"])
    assert a.step_us == r["step_us"]


def test_the_core_equals_the_python_reference_on_a_wide_window():
    # W = 40: the long-first split over k > 32 steps takes the core's heap (a scan below), which
    # must pick the same steps as the reference's scan (least load, ties to the lower step).
    batches = window(21, 40, 3, 4096, 2)
    cost, opt = cm.preset(), options(2, 2, 4096)
    a = _core.lookahead(batches, cost, opt)
    r = ref.lookahead(batches, cost, 2, 2, 4096, lambda l: _core.schedule(l, cost, opt).makespan_us)
    # Long-first splits over the ladder's 13 k (1..8, 12, 16, 24, 32, 40) for 5 fractions: 25 of them fit
    # the steps' counts (a step that no sample arrived in takes none), and the sort.
    assert ref.screened_steps(40) == [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 40] and a.screened == 26
    assert (a.step, a.long_fraction, a.long_steps, a.candidates, a.screened, a.swaps, a.swap_trials, a.swap_visits,
            a.planned) == (r["step"], r["long_fraction"], r["long_steps"], r["candidates"], r["screened"], r["swaps"],
                           r["swap_trials"], r["swap_visits"], r["planned"])


def test_every_k_is_screened_at_the_shipped_widths_and_a_ladder_beyond():
    # W <= 8 (the shipped widths, and "auto"'s 2, 4 and 8) screens every k = 1..W, as before the ladder;
    # wider windows every k to 8, then two a doubling, then W: O(log W) a fraction.
    for w in range(1, 9):
        assert ref.screened_steps(w) == list(range(1, w + 1))
    assert ref.screened_steps(9) == list(range(1, 10))
    assert ref.screened_steps(16) == [1, 2, 3, 4, 5, 6, 7, 8, 12, 16]
    assert ref.screened_steps(1024) == [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512,
                                        768, 1024]


def test_the_core_equals_the_python_reference_on_a_window_of_a_hundred():
    # W = 100 at 4 samples a step: the ladder's k up to 96 and 100 (the heap's LPT), the finalists and the
    # swap search over 4,950 pairs of steps, step for step the reference's.
    batches = window(8, 100, 4, 4096, 2)
    cost, opt = cm.preset(), options(4, 2, 4096)
    a = _core.lookahead(batches, cost, opt)
    r = ref.lookahead(batches, cost, 4, 2, 4096, lambda l: _core.schedule(l, cost, opt).makespan_us)
    assert a.screened <= 5 * len(ref.screened_steps(100)) + 1 and a.swap_visits > 100 * 99 // 2
    assert (a.step, a.long_fraction, a.long_steps, a.candidates, a.screened, a.swaps, a.swap_trials, a.swap_visits,
            a.planned) == (r["step"], r["long_fraction"], r["long_steps"], r["candidates"], r["screened"], r["swaps"],
                           r["swap_trials"], r["swap_visits"], r["planned"])
    assert a.step_us == r["step_us"]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.sampled_from([9, 16, 40, 100, 333, 1024]), st.integers(0, 4),
       st.sampled_from([1, 2, 4]), st.sampled_from(["lockstep", "free"]))
def test_wide_window_invariants(seed, w, per_step, dp, timeline):
    # Up to kMaxLookahead steps: every sample once at a step that keeps its count, at most W-1 steps
    # from its arrival, never predicted slower than arrival order, a long-first split on the ladder.
    batches = window(seed, w, per_step, 4096, 2)
    cost, opt = cm.preset(), options(dp, 2, 4096, timeline)
    a = _core.lookahead(batches, cost, opt)
    n = sum(map(len, batches))
    arrival = [b for b, x in enumerate(batches) for _ in x]
    assert sorted(q for s in a.steps for q in s) == list(range(n))
    assert [len(s) for s in a.steps] == [len(b) for b in batches]
    assert a.max_delay == max((abs(a.step[q] - arrival[q]) for q in range(n)), default=0) <= w - 1
    assert a.window_us <= a.arrival_window_us
    assert a.long_fraction in (0.0, 1.0) or a.long_steps in ref.screened_steps(w)
    assert a.screened <= 5 * len(ref.screened_steps(w)) + 1 and a.planned <= 2 * n + ref.LOOKAHEAD_PLAN_WORK
    assert a.swap_trials <= ref.LOOKAHEAD_SCREEN_WORK and a.swap_visits <= ref.LOOKAHEAD_SWAP_VISITS


def test_the_swap_search_stops_at_its_visit_budget():
    # 1,024 steps of 8 samples of one length: no swap changes a step, so none is a trial, but a pass
    # looks at 523,776 pairs of steps and 64 pairs of samples in each (34 million): the visit budget
    # (2^24) stops it.
    batches = [[700] * 8 for _ in range(1024)]
    a = _core.lookahead(batches, cm.preset(), options(2, 1, 4096))
    assert (a.swap_trials, a.swaps, a.swap_visits) == (0, 0, ref.LOOKAHEAD_SWAP_VISITS)
    assert a.window_us == a.arrival_window_us
