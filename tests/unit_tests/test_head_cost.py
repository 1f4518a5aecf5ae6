"""The per-token cost outside the layers (CostModel.token_us): the embedding,
final norm, output projection and loss, paid once per micro-batch for the
rank holding the most tokens; DACP weighs it, every bound keeps it, profile
files carry it as [micro_batch] token_us.

Toy cost (conftest): layers 1, a = 1 us/FLOP, flops(s) = 24 s + 4 s^2,
T_comp(F) = F + b, one flat collective of comm_us per layer.
flops: 1 -> 28, 6 -> 288, 7 -> 364, 8 -> 448.
"""

import math
import random

import pytest

from skrull_ext import DISTRIBUTED as D
from skrull_ext import Scheduler, SchedulerConfig, _core
from skrull_ext.bench import reference
from skrull_ext.scheduler.profile_file import from_dict, to_dict
from skrull_ext.sim import bound


def with_head(cost, token_us: float):
    return _core.CostModel(cost.shape, cost.a_us_per_flop, cost.b_us, cost.comm, cost.micro_batch_fixed_us,
                           cost.step_fixed_us, token_us)


def test_micro_batch_time_adds_it_once_for_the_fullest_rank(make_toy):
    cost = with_head(make_toy(comm_us=10.0, b_us=1.0, fixed_us=7.0), 10.0)
    # max(comm 10, comp(288) = 289) + comp(364 / 2) = 183, + 7, + 10 a token of the fullest rank's 10.
    assert cost.micro_batch_us([288.0, 0.0], 182.0, 16.0, 10) == 289 + 183 + 7 + 100
    assert cost.micro_batch_us([288.0, 0.0], 182.0, 16.0) == 289 + 183 + 7  # the layers alone
    deep = _core.CostModel(_core.ModelShape(4, 1, 1, 1), 1.0, 1.0, cost.comm, 7.0, 0.0, 10.0)
    assert deep.micro_batch_us([288.0, 0.0], 182.0, 16.0, 10) == 4 * (289 + 183) + 7 + 100  # not per layer
    # Scored placements: 6 on r0, 6 on r1, 7 sharded (4 a rank): 10 tokens on each rank.
    scored = _core.evaluate_placement([6, 6, 7], [0, 1, D], cost, 2, 10)
    assert list(scored.rank_tokens) == [10, 10] and scored.time_us == 289 + 183 + 7 + 100
    # 8 on r0 alone, 1 and 1 on r1: the fullest rank holds 8.
    assert _core.evaluate_placement([8, 1, 1], [0, 1, 1], cost, 2, 10).time_us == 449 + 7 + 80
    # Lower bound: max(a * 940 / 2 + b = 471, longest min(365, 10 + 183)) + 7, + 10 * 19 tokens / 2 ranks.
    assert cost.micro_batch_lower_bound_us([6, 6, 7], 2) == 471 + 7 + 95
    assert make_toy().token_us == 0.0


@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan, 2e3])
def test_rejected_out_of_range(make_toy, bad):
    with pytest.raises(ValueError, match=r"token_us must be finite and in \[0, 1000\], got (-1|inf|nan|2000)$"):
        with_head(make_toy(), bad)


def test_dacp_shards_a_long_sequence_to_even_the_tokens(make_toy):
    # [8, 1, 1] at CP 2, C = 10, a dear exchange (300 us): 8 whole on r0 costs comp(448) = 448;
    # sharded, max(300, comp(28)) + comp(224) = 524, so it stays whole. With 50 us a token the
    # whole 8 costs 448 + 8 * 50 = 848 and the sharded one 524 + 5 * 50 = 774 (4 + 1 a rank).
    cfg = SchedulerConfig(dp=1, cp=2, bucket_size=10).core_options()
    for head, placement, tokens, time_us in [(0.0, [0, 1, 1], [8, 2], 448.0), (50.0, [D, 0, 1], [5, 5], 774.0)]:
        cost = with_head(make_toy(comm_us=300.0), head)
        r = _core.dacp_for([8, 1, 1], cost, cfg)
        assert (list(r.cp_rank), list(r.rank_tokens), r.time_us) == (placement, tokens, time_us)
        ref = reference.dacp_for([8, 1, 1], reference.RefCost.of(cost), 2, 10, False, True, True)
        assert (ref.cp_rank, ref.time_us) == (placement, time_us)
        assert reference.lower_bound([8, 1, 1], reference.RefCost.of(cost), 2) == \
            cost.micro_batch_lower_bound_us([8, 1, 1], 2)


