"""A pad pass (CostModel.pad_pass_us, cpp/include/skrull/cost_model.hpp): what a rank runs at a lockstep
slot where it holds no micro-batch (a pad chunk runs more: CostModel.pad_chunks_us). The trainer feeds every CP rank one ignored local
token (data/steps/buffers.py pad_buffer) through every layer and the head, so it is priced as that
micro-batch, layers x layer_us(0, flops(1), 0) + micro_batch_fixed_us + token_us: each layer call's
intercept or host floor, not the fixed cost alone. Exact small cases, by hand, with and without a floor."""

import time

import pytest

from skrull_ext import _core
from skrull_ext.bench.reference_cost import RefCost
from skrull_ext.scheduler.config import SchedulerConfig
from skrull_ext.sim.packing import Shape, all_sharded_plan


def _cost(layers: int = 1, b_us: float = 0.0, fixed_us: float = 0.0, token_us: float = 0.0,
          floor_us: float = 0.0) -> _core.CostModel:
    """h = h_kv = 1: flops(s) = 24 s + 4 s^2 (flops(1) = 28), a microsecond a FLOP, no exchange cost."""
    return _core.CostModel(_core.ModelShape(layers, 1, 1, 1), 1.0, b_us, _core.CommModel([1.0], [0.0]),
                           micro_batch_fixed_us=fixed_us, token_us=token_us, host_floor_us=floor_us)


@pytest.mark.parametrize(("floor_us", "want"), [(0.0, 3 * (28 + 2) + 5 + 0.5), (40.0, 3 * 40 + 5 + 0.5)])
def test_a_pad_pass_is_one_token_through_every_layer(floor_us, want):
    cost = _cost(layers=3, b_us=2.0, fixed_us=5.0, token_us=0.5, floor_us=floor_us)
    assert cost.pad_pass_us() == want
    assert cost.pad_pass_us() == cost.micro_batch_us([cost.flops(1)], 0.0, 0.0, 1)  # any micro-batch's price
    assert RefCost.of(cost).pad() == want  # the labelled reference (bench/reference_chunked.py prices by it)
    assert cost.pad_pass_us() > cost.micro_batch_fixed_us


@pytest.mark.parametrize(("floor_us", "want"), [(0.0, 37.0 + 33.0), (40.0, 45.0 + 45.0)])
def test_a_lockstep_idle_slot_costs_a_pad_pass(floor_us, want):
    # DP 2 x CP 2, every sequence sharded (no exchange cost), fixed 5: a sequence of 1 token is a shard of
    # flops(1) / 2 = 14 a rank (19), of 2 tokens 64 / 2 = 32 (37); a pad pass 28 + 5 = 33. Slot 0: 1 on
    # DP 0, 2 on DP 1: 37. Slot 1: 1 on DP 0, DP 1 idle: max(19, 33) = 33 (the fixed cost alone said 19).
    # At a floor of 40 each call is 40: 45 a micro-batch, and the pad 40 + 5 = 45 (the fixed cost alone
    # said 5): under a floor a real micro-batch costs at least a pad pass, so an idle slot ties it.
    cost = _cost(fixed_us=5.0, floor_us=floor_us)
    shape = Shape(dp=2, cp=2, batch_size=2, bucket_size=8, timeline="lockstep")
    plan = all_sharded_plan([1, 1, 2], [[[0], [1]], [[2]]], cost, shape, time.perf_counter())
    assert plan.pad_us == cost.pad_pass_us() == (45.0 if floor_us else 33.0)
    assert [mb.slot for mb in plan.micro_batches] == [0, 0, 1]
    assert plan.makespan_us == want == plan.step_time_us()


@pytest.mark.parametrize(("floor_us", "pads", "ranks"),
                         [(0.0, [28.0, 36.0 * 4 / 3 + 44.0 + 28.0 / 3], [0, 1, 1]),
                          (40.0, [40.0, 40.0 * 4 / 3 + 44.0 + 40.0 / 3], [0, 1, 1])])
def test_a_lockstep_chunked_step_prices_its_pad_chunks_as_chunks(floor_us, pads, ranks):
    # Documents of 6, 5 and 2 us in 3, 1 and 1 chunk passes (3, 1 and 1 tokens) on 2 lockstep DP ranks, no
    # samples (cpp/tests/test_core.cpp test_chunked_lockstep). LPT's [0, 1, 1]: positions [3, 1], DP 0 runs
    # an all-pad position of 1 (a pad chunk after no token: flops(1) = 28, or the floor), DP 1 pads its
    # 1-token document twice: after 1 token (flops(2) - flops(1) = 36, recomputed: 4/3 of it or of the
    # floor) and after 2 (44, the position's last), and its document's one chunk, now checkpointed, is
    # recomputed (1/3 of 28, or of the floor). A pad pass each (28 or 40) priced DP 1's at 56 or 80.
    # Round robin's [0, 1, 0]: DP 1 pads 3 (5 + those 2 + 28 or 40): LPT.
    cost = _cost(floor_us=floor_us)
    opts = SchedulerConfig(dp=2, cp=1, bucket_size=100, timeline="lockstep").core_options()
    s = _core.schedule([], cost, opts, [6.0, 5.0, 2.0], [3, 1, 1], [3, 1, 1], [1, 1, 1])
    assert s.chunked_dp_rank == ranks and s.chunked_pad_us == pytest.approx(pads)
    assert list(s.dp_time_us) == pytest.approx([6.0 + pads[0], 7.0 + pads[1]])
    assert s.makespan_us == pytest.approx(7.0 + pads[1]) and pads[1] > 2 * cost.pad_pass_us()
    assert _core.to_plan(s, cost, opts).makespan_us == s.makespan_us
    assert _core.chunked_after([6.0, 5.0, 2.0], ranks, 2, opts.timeline, s.chunked_pad_us) == list(s.dp_time_us)