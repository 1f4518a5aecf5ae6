"""Policy skrull-pool's sub-group sets (issue 18, "at CP 4 with a 2-rank sharded
sequence beside a 4-rank one"): a one-group micro-batch's sequence sharded
over an aligned power-of-two block of 2 <= k < cp ranks of its CP group.

The tiny llama3 debug model priced on the h100-assumed preset (compute cheap,
so the K/V exchange weighs) narrows often on lengths of 1..4 x BucketSize;
real-looking batches at the 0.5B shape rarely do (test_pool.py covers those).
"""

import random
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skrull_ext import Scheduler, SchedulerConfig, _core
from skrull_ext.scheduler import cost_model as cm
from skrull_ext.scheduler.plan import Plan

from tests.unit_tests.margin import with_margin

DEBUG = cm.preset("llama3-debug", "h100-assumed")


def plan_of(lengths_, dp, cp, bucket, policy="skrull-pool", cost=DEBUG):
    cfg = SchedulerConfig(dp=dp, cp=cp, bucket_size=bucket, policy=policy, cpsat=False, overlength="error")
    return Scheduler(cfg, cost).schedule(lengths_)


def shard(s: int, k: int) -> int:
    return s if k == 1 else 2 * -(-s // (2 * k))


def oracle_time_us(mb, cost, cp: int) -> float:
    """Test oracle (a restatement, not the implementation): the overlap formula per
    rank of the group, each rank paying the exchange of the sharded sequences it
    holds, a k-rank one's bytes scaled by ((k-1)/k) / ((cp-1)/cp)."""
    local, dist, comm = [0.0] * cp, [0.0] * cp, [0.0] * cp
    base = mb.first_group * cp
    for s, r, k in zip(mb.lengths, mb.first_rank, mb.num_ranks):
        f = cost.flops(s)
        if k == 1:
            local[r - base] += f
            continue
        b = cost.kv_bytes(shard(s, k) * k) * (1.0 if k == cp else ((k - 1) / k) / ((cp - 1) / cp))
        for j in range(r - base, r - base + k):
            dist[j] += f / k
            comm[j] += b
    per_rank = [cost.layer_us(cost.comm_us(comm[j]), local[j], dist[j]) for j in range(cp)]
    return cost.shape.layers * max(per_rank)


def check_plan(plan: Plan, lengths_: list[int], dp: int, cp: int, bucket: int) -> None:
    """Every sequence once, no rank over C in any slot, sub-group sets aligned inside a
    group, each narrowed micro-batch timed by the per-rank formula."""
    plan.validate()
    assert not plan.truncated and not plan.dropped and plan.lengths == lengths_
    assert sorted(k for mb in plan.micro_batches for k in mb.seqs) == list(range(len(lengths_)))
    for rank in range(dp * cp):
        slots = [s for s, _, _ in plan.rank_slots(rank)]
        assert slots == sorted(set(slots))
        for _, _, mine in plan.rank_slots(rank):
            assert sum(shard(lengths_[q], n) for q, _, n in mine) <= bucket
    narrowed = 0
    for mb in plan.micro_batches:
        subs = [(r, k) for r, k in zip(mb.first_rank, mb.num_ranks) if 1 < k < cp]
        narrowed += len(subs)
        for r, k in subs:
            assert mb.groups == 1 and k & (k - 1) == 0 and (r % cp) % k == 0 and r % cp + k <= cp, (r, k)
        if subs:
            assert abs(mb.time_us - oracle_time_us(mb, DEBUG, cp)) <= 1e-9 * mb.time_us
    assert narrowed == plan.narrowed


def draw(rng: random.Random, bucket: int, dp: int, cp: int, k: int) -> list[int]:
    """Lengths of 1..4 x bucket (within what the world holds)."""
    top = min(4 * bucket, _core.max_sequence_length(bucket, dp * cp))
    return [rng.randint(1, top) for _ in range(k)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.integers(1, 60), st.sampled_from([4, 8]), st.sampled_from([1, 2, 3]),
       st.sampled_from([64, 256, 1024]))
def test_subgroup_plans_cover_every_sequence_once_within_memory(seed, k, cp, dp, bucket):
    lengths_ = draw(random.Random(seed), bucket, dp, cp, k)
    plan = plan_of(lengths_, dp, cp, bucket)
    check_plan(plan, lengths_, dp, cp, bucket)
    # Never predicted slower than skrull (when skrull holds every sequence), and deterministic.
    if max(lengths_) <= _core.max_sequence_length(bucket, cp):
        assert plan.makespan_us <= plan_of(lengths_, dp, cp, bucket, policy="skrull").makespan_us
    again = plan_of(list(lengths_), dp, cp, bucket)
    assert again.digest() == plan.digest() and again.group_time_us == plan.group_time_us


def test_subgroup_sets_occur_at_cp4_and_cp8():
    # The property test above is not vacuous: the same draws narrow at both CP sizes,
    # to 2 ranks at CP 4 and to 2 and 4 ranks at CP 8.
    sizes = {4: set(), 8: set()}
    for cp in (4, 8):
        for seed in range(40):
            rng = random.Random(seed)
            dp, bucket = rng.choice([1, 2]), rng.choice([64, 256, 1024])
            lengths_ = draw(rng, bucket, dp, cp, rng.randint(1, 40))
            plan = plan_of(lengths_, dp, cp, bucket)
            check_plan(plan, lengths_, dp, cp, bucket)
            sizes[cp] |= {k for k in plan.num_ranks if 1 < k < cp}
    assert sizes == {4: {2}, 8: {2, 4}}


def test_two_rank_set_beside_four_rank_sets_at_dp1_cp4():
    # The debug data's step-2 batch (tests/integration_tests/test_parity_pool.py trains it):
    # bucket_size 472 at DP 1 x CP 4 holds all 8 sequences in one micro-batch. Skrull shards
    # 335, 390 and 512 over the 4 ranks and keeps the 5 short ones local. The pool then moves
    # the 335 to ranks 2-3: their exchange shrinks to a 2-rank one (2/3 of the bytes per rank)
    # and ranks 0-1 drop it, which predicts the micro-batch faster than skrull's.
    lengths_ = [156, 109, 335, 47, 512, 22, 390, 78]
    plan = plan_of(lengths_, 1, 4, 472)
    check_plan(plan, lengths_, 1, 4, 472)
    skrull = plan_of(lengths_, 1, 4, 472, policy="skrull")
    (mb,) = plan.micro_batches
    assert (plan.skrull_plan, plan.narrowed, plan.widened, plan.slots) == (True, 1, 0, 1)
    assert mb.seqs == [5, 3, 7, 1, 0, 2, 6, 4]
    assert mb.first_rank == [3, 3, 2, 1, 0, 2, 0, 0]
    assert mb.num_ranks == [1, 1, 1, 1, 1, 2, 4, 4]
    # rank 2: 78 + 335/2 -> 168 + 390/4 -> 98 + 512/4 = 128: exactly the bucket.
    assert mb.rank_tokens == [382, 335, 472, 463]
    assert mb.comm_bytes == sum(DEBUG.kv_bytes(shard(s, k) * k) for s, k in ((335, 2), (390, 4), (512, 4)))
    (sk,) = skrull.micro_batches
    assert [sk.cp_rank[sk.seqs.index(q)] for q in mb.seqs] == [3, 3, 2, 1, 0, _core.DISTRIBUTED,
                                                               _core.DISTRIBUTED, _core.DISTRIBUTED]
    assert mb.time_us == oracle_time_us(mb, DEBUG, 4) < sk.time_us
    assert plan.makespan_us == mb.time_us and plan.group_time_us == [mb.time_us]
    # Policy skrull is untouched: the same batch keeps its whole-group set there.
    assert skrull.cp_rank[2] == _core.DISTRIBUTED


def test_no_subgroup_when_it_does_not_pay():
    # On the measured CPU profile the debug model's compute dwarfs its exchange: narrowing
    # a sharded sequence only loads its block, so the same batch keeps skrull's plan exactly.
    cpu = cm.load(Path(__file__).parents[2] / "profiles" / "cpu-debug-gloo2.toml")
    lengths_ = [156, 109, 335, 47, 512, 22, 390, 78]
    plan = plan_of(lengths_, 1, 4, 472, cost=cpu)
    skrull = plan_of(lengths_, 1, 4, 472, policy="skrull", cost=cpu)
    assert plan.narrowed == 0 and plan.skrull_plan and plan.group_time_us == skrull.group_time_us
    assert set(plan.num_ranks) <= {1, 4}
    # And at CP 2 there is no sub-group to narrow to.
    assert plan_of(lengths_, 2, 2, 472).narrowed == 0


def test_cpsat_keeps_a_narrowed_micro_batch_it_cannot_beat():
    # CP-SAT places on whole groups (DACP). On the narrowed step-2 micro-batch (margin 0:
    # always tried) it proves every whole-group placement slower than the narrowed one
    # (its bound, recorded as the micro-batch's lower bound, is above the narrowed time),
    # so the sub-group set stays and the plan stays consistent.
    # Unhedged (plan_margin 1): a hedged scheduler's CP-SAT solves under the planning model,
    # whose bound is not one on the times the plan reports, so it records none (test_hedge).
    lengths_ = [156, 109, 335, 47, 512, 22, 390, 78]
    cfg = SchedulerConfig(dp=1, cp=4, bucket_size=472, policy="skrull-pool", cpsat=True, cpsat_margin=0.0,
                          overlength="error")
    plan = Scheduler(cfg, with_margin(DEBUG, 1.0)).schedule(lengths_)
    check_plan(plan, lengths_, 1, 4, 472)
    (mb,) = plan.micro_batches
    assert mb.path == "heuristic" and plan.narrowed == 1 and mb.num_ranks == [1, 1, 1, 1, 1, 2, 4, 4]
    assert DEBUG.micro_batch_lower_bound_us(mb.lengths, 4) < mb.time_us < mb.lower_bound_us


def test_replacing_a_narrowed_placement_recounts():
    # A whole-group placement swapped in (as CP-SAT would) removes the sub-group set.
    lengths_ = [156, 109, 335, 47, 512, 22, 390, 78]
    plan = plan_of(lengths_, 1, 4, 472)
    (mb,) = plan.micro_batches
    whole = _core.evaluate_placement(mb.lengths, mb.cp_rank, DEBUG, 4, 472)
    plan.replace_placement(mb, whole, "cpsat")
    plan.validate()
    assert plan.narrowed == 0 and plan.num_ranks[2] == 4 and plan.makespan_us == whole.time_us
