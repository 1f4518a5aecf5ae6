"""Plan with one cost model, score with another: skrull's gaps and skrull-pool against skrull.

    PYTHONPATH=. python tools/cross_score.py                                  # plan h100-assumed, score the harness's
    PYTHONPATH=. python tools/cross_score.py --plan tools/harness_h100.toml   # plan and score with the harness's
    PYTHONPATH=. python tools/cross_score.py --datasets sharegpt_v3_conversations --iterations 20
    PYTHONPATH=. python tools/cross_score.py --plan-margin 1                   # plan unhedged (hedge.hpp)

The independent scoring of issue 36 ran the scheduler and scored its plans
with an analytic model of its own (tools/harness_h100.toml); this replays
that on the simulator's global batches (dataset order, the paper's shape:
DP 4 x CP 8, 64 a rank, 0.5B at C=26624, 7B at C=13312, sequences cut at
C x CP for both policies). Per cell and timeline it prints, under the
scoring model: skrull's gap to the classic bound and to the lockstep-aware
one (skrull_ext/sim/bound.py; mean over iterations, and the worst
iteration), and skrull-pool's mean step over skrull's with the iterations
where it is slower.

Scoring restates pool.hpp's per-rank formula (a rank pays the exchange of
the sharded sets it holds, a k-rank set's bytes scaled by the ring share
((k-1)/k) / ((cp-1)/cp), a set over several CP groups times the
cross-group factor): skrull's plans are its one-group case. With the plan's
own model it reproduces every micro-batch's time to 1e-9 (checked each run).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence

from skrull_ext import Scheduler, SchedulerConfig, _core
from skrull_ext.scheduler import cost_model as cost_models
from skrull_ext.scheduler.config import TIMELINES
from skrull_ext.scheduler.plan import MicroBatchPlan, Plan
from skrull_ext.scheduler.profile_file import Profile
from skrull_ext.sim import bound, scenarios, simulator

HARNESS = "tools/harness_h100.toml"
HARNESS_DATASETS = ("sharegpt_v3_conversations", "mix_sharegpt_conv+longbench_en", "mix_azureconv90+longbench_en10")


def _ring_share(k: int, cp: int) -> float:
    ref = max(cp, 2)
    return ((k - 1) / k) / ((ref - 1) / ref)


def micro_batch_us(mb: MicroBatchPlan, cost: _core.CostModel, cp: int) -> float:
    """A micro-batch's time under `cost`, from its rank sets (pool.hpp's formula)."""
    layers = cost.shape.layers
    if mb.groups > 1:  # a wide micro-batch: one sequence over whole groups
        (s,), (k,) = mb.lengths, mb.num_ranks
        b = cost.kv_bytes(_core.shard_tokens(s, k) * k) * _ring_share(k, cp)
        return layers * cost.layer_us(cost.comm.cross_group_factor * cost.comm_us(b), 0.0, cost.flops(s) / k) + \
            cost.micro_batch_fixed_us
    base = mb.first_group * cp
    local, dist, comm = [0.0] * cp, [0.0] * cp, [0.0] * cp
    for s, first, k in zip(mb.lengths, mb.first_rank, mb.num_ranks):
        f = cost.flops(s)
        if k == 1:
            local[first - base] += f
            continue
        b = cost.kv_bytes(_core.shard_tokens(s, k) * k) * (1.0 if k == cp else _ring_share(k, cp))
        for j in range(first - base, first - base + k):
            dist[j] += f / k
            comm[j] += b
    per_rank = [cost.layer_us(cost.comm_us(comm[j]), local[j], dist[j]) for j in range(cp)]
    return layers * max(per_rank) + cost.micro_batch_fixed_us


def step_us(plan: Plan, cost: _core.CostModel, timeline: str) -> float:
    slots = [_core.SlotTime(mb.slot, mb.first_group, mb.groups, micro_batch_us(mb, cost, plan.cp))
             for mb in plan.micro_batches]
    return _core.plan_step_time_us(slots, plan.dp, TIMELINES[timeline], cost.micro_batch_fixed_us) + \
        cost.step_fixed_us


def _profile(name: str) -> Profile:
    return cost_models.hardware() if name == "h100-assumed" else Profile.load(name)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", default="h100-assumed", help="profile the scheduler plans with (default %(default)s)")
    p.add_argument("--score", default=HARNESS, help="profile the plans are scored with (default %(default)s)")
    p.add_argument("--plan-margin", type=float,
                   help="the planning profile's [comm] plan_margin instead of its own (1: plan as priced)")
    p.add_argument("--datasets", default=",".join(HARNESS_DATASETS), help="comma list (default: %(default)s)")
    p.add_argument("--models", default=",".join(scenarios.MODELS))
    p.add_argument("--timelines", default="lockstep,free")
    p.add_argument("--iterations", type=int, default=20)
    args = p.parse_args(argv)
    plan_profile, score_profile = _profile(args.plan), _profile(args.score)
    if args.plan_margin is not None:
        plan_profile = plan_profile.with_plan_margin(args.plan_margin)
    print(f"plan with {plan_profile.label}, score with {score_profile.label}; {args.iterations} iterations a cell\n")
    print("| cell | timeline | skrull gap to classic bound (worst iteration) | to lockstep-aware bound | "
          "skrull-pool / skrull | iterations pool slower |")
    print("|---|---|---|---|---|---|")
    gaps: dict[str, list[float]] = {}
    for d in args.datasets.split(","):
        for m in args.models.split(","):
            for tl in args.timelines.split(","):
                shape = scenarios.paper_shape(d, m, tl)
                plan_cost = plan_profile.cost_model(cost_models.shape(m), m)
                score = score_profile.cost_model(cost_models.shape(m), m)
                batches, _ = simulator.global_batches(d, shape, args.iterations, 0)
                make = lambda policy: Scheduler(SchedulerConfig(  # noqa: E731
                    dp=shape.dp, cp=shape.cp, bucket_size=shape.bucket_size, policy=policy, timeline=tl), plan_cost)
                sk, pool = make("skrull"), make("skrull-pool")
                classic, aware, ratio_num, ratio_den, slower = [], [], 0.0, 0.0, 0
                for b in batches:
                    a, q = sk.schedule(b), pool.schedule(b)
                    for plan in (a, q):  # the restatement reproduces the planner's own times
                        assert all(abs(micro_batch_us(mb, plan_cost, plan.cp) - mb.time_us) <= 1e-9 * mb.time_us
                                   for mb in plan.micro_batches)
                    ta, tq = step_us(a, score, tl), step_us(q, score, tl)
                    c = bound.classic_bound_us(b, score, shape.dp, shape.cp, shape.bucket_size)
                    lb = bound.lower_bound_us(b, score, shape.dp, shape.cp, shape.bucket_size, tl)
                    classic.append(ta / c - 1)
                    aware.append(ta / lb - 1)
                    ratio_num, ratio_den = ratio_num + tq, ratio_den + ta
                    slower += tq > ta * (1 + 1e-9)
                gaps.setdefault(tl, []).append(statistics.fmean(classic))
                print(f"| {d} / {m} | {tl} | {100 * statistics.fmean(classic):.1f}% ({100 * max(classic):.1f}%) | "
                      f"{100 * statistics.fmean(aware):.1f}% | {ratio_num / ratio_den:.4f}x | {slower} |")
    for tl, g in gaps.items():
        print(f"\n{tl}: skrull's gap to the classic bound, mean over cells {100 * statistics.fmean(g):.1f}%, "
              f"worst cell {100 * max(g):.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
