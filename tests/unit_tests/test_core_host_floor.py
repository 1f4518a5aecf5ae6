"""The host floor priced by the core: a rank's layer call costs
max(host_floor_us, max(T_comm, line(local)) + line(dist)), the floor once a call, not per part.

On a GPU a short buffer's layer takes the host's launch work whatever its FLOPs (docs/profile.md,
"The host floor"). The trainer runs one block call a layer, whose local and distributed attentions
are two kernels inside it (attention/dacp.py), so the floor holds up the call's device time.
The profile's ``[compute] host_floor_us`` gives the core the floor; 0 (absent) prices the line
alone, as before. Exact small cases where the floor changes the plan, the profile key's round trip
and its messages, and with a random floor: the core equals the plain-Python references bit for bit,
lower bounds stay below every plan, CP-SAT never predicts worse than the heuristic.
"""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skrull_ext import POLICIES, Scheduler, SchedulerConfig, _core
from skrull_ext._core import DISTRIBUTED, CommModel, CostModel, ModelShape
from skrull_ext.bench import reference as ref
from skrull_ext.bench import reference_lookahead as refl
from skrull_ext.bench import reference_slots as refs
from skrull_ext.scheduler import cost_model as cm
from skrull_ext.scheduler import profile_file
from skrull_ext.scheduler.cpsat import solve_dacp
from tests.unit_tests.test_lookahead import window
from tests.unit_tests.test_properties import batch
from tests.unit_tests.test_reference_chunked import assert_equal, restated
from tests.unit_tests.test_reference_slots import slot_options

FLOORS = [40.0, 400.0, 4000.0]
"""us a layer call: under the preset's b (30 us + FLOPs), about a short buffer's, and run 9's 4.34 ms."""


def with_floor(c: CostModel, floor: float, whole: bool | None = None) -> CostModel:
    """``c`` with ``host_floor_us = floor`` (and whole_buffer where given), every other field kept."""
    return CostModel(c.shape, c.a_us_per_flop, c.b_us, c.comm, c.micro_batch_fixed_us, c.step_fixed_us, c.token_us,
                     c.attention_weight, c.whole_buffer if whole is None else whole, floor)


def toy(floor: float = 0.0, whole: bool = False, comm_us: float = 0.0, regather: bool = False) -> CostModel:
    """flops(s) = 24 s + 4 s^2, line(F) = F, an exchange of comm_us a layer (conftest.toy_cost), with a floor
    (``regather``: a traced chunk's recompute gathers again)."""
    return CostModel(ModelShape(layers=1, hidden=1, kv_width=1, bytes_per_elem=1), 1.0, 0.0,
                     CommModel([1.0], [comm_us], collectives_per_layer=1.0), whole_buffer=whole, host_floor_us=floor,
                     chunk_regather=regather)


def test_a_call_costs_the_floor_or_the_line_and_no_call_nothing():
    c = toy(300.0)
    assert (c.host_floor_us, toy().host_floor_us) == (300.0, 0.0)
    assert [c.comp_us(f) for f in (0.0, 108.0, 448.0)] == [0.0, 300.0, 448.0]
    assert [c.line_us(f) for f in (0.0, 108.0)] == [0.0, 108.0]
    # 3 and 5 tokens (108 and 220 FLOPs): one a rank, both at the floor; together 328, above it;
    # 3 local + 5 sharded: rank 0 runs 108 + 110 in its one call, under the floor, so 300 (not two floors).
    assert _core.evaluate_placement([3, 5], [0, 1], c, 2, 10).time_us == 300.0
    assert _core.evaluate_placement([3, 5], [0, 0], c, 2, 10).time_us == 328.0
    assert _core.evaluate_placement([3, 5], [0, DISTRIBUTED], c, 2, 10).time_us == 300.0
    assert _core.evaluate_placement([3, 5], [0, DISTRIBUTED], toy(), 2, 10).time_us == 108.0 + 110.0
    assert c.micro_batch_lower_bound_us([3, 5], 2) == 300.0  # the line's 164 is below one call's floor
    assert c.floored_us(3.0) == 900.0 and toy(300.0, comm_us=0.0).layer_us(0.0, 0.0, 0.0) == 0.0


