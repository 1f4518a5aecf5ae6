"""Bad input is refused with a ValueError naming it, never a crash or a bad
plan (issue 7). Each test here pins a defect the hardening work found; the
fuzzer (tools/fuzz.sh) and docs/reliability.md cover the rest."""

import os
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull_ext import POLICIES, Scheduler, SchedulerConfig, _core
from skrull_ext.bench import reference as ref
from skrull_ext.scheduler import cost_model as cm

EXAMPLES = int(os.environ.get("SKRULL_HARDENING_EXAMPLES", "150"))


def test_dacp_refuses_unknown_placement_and_rollback():
    # Found by review: the dacp binding checked cp and bucket but not the
    # enums, so Placement(7) silently ran as worst-fit.
    c = cm.preset()
    with pytest.raises(ValueError, match=r"unknown placement 7"):
        _core.dacp([1, 2, 3], c, 2, 10, _core.Placement(7), _core.Rollback.LONGEST)
    with pytest.raises(ValueError, match=r"unknown rollback 9"):
        _core.dacp([1, 2, 3], c, 2, 10, _core.Placement.LEAST_LOAD, _core.Rollback(9))


@pytest.mark.parametrize(
    "args, msg",
    [
        (([0], 2, 10), r"sequence 0 has length 0, outside \[1, 68719476736\]"),
        (([1], 0, 10), r"cp must be in \[1, 65536\], got 0"),
        (([1], 2, 0), r"bucket_size must be in \[1, 68719476736\], got 0"),
        (([1 << 40], 2, 10), r"sequence 0 has length 1099511627776"),
    ],
)
def test_dacp_refuses_out_of_range_arguments(args, msg):
    lengths, cp, bucket = args
    with pytest.raises(ValueError, match=msg):
        _core.dacp(lengths, cm.preset(), cp, bucket)
    with pytest.raises(ValueError, match=msg):
        _core.evaluate_placement(lengths, [-1] * len(lengths), cm.preset(), cp, bucket)


def _cost(a=1e-9, b=1.0, layers=2, bytes_=(1.0, 2.0), us=(1.0, 2.0), floor=0.0, per_layer=2.0):
    return _core.CostModel(_core.ModelShape(layers, 8, 8), a, b,
                           _core.CommModel(list(bytes_), list(us), 0.0, floor, per_layer))


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"a": float("inf")}, r"a_us_per_flop must be finite and in \[0, 1\], got inf"),
        ({"a": 2.0}, r"a_us_per_flop must be finite and in \[0, 1\], got 2$"),
        ({"b": -1.0}, r"b_us must be finite"),
        ({"b": 1e300}, r"b_us must be finite"),
        ({"layers": 1 << 20}, r"layers must be in \[1, 65536\]"),
        ({"us": (1.0, float("nan"))}, r"comm point 1 must be finite"),
        ({"us": (1.0, 1e12)}, r"comm point 1 must be finite and >= 0, latency <="),
        ({"bytes_": (1.0, 1.5)}, r"points 0 and 1 must be at least one byte apart"),
        ({"floor": float("inf")}, r"comm.floor_us must be finite"),
        ({"per_layer": 1e9}, r"collectives_per_layer must be finite and in \[0, 1000"),
    ],
)
def test_cost_model_refuses_coefficients_outside_accepted_ranges(kw, msg):
    # Found by review: huge coefficients (a_us_per_flop = 1e308) passed and
    # turned predicted times into inf, which Plan.validate() rejects; byte
    # points 1e-300 apart gave an infinite extrapolated slope.
    with pytest.raises(ValueError, match=msg):
        _cost(**kw)


def test_falling_comm_table_never_predicts_negative_latency():
    # Found by review: a last segment that falls, extended past the table,
    # went below zero (-1e6 us for a big message).
    c = _cost(bytes_=(1.0, 2.0), us=(10.0, 5.0))
    assert c.collective_us(1e9) == 0.0
    assert c.collective_us(1.5) == 7.5


