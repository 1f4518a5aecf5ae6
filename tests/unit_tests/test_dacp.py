"""DACP on hand-computed micro-batches (toy cost: flops(s) = 24 s + 4 s^2)."""

from skrull_ext import _core
from skrull_ext._core import Placement, Rollback, Status

D = _core.DISTRIBUTED


def run(lengths, cost, cp, bucket, placement=Placement.LEAST_LOAD, rollback=Rollback.LONGEST):
    return _core.dacp(lengths, cost, cp, bucket, placement, rollback)


def test_all_local_least_load(toy):
    # 3 -> r0; 4 -> r1 (least load); 5 -> r0 (load 108 < 160).
    r = run([3, 4, 5], toy, 2, 10)
    assert r.status == Status.OK
    assert list(r.cp_rank) == [0, 1, 0]
    assert list(r.rank_tokens) == [8, 4]
    assert r.rollbacks == 0
    assert r.time_us == toy.flops(3) + toy.flops(5)  # rank 0, no comm, no dist


def test_results_come_back_in_callers_order(toy):
    r = run([5, 3, 4], toy, 2, 10)
    assert list(r.cp_rank) == [0, 0, 1]


def test_distribute_when_no_rank_has_room(toy):
    # 6 -> r0, 6 -> r1, 7: no rank has 7 free; shard(7, 2) = 4 fits both.
    r = run([6, 6, 7], toy, 2, 10)
    assert list(r.cp_rank) == [0, 1, D]
    assert list(r.rank_tokens) == [10, 10]
    assert r.comm_bytes == 2 * 8 * 1 * 1  # K and V of the 8 padded tokens
    assert r.rollbacks == 0


def test_rollback_longest_first(toy):
    # 4 -> r0, 4 -> r1, 4 -> r0 (tie), rooms [4, 8]; 9 needs shard 6 on both:
    # roll back the latest 4 on r0 (rooms 6, 6), then 9 is sharded.
    r = run([4, 4, 4, 9], toy, 2, 12)
    assert r.status == Status.OK
    assert list(r.cp_rank) == [0, 1, D, D]
    assert list(r.rank_tokens) == [12, 12]
    assert r.rollbacks == 1


def test_rollback_shortest_first_as_published(toy):
    r = run([4, 4, 4, 9], toy, 2, 12, rollback=Rollback.SHORTEST)
    assert list(r.cp_rank) == [D, 1, 0, D]
    assert r.rollbacks == 1


def test_unschedulable_is_reported_not_hidden(toy):
    # 21 tokens > 2 x 10; padding makes even 19 tokens ([5, 5, 9]) unschedulable.
    for lengths in ([4, 4, 4, 9], [5, 5, 9]):
        r = run(lengths, toy, 2, 10)
        assert r.status == Status.UNSCHEDULABLE
    r = run([11], toy, 1, 10)
    assert r.status == Status.UNSCHEDULABLE


def test_worst_fit_places_on_roomiest(toy):
    # Least-load puts 6 on r1 (load 136+... vs 108); worst-fit on the roomier rank.
    # 1 -> r0 [9,10]; 3 -> r1 [9,7]; 3 -> r0 [6,7]; 6: least load is r1 (108 < 136), room 7.
    ll = run([1, 3, 3, 6], toy, 2, 10)
    wf = run([1, 3, 3, 6], toy, 2, 10, placement=Placement.WORST_FIT)
    assert list(ll.cp_rank) == [0, 1, 0, 1]
    assert list(wf.cp_rank) == [0, 1, 0, 1]
    # Here they differ: 2 -> r0; 2 -> r1; 5 -> r0 [3,8]; 3: least load r1 (f2 < f2+f5) -> r1 too;
    # 1: least load r1? loads r0 = 64+220, r1 = 64+108 -> r1 (room 5) ; worst-fit -> r1 (room 5 vs 3).
    ll = run([2, 2, 5, 3, 1, 3], toy, 2, 10)
    wf = run([2, 2, 5, 3, 1, 3], toy, 2, 10, placement=Placement.WORST_FIT)
    assert sum(ll.rank_tokens) == sum(wf.rank_tokens) == 16
    assert max(ll.rank_tokens) <= 10 and max(wf.rank_tokens) <= 10