def test_a_rank_with_both_parts_pays_one_floor_over_its_device_time():
    # CP 2: 5 tokens local on rank 0 (220 FLOPs), 3 sharded (108 / 2 = 54 a rank), an exchange of
    # 100 us a layer, floor 250. Rank 0: max(250, max(100, 220) + 54) = 274, above the floor, where
    # the per-part rule charged max(100, max(250, 220)) + max(250, 54) = 500. Rank 1 (its share
    # alone): max(250, 100 + 54) = 250, where comm + floor charged 350.
    c = toy(250.0, comm_us=100.0)
    assert c.layer_us(100.0, 220.0, 54.0) == 274.0 and c.layer_us(100.0, 0.0, 54.0) == 250.0
    assert c.micro_batch_us([220.0, 0.0], 54.0, 1.0) == 274.0
    assert _core.evaluate_placement([5, 3], [0, DISTRIBUTED], c, 2, 10).time_us == 274.0
    # The dist-only rank shows through when its exchange outlasts the floor: max(250, 300 + 54).
    c = toy(250.0, comm_us=300.0)
    assert c.layer_us(300.0, 0.0, 54.0) == 354.0
    assert _core.evaluate_placement([3], [DISTRIBUTED], c, 2, 10).time_us == 354.0
    # Both ranks sharing two sharded sequences (5 and 3: 110 + 54 a rank): one call each, 300 + 164.
    assert _core.evaluate_placement([5, 3], [DISTRIBUTED, DISTRIBUTED], c, 2, 10).time_us == 464.0
    # With no floor, the overlap formula as before: max(comm, line(local)) + line(dist).
    assert toy(comm_us=100.0).micro_batch_us([220.0, 0.0], 54.0, 1.0) == 220.0 + 54.0


def test_a_short_sequence_stays_local_beside_a_sharded_one_at_a_large_floor():
    # CP 2, BucketSize 9: the 10-token sequence (640 FLOPs) must be sharded, 6 tokens a rank; the
    # 3-token one (108) fits beside it on one rank. Floor 1,000 us a call. Kept local, rank 0 runs
    # 108 + 320 in its one call: 1,000, as sharding both (320 + 54 a rank) does, so Algorithm 1's
    # placement stands and the sweep (strictly faster only) does not shard it. Charged per part,
    # local was 1,000 + 1,000 = 2,000 against sharding's 1,000, and the 3 was sharded.
    c = toy(1000.0)
    assert _core.evaluate_placement([3, 10], [0, DISTRIBUTED], c, 2, 9).time_us == 1000.0
    assert _core.evaluate_placement([3, 10], [DISTRIBUTED, DISTRIBUTED], c, 2, 9).time_us == 1000.0
    plan = Scheduler(SchedulerConfig(dp=1, cp=2, bucket_size=9, policy="skrull"), c).schedule([3, 10])
    assert (plan.cp_rank, plan.makespan_us) == ([0, DISTRIBUTED], 1000.0)
    # With no floor the device's times decide: sharding both (374) beats 108 + 320 = 428.
    plan = Scheduler(SchedulerConfig(dp=1, cp=2, bucket_size=9, policy="skrull"), toy()).schedule([3, 10])
    assert (plan.cp_rank, plan.makespan_us) == ([DISTRIBUTED, DISTRIBUTED], 374.0)


