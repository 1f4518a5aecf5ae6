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


@pytest.fixture
def mix_order():
    triton = torch._inductor.config.triton
    before = triton.mix_order_reduction
    yield triton
    triton.mix_order_reduction = before


def test_compiled_job_turns_off_the_length_guarded_fusion(mix_order):
    """The CUDA config a compiled Skrull job resolves: inductor's mix-order reduction, whose size
    conditions on the token count recompiled an H200 run mid-way, off; eager jobs leave it."""
    from skrull_ext.train.compile_limit import length_free_fusion

    mix_order.mix_order_reduction = True
    assert length_free_fusion(False) is None and mix_order.mix_order_reduction is True
    line = length_free_fusion(True)
    assert mix_order.mix_order_reduction is False and "mix_order_reduction off" in line
    assert length_free_fusion(True) is None  # already off: nothing to say


def test_compile_settings_mark_a_compiled_jobs_blocks_only(mix_order, limit):
    """A compiled job's blocks get the token-dimension hook (train/dynamic_tokens.py) and its two
    settings' lines; an eager job's blocks and settings stay as they were, nothing to log."""
    from torch import nn

    from skrull_ext.train.compile_limit import compile_settings
    from skrull_ext.train.dynamic_tokens import mark_tokens

    torch._dynamo.config.recompile_limit = 8
    mix_order.mix_order_reduction = True
    part = nn.Module()
    part.layers = nn.ModuleDict({"0": nn.Linear(2, 2), "1": nn.Linear(2, 2)})
    assert compile_settings(False, [part]) == []
    assert all(not b._forward_pre_hooks for b in part.layers.values())
    lines = compile_settings(True, [part])
    assert len(lines) == 2 and "recompile_limit" in lines[0] and "mix_order_reduction" in lines[1]
    assert all(list(b._forward_pre_hooks.values()) == [mark_tokens] for b in part.layers.values())