def test_every_micro_batch_pays_it_and_plans_stay_above_the_bounds(make_toy):
    rng = random.Random(0)
    base = make_toy(comm_us=20.0, b_us=1.0, fixed_us=5.0)
    cost = with_head(base, 3.0)
    for policy in ("skrull", "skrull-paper", "skrull-pool"):
        for _ in range(20):
            dp, cp = rng.choice([(1, 2), (2, 2), (2, 4), (4, 1)])
            lengths = [rng.randint(1, _core.max_sequence_length(16, cp)) for _ in range(rng.randint(1, 24))]
            cfg = SchedulerConfig(dp=dp, cp=cp, bucket_size=16, policy=policy, cpsat=False)
            plan = Scheduler(cfg, cost).schedule(lengths)
            plan.validate()
            for mb in plan.micro_batches:  # the plan's own times are the core's scores, head included
                assert mb.time_us >= base.micro_batch_fixed_us + 3.0 * max(mb.rank_tokens)
            world = dp * cp
            low = (bound.pool_lower_bound_us(lengths, cost, dp, cp, 16) if policy == "skrull-pool"
                   else bound.lower_bound_us(lengths, cost, dp, cp, 16, plan.timeline))
            assert plan.makespan_us >= low, (policy, lengths, dp, cp)
            # some rank holds at least the average tokens: the bound counts them
            assert bound.work_bound_us(lengths, cost, dp, cp, 16) == pytest.approx(
                bound.work_bound_us(lengths, base, dp, cp, 16) + 3.0 * sum(lengths) / world)


def test_pool_wide_micro_batch_pays_it_on_its_shard(make_toy):
    # 40 > C x CP = 20: one wide micro-batch over both groups (4 ranks, 10 tokens each) holds it.
    cfg = SchedulerConfig(dp=2, cp=2, bucket_size=10, policy="skrull-pool", cpsat=False)
    free = Scheduler(cfg, make_toy(comm_us=10.0, b_us=1.0)).schedule([40, 3, 4, 5])
    dear = Scheduler(cfg, with_head(make_toy(comm_us=10.0, b_us=1.0), 2.0)).schedule([40, 3, 4, 5])
    assert [mb.seqs for mb in dear.micro_batches] == [mb.seqs for mb in free.micro_batches] == [[0], [3], [1, 2]]
    for d, f in zip(dear.micro_batches, free.micro_batches):
        assert d.time_us - f.time_us == 2.0 * max(d.rank_tokens)
    assert max(dear.micro_batches[0].rank_tokens) == 10


def test_profile_key_optional_and_round_trips(make_toy):
    d = to_dict(make_toy(comm_us=10.0, b_us=1.0))
    assert "micro_batch" not in d and from_dict(d).token_us == 0.0
    d["micro_batch"] = {"fixed_us": 100.0, "token_us": 2.5, "token_points": 7}
    cm = from_dict(d)
    assert (cm.micro_batch_fixed_us, cm.token_us) == (100.0, 2.5)
    assert to_dict(cm)["micro_batch"] == {"fixed_us": 100.0, "token_us": 2.5}
    assert from_dict(d, free_running=True).token_us == 2.5  # both executions pay it alike
    d["micro_batch"] = {"token_us": -1.0}
    with pytest.raises(ValueError, match=r"profile: cost model: token_us must be finite and in \[0, 1000\], got -1$"):
        from_dict(d)
    d["micro_batch"] = {"token_us": "3 us"}
    with pytest.raises(ValueError, match=r"^profile: \[micro_batch\] token_us must be a number, got '3 us'$"):
        from_dict(d)


def test_profiler_names_what_a_model_lacks_to_time_the_head():
    from types import SimpleNamespace

    import torch

    from skrull_ext.profile.head import _parts

    model = torch.nn.Module()
    model.tok_embeddings, model.norm = torch.nn.Embedding(4, 2), torch.nn.LayerNorm(2)
    jm = SimpleNamespace(model=model, name="toy/flavor")
    with pytest.raises(ValueError, match=r"^toy/flavor: no lm_head to time the per-token head cost on"):
        _parts(jm)
    model.lm_head = torch.nn.Linear(2, 4)
    assert _parts(jm) == (model.tok_embeddings, model.norm, model.lm_head)
