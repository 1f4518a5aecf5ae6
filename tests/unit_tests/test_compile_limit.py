"""A compiled Skrull job raises dynamo's recompile limit (skrull_ext/train/compile_limit.py):
past it, torchtitan's fullgraph=True block compile fails the run instead of falling back."""

import pytest
import torch

from skrull_ext.train.compile_limit import raise_recompile_limit, SKRULL_RECOMPILE_LIMIT


@pytest.fixture
def limit():
    before = torch._dynamo.config.recompile_limit
    yield
    torch._dynamo.config.recompile_limit = before


def test_compiled_job_raises_the_limit_once(limit):
    torch._dynamo.config.recompile_limit = 8  # torch's default
    line = raise_recompile_limit(True)
    assert torch._dynamo.config.recompile_limit == SKRULL_RECOMPILE_LIMIT >= 16
    assert line is not None and f"recompile_limit 8 -> {SKRULL_RECOMPILE_LIMIT}" in line
    assert raise_recompile_limit(True) is None  # already there: nothing to say


def test_eager_job_and_a_higher_limit_are_left_alone(limit):
    torch._dynamo.config.recompile_limit = 8
    assert raise_recompile_limit(False) is None and torch._dynamo.config.recompile_limit == 8
    torch._dynamo.config.recompile_limit = 64  # a user's own, higher setting stays
    assert raise_recompile_limit(True) is None and torch._dynamo.config.recompile_limit == 64