def test_a_chunk_pays_one_floor_over_its_compute_and_exchange():
    from skrull_ext.scheduler.chunk_cost import chunk_cost

    # CP 2, one chunk of 4 tokens: 160 / 2 = 80 FLOPs a rank and a 100 us exchange in one block call:
    # max(250, 80 + 100) = 250 and max(150, 180) = 180 (the per-part rule: 250 + 100 and 150 + 100).
    assert chunk_cost(toy(250.0, comm_us=100.0), 4, 4, cp=2).us == 250.0
    assert chunk_cost(toy(150.0, comm_us=100.0), 4, 4, cp=2).us == 180.0
    assert chunk_cost(toy(150.0, comm_us=100.0), 4, 4, cp=2).one_pass_us == 180.0
    # Two chunks of 4: the first recomputed (x 4/3; its recompute reuses the forward's K/V, one exchange:
    # max(250 x 4/3, 80 x 4/3 + 100); traced it gathers again, two: 80 x 4/3 + 200); the second (288 / 2 =
    # 144 FLOPs a rank): max(250, 144 + 100).
    assert chunk_cost(toy(250.0, comm_us=100.0), 8, 4, cp=2).us == pytest.approx(1000.0 / 3.0 + 250.0, rel=1e-12)
    assert chunk_cost(toy(comm_us=100.0), 8, 4, cp=2).us == pytest.approx(80.0 * 4 / 3 + 100.0 + 244.0, rel=1e-12)
    traced = toy(comm_us=100.0, regather=True)
    assert chunk_cost(traced, 8, 4, cp=2).us == pytest.approx(80.0 * 4 / 3 + 200.0 + 244.0, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.floats(0.0, 5000.0), st.floats(0.0, 3000.0), st.floats(0.0, 1e5), st.floats(0.0, 1e5),
       st.sampled_from([0.0, 30.0]))
def test_layer_us_is_the_formula_and_equals_the_reference(floor, comm, local, dist, b):
    c = CostModel(ModelShape(layers=1, hidden=1, kv_width=1, bytes_per_elem=1), 0.01, b,
                  CommModel([1.0], [0.0], collectives_per_layer=1.0), host_floor_us=floor)
    line = [0.01 * f + b if f > 0 else 0.0 for f in (local, dist)]
    want = max(comm, line[0]) + line[1]
    assert c.layer_us(comm, local, dist) == (max(floor, want) if local > 0 or dist > 0 else want)
    assert c.layer_us(comm, local, dist) == ref.RefCost.of(c).layer(comm, local, dist)
    assert c.comp_us(local) == c.layer_us(0.0, local, 0.0)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.integers(1, 12), st.sampled_from([2, 3, 4]), st.sampled_from([8, 50, 300]),
       st.floats(0.0, 6000.0), st.booleans())
def test_lower_bounds_stay_below_every_placement_under_a_random_floor(seed, n, cp, bucket, floor, whole):
    # Any placement the bucket admits, random or DACP's, is at or above the micro-batch bound.
    rng = random.Random(seed)
    lengths = [rng.randint(1, max(1, 2 * bucket * cp // n)) for _ in range(n)]
    cost = with_floor(cm.preset(), floor, whole)
    lb = cost.micro_batch_lower_bound_us(lengths, cp)
    opt = SchedulerConfig(dp=1, cp=cp, bucket_size=bucket, policy="skrull").core_options()
    tries = [_core.dacp_for(lengths, cost, opt)]
    tries += [_core.evaluate_placement(lengths, [rng.choice([DISTRIBUTED, *range(cp)]) for _ in lengths], cost, cp,
                                       bucket) for _ in range(8)]
    for r in tries:
        if r.status == _core.Status.OK:
            assert r.time_us >= lb * (1 - 1e-12)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.integers(1, 60), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 3]),
       st.sampled_from([64, 1000, 4096]), st.sampled_from(sorted(POLICIES)), st.floats(0.0, 6000.0),
       st.sampled_from(["lockstep", "free"]))
def test_the_simulators_bounds_stay_below_every_plan_under_a_random_floor(seed, k, cp, dp, bucket, policy, floor,
                                                                          timeline):
    from skrull_ext.sim import bound

    lengths = batch(seed, k, bucket, cp)
    cost = with_floor(cm.preset(), floor)
    cfg = SchedulerConfig(dp=dp, cp=cp, bucket_size=bucket, policy=policy, timeline=timeline)
    plan = Scheduler(cfg, cost).schedule(lengths)
    lb = (bound.pool_lower_bound_us(lengths, cost, dp, cp, bucket) if POLICIES[policy].pool
          else bound.lower_bound_us(lengths, cost, dp, cp, bucket, timeline))
    assert plan.makespan_us >= lb * (1 - 1e-9)


