"""Bad input is refused with a ValueError naming it, never a crash or a bad
plan (issue 7). Each test here pins a defect the hardening work found; the
fuzzer (tools/fuzz.sh) and docs/reliability.md cover the rest."""

import pytest

from skrull_ext import _core
from skrull_ext import cost_model as cm


def test_dacp_refuses_unknown_placement_and_rollback():
    # Found by review: the dacp binding checked cp and bucket but not the
    # enums, so Placement(7) silently ran as worst-fit.
    c = cm.preset()
    with pytest.raises(ValueError, match=r"unknown placement 7"):
        _core.dacp([1, 2, 3], c, 2, 10, _core.Placement(7), _core.Rollback.LONGEST)
    with pytest.raises(ValueError, match=r"unknown rollback 9"):
        _core.dacp([1, 2, 3], c, 2, 10, _core.Placement.LEAST_LOAD, _core.Rollback(9))


@pytest.mark.parametrize(
    "args, msg",
    [
        (([0], 2, 10), r"sequence 0 has length 0, outside \[1, 68719476736\]"),
        (([1], 0, 10), r"cp must be in \[1, 65536\], got 0"),
        (([1], 2, 0), r"bucket_size must be in \[1, 68719476736\], got 0"),
        (([1 << 40], 2, 10), r"sequence 0 has length 1099511627776"),
    ],
)
def test_dacp_refuses_out_of_range_arguments(args, msg):
    lengths, cp, bucket = args
    with pytest.raises(ValueError, match=msg):
        _core.dacp(lengths, cm.preset(), cp, bucket)
    with pytest.raises(ValueError, match=msg):
        _core.evaluate_placement(lengths, [-1] * len(lengths), cm.preset(), cp, bucket)