def test_comm_hidden_behind_local_work(make_toy):
    toy_cost = make_toy
    cost = toy_cost(comm_us=50.0)
    # [6, 6, 7] on cp 2: local 6 on each rank (flops 288) hides comm 50.
    r = run([6, 6, 7], cost, 2, 10)
    assert r.time_us == toy_cost().flops(6) + toy_cost().flops(7) / 2
    # Only a distributed sequence: comm is not hidden.
    r = run([7], cost, 2, 4)
    assert list(r.cp_rank) == [D]
    assert r.time_us == 50.0 + toy_cost().flops(7) / 2


def test_empty_micro_batch(toy):
    r = run([], toy, 4, 10)
    assert r.status == Status.OK and list(r.cp_rank) == [] and r.time_us == 0.0


def test_refine_shards_the_local_bottleneck(toy):
    # Algorithm 1: 10 -> r0, 10 -> r1, 40 -> r0 (fits): r0 does 640 + 7360 FLOPs.
    r = run([10, 10, 40], toy, 2, 100)
    assert list(r.cp_rank) == [0, 1, 0] and r.time_us == 8000.0
    # Refined: moving 40 to r1 only swaps the bottleneck (8000, no gain);
    # sharding it (20 tokens per rank) gives 640 + 7360 / 2 = 4320.
    r = _core.dacp([10, 10, 40], toy, 2, 100, Placement.LEAST_LOAD, Rollback.LONGEST, True)
    assert list(r.cp_rank) == [0, 1, D]
    assert r.time_us == 640 + 3680 and r.moves == 1
    assert list(r.rank_tokens) == [30, 30]


def test_refine_moves_instead_when_the_exchange_would_show(make_toy):
    cost = make_toy(comm_us=5000.0)
    # Sharding 40 would cost 5000 + 3680 > 8000. Moving it swaps the bottleneck
    # (no gain); moving the 10 off r0 gives max(7360, 1280) = 7360. Then
    # nothing else helps: 40 is alone on r0.
    r = _core.dacp([10, 10, 40], cost, 2, 100, Placement.LEAST_LOAD, Rollback.LONGEST, True)
    assert list(r.cp_rank) == [1, 1, 0] and r.moves == 1 and r.time_us == 7360.0


def test_shard_sweep_shards_the_straggler(toy):
    # Algorithm 1 keeps 12 whole: ranks [2+2, 2+12] -> 64+864 = 928.
    assert run([2, 2, 2, 12], toy, 2, 20).time_us == 928
    # Sweep (free comm): k=0 LPT 864; k=1 shard 12: 128 + 432 = 560;
    # k=2 also shard the first 2: 64 + 464 = 528; k=3: 64 + 496 = 560;
    # k=4: the sharded part alone is 528, not better -> stop.
    r = _core.dacp_sweep([2, 2, 2, 12], toy, 2, 20)
    assert r.status == Status.OK
    assert list(r.cp_rank) == [D, 0, 1, D]
    assert r.time_us == 528
    assert list(r.rank_tokens) == [2 + 2 + 6, 2 + 2 + 6]
    assert r.rollbacks == 0


def test_shard_sweep_keeps_local_when_comm_is_dear(make_toy):
    # Exchange costs 1000: sharding 12 costs 1000 + 432 > 864 of keeping it whole.
    r = _core.dacp_sweep([2, 2, 2, 12], make_toy(comm_us=1000.0), 2, 20)
    assert list(r.cp_rank) == [1, 1, 1, 0] and r.time_us == 864


def test_shard_sweep_unschedulable(toy):
    r = _core.dacp_sweep([9, 9, 9], toy, 2, 10)
    assert r.status == Status.UNSCHEDULABLE
