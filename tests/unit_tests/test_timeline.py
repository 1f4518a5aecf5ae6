"""Plans for the timeline the trainer runs (docs/design/cost_model.md, "Timelines").

A lockstep plan covers every sequence once, never holds more than BucketSize
on any rank in any slot, and its predicted time is the timeline function
applied to its slots, restated here in plain Python; the same for pool
plans. The job's timeline comes from its parallelism."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skrull_ext import Scheduler, SchedulerConfig, _core, lengths
from skrull_ext.scheduler import cost_model as cm
from skrull_ext.scheduler.config import TIMELINES, job_timeline
from skrull_ext.sim import bound

REAL = lengths.load("mix_sharegpt_conv95+longbench_en5")


def lockstep_us(rank_times: list[list[float]], pad_us: float) -> float:
    """Sum over slots of the slowest rank in the slot (a pad pass where a rank has none): the reference."""
    slots = max((len(r) for r in rank_times), default=0)
    return sum(max(r[j] if j < len(r) else pad_us for r in rank_times) for j in range(slots))


def batch(seed: int, k: int, bucket: int, cp: int) -> list[int]:
    rng = random.Random(seed)
    limit = _core.max_sequence_length(bucket, cp)
    scale = rng.choice([0.05, 0.2, 1.0])
    return [max(1, min(limit, int(rng.choice(REAL) * scale * bucket / 26624))) for _ in range(k)]


def fixed_cost(fixed_us: float) -> _core.CostModel:
    c = cm.preset()
    return _core.CostModel(c.shape, c.a_us_per_flop, c.b_us, c.comm, micro_batch_fixed_us=fixed_us)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.integers(0, 1500), st.sampled_from([1, 2, 4, 8]), st.sampled_from([2, 3, 4, 16]),
       st.sampled_from([64, 1000, 4096, 26624]), st.sampled_from(["skrull", "skrull-fast", "skrull-paper"]),
       st.sampled_from([0.0, 5e4]))
def test_lockstep_plan_covers_fits_and_is_timed_by_its_slots(seed, k, cp, dp, bucket, policy, fixed_us):
    lengths_ = batch(seed, k, bucket, cp)
    cost = fixed_cost(fixed_us)
    plan = Scheduler(SchedulerConfig(dp=dp, cp=cp, bucket_size=bucket, policy=policy, cpsat=False), cost).schedule(
        lengths_)
    plan.validate()
    pad_us = cost.pad_pass_us()  # one token a CP rank through every layer, not the fixed cost alone
    assert plan.timeline == _core.Timeline.LOCKSTEP and plan.pad_us == pad_us > fixed_us
    assert sorted(s for r in plan.ranks for mb in r for s in mb.seqs) == list(range(k))  # each once
    for rank in plan.ranks:
        for slot, mb in enumerate(rank):
            assert mb.slot == slot and max(mb.rank_tokens) <= bucket  # memory, every rank, every slot
    rank_times = [[mb.time_us for mb in r] for r in plan.ranks]
    assert plan.makespan_us == pytest.approx(lockstep_us(rank_times, pad_us), rel=1e-12, abs=1e-9)
    # Never shorter than the free-running step of the same micro-batches, nor than the bound.
    assert plan.makespan_us >= max(map(sum, rank_times), default=0.0) * (1 - 1e-12)
    lb = bound.lower_bound_us(lengths_, cost, dp, cp, bucket, "lockstep")
    assert plan.makespan_us >= lb * (1 - 1e-9)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.integers(1, 800), st.sampled_from([2, 4]), st.sampled_from([2, 4]),
       st.sampled_from([256, 4096]), st.sampled_from(["lockstep", "free"]))
def test_pool_plan_is_timed_by_its_slots(seed, k, cp, dp, bucket, timeline):
    lengths_ = batch(seed, k, bucket, cp)
    cost = fixed_cost(1e4)
    cfg = SchedulerConfig(dp=dp, cp=cp, bucket_size=bucket, policy="skrull-pool", cpsat=False, timeline=timeline)
    plan = Scheduler(cfg, cost).schedule(lengths_)
    plan.validate()  # restates both timelines in Python
    mbs = [_core.SlotTime(mb.slot, mb.first_group, mb.groups, mb.time_us) for mb in plan.micro_batches]
    assert plan.makespan_us == _core.plan_step_time_us(mbs, dp, TIMELINES[timeline], cost.pad_pass_us())
    if timeline == "lockstep":
        per_slot: dict[int, float] = {}
        for mb in plan.micro_batches:
            per_slot[mb.slot] = max(per_slot.get(mb.slot, 0.0), mb.time_us)
        assert plan.makespan_us == pytest.approx(sum(per_slot.values()), rel=1e-12, abs=1e-9)


def test_step_time_by_hand():
    ranks = [[5.0, 1.0, 1.0], [2.0]]
    assert _core.step_time_us(ranks, _core.Timeline.LOCKSTEP, 0.5) == 5.0 + 1.0 + 1.0
    assert _core.step_time_us(ranks, _core.Timeline.FREE_RUNNING, 0.5) == 7.0
    assert _core.step_time_us([[1.0], [0.2, 0.2]], _core.Timeline.LOCKSTEP, 0.5) == 1.0 + 0.5  # the pad pass
    assert _core.step_time_us([], _core.Timeline.LOCKSTEP, 0.5) == 0.0
    with pytest.raises(ValueError, match="finite"):
        _core.step_time_us([[float("nan")]], _core.Timeline.LOCKSTEP, 0.0)


def test_slot_gds_beats_the_per_rank_plan_on_a_lockstep_step():
    """The case that motivates it: DP ranks whose per-rank sums balance, but whose slots pair
    one rank's long micro-batch with another's short one. Mean over 20 real batches at the
    paper's shape: the slot plan is faster on the lockstep timeline than the per-rank plan
    timed on it (skrull-paper keeps the per-rank GDS), and never behind it by more than noise."""
    cost = cm.preset("qwen2.5-0.5b")
    rng = random.Random(3)
    limit = _core.max_sequence_length(26624, 8)
    slot, per_rank = [], []
    for _ in range(20):
        b = [min(limit, rng.choice(REAL)) for _ in range(256)]
        slot.append(Scheduler(SchedulerConfig(dp=4, cp=8, policy="skrull"), cost).schedule(b).makespan_us)
        per_rank.append(Scheduler(SchedulerConfig(dp=4, cp=8, policy="skrull-paper"), cost).schedule(b).makespan_us)
    assert sum(slot) < 0.97 * sum(per_rank)


@pytest.mark.parametrize("dp_shard, dp_replicate, free_running, defer, want", [
    (4, 1, False, False, "lockstep"),   # FSDP over the DP ranks
    (4, 1, False, True, "lockstep"),    # deferred grad sync still gathers parameters per micro-batch
    (4, 1, True, False, "free"),        # free-running mode
    (1, 1, False, False, "free"),       # one DP rank: nothing to wait for
    (1, 4, False, True, "free"),        # replicate-only, gradients reduced once
    (1, 4, False, False, "lockstep"),   # replicate-only, an all-reduce per micro-batch
    (2, 2, False, True, "lockstep"),    # HSDP: the shard mesh spans DP ranks
])
def test_job_timeline_follows_the_parallelism(dp_shard, dp_replicate, free_running, defer, want):
    assert job_timeline(dp_shard, dp_replicate, free_running, defer) == TIMELINES[want]


def test_bad_timeline_is_named():
    with pytest.raises(ValueError, match=r"timeline must be one of \['free', 'lockstep'\], got 'fifo'"):
        SchedulerConfig(timeline="fifo")
