"""Policy skrull-pool (issue 18): the DP x CP world as one pool.

Properties on random batches (hypothesis): every sequence planned once, no
rank over BucketSize in any slot, rank sets of the allowed shapes, nothing
truncated that the world holds, never predicted slower than skrull on the
same batch, deterministic.
"""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skrull_ext import Scheduler, SchedulerConfig, _core, lengths
from skrull_ext.scheduler import cost_model as cm
from skrull_ext.scheduler.config import TIMELINES
from skrull_ext.scheduler.plan import Plan

REAL = lengths.load("mix_sharegpt_conv95+longbench_en5")


def batch(seed: int, k: int, bucket: int, dp: int, cp: int, long_share: float) -> list[int]:
    """Real-looking lengths scaled to the bucket; a share of them between C x CP and C x DP x CP."""
    rng = random.Random(seed)
    group = _core.max_sequence_length(bucket, cp)
    world = _core.max_sequence_length(bucket, dp * cp)
    scale = rng.choice([0.05, 0.2, 1.0])
    out = []
    for _ in range(k):
        if rng.random() < long_share and world > group:
            out.append(rng.randint(group + 1, world))
        else:
            out.append(max(1, min(group, int(rng.choice(REAL) * scale * bucket / 26624))))
    return out


def plan_of(lengths_, dp, cp, bucket, policy="skrull-pool", **kw):
    cfg = SchedulerConfig(dp=dp, cp=cp, bucket_size=bucket, policy=policy, cpsat=False, **kw)
    return Scheduler(cfg, cm.preset()).schedule(lengths_)


shapes = st.tuples(
    st.integers(0, 2**31),  # seed
    st.integers(0, 600),  # sequences
    st.sampled_from([1, 2, 3, 4, 8]),  # cp
    st.sampled_from([1, 2, 3, 4, 6, 8, 16]),  # dp
    st.sampled_from([64, 1000, 4096, 26624]),  # bucket
    st.sampled_from([0.0, 0.0, 0.01, 0.1]),  # share longer than a CP group holds
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes)
def test_pool_plan_covers_every_sequence_once_within_memory(shape):
    seed, k, cp, dp, bucket, long_share = shape
    lengths_ = batch(seed, k, bucket, dp, cp, long_share)
    plan = plan_of(lengths_, dp, cp, bucket)
    assert isinstance(plan, Plan)
    plan.validate()
    assert not plan.truncated and not plan.dropped  # the world holds every one of them
    assert plan.lengths == lengths_
    assert sorted(k for mb in plan.micro_batches for k in mb.seqs) == list(range(k))
    # Per rank per slot: what it holds, recomputed from the rank view, within C.
    for rank in range(dp * cp):
        slots = [s for s, _, _ in plan.rank_slots(rank)]
        assert slots == sorted(set(slots))  # one micro-batch a slot, in slot order
        for _, _, mine in plan.rank_slots(rank):
            held = sum(lengths_[q] if n == 1 else 2 * -(-lengths_[q] // (2 * n)) for q, _, n in mine)
            assert held <= bucket
    again = plan_of(list(lengths_), dp, cp, bucket)
    assert again.digest() == plan.digest() and again.group_time_us == plan.group_time_us


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes.filter(lambda s: s[1] <= 300))
def test_pool_never_predicted_slower_than_skrull(shape):
    seed, k, cp, dp, bucket, _ = shape
    lengths_ = batch(seed, k, bucket, dp, cp, 0.0)  # skrull holds them all too
    pool = plan_of(lengths_, dp, cp, bucket)
    skrull = plan_of(lengths_, dp, cp, bucket, policy="skrull")
    assert pool.makespan_us <= skrull.makespan_us
    if pool.skrull_plan:  # kept skrull's micro-batches
        assert sorted(map(sorted, (mb.seqs for mb in pool.micro_batches))) == sorted(
            map(sorted, (mb.seqs for mb in skrull.micro_batches)))
        if not pool.narrowed:  # and its placements: bit for bit
            assert pool.group_time_us == skrull.group_time_us
        else:  # some sharded sequences narrowed to sub-group sets: each group no slower
            assert all(a <= b for a, b in zip(pool.group_time_us, skrull.group_time_us))
            assert any(a < b for a, b in zip(pool.group_time_us, skrull.group_time_us))


def priced(model: str, cross: float, b_us: float, fixed_us: float, step_us: float) -> _core.CostModel:
    """The preset's model with another cross-group factor, per-call overhead and fixed costs."""
    base = cm.preset(model)
    comm = base.comm
    comm.cross_group_factor = cross
    return _core.CostModel(base.shape, base.a_us_per_flop, b_us, comm, fixed_us, step_us)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes.filter(lambda s: s[1] <= 300),
       st.sampled_from(["lockstep", "free"]),
       st.sampled_from(["qwen2.5-0.5b", "qwen2.5-7b", "llama3-debug"]),
       st.sampled_from([1.0, 2.0, 9.0, 40.0]),  # cross-group factor
       st.sampled_from([0.0, 30.0, 300.0]),  # b_us
       st.sampled_from([0.0, 0.0, 200.0, 20000.0]),  # micro_batch_fixed_us
       st.sampled_from([0.0, 5000.0]))  # step_fixed_us
