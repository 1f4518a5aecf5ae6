"""Policy skrull-pool trains with the parity of the 1-process torchtitan reference (issue 18).

World 4 = DP 2 x CP 2 over gloo, bucket_size C = 128 on the debug job's data:
each step, sequences longer than C x CP = 256 tokens (314, 335, 379, 390, 512
in steps 2-5) would be cut by skrull; the pool shards them over all 4 ranks,
across both DP groups, while others stay local or sharded over one CP group.
Losses of the 5 steps and every gradient at the check step (step 4: a
314-token sequence over ranks 0-3, a 233-token one over ranks 0-1, the rest
local on ranks 2 and 3) equal the reference's (tests/integration_tests/
test_parity_skrull.py's standard), and nothing is truncated or dropped.
"""

import os

import pytest

from skrull_ext.plan_log import read_plan_log
from tests.integration_tests.conftest import CHECK_STEP, STEPS
from tests.integration_tests.test_parity_skrull import _matches_reference_losses_and_grads

C, CP, WORLD = 128, 2, 4


@pytest.mark.slow
def test_pool_parity_dp2_cp2_spanning_dp_groups(skrull_runs, reference):
    run = skrull_runs["dp2cp2_pool"]
    assert "policy skrull-pool" in run.output
    _matches_reference_losses_and_grads(run, reference)
    assert sum(run.scalars("skrull/truncated")) == 0 and sum(run.scalars("skrull/dropped")) == 0
    plans = read_plan_log(os.path.join(run.dump, "skrull_plans", "rank0.jsonl"))
    check = plans[CHECK_STEP]
    sets = list(zip(check["lengths"], check["plan_first_rank"], check["plan_num_ranks"]))
    # The check step ran a sequence over C x CP on all 4 ranks (both DP groups), and local ones.
    assert any(C * CP < n <= C * WORLD and (a, k) == (0, WORLD) for n, a, k in sets), sets
    assert any(k == 1 for _, _, k in sets), sets
    # Every step past the first had such a sequence: trained, not cut (skrull would truncate it).
    for step in range(2, STEPS + 1):
        p = plans[step]
        assert any(n > C * CP and k == WORLD for n, k in zip(p["lengths"], p["plan_num_ranks"])), p
    # Rank 0 holds shards of the check step's sharded sequences: its DACP exchanged K/V.
    assert run.scalars("skrull/dacp_dist_seqs")[CHECK_STEP - 1] > 0
    assert run.scalars("skrull/widened")[CHECK_STEP - 1] >= 1
