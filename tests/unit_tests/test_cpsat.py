"""CP-SAT: the brute-force optimum on tiny micro-batches; the fallback never predicts slower."""

import itertools
import math
import random

import pytest

from skrull_ext import Scheduler, SchedulerConfig, _core
from skrull_ext.scheduler import cost_model as cm
from skrull_ext.scheduler.cpsat import solve_dacp

from tests.unit_tests.margin import with_margin

D = _core.DISTRIBUTED


def brute_force(lengths, cost, cp, bucket):
    best, arg = math.inf, None
    for p in itertools.product([D, *range(cp)], repeat=len(lengths)):
        if cp == 1 and D in p:
            continue
        r = _core.evaluate_placement(lengths, list(p), cost, cp, bucket)
        if r.status == _core.Status.OK and r.time_us < best:
            best, arg = r.time_us, p
    return best, arg


def costs():
    yield cm.preset("qwen2.5-0.5b")
    yield cm.preset("qwen2.5-7b")
    # A comm-heavy model with a threshold step, to exercise every comm piece.
    yield _core.CostModel(_core.ModelShape(2, 64, 32, 2), 1e-4, 3.0,
                          _core.CommModel([4096.0, 65536.0, 1e6], [40.0, 60.0, 400.0], 2048.0, 25.0, 2.0))


@pytest.mark.parametrize("seed", range(12))
def test_cpsat_matches_brute_force(seed):
    rng = random.Random(seed)
    cp = rng.choice([1, 2, 3])
    n = rng.randint(1, 5 if cp < 3 else 4)
    cost = list(costs())[seed % 3]
    bucket = rng.choice([2048, 8192, 26624])
    lengths = [rng.randint(1, bucket) for _ in range(n)]
    best, arg = brute_force(lengths, cost, cp, bucket)
    res = solve_dacp(lengths, cost, cp, bucket, deterministic_time=10.0)
    if arg is None:
        assert res.status == "INFEASIBLE" and res.cp_rank is None
        return
    assert res.status == "OPTIMAL"
    got = _core.evaluate_placement(lengths, res.cp_rank, cost, cp, bucket)
    assert got.status == _core.Status.OK
    # Integer nanoseconds in the model: optimal up to rounding.
    assert got.time_us == pytest.approx(best, rel=1e-4)
    assert res.bound_us <= best * (1 + 1e-4)


def test_cpsat_proves_padding_infeasibility(toy):
    # 19 tokens on 2 x 10, but shards are padded to 4 tokens: nothing fits.
    res = solve_dacp([7, 7, 5], toy, 2, 10, deterministic_time=10.0)
    assert res.status == "INFEASIBLE" and res.cp_rank is None


