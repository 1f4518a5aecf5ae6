"""Policy skrull-pool trains with the parity of the 1-process torchtitan reference (issue 18).

World 4 = DP 2 x CP 2 over gloo, bucket_size C = 128 on the debug job's data:
each step, sequences longer than C x CP = 256 tokens (314, 335, 379, 390, 512
in steps 2-5) would be cut by skrull; the pool shards them over all 4 ranks,
across both DP groups, while others stay local or sharded over one CP group.
Both runs train 2 steps (conftest.SHORT): step 2 is the first with such
sequences (335, 390 and 512 tokens), after one optimizer step. Its losses and
every gradient at step 2 equal the reference's (tests/integration_tests/
test_parity_skrull.py's standard), and nothing is truncated or dropped.

World 4 = DP 1 x CP 4 (test_pool_parity_cp4), bucket_size 472, priced on the
h100-assumed preset: at step 2 the planner narrows the 335-token sequence to
ranks 2-3 (a sub-group set) beside the 390- and 512-token ones on all 4 ranks
and five local ones; the losses and step 2's gradients equal the reference's.
"""

import os

import pytest

from skrull_ext.train.plan_log import read_plan_log
from tests.integration_tests.conftest import POOL_SUB_STEP
from tests.integration_tests.test_parity_skrull import _matches_reference_losses_and_grads

C, CP, WORLD = 128, 2, 4


@pytest.mark.slow
def test_pool_parity_dp2_cp2_spanning_dp_groups(skrull_runs, reference):
    run = skrull_runs["dp2cp2_pool"]
    assert "policy skrull-pool" in run.output
    _matches_reference_losses_and_grads(run, reference, short=True)
    assert sum(run.scalars("skrull/truncated")) == 0 and sum(run.scalars("skrull/dropped")) == 0
    plans = read_plan_log(os.path.join(run.dump, "skrull_plans", "rank0.jsonl"))
    check = plans[POOL_SUB_STEP]
    sets = list(zip(check["lengths"], check["plan_first_rank"], check["plan_num_ranks"]))
    # The check step ran sequences over C x CP on all 4 ranks (both DP groups), trained, not cut
    # (skrull would truncate them), and local ones.
    assert any(C * CP < n <= C * WORLD and (a, k) == (0, WORLD) for n, a, k in sets), sets
    assert all(k == WORLD for n, _, k in sets if n > C * CP), sets
    assert any(k == 1 for _, _, k in sets), sets
    # Rank 0 holds shards of the check step's sharded sequences: its DACP exchanged K/V.
    assert run.scalars("skrull/dacp_dist_seqs")[POOL_SUB_STEP - 1] > 0
    assert run.scalars("skrull/widened")[POOL_SUB_STEP - 1] >= 1


@pytest.mark.slow
def test_pool_parity_cp4(skrull_runs, reference):
    run = skrull_runs["dp1cp4_pool"]
    assert "policy skrull-pool" in run.output
    _matches_reference_losses_and_grads(run, reference, short=True)  # the sub-group step's gradients
    assert sum(run.scalars("skrull/truncated")) == 0 and sum(run.scalars("skrull/dropped")) == 0
    plans = read_plan_log(os.path.join(run.dump, "skrull_plans", "rank0.jsonl"))
    p = plans[POOL_SUB_STEP]
    sets = sorted(zip(p["lengths"], p["plan_first_rank"], p["plan_num_ranks"]))
    # The exact plan of tests/unit_tests/test_pool_subgroup.py: 335 tokens on ranks 2-3, 390 and 512 on all 4.
    assert sets == [(22, 3, 1), (47, 3, 1), (78, 2, 1), (109, 1, 1), (156, 0, 1), (335, 2, 2), (390, 0, 4),
                    (512, 0, 4)], sets
    assert run.scalars("skrull/narrowed")[POOL_SUB_STEP - 1] == 1
