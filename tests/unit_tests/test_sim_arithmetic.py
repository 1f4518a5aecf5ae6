"""Simulator arithmetic on tiny cases computed by hand.

Toy cost (conftest): layers 1, h = h_kv = 1, 1 byte, a = 1 us/FLOP, so
flops(s) = 24 s + 4 s^2, kv_bytes(s) = 2 s, T_comp(F) = F + b, and every
collective takes comm_us (one per layer).
"""

import random

import pytest

from skrull_ext import DISTRIBUTED as D
from skrull_ext.scheduler.profile_file import Profile
from skrull_ext.sim import bound, chunkflow, datasets, metrics, simulator
from skrull_ext.sim import policies as P
from skrull_ext.sim.packing import Shape

# flops: 3 -> 108, 4 -> 160, 5 -> 220, 6 -> 288
LENGTHS = [4, 6, 3, 5]
SHAPE = Shape(dp=2, cp=2, batch_size=2, bucket_size=10)


def test_baseline_by_hand(make_toy):
    cost = make_toy(comm_us=10.0)
    plan = P.get("baseline").plan(LENGTHS, cost, SHAPE, 0)
    plan.validate()
    # DistributedSampler split: rank 0 gets [4, 3], rank 1 [6, 5]; shards (2*ceil(s/4)) 2+2 and 4+4 fit C=10.
    assert [[mb.seqs for mb in r] for r in plan.ranks] == [[[0, 2]], [[1, 3]]]
    assert set(plan.cp_rank) == {D}
    # rank 0: comm 10 + (160 + 108) / 2 = 144; rank 1: 10 + (288 + 220) / 2 = 264.
    assert plan.group_time_us == [144.0, 264.0]
    m = metrics.of_plan(plan, cost, capacity=10, bound_us=194.0)
    assert m.time_us == 264.0
    assert m.peak_tokens == 8 and m.mean_peak_tokens == (4 + 4 + 8 + 8) / 4
    # K/V of the padded lengths: rank 0 2*(4 + 4), rank 1 2*(8 + 8); one collective, one layer.
    assert m.comm_bytes == 16 + 32
    assert m.overflow == 0 and m.micro_batches == 1
    assert m.local_share == 0.0  # the baseline shards every sequence


def test_local_share_counts_sequences_kept_whole(make_toy):
    cost = make_toy(comm_us=1000.0)
    plan = P.get("skrull").plan(LENGTHS, cost, SHAPE, 0)
    plan.validate()
    mbs = plan.micro_batches
    local = sum(1 for mb in mbs for r in mb.cp_rank if r != D)
    assert local > 0  # an expensive exchange: skrull keeps some whole
    assert metrics.of_plan(plan, cost, capacity=10, bound_us=1.0).local_share == local / len(LENGTHS)
    cp1 = P.get("baseline").plan(LENGTHS, cost, Shape(dp=1, cp=1, batch_size=4, bucket_size=18), 0)
    assert metrics.of_plan(cp1, cost, capacity=18, bound_us=1.0).local_share == 1.0  # CP 1: all whole


def test_baseline_packs_in_arrival_order(toy):
    shape = Shape(dp=1, cp=2, batch_size=4, bucket_size=4)
    plan = P.get("baseline").plan([4, 6, 3, 5], toy, shape, 0)
    plan.validate()
    # Shards per rank 2, 4, 2, 4 against a 4-token bucket: no two neighbours fit together.
    assert [mb.seqs for mb in plan.ranks[0]] == [[0], [1], [2], [3]]


def test_unpacked_is_one_sequence_per_micro_batch(toy):
    plan = P.get("unpacked").plan(LENGTHS, toy, SHAPE, 0)
    plan.validate()
    assert [[mb.seqs for mb in r] for r in plan.ranks] == [[[0], [2]], [[1], [3]]]


def test_cp1_baseline_exchanges_nothing(make_toy):
    cost = make_toy(comm_us=10.0)
    plan = P.get("baseline").plan(LENGTHS, cost, Shape(dp=1, cp=1, batch_size=4, bucket_size=18), 0)
    plan.validate()
    assert plan.makespan_us == 160 + 288 + 108 + 220 and plan.micro_batches[0].comm_bytes == 0