def test_pool_step_never_longer_than_skrulls_on_either_timeline(shape, timeline, model, cross, b_us, fixed_us,
                                                                  step_us):
    """Issue 36 item 4: on the timeline the job runs, at the cross-group factor it is given, the pool's
    step is never longer than skrull's; it departs from skrull's plan (its own plan, or sub-group sets)
    only for a step shorter by more than 1%, never for a faster micro-batch the step does not need."""
    seed, k, cp, dp, bucket, _ = shape
    lengths_ = batch(seed, k, bucket, dp, cp, 0.0)  # skrull holds them all too
    cost = priced(model, cross, b_us, fixed_us, step_us)
    make = lambda policy: Scheduler(SchedulerConfig(dp=dp, cp=cp, bucket_size=bucket, policy=policy,  # noqa: E731
                                                    timeline=timeline), cost).schedule(lengths_)
    pool, skrull = make("skrull-pool"), make("skrull")
    assert pool.makespan_us <= skrull.makespan_us
    assert pool.step_time_us(TIMELINES[timeline]) == pytest.approx(pool.makespan_us, rel=1e-12, abs=1e-9)
    if not pool.skrull_plan or pool.narrowed:  # a departure: kept for a step shorter by > kPoolMinGain (pool.hpp)
        assert pool.makespan_us < (1 - 0.01) * skrull.makespan_us
    else:  # skrull's plan as it is
        assert pool.makespan_us == skrull.makespan_us
        assert [(mb.slot, mb.first_group, mb.seqs, mb.num_ranks) for mb in pool.micro_batches] == [
            (mb.slot, mb.first_group, mb.seqs, mb.num_ranks) for mb in skrull.micro_batches]


@pytest.mark.parametrize("dp,cp,bucket", [(4, 8, 26624), (3, 4, 1000), (16, 2, 4096)])
def test_sequence_between_group_and_world_limit_is_planned_whole(dp, cp, bucket):
    group = _core.max_sequence_length(bucket, cp)
    world = _core.max_sequence_length(bucket, dp * cp)
    for s in (group + 1, (group + world) // 2, world):
        lengths_ = [s, 100, 7, bucket // 2] + [bucket // 8] * 20
        plan = plan_of(lengths_, dp, cp, bucket)
        plan.validate()
        assert plan.lengths[0] == s and not plan.truncated
        assert plan.num_ranks[0] > cp and plan.widened >= 1
    # skrull truncates it; the pool only beyond the world.
    trunc = plan_of([group + 1], dp, cp, bucket, policy="skrull", overlength="truncate")
    assert trunc.truncated == [0]
    over = plan_of([world + 1, 5], dp, cp, bucket, overlength="truncate")
    over.validate()
    assert over.truncated == [0] and over.lengths[0] == world
    with pytest.raises(ValueError, match="tokens the world can hold"):
        plan_of([world + 1], dp, cp, bucket)


def test_long_sequence_is_spread_over_groups_when_its_group_would_straggle():
    # One 150K-token document among chat turns at DP=4, CP=8: skrull leaves it
    # on one group, which then takes far longer than the others.
    lengths_ = [150_000] + [800] * 255
    pool = plan_of(lengths_, 4, 8, 26624)
    skrull = plan_of(lengths_, 4, 8, 26624, policy="skrull")
    pool.validate()
    assert pool.widened == 1 and not pool.skrull_plan
    assert pool.makespan_us < 0.7 * skrull.makespan_us


@pytest.mark.parametrize("seed", range(6))
def test_rank_flops_follow_the_rank_sets(seed):
    # Each micro-batch's per-rank FLOPs: a local sequence's on its rank, a
    # sharded one's split over its set; a one-group micro-batch's equal what
    # the core reports for the same placement. The step log's FLOP imbalance
    # is then a number, not NaN.
    dp, cp, bucket = 4, 4, 4096
    lengths_ = batch(seed, 200, bucket, dp, cp, 0.05) + [5 * bucket, 2 * bucket]
    plan = plan_of(lengths_, dp, cp, bucket)
    cost = cm.preset()
    sizes = set()
    for mb in plan.micro_batches:
        assert len(mb.rank_flops) == len(mb.rank_tokens)
        assert sum(mb.rank_flops) == pytest.approx(sum(cost.flops(s) for s in mb.lengths), rel=1e-12)
        sizes.update(mb.num_ranks)
        if mb.groups == 1 and all(n in (1, cp) for n in mb.num_ranks):
            core = _core.evaluate_placement(mb.lengths, mb.cp_rank, cost, cp, bucket)
            assert mb.rank_flops == pytest.approx(list(core.rank_flops), rel=1e-12)
    assert {1, cp} < sizes  # local, one group and wider sets all seen
    imbalance = plan.summary()["rank_flop_imbalance"]
    assert 1.0 <= imbalance < float("inf")


def test_pool_options_are_checked():
    opt = SchedulerConfig(dp=2, cp=2, policy="skrull-pool").core_options()
    o = SchedulerConfig(dp=2, cp=2, policy="skrull-pool").core_options()
    o.pool_widen = -1.0
    with pytest.raises(ValueError, match="pool_widen"):
        _core.schedule_pool([10, 20], cm.preset(), o)
    c = cm.preset()
    for bad in (float("nan"), 0.5, 2e3):  # the exchange across groups is never cheaper than within one
        with pytest.raises(ValueError, match=r"comm\.cross_group_factor must be finite and in \[1, 1000\], got"):
            _core.CostModel(c.shape, c.a_us_per_flop, c.b_us,
                            _core.CommModel(c.comm.bytes, c.comm.us, cross_group_factor=bad))
    assert _core.schedule_pool([], cm.preset(), opt).micro_batches == []