def test_the_floor_merges_two_short_documents_into_one_micro_batch():
    # Whole-buffer pricing: two micro-batches of one document each (108 + 220 = 328) beat one of
    # both (448) on the line; at a floor of 300 a call, two cost 600 and one 448: merged.
    plans = [Scheduler(SchedulerConfig(dp=1, cp=1, bucket_size=10), toy(f, whole=True)).schedule([3, 5])
             for f in (0.0, 300.0)]
    assert [(p.slots, p.makespan_us) for p in plans] == [(2, 328.0), (1, 448.0)]
    # Per document on CP 2: each on its own rank (both at the floor, 300) rather than both on one (328).
    plan = Scheduler(SchedulerConfig(dp=1, cp=2, bucket_size=10), toy(300.0)).schedule([3, 5])
    assert (sorted(plan.cp_rank), plan.makespan_us) == ([0, 1], 300.0)


def test_the_profile_key_round_trips_and_a_bad_value_is_named():
    d = profile_file.to_dict(toy(4341.0))
    assert d["compute"]["host_floor_us"] == 4341.0
    assert profile_file.from_dict(d).host_floor_us == 4341.0
    assert "host_floor_us" not in profile_file.to_dict(toy())["compute"]  # absent = 0: files as before
    bad = {**d, "compute": {**d["compute"], "host_floor_us": -1.0}}
    with pytest.raises(ValueError, match=r"^p: cost model: host_floor_us must be finite and in \[0, 1e\+09\], got -1$"):
        profile_file.from_dict(bad, where="p")
    bad["compute"]["host_floor_us"] = "4 ms"
    with pytest.raises(ValueError, match=r"\[compute\] host_floor_us must be a number, got '4 ms'"):
        profile_file.from_dict(bad, where="p")


def test_a_mode_carries_its_own_floor():
    from skrull_ext.scheduler import checkpointing

    d = profile_file.to_dict(toy(4341.0))
    d["memory"] = {}
    d[checkpointing.SECTION] = {"measured": "selective",
                                "selective": {"a_us_per_flop": 1.0, "b_us": 0.0, "host_floor_us": 4341.0,
                                              "a_bytes_per_token": 1.0, "b_bytes": 0.0, "bucket_size": 10},
                                "none": {"a_us_per_flop": 0.5, "b_us": 0.0, "a_bytes_per_token": 2.0,
                                         "b_bytes": 0.0, "bucket_size": 5}}
    modes = checkpointing.modes_of(d)
    assert (modes["selective"].host_floor_us, modes["none"].host_floor_us) == (4341.0, 0.0)
    assert modes["selective"].keys()["host_floor_us"] == 4341.0 and "host_floor_us" not in modes["none"].keys()
    assert profile_file.from_dict(checkpointing.under_mode(d, "selective")).host_floor_us == 4341.0
    assert profile_file.from_dict(checkpointing.under_mode(d, "none")).host_floor_us == 0.0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.integers(0, 600), st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 7, 32]),
       st.sampled_from([64, 1000, 4096, 26624]), st.sampled_from(sorted(p for p, v in POLICIES.items() if not v.pool)),
       st.sampled_from(FLOORS), st.booleans())
def test_core_equals_python_reference_under_a_floor(seed, k, cp, dp, bucket, policy, floor, whole):
    lengths = batch(seed, k, bucket, cp)
    cost = with_floor(cm.preset(), floor, whole)
    p = POLICIES[policy]
    cfg = SchedulerConfig(dp=dp, cp=cp, bucket_size=bucket, policy=policy, cpsat=False, timeline="free")
    plan = Scheduler(cfg, cost).schedule(lengths)
    want = ref.schedule(lengths, ref.RefCost.of(cost), dp, cp, bucket,
                        worst_fit=p.placement == _core.Placement.WORST_FIT,
                        longest_rollback=p.rollback == _core.Rollback.LONGEST,
                        predicted_time=p.micro_batch_count == _core.MicroBatchCount.PREDICTED_TIME,
                        refine_=p.refine, sweep=p.dacp_search == _core.DacpSearch.SHARD_SWEEP, free_running=True)
    assert plan.cp_rank == want.cp_rank and plan.slot == want.micro_batch and plan.dp_rank == want.dp_rank
    assert plan.group_time_us == want.dp_time_us  # bitwise


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31), st.integers(0, 40), st.sampled_from([2, 3, 4, 8]), st.sampled_from([8, 50, 300]),
       st.sampled_from(FLOORS), st.booleans())
