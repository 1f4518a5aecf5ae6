"""A cost model with another ``comm.plan_margin`` (cpp/include/skrull/hedge.hpp), all else kept."""

from skrull_ext import _core


def with_margin(cost: _core.CostModel, margin: float) -> _core.CostModel:
    c = cost.comm
    comm = _core.CommModel(list(c.bytes), list(c.us), c.threshold_bytes, c.floor_us, c.collectives_per_layer,
                           c.cross_group_factor, margin)
    return _core.CostModel(cost.shape, cost.a_us_per_flop, cost.b_us, comm, cost.micro_batch_fixed_us,
                           cost.step_fixed_us, cost.token_us)