def test_cost_model_fields_cannot_be_changed_behind_validate():
    # Found by review: CostModel.shape/comm returned references, so
    # `c.comm.us = [1.0]` (one point for ten byte sizes) skipped validate()
    # and c.collective_us() then read past the table.
    c = cm.preset()
    c.comm.us = [1.0]
    c.shape.layers = 0
    assert len(c.comm.us) == len(c.comm.bytes) == 10
    assert c.shape.layers == 24


def test_helpers_refuse_arguments_that_would_overflow():
    # Found by review: the helpers were bound without checks, so
    # shard_tokens(2**63 - 1, 2) overflowed int64 (UB; it returned a negative
    # count), max_sequence_length(2**62, 2**20) wrapped, and
    # micro_batch_lower_bound_us(..., cp=0) divided by zero.
    with pytest.raises(ValueError, match=r"sequence 0 has length 9223372036854775807"):
        _core.shard_tokens(2**63 - 1, 2)
    with pytest.raises(ValueError, match=r"cp must be in \[1, 65536\], got -3"):
        _core.shard_tokens(5, -3)
    with pytest.raises(ValueError, match=r"bucket_size must be in"):
        _core.max_sequence_length(2**62, 2**10)
    with pytest.raises(ValueError, match=r"ranks must be in \[1, 4294967296\], got 4294967297"):
        _core.max_sequence_length(2**30, 2**32 + 1)
    # a pool world (dp x cp) may exceed one group's 65536 ranks: found by
    # test_facade_gives_a_valid_plan_or_a_value_error at dp 2 x cp 65536
    assert _core.max_sequence_length(2**30, 2**20) == 2**50
    assert _core.max_sequence_length(_core.MAX_BUCKET_SIZE, 2**32) == 2**63 - 1  # saturates, never wraps
    with pytest.raises(ValueError, match=r"cp must be in \[1, 65536\], got 0"):
        cm.preset().micro_batch_lower_bound_us([5], 0)
    assert _core.max_sequence_length(_core.MAX_BUCKET_SIZE, _core.MAX_RANKS) == 1 << 52
    assert _core.shard_tokens(_core.MAX_LENGTH, 2) == 1 << 35


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 300), st.sampled_from([2, 3, 4, 8]), st.integers(4, 400),
       st.booleans(), st.booleans(), st.booleans())