def test_bound_by_hand(make_toy):
    # work: (160 + 288 + 108 + 220) / (2 * 2) = 194, plus b * max(1, ceil(18 / 20) / 2) = b.
    assert bound.work_bound_us(LENGTHS, make_toy(), 2, 2, 10) == 194
    assert bound.work_bound_us(LENGTHS, make_toy(b_us=5.0), 2, 2, 10) == 199
    # longest (6 fits whole): max(288 / 2, min(288 whole, 10 + 144 sharded)) = 154 < 194.
    assert bound.longest_bound_us(LENGTHS, make_toy(comm_us=10.0), 2, 10) == 154
    assert bound.lower_bound_us(LENGTHS, make_toy(comm_us=10.0), 2, 2, 10) == 194
    # A 30-token sequence cannot stay whole in a 16-token bucket: it pays the exchange
    # (5000) + half of flops(30) = 4320 / 2, although whole (4320) would be cheaper.
    assert bound.longest_bound_us([30], make_toy(comm_us=5000.0), 2, 16) == 5000 + 2160
    assert bound.lower_bound_us([], make_toy(), 2, 2, 10) == 0


def test_bound_is_below_every_policy(make_toy):
    cost = make_toy(comm_us=10.0, b_us=3.0)
    rng = random.Random(1)
    for _ in range(20):
        lengths = [rng.randint(1, 20) for _ in range(8)]
        lb = bound.lower_bound_us(lengths, cost, 2, 2, 10)
        for name, p in P.SIM_POLICIES.items():
            if not p.is_bound:
                assert p.plan(lengths, cost, SHAPE, 0).makespan_us >= lb * (1 - 1e-12), name


def test_pool_bound_by_hand_and_below_every_pool_plan(make_toy):
    # The longest (6: 288 FLOPs) over all 4 ranks with no exchange: 72 (+ b), under the work term's 194.
    assert bound.pool_longest_bound_us(LENGTHS, make_toy(), 4) == 72
    assert bound.pool_longest_bound_us(LENGTHS, make_toy(b_us=5.0), 4) == 77
    assert bound.pool_lower_bound_us(LENGTHS, make_toy(), 2, 2, 10) == 194
    # One 30-token sequence (4320 FLOPs) in a world of 8: 540, below the group bound that prices
    # it on 2 ranks with its exchange (what a pool plan need not pay).
    assert bound.pool_lower_bound_us([30], make_toy(comm_us=5000.0), 4, 2, 16) == 540
    # Every pool plan (blocks of groups, sub-group sets at CP 4) is at or above it, sequences up to C x W.
    cost = make_toy(comm_us=10.0, b_us=3.0)
    shape = Shape(dp=2, cp=4, batch_size=4, bucket_size=10)
    rng = random.Random(2)
    for _ in range(30):
        lengths = [rng.randint(1, 75) for _ in range(8)]
        lb = bound.pool_lower_bound_us(lengths, cost, shape.dp, shape.cp, shape.bucket_size)
        for name in ("skrull-pool", "skrull-pool-capped"):
            assert P.get(name).plan(lengths, cost, shape, 0).makespan_us >= lb * (1 - 1e-12), (name, lengths)


def test_chunk_flops_add_up_and_chains_stay_in_order(toy):
    # Chunk i of a split sequence costs flops(end) - flops(start): the pieces sum to the whole.
    pieces = chunkflow.split_pieces([10, 3], 4)
    assert pieces == [(0, 0, 4), (0, 4, 4), (0, 8, 2), (1, 0, 3)]
    assert sum(toy.flops(s + n) - toy.flops(s) for k, s, n in pieces if k == 0) == toy.flops(10)
    plan, pieces = chunkflow.plan([10, 3], toy, Shape(dp=1, cp=2, batch_size=2, bucket_size=4), chunk=4)
    plan.validate()
    order = [pieces[i] for mb in plan.ranks[0] for i in mb.seqs if pieces[i][0] == 0]
    assert [start for _, start, _ in order] == [0, 4, 8]
    # Second chunk of 10: attention to its 4-token prefix, (flops(8) - flops(4)) / 2 = (448 - 160) / 2.
    times = {tuple(mb.seqs): mb.time_us for mb in plan.ranks[0]}
    assert times[(1,)] == 144.0


