"""The suite's forked launcher (forked.py) gives each rank torchrun's
environment, and ends the job when one rank fails, as torchrun does."""

import time

import pytest

from tests.integration_tests import forked
from tests.integration_tests.launch import _env


@pytest.mark.slow
def test_ranks_get_torchruns_environment_and_a_failure_ends_the_job(tmp_path):
    rc, out = forked.launch(2, "tests.integration_tests.rank_exit", ["0"], str(tmp_path), _env(), timeout=120)
    assert rc == 0, out
    lines = sorted(line for line in out.splitlines() if line.startswith("RANK="))
    assert [line.split()[:4] for line in lines] == [
        [f"RANK={r}", f"LOCAL_RANK={r}", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2"] for r in (0, 1)], out
    assert all(f"argv=['0'] cwd={tmp_path}" in line for line in lines), out
    start = time.monotonic()
    rc, out = forked.launch(2, "tests.integration_tests.rank_exit", ["3"], str(tmp_path), _env(), timeout=120)
    assert rc == 3, out  # rank 1's status; rank 0, asleep, was stopped
    assert time.monotonic() - start < 30, "rank 0 outlived the failed rank"
