"""The CP-SAT fallback in a real CP=2 run: both ranks agree, training is exact.

Each rank of a CP group plans its global batch itself, so the exact solver
runs once per rank, in separate processes. With the fallback forced on
every micro-batch (``cpsat_margin = 0``, policy ``skrull-fast``) on the
debug CPU job, CP-SAT replaces some of the heuristic's placements
(asserted: rank 0's ``skrull/cpsat_used`` counter, and the logged
placements differ from the heuristic's exactly at those steps); the two
ranks' plans are identical at every step (their plan logs, besides the
trainer's own cross-rank ``check_plan_hash``), and the losses and the
check-step gradients still match torchtitan's 1-process run.
"""

import os

import pytest

from skrull_ext import Scheduler, SchedulerConfig
from skrull_ext.scheduler import cost_model as cost_models
from skrull_ext.train.plan_log import read_plan_log
from tests.integration_tests.conftest import PLAN_PROFILE, STEPS
from tests.integration_tests.test_parity_skrull import _matches_reference

PROFILE = PLAN_PROFILE  # the cost model the runs plan with (conftest.py)


def _plans(run, rank: int) -> dict:
    return read_plan_log(os.path.join(run.dump, "skrull_plans", f"rank{rank}.jsonl"))


@pytest.mark.slow
def test_cpsat_replaces_placements_and_ranks_agree(skrull_runs, reference):
    run = skrull_runs["cp2_cpsat"]
    used = run.scalars("skrull/cpsat_used")
    print(f"CP-SAT placements per step: {used}")
    assert len(used) == STEPS and sum(used) > 0, f"CP-SAT replaced no placement: {used}"

    r0, r1 = _plans(run, 0), _plans(run, 1)
    assert sorted(r0) == sorted(r1) == list(range(1, STEPS + 1))
    for step in r0:
        a, b = r0[step], r1[step]
        for key in ("samples", "plan_cp_rank", "plan_micro_batch", "plan_dp_rank", "plan_digest", "gds_digest"):
            assert a[key] == b[key], f"step {step}: ranks 0 and 1 disagree on {key}"

    # The heuristic alone (same policy, no fallback) on the logged batches:
    # the run's placements differ from it exactly where CP-SAT replaced some.
    heuristic = Scheduler(SchedulerConfig(dp=1, cp=2, bucket_size=256, policy="skrull-fast", overlength="truncate",
                                          cpsat=False), cost_models.load(PROFILE))
    changed = [s for s in r0 if heuristic.schedule(r0[s]["lengths"], dp_rank=0).cp_rank != r0[s]["plan_cp_rank"]]
    replaced = [s for s, n in zip(range(1, STEPS + 1), used) if n > 0]
    print(f"steps whose placements CP-SAT changed: {changed}; steps it replaced placements: {replaced}")
    assert changed == replaced

    _matches_reference(run, reference)
