"""The compiled module: version, constants, and bad arguments -> ValueError/TypeError."""

import pytest

import skrull_ext
from skrull_ext import _core
from skrull_ext.scheduler import cost_model as cm


def test_version_and_constants():
    assert skrull_ext.__version__ == "0.1.0"
    assert _core.DISTRIBUTED == -1
    assert _core.MAX_LENGTH == 1 << 36


def test_shard_tokens_and_limit():
    # Padded to a multiple of 2N, two of the 2N chunks per rank.
    assert _core.shard_tokens(7, 2) == 4
    assert _core.shard_tokens(8, 2) == 4
    assert _core.shard_tokens(9, 2) == 6
    assert _core.shard_tokens(9, 1) == 9
    assert _core.max_sequence_length(10, 1) == 10
    assert _core.max_sequence_length(10, 4) == 40
    assert _core.max_sequence_length(11, 4) == 40
    assert _core.max_sequence_length(1, 4) == 1  # whole on one rank


def _opts(**kw):
    o = _core.Options()
    for k, v in kw.items():
        setattr(o, k, v)
    return o


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"dp": 0}, r"dp must be in \[1, 65536\], got 0"),
        ({"cp": 0}, r"cp must be in \[1, 65536\], got 0"),
        ({"bucket_size": 0}, r"bucket_size must be in \[1, 68719476736\], got 0"),
        ({"max_extra_micro_batches": -1}, r"max_extra_micro_batches must be in \[0, 1024\], got -1"),
    ],
)
def test_bad_options_raise_value_error(kw, msg):
    with pytest.raises(ValueError, match=msg):
        _core.schedule([1, 2], cm.preset(), _opts(**kw))


@pytest.mark.parametrize("bad, msg", [([5, 0, 3], r"sequence 1 has length 0"), ([-4], r"sequence 0 has length -4")])
def test_bad_lengths_raise_value_error(bad, msg):
    with pytest.raises(ValueError, match=msg):
        _core.schedule(bad, cm.preset(), _opts())


def test_non_integer_lengths_raise_type_error():
    with pytest.raises(TypeError):
        _core.schedule([1.5], cm.preset(), _opts())
    with pytest.raises(TypeError):
        _core.schedule([1 << 70], cm.preset(), _opts())


def test_overlength_error_names_value_and_limit():
    with pytest.raises(ValueError, match=r"sequence 1 has length 50, longer than the 40 tokens .*bucket_size 10 x cp 4"):
        _core.schedule([3, 50], cm.preset(), _opts(cp=4, bucket_size=10))


def test_bad_cost_model_raises():
    with pytest.raises(ValueError, match=r"layers must be in \[1, 65536\], got 0"):
        _core.CostModel(_core.ModelShape(0, 8, 8), 1.0, 0.0, _core.CommModel([1.0], [1.0]))
    with pytest.raises(ValueError, match=r"a_us_per_flop must be finite"):
        _core.CostModel(_core.ModelShape(1, 8, 8), float("nan"), 0.0, _core.CommModel([1.0], [1.0]))
    with pytest.raises(ValueError, match=r"strictly ascending at point 1"):
        _core.CostModel(_core.ModelShape(1, 8, 8), 1.0, 0.0, _core.CommModel([2.0, 1.0], [1.0, 2.0]))
    with pytest.raises(ValueError, match=r"differ in length"):
        _core.CostModel(_core.ModelShape(1, 8, 8), 1.0, 0.0, _core.CommModel([1.0], [1.0, 2.0]))


def test_evaluate_placement_checks_ranks(toy):
    with pytest.raises(ValueError, match=r"cp_rank\[1\] = 2 is neither DISTRIBUTED"):
        _core.evaluate_placement([3, 4], [0, 2], toy, 2, 10)
    with pytest.raises(ValueError, match=r"cp_rank has 1 entries for 2 sequences"):
        _core.evaluate_placement([3, 4], [0], toy, 2, 10)


def test_empty_batch_gives_empty_plan():
    s = _core.schedule([], cm.preset(), _opts(dp=3, cp=2))
    assert list(s.dp_offsets) == [0, 0, 0, 0]
    assert list(s.micro_batches) == []
    assert s.makespan_us == 0.0
