"""Every simulator policy yields valid plans; skrull never predicts slower than skrull-paper."""

import pytest

from skrull_ext.scheduler import cost_model
from skrull_ext.sim import chunkflow, simulator
from skrull_ext.sim import policies as P
from skrull_ext.sim.packing import Shape

SHAPES = [
    Shape(dp=4, cp=8, batch_size=16, bucket_size=26624),
    Shape(dp=2, cp=16, batch_size=10, bucket_size=13312),
    Shape(dp=3, cp=2, batch_size=7, bucket_size=4096),
    Shape(dp=2, cp=1, batch_size=8, bucket_size=26624),
]
PLANNERS = [name for name, p in P.SIM_POLICIES.items() if not p.is_bound]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"dp{s.dp}cp{s.cp}C{s.bucket_size}")
@pytest.mark.parametrize("dataset", ["chatqa2", "lmsyschat1m", "mix_sharegpt_conv95+longbench_en5"])
def test_every_policy_plan_validates(shape, dataset):
    cost = cost_model.preset("qwen2.5-0.5b")
    batches, _ = simulator.global_batches(dataset, shape, 2, seed=3)
    for batch in batches:
        for name in PLANNERS:
            plan = P.get(name).plan(batch, cost, shape, 0)
            plan.validate()  # memory within BucketSize, each (piece of a) sequence exactly once
            if name.startswith("chunkflow"):  # its plan is over pieces
                assert sum(plan.lengths) == sum(batch)
            else:
                assert plan.input_lengths == batch and not plan.dropped
        assert P.get("bound").plan(batch, cost, shape, 0) > 0


def test_chunkflow_pieces_cover_each_sequence_once(toy):
    lengths = [50, 350, 20, 120, 7, 300, 30, 10]
    plan, pieces = chunkflow.plan(lengths, toy, Shape(dp=2, cp=4, batch_size=4, bucket_size=100), chunk=200)
    plan.validate()
    covered = {}
    for k, start, n in pieces:
        covered.setdefault(k, []).append((start, n))
    assert {k: sum(n for _, n in v) for k, v in covered.items()} == dict(enumerate(lengths))


@pytest.mark.parametrize("dataset", ["wikipedia", "chatqa2", "sharegpt_v3_conversations.qwen"])
@pytest.mark.parametrize("model", ["qwen2.5-0.5b", "qwen2.5-7b"])
def test_skrull_never_slower_than_skrull_paper(dataset, model):
    shape = Shape(dp=4, cp=8, batch_size=64, bucket_size=26624 if model == "qwen2.5-0.5b" else 13312)
    res = simulator.simulate(simulator.Scenario(dataset, model, shape), ["skrull-paper", "skrull", "bound"],
                             iterations=3, seed=5)
    for ours, paper in zip(res.per_policy["skrull"], res.per_policy["skrull-paper"]):
        assert ours.time_us <= paper.time_us
        assert ours.time_us >= ours.bound_us


def test_unknown_policy_names_the_choices():
    with pytest.raises(ValueError, match=r"unknown policy 'fifo'; choose one of \['baseline'"):
        P.get("fifo")
