"""GDS on hand-computed global batches, policies and over-length handling."""

import pytest

from skrull_ext import DROPPED, Scheduler, SchedulerConfig, _core

D = -1


def test_lpt_split_over_dp(toy):
    # FLOPs-LPT: 6->d0, 5->d1, 4->d1, 3->d0, 2->d1, 1->d0; one micro-batch each.
    plan = Scheduler(SchedulerConfig(dp=2, cp=2, bucket_size=10, policy="skrull-paper"), toy).schedule([1, 2, 3, 4, 5, 6])
    plan.validate()
    assert plan.dp_rank == [0, 1, 0, 1, 1, 0]
    assert plan.slot == [0] * 6
    # d0 group [1, 3, 6]: 1->r0, 3->r1, 6->r0; d1 group [2, 4, 5]: 2->r0, 4->r1, 5->r0.
    assert plan.cp_rank == [0, 0, 1, 1, 0, 0]
    assert [mb.seqs for mb in plan.group_micro_batches(0)] == [[0, 2, 5]]


def test_smallest_feasible_micro_batch_count(toy):
    # cp 1, C 5, 10 tokens: m=2 puts [2, 4] (6 tokens) together; m=3 works:
    # strided groups [1, 4], [2], [3].
    plan = Scheduler(SchedulerConfig(dp=1, cp=1, bucket_size=5, policy="skrull-paper"), toy).schedule([1, 2, 3, 4])
    plan.validate()
    assert plan.slot == plan.micro_batch == [0, 1, 2, 0]
    assert [mb.seqs for mb in plan.group_micro_batches(0)] == [[0, 3], [1], [2]]
    assert plan.slots == 3


def test_predicted_time_may_pick_more_micro_batches(make_toy):
    toy_cost = make_toy
    # Heavy comm: sharding costs 1000 us; per-call overhead is small.
    cost = toy_cost(comm_us=1000.0, b_us=1.0)
    lengths = [6, 6, 7]
    paper = Scheduler(SchedulerConfig(dp=1, cp=2, bucket_size=10, policy="skrull-paper"), cost).schedule(lengths)
    ours = Scheduler(SchedulerConfig(dp=1, cp=2, bucket_size=10, policy="skrull", cpsat=False), cost).schedule(lengths)
    paper.validate()
    ours.validate()
    assert paper.slots == 1 and paper.cp_rank.count(D) == 1
    assert ours.slots == 2 and D not in ours.cp_rank
    assert ours.makespan_us < paper.makespan_us


@pytest.mark.parametrize("policy", ["skrull", "skrull-paper", "worstfit"])
def test_overlength_policies(toy, policy):
    lengths = [3, 50, 7, 41]  # limit for C 10 x cp 2 is 20
    with pytest.raises(ValueError, match=r"sequence 1 has length 50, longer than the 20 tokens"):
        Scheduler(SchedulerConfig(dp=1, cp=2, bucket_size=10, policy=policy), toy).schedule(lengths)
    drop = Scheduler(SchedulerConfig(dp=2, cp=2, bucket_size=10, policy=policy, overlength="drop"), toy).schedule(lengths)
    drop.validate()
    assert drop.dropped == [1, 3]
    assert drop.dp_rank[1] == drop.dp_rank[3] == DROPPED
    assert drop.summary()["dropped"] == 2
    trunc = Scheduler(SchedulerConfig(dp=1, cp=2, bucket_size=10, policy=policy, overlength="truncate"), toy).schedule(lengths)
    trunc.validate()
    assert trunc.truncated == [1, 3]
    assert trunc.lengths == [3, 20, 7, 20]
    assert trunc.input_lengths == lengths


def test_empty_batch_is_an_empty_plan(toy):
    plan = Scheduler(SchedulerConfig(dp=2, cp=2, bucket_size=10), toy).schedule([])
    plan.validate()
    assert plan.slots == 0 and plan.makespan_us == 0.0


def test_more_dp_ranks_than_sequences(toy):
    plan = Scheduler(SchedulerConfig(dp=4, cp=2, bucket_size=10), toy).schedule([3, 4])
    plan.validate()
    assert sorted(len(plan.group_micro_batches(d)) for d in range(4)) == [0, 0, 1, 1]


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"dp": 0}, r"dp must be in \[1, 65536\], got 0"),
        ({"cp": 1.5}, r"cp must be an integer in"),
        ({"bucket_size": -3}, r"bucket_size must be in \[1, 68719476736\], got -3"),
        ({"policy": "fifo"}, r"policy must be one of \['skrull', 'skrull-fast', 'skrull-paper', 'skrull-per-rank', 'skrull-pool', 'worstfit'\], got 'fifo'"),
        ({"overlength": "skip"}, r"overlength must be one of \['chunk', 'drop', 'error', 'truncate'\], got 'skip'"),
        ({"cpsat_margin": -0.1}, r"cpsat_margin must be in"),
    ],
)
def test_config_errors_name_the_field(kw, msg):
    with pytest.raises(ValueError, match=msg):
        SchedulerConfig(**kw)


def test_facade_rejects_non_integer_lengths(toy):
    with pytest.raises(ValueError, match=r"sequence 1 has length 2.5, which is not an integer"):
        Scheduler(SchedulerConfig(), toy).schedule([1, 2.5])
    with pytest.raises(ValueError, match=r"sequence 2 has length True, which is not an integer"):
        Scheduler(SchedulerConfig(), toy).schedule([1, 2, True])
    for bad, k in (([3, 0, 2], 1), ([3, 2, _core.MAX_LENGTH + 1], 2)):
        with pytest.raises(ValueError, match=rf"sequence {k} has length {bad[k]}, outside \[1, {_core.MAX_LENGTH}\]"):
            Scheduler(SchedulerConfig(), toy).schedule(bad)