def test_sorted_regroups_the_window():
    out = P.sort_window([[5, 1, 9], [4, 2, 8]], seed=0)
    assert sorted(out) == [[1, 2, 4], [5, 8, 9]] and [len(b) for b in out] == [3, 3]


def test_global_batches_truncate_and_count():
    shape = Shape(dp=1, cp=2, batch_size=4, bucket_size=4096)  # a group holds 8192 tokens
    batches, truncated = simulator.global_batches("chatqa2", shape, 3, 0)
    assert [len(b) for b in batches] == [4, 4, 4]
    assert max(max(b) for b in batches) <= 8192
    raw = datasets.get("chatqa2").stream(12, 0)
    assert truncated == sum(s > 8192 for s in raw) > 0


def test_overflow_is_counted_not_hidden(toy):
    # A capacity below BucketSize: plans are made for 4096 tokens per rank, the device holds 100.
    scen = simulator.Scenario("wikipedia", "qwen2.5-0.5b", Shape(dp=1, cp=2, batch_size=8, bucket_size=4096),
                              capacity=100)
    res = simulator.simulate(scen, ["baseline", "skrull", "bound"], iterations=2, seed=0)
    assert all(m.overflow >= 1 for m in res.per_policy["baseline"])
    # By hand: rank 1's micro-batch holds 8 tokens per CP rank, rank 0's holds 4; capacity 6.
    plan = P.get("baseline").plan(LENGTHS, toy, SHAPE, 0)
    assert metrics.of_plan(plan, toy, capacity=6, bound_us=1.0).overflow == 1


def test_paper_samplers_reproduce_table_1():
    for name, dist in datasets.PAPER_DISTRIBUTIONS.items():
        x = datasets.get(name).stream(40000, 7)
        assert max(x) <= dist.longest and min(x) >= datasets.MIN_LENGTH
        for edge, share in zip(datasets.EDGES, dist.cumulative):
            assert sum(s < edge for s in x) / len(x) == pytest.approx(share, abs=0.006), (name, edge)
        assert x == datasets.get(name).stream(40000, 7)  # same seed, same stream
    assert datasets.get("chatqa2").stream(10, 1) != datasets.get("chatqa2").stream(10, 2)


def test_default_profile_is_the_assumed_preset():
    from skrull_ext.scheduler import cost_model as cm

    prof = cm.hardware()
    assert prof.label == "assumed: h100_assumed.toml, planned at 1.5x the exchange"
    assert prof.with_plan_margin(1.0).label == "assumed: h100_assumed.toml"
    for model in ("qwen2.5-0.5b", "qwen2.5-7b"):
        a, b = prof.cost_model(cm.shape(model)), cm.preset(model)
        assert (a.a_us_per_flop, a.b_us, list(a.comm.bytes), list(a.comm.us)) == \
            (b.a_us_per_flop, b.b_us, list(b.comm.bytes), list(b.comm.us))
        assert a.shape.hidden == b.shape.hidden and a.shape.layers == b.shape.layers


def test_profile_with_another_model_is_refused():
    from skrull_ext.scheduler import cost_model as cm

    data = dict(cm.hardware().data, model={"layers": 24, "hidden": 896, "kv_width": 128, "bytes_per_elem": 2})
    prof = Profile(data, "measured.toml")
    assert prof.cost_model(cm.shape("qwen2.5-0.5b")).shape.hidden == 896
    assert prof.cost_model().shape.hidden == 896
    with pytest.raises(ValueError, match=r"measured.toml: its \[model\] .* is not the shape of 'qwen2.5-7b'"):
        prof.cost_model(cm.shape("qwen2.5-7b"), "'qwen2.5-7b'")
    with pytest.raises(ValueError, match=r"is not the shape of the model priced"):
        prof.cost_model(cm.shape("qwen2.5-7b"))