def test_dacp_sweep_equals_its_exhaustive_reference_under_a_floor(seed, n, cp, bucket, floor, whole):
    # The sweep's bound prunes candidates (dacp_sweep.hpp sweep_bound); the reference tries every one.
    rng = random.Random(seed)
    lengths = [rng.randint(1, max(1, 2 * bucket * cp // max(n, 1))) for _ in range(n)]
    cost = with_floor(cm.preset(), floor, whole)
    r = _core.dacp_sweep(lengths, cost, cp, bucket)
    want = ref.dacp_sweep(lengths, ref.RefCost.of(cost), cp, bucket)
    assert (r.status == _core.Status.OK) == want.ok
    if want.ok:
        assert (list(r.cp_rank), r.time_us) == (want.cp_rank, want.time_us)
        assert r.time_us >= cost.micro_batch_lower_bound_us(lengths, cp) * (1 - 1e-12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.integers(0, 300), st.sampled_from([1, 2, 4]), st.sampled_from([1, 3, 16]),
       st.sampled_from([64, 1000, 26624]), st.sampled_from(sorted(p for p, v in POLICIES.items() if not v.pool)),
       st.booleans(), st.sampled_from(FLOORS))
def test_slot_gds_equals_its_reference_under_a_floor(seed, k, cp, dp, bucket, policy, lockstep, floor):
    lengths = batch(seed, k, bucket, cp)
    cost = with_floor(cm.preset(), floor)
    o = slot_options(dp, cp, bucket, policy, lockstep, 3)
    assert_equal(_core.schedule(lengths, cost, o, [], []), restated(refs, lengths, cost, o, [], [], lockstep))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.integers(1, 400), st.sampled_from([1, 2, 8]), st.sampled_from([2, 3, 16, 64]),
       st.sampled_from([64, 1000, 26624]), st.sampled_from(sorted(p for p, v in POLICIES.items() if not v.pool)),
       st.sampled_from([0.0] + FLOORS), st.sampled_from([0.02, 0.1, 0.5]))
def test_leader_slot_fill_equals_its_reference_under_a_floor(seed, k, cp, dp, bucket, policy, floor, short):
    # The leader slot's case: one sequence at the CP group's limit among short ones, so its slot's groups
    # fill to their token room and, on the floor, the full ones are those of least time (slots.hpp parks a
    # group without room until a short enough sequence comes; the reference visits every group each time).
    rng = random.Random(seed)
    limit = _core.max_sequence_length(bucket, cp)
    lengths = [rng.randint(1, max(1, int(short * bucket))) for _ in range(k)]
    lengths.insert(rng.randrange(k + 1), limit)
    cost = with_floor(cm.preset(), floor)
    o = slot_options(dp, cp, bucket, policy, True, 3)
    assert_equal(_core.schedule(lengths, cost, o, [], []), restated(refs, lengths, cost, o, [], [], True))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.integers(1, 6), st.integers(0, 30), st.sampled_from([1, 2, 4]),
       st.sampled_from([1, 2]), st.sampled_from(["lockstep", "free"]), st.sampled_from(FLOORS))
def test_lookahead_equals_its_reference_under_a_floor(seed, w, per_step, dp, cp, timeline, floor):
    batches = window(seed, w, per_step, 4096, cp)
    cost = with_floor(cm.preset(), floor)
    opt = SchedulerConfig(dp=dp, cp=cp, bucket_size=4096, timeline=timeline).core_options()
    a = _core.lookahead(batches, cost, opt)
    r = refl.lookahead(batches, cost, dp, cp, 4096, lambda l: _core.schedule(l, cost, opt).makespan_us)
    assert (a.step, a.candidates, a.screened, a.swaps, a.planned) == (
        r["step"], r["candidates"], r["screened"], r["swaps"], r["planned"])
    assert a.step_us == r["step_us"]


def test_the_step_estimate_pays_a_floor_per_micro_batch_call():
    # Two samples of 6 and 3 us of line on one CP group, one micro-batch: the line's estimate is
    # 6 + layers b; a floor of 4,000 us a call makes it layers x 4,000.
    cost = with_floor(cm.preset(), 4000.0)
    est = refl.Estimator(cost, 1, 1, 4096)
    s = refl.Sketch()
    for c, length in ((6.0, 10), (3.0, 5)):
        est.add(s, c, length)
    layers = cost.shape.layers
    assert est.us(s) == layers * 4000.0 + cost.token_us * 15.0 + cost.step_fixed_us
    est0 = refl.Estimator(cm.preset(), 1, 1, 4096)
    assert est0.us(s) == 9.0 + layers * cm.preset().b_us


@pytest.mark.parametrize("seed", range(6))
def test_cpsat_never_predicts_worse_than_the_heuristic_under_a_floor(seed):
    rng = random.Random(seed)
    real = [int(x) for x in __import__("skrull_ext.lengths", fromlist=["load"]).load("mix_sharegpt_conv+longbench_en")]
    lengths = [rng.choice(real) for _ in range(48)]
    cost = with_floor(cm.preset("qwen2.5-0.5b"), FLOORS[seed % 3])
    cfg = dict(dp=2, cp=4, bucket_size=16384, overlength="truncate")
    p0 = Scheduler(SchedulerConfig(**cfg, cpsat=False), cost).schedule(lengths)
    p1 = Scheduler(SchedulerConfig(**cfg, cpsat=True, cpsat_margin=0.0, cpsat_deterministic_time=0.05),
                   cost).schedule(lengths)
    p1.validate()
    for a, b in zip(p0.micro_batches, p1.micro_batches):
        assert b.seqs == a.seqs and b.time_us <= a.time_us
        assert b.lower_bound_us <= b.time_us * (1 + 1e-4)
    assert p1.makespan_us <= p0.makespan_us


@pytest.mark.parametrize("seed", range(8))
def test_cpsat_finds_the_floored_optimum_of_tiny_micro_batches(seed):
    # Brute force over every placement, priced by the core with the floor: the model's optimum
    # (integer nanoseconds) is it up to rounding, and its bound is below it.
    import itertools
    import math

    rng = random.Random(seed)
    cp = rng.choice([2, 3])
    lengths = [rng.randint(1, 3000) for _ in range(rng.randint(2, 4))]
    cost = with_floor(cm.preset("qwen2.5-0.5b"), FLOORS[seed % 3] * rng.choice([1.0, 3.0]))
    best = math.inf
    for p in itertools.product([DISTRIBUTED, *range(cp)], repeat=len(lengths)):
        r = _core.evaluate_placement(lengths, list(p), cost, cp, 8192)
        if r.status == _core.Status.OK:
            best = min(best, r.time_us)
    res = solve_dacp(lengths, cost, cp, 8192, deterministic_time=10.0)
    assert res.status == "OPTIMAL"
    assert _core.evaluate_placement(lengths, res.cp_rank, cost, cp, 8192).time_us == pytest.approx(best, rel=1e-4)
    assert res.bound_us <= best * (1 + 1e-4)


def test_the_profiler_gives_each_mode_its_floor():
    from types import SimpleNamespace

    from skrull_ext.profile.checkpointing import mode_cost
    from skrull_ext.profile.fit import HostFloor

    memory = SimpleNamespace(fit=SimpleNamespace(slope=1e3, intercept=0.0, quadratic=0.0), bucket_size=100)
    fit = SimpleNamespace(slope=1.176e-8, intercept=546.8)
    floored = SimpleNamespace(fit=fit, attention_weight=0.508, floor=HostFloor(4341.0, 3))
    assert mode_cost("selective", floored, memory).host_floor_us == 4341.0
    assert mode_cost("none", SimpleNamespace(fit=fit, attention_weight=1.0, floor=None), memory).host_floor_us == 0.0