def test_rollback_index_picks_what_a_full_scan_picks(seed, n, cp, bucket, worst_fit, longest, refine):
    # Roll-back heavy micro-batches (many tiny sequences, then longer ones
    # that do not fit) against the reference's plain scan of every local
    # sequence: same placements, same roll-back count, same status.
    rng = random.Random(seed)
    tiny = rng.randint(1, 8)
    lengths = [rng.randint(1, tiny) if rng.random() < 0.8 else rng.randint(1, bucket * cp // 2) for _ in range(n)]
    cost = cm.preset()
    r = _core.dacp(lengths, cost, cp, bucket,
                   _core.Placement.WORST_FIT if worst_fit else _core.Placement.LEAST_LOAD,
                   _core.Rollback.LONGEST if longest else _core.Rollback.SHORTEST, refine)
    want = ref.dacp(lengths, ref.RefCost.of(cost), cp, bucket, worst_fit, longest, refine)
    assert (r.status == _core.Status.OK, list(r.cp_rank), r.rollbacks) == (want.ok, want.cp_rank, want.rollbacks)


# The complexity guards below read this thread's CPU time (time.thread_time: the
# core runs on the calling thread), not the wall clock: other processes' load
# does not count, so they fail only when the work itself grows (the O(n^2)
# regressions they pin cost 1.4-2.3 s of CPU, against a 0.5 s limit and a
# few ms of CPU today).


def test_rollbacks_cost_linear_time():
    # Found by review: each roll-back rescanned every local sequence, so
    # 40,000 tiny sequences and one that needs room took 1.7 s (O(n^2)).
    cost = cm.preset()
    lengths = [4] * 40_000 + [1200]
    for rule in (_core.Rollback.SHORTEST, _core.Rollback.LONGEST):
        t0 = time.thread_time()
        r = _core.dacp(lengths, cost, 2, 2 * 40_000 + 500, _core.Placement.LEAST_LOAD, rule)
        elapsed = time.thread_time() - t0
        assert r.rollbacks == 40_000 and r.status == _core.Status.UNSCHEDULABLE
        assert elapsed < 0.5, f"{rule}: {elapsed:.3f} s"


@settings(max_examples=EXAMPLES // 3, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 120), st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 3]),
       st.integers(1, 64), st.booleans(), st.booleans())
def test_galloping_count_search_equals_reference(seed, n, cp, dp, bucket, predicted, worst_fit):
    # Batches whose feasible micro-batch counts are far above the token
    # bound (sequences at the limit must sit alone), so the search gallops
    # and bisects: the core and the reference agree on every count.
    rng = random.Random(seed)
    limit = _core.max_sequence_length(bucket, cp)
    lengths = [limit if rng.random() < 0.3 else rng.randint(1, max(1, limit // 8)) for _ in range(n)]
    cost = cm.preset()
    opts = _core.Options()
    opts.dp, opts.cp, opts.bucket_size = dp, cp, bucket
    opts.placement = _core.Placement.WORST_FIT if worst_fit else _core.Placement.LEAST_LOAD
    opts.micro_batch_count = _core.MicroBatchCount.PREDICTED_TIME if predicted else _core.MicroBatchCount.SMALLEST_FEASIBLE
    s = _core.schedule(lengths, cost, opts)
    want = ref.schedule(lengths, ref.RefCost.of(cost), dp, cp, bucket, worst_fit=worst_fit,
                        predicted_time=predicted, max_extra=opts.max_extra_micro_batches)
    assert list(s.micro_batch) == want.micro_batch
    assert list(s.cp_rank) == want.cp_rank
    assert list(s.dp_time_us) == want.dp_time_us


def test_micro_batch_count_search_is_bounded():
    # Found by review: every count from the token bound up was tried, and one
    # giant sequence among 50,000 tiny ones is feasible only at one sequence
    # per micro-batch: 50,000 splits, 1.4 s (O(n^2)). Now it gallops.
    cost = cm.preset()
    opts = _core.Options()
    opts.cp, opts.bucket_size = 8, 26624
    lengths = [26624 * 8] + [1] * 50_000
    t0 = time.thread_time()
    s = _core.schedule(lengths, cost, opts)
    elapsed = time.thread_time() - t0
    assert len(s.micro_batches) == len(lengths)
    assert elapsed < 0.5, f"{elapsed:.3f} s"


def test_refinement_moves_are_capped():
    # Found by the adversarial benchmark: the refinement could make n moves
    # of O(n) each; lengths 1..50,000 in one micro-batch took 2.3 s.
    cost = cm.preset()
    n = 20_000
    lengths = list(range(1, n + 1))
    t0 = time.thread_time()
    r = _core.dacp(lengths, cost, 8, n * n, _core.Placement.LEAST_LOAD, _core.Rollback.LONGEST, True)
    elapsed = time.thread_time() - t0
    assert r.status == _core.Status.OK and r.moves == 256
    assert elapsed < 0.5, f"{elapsed:.3f} s"
    want = ref.dacp(lengths[:3000], ref.RefCost.of(cost), 8, 3000 * 3000, False, True, True)
    got = _core.dacp(lengths[:3000], cost, 8, 3000 * 3000, refine=True)
    assert (list(got.cp_rank), got.moves) == (want.cp_rank, want.moves)


_EXTREME = st.sampled_from([0, -1, 1, 2, 3, 2**36, 2**36 + 1, 2**63 - 1, -(2**63), 2**64, 26624, 26625, 4 * 26624])


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    st.integers(-2, 9) | st.sampled_from([2**16, 2**16 + 1, 2**31]),
    st.integers(-2, 9) | st.sampled_from([2**16, 2**16 + 1]),
    st.integers(-1, 300) | st.sampled_from([26624, 2**36, 2**36 + 1, 2**63]),
    st.sampled_from(sorted(POLICIES) + ["nope"]),
    st.sampled_from(["error", "truncate", "drop"]),
    st.booleans(),
    st.lists(st.integers(1, 400) | _EXTREME, max_size=60),
)
def test_facade_gives_a_valid_plan_or_a_value_error(dp, cp, bucket, policy, overlength, cpsat, lengths):
    # The Python entry point, CP-SAT fallback included: a plan that passes
    # Plan.validate(), or ValueError with a message; nothing else.
    try:
        cfg = SchedulerConfig(dp=dp, cp=cp, bucket_size=bucket, policy=policy, overlength=overlength, cpsat=cpsat,
                              cpsat_deterministic_time=0.001)
    except ValueError as e:
        assert str(e)
        return
    try:
        plan = Scheduler(cfg, cm.preset()).schedule(lengths)
    except ValueError as e:
        assert str(e)
        return
    plan.validate()


def test_largest_world_and_bucket_plan():
    # Found by the facade property test (a SIGFPE that killed the worker): at dp = cp
    # = 2^16 and bucket 2^36, a lockstep slot's capacity (bucket x cp x dp, skrull's slot
    # GDS) 2^68 wrapped to 0 in int64. dp 2^12 wraps the same (2^64), 100x faster.
    cfg = SchedulerConfig(dp=2**12, cp=2**16, bucket_size=2**36, policy="skrull", overlength="truncate")
    lengths = [2, 262, 3]
    plan = Scheduler(cfg, cm.preset()).schedule(lengths)
    plan.validate()
    assert sorted(n for mb in plan.micro_batches for n in mb.lengths) == sorted(lengths)


def test_facade_refuses_lengths_outside_int64_with_value_error():
    # Found by the facade property test: 2**64 reached the binding, which
    # raised TypeError (incompatible function arguments), not ValueError.
    sched = Scheduler(SchedulerConfig(), cm.preset())
    for bad in (2**64, -(2**63) - 1, 2**36 + 1, 0):
        with pytest.raises(ValueError, match=r"sequence 1 has length .*outside \[1, 68719476736\]"):
            sched.schedule([5, bad])


def test_plans_too_large_for_memory_are_refused():
    # Found by review: 2**24 sequences (accepted) on 65536 CP ranks
    # (accepted) ask for a plan with up to 2**40 per-rank entries (16 TiB):
    # std::bad_alloc at best. Sequences x cp is now capped at 2**28.
    opts = _core.Options()
    opts.cp = 64
    n = _core.MAX_SEQUENCE_RANKS // 64 + 1
    with pytest.raises(ValueError, match=r"sequences x cp 64 = 268435520, more than the limit 268435456"):
        _core.schedule([1] * n, cm.preset(), opts)


def test_shard_sweep_candidates_are_capped():
    # Found after merging the shard sweep: every k from 0 to n was a
    # candidate of O(n cp), so 8,000 tiny sequences took 0.35 s (O(n^2)).
    cost = cm.preset()
    t0 = time.thread_time()
    r = _core.dacp_sweep([8] * 20_000, cost, 8, 26624)
    elapsed = time.thread_time() - t0
    assert r.status == _core.Status.OK
    assert elapsed < 0.5, f"{elapsed:.3f} s"
    # A comm table that falls after its floor: no pruning, so the cap ends
    # the sweep; the reference stops at the same k.
    flat = _core.CostModel(cost.shape, cost.a_us_per_flop, cost.b_us,
                           _core.CommModel(list(cost.comm.bytes), list(cost.comm.us), 1.0, 100.0))
    assert not flat.comm_is_monotone()
    lengths = [random.Random(5).randint(1, 400) for _ in range(600)]
    want = ref.dacp_sweep(lengths, ref.RefCost.of(flat), 4, 26624)
    got = _core.dacp_sweep(lengths, flat, 4, 26624)
    assert (list(got.cp_rank), got.time_us) == (want.cp_rank, want.time_us)
