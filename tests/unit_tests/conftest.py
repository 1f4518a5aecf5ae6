"""Shared fixtures: a toy cost model whose numbers can be computed by hand."""

import pytest

from skrull_ext._core import CommModel, CostModel, ModelShape


def toy_cost(comm_us: float = 0.0, b_us: float = 0.0, fixed_us: float = 0.0) -> CostModel:
    """layers=1, h=h_kv=1, 1 byte: flops(s) = 24 s + 4 s^2; T_comp(F) = F + b; flat comm;
    fixed_us added once to every micro-batch."""
    return CostModel(
        shape=ModelShape(layers=1, hidden=1, kv_width=1, bytes_per_elem=1),
        a_us_per_flop=1.0,
        b_us=b_us,
        comm=CommModel(bytes=[1.0], us=[comm_us], collectives_per_layer=1.0),
        micro_batch_fixed_us=fixed_us,
    )


@pytest.fixture
def toy():
    return toy_cost()


@pytest.fixture
def make_toy():
    return toy_cost