def test_a_model_too_large_is_not_built_and_the_heuristic_stands(monkeypatch):
    # Found under load: 60 sequences on 65,536 CP ranks (3.9M placement variables) held
    # the facade's property test in the solver for over 10 minutes, whatever the
    # deterministic limit. Over MAX_PLACEMENT_VARS the solver is never called.
    from ortools.sat.python import cp_model

    from skrull_ext.scheduler.cpsat import MAX_PLACEMENT_VARS

    cost = cm.preset("qwen2.5-0.5b")
    calls = []
    monkeypatch.setattr(cp_model.CpSolver, "solve", lambda self, *a, **k: calls.append(1))
    res = solve_dacp([100, 100], cost, MAX_PLACEMENT_VARS // 2 + 1, 26624)
    assert (res.status, res.cp_rank, res.bound_us) == ("TOO_LARGE", None, 0.0)
    lengths = [5000] * 20 + [400_000]  # 21 sequences x 4096 ranks > MAX_PLACEMENT_VARS
    plan = Scheduler(SchedulerConfig(dp=1, cp=4096, bucket_size=26624, cpsat=True, cpsat_margin=0.0), cost).schedule(
        lengths)
    want = Scheduler(SchedulerConfig(dp=1, cp=4096, bucket_size=26624, cpsat=False), cost).schedule(lengths)
    plan.validate()
    (mb,) = plan.group_micro_batches(0)
    assert mb.time_us > mb.lower_bound_us  # the fallback would have been tried
    assert calls == [] and plan.cp_rank == want.cp_rank


@pytest.mark.parametrize("seed", range(6))
def test_fallback_never_slower_than_heuristic(seed):
    rng = random.Random(seed)
    real = [int(x) for x in __import__("skrull_ext.lengths", fromlist=["load"]).load("mix_sharegpt_conv+longbench_en")]
    lengths = [rng.choice(real) for _ in range(48)]
    cost = with_margin(cm.preset("qwen2.5-0.5b"), 1.0)  # unhedged: never slower at the price it plans with
    base = Scheduler(SchedulerConfig(dp=2, cp=4, bucket_size=16384, cpsat=False, overlength="truncate"), cost)
    fb = Scheduler(SchedulerConfig(dp=2, cp=4, bucket_size=16384, cpsat=True, cpsat_margin=0.0,
                                   cpsat_deterministic_time=0.05, overlength="truncate"), cost)
    p0, p1 = base.schedule(lengths), fb.schedule(lengths)
    p1.validate()
    for a, b in zip(p0.micro_batches, p1.micro_batches):
        assert b.seqs == a.seqs
        assert b.time_us <= a.time_us
        if b.path == "cpsat":
            assert b.heuristic_time_us == a.time_us and b.time_us < a.time_us
        assert b.lower_bound_us is not None and b.lower_bound_us <= b.time_us * (1 + 1e-4)
    assert p1.makespan_us <= p0.makespan_us


def test_single_micro_batch_rescued_by_sweep(toy):
    # Algorithm 1: 5 -> r0, 5 -> r1, then 9 fits nowhere and roll-back cannot
    # help. The shard sweep (longest first) puts 9 alone and both 5s together.
    assert _core.dacp([5, 5, 9], toy, 2, 10).status == _core.Status.UNSCHEDULABLE
    s = Scheduler(SchedulerConfig(cp=2, bucket_size=10), toy)
    r, path = s.schedule_micro_batch([5, 5, 9])
    assert path == "heuristic" and r.status == _core.Status.OK
    assert sorted(r.rank_tokens) == [9, 10]
    assert r.cp_rank[0] == r.cp_rank[1] != r.cp_rank[2]


def test_single_micro_batch_rescued_by_cpsat(toy):
    # Both heuristics fail: Algorithm 1 ends with 6 homeless, LPT puts 3 + 3
    # apart. The only fit is {6, 4} and {4, 3, 3}, which CP-SAT finds.
    assert _core.dacp([6, 4, 4, 3, 3], toy, 2, 10).status == _core.Status.UNSCHEDULABLE
    assert _core.dacp_sweep([6, 4, 4, 3, 3], toy, 2, 10).status == _core.Status.UNSCHEDULABLE
    s = Scheduler(SchedulerConfig(cp=2, bucket_size=10), toy)
    r, path = s.schedule_micro_batch([6, 4, 4, 3, 3])
    assert path == "cpsat" and r.status == _core.Status.OK
    assert list(r.rank_tokens) == [10, 10] and _core.DISTRIBUTED not in r.cp_rank
    assert r.cp_rank[0] == r.cp_rank[1] or r.cp_rank[0] == r.cp_rank[2]
    with pytest.raises(ValueError, match=r"micro-batch of 3 sequences \(19 tokens\) does not fit 2 CP ranks x 10 tokens"):
        s.schedule_micro_batch([7, 7, 5])


def test_cpsat_is_deterministic():
    cost = cm.preset()
    rng = random.Random(3)
    lengths = [rng.randint(100, 20000) for _ in range(40)]
    a = solve_dacp(lengths, cost, 8, 26624, deterministic_time=0.01)
    b = solve_dacp(lengths, cost, 8, 26624, deterministic_time=0.01)
    assert a.cp_rank == b.cp_rank and a.status == b.status


def test_fallback_for_one_dp_rank_touches_only_that_rank():
    rng = random.Random(7)
    real = __import__("skrull_ext.lengths", fromlist=["load"]).load("mix_sharegpt_conv+longbench_en")
    lengths = [rng.choice(real) for _ in range(64)]
    cost = cm.preset("qwen2.5-0.5b")
    cfg = dict(dp=2, cp=4, bucket_size=16384, overlength="truncate", cpsat_margin=0.0, cpsat_deterministic_time=0.05)
    base = Scheduler(SchedulerConfig(cpsat=False, **cfg), cost).schedule(lengths)
    full = Scheduler(SchedulerConfig(cpsat=True, **cfg), cost).schedule(lengths)
    one = Scheduler(SchedulerConfig(cpsat=True, **cfg), cost).schedule(lengths, dp_rank=1)
    one.validate()
    assert one.refined_dp_rank == 1
    assert [mb.cp_rank for mb in one.ranks[0]] == [mb.cp_rank for mb in base.ranks[0]]
    assert [mb.cp_rank for mb in one.ranks[1]] == [mb.cp_rank for mb in full.ranks[1]]
    assert all(mb.path == "heuristic" for mb in one.ranks[0])
    # The fallback looked at rank 1 only: bounds exist there and nowhere else.
    assert all(mb.lower_bound_us is None for mb in one.ranks[0])
    assert all(mb.lower_bound_us is not None for mb in one.ranks[1])
    with pytest.raises(ValueError, match=r"dp_rank must be in \[0, 2\), got 2"):
        Scheduler(SchedulerConfig(**cfg), cost).schedule(lengths, dp_rank=2)