def test_facade_takes_integer_likes_as_ints(toy):
    import numpy as np

    plain = Scheduler(SchedulerConfig(), toy).schedule([5, 3, 9])
    numpy = Scheduler(SchedulerConfig(), toy).schedule(np.array([5, 3, 9]))
    assert numpy.input_lengths == plain.input_lengths == [5, 3, 9]
    assert all(type(s) is int for s in numpy.input_lengths) and numpy.micro_batch == plain.micro_batch


def test_lpt_groups_when_strided_needs_more_micro_batches_than_the_tokens():
    # A step of the README job's data (DP 1 x CP 2, C = 256): strided groups (sorted[j::m]) put
    # 456 with 97 and 25 (578 tokens > 512) at m = 2, so they took 3 micro-batches; the tokens
    # (657) need 2, and LPT groups pack them so: 456 sharded with 2 short ones beside it on
    # each rank, the rest in the second. Each micro-batch saved is a fixed cost and a call per
    # layer (scheduler.hpp split_share). The reference restates it, bit for bit.
    from skrull_ext.bench import reference as ref
    from skrull_ext.scheduler import cost_model as cm

    cost = cm.preset("llama3-debug")
    lengths = [456, 97, 29, 25, 22, 17, 9, 2]
    for timeline in ("free", "lockstep"):
        plan = Scheduler(SchedulerConfig(dp=1, cp=2, bucket_size=256, timeline=timeline), cost).schedule(lengths)
        plan.validate()
        assert plan.slots == 2
        want = ref.schedule(lengths, ref.RefCost.of(cost), 1, 2, 256, predicted_time=True, refine_=True, sweep=True)
        assert [[mb.seqs for mb in r] for r in plan.ranks] == want.groups and plan.group_time_us == want.dp_time_us
    paper = Scheduler(SchedulerConfig(dp=1, cp=2, bucket_size=256, policy="skrull-paper"), cost).schedule(lengths)
    assert paper.slots == 3  # Algorithm 2's strided groups alone


def test_a_sequence_that_fills_a_micro_batch_does_not_split_the_rest_one_by_one():
    # Per-rank GDS (free-running). Strided groups pair long with short, so a sequence of
    # C x CP tokens shares no micro-batch until every sequence has its own: 1 + 40 micro-batches,
    # each short one paying a call. With the count that far above the token bound (2), LPT groups
    # are tried too (scheduler.hpp split_share): the long one alone, the 40 short ones packed.
    # The Python reference restates it (plans equal, bit for bit).
    from skrull_ext.bench import reference as ref
    from skrull_ext.scheduler import cost_model as cm

    cost = cm.preset("qwen2.5-7b")
    lengths = [13312 * 8] + [500 + 37 * k for k in range(40)]
    cfg = SchedulerConfig(dp=1, cp=8, bucket_size=13312, policy="skrull", timeline="free")
    plan = Scheduler(cfg, cost).schedule(lengths)
    plan.validate()
    assert plan.slots == 2
    assert [mb.seqs for mb in plan.group_micro_batches(0)] == [[0], list(range(1, 41))]  # the long one alone
    want = ref.schedule(lengths, ref.RefCost.of(cost), 1, 8, 13312, predicted_time=True, refine_=True, sweep=True)
    assert [[mb.seqs for mb in r] for r in plan.ranks] == want.groups and plan.group_time_us == want.dp_time_us
    paper = Scheduler(SchedulerConfig(dp=1, cp=8, bucket_size=13312, policy="skrull-paper", timeline="free"),
                      cost).schedule(lengths)
    assert paper.slots == 41 and plan.makespan_us < paper.makespan_us


def test_an_attention_weight_reaches_the_plan_and_the_reference_restates_it():
    # The committed H200 profile prices attention at its fitted weight (0.56): random steps of long
    # and short sequences at CP 4 plan alike in the core and in the plain-Python reference, on both
    # timelines, and the reference's times move with the weight.
    import os
    import random

    from skrull_ext.bench import reference as ref
    from skrull_ext.scheduler.profile_file import Profile

    path = os.path.join(os.path.dirname(__file__), "..", "..", "profiles", "h200-qwen2.5-0.5b.toml")
    cost = Profile.load(path).cost_model()
    assert 0.4 < cost.attention_weight < 0.7
    rng = random.Random(3)
    for _ in range(5):
        lengths = [rng.choice([rng.randint(100, 3000), rng.randint(8000, 60000)]) for _ in range(12)]
        want = ref.schedule(lengths, ref.RefCost.of(cost), 1, 4, 26624, predicted_time=True, refine_=True, sweep=True)
        for timeline in ("free", "lockstep"):
            plan = Scheduler(SchedulerConfig(dp=1, cp=4, bucket_size=26624, timeline=timeline), cost).schedule(lengths)
            plan.validate()
            assert [[mb.seqs for mb in r] for r in plan.ranks] == want.groups and plan.group_time_us == want.dp_time_us
        full = ref.RefCost.of(cost)
        full.attention = 1.0
        assert ref.schedule(lengths, full, 1, 4, 26624, predicted_time=True, refine_=True,
                            sweep=True).dp_time_us != want.dp_time_us
