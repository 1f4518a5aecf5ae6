"""check_plan_digests fails loudly on every rank when ranks disagree (gloo, 2 processes)."""

import os
import warnings

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from skrull_ext.scheduler import Scheduler, cost_model
from skrull_ext.train.job.skrull_config import SkrullConfig
from skrull_ext.train.step_checks import PlanMismatchError, check_plan_digests, gds_digest
from tests.integration_tests.launch import free_port

LENGTHS = [300, 20, 40, 500, 60, 80, 10, 200]


def _plan():
    config = SkrullConfig(bucket_size=256, cost_model="h100-assumed").scheduler_config(dp=1, cp=2, lookahead=1)
    return Scheduler(config, cost_model.preset("llama3-debug")).schedule(LENGTHS)


def _worker(rank: int, port: int, out: str) -> None:
    """Both cases in one gloo group: the same plan on both ranks, then rank 1's tampered."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    for tamper in (False, True):
        plan = _plan()
        if tamper and rank == 1:
            plan.micro_batch[0] += 1
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a deprecated collective's FutureWarning is a user-visible line each step
                check_plan_digests(plan, dp_rank=0)
            result = "ok"
        except PlanMismatchError as e:
            result = "mismatch: " + str(e)[:40]
        with open(f"{out}.{tamper}.{rank}", "w") as f:
            f.write(result)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[bool, list[str]]:
    """Each rank's result, untampered and tampered: one spawn of 2 processes for both
    (a spawned rank spends seconds importing torch; the checks take milliseconds)."""
    out = tmp_path_factory.mktemp("plan_check")
    mp.spawn(_worker, args=(free_port(), str(out / "result")), nprocs=2)
    return {tamper: [(out / f"result.{tamper}.{r}").read_text() for r in range(2)] for tamper in (False, True)}


@pytest.mark.slow
@pytest.mark.parametrize("tamper", [False, True])
def test_plan_digests_across_ranks(results, tamper):
    if tamper:
        assert all(r.startswith("mismatch: GDS plans differ") for r in results[tamper]), results
    else:
        assert results[tamper] == ["ok", "ok"]


def test_gds_digest_ignores_cp_placement_only():
    a, b = _plan(), _plan()
    assert gds_digest(a) == gds_digest(b) and a.digest() == b.digest()
    mb = b.micro_batches[b.micro_batch[0]]
    mb.first_rank[mb.seqs.index(0)] += 1  # another rank set (stored on its micro-batch), same micro-batch
    assert gds_digest(a) == gds_digest(b) and a.digest() != b.digest()


def test_the_step_line_says_whose_micro_batches_it_counts():
    """The step line said "N micro-batches" without saying per rank or in all."""
    from skrull_ext.train.step_checks import micro_batches_said

    def said(total, mine, most):
        return micro_batches_said({"skrull/micro_batches": total, "skrull/rank_micro_batches": mine,
                                   "skrull/max_micro_batches": most})

    assert said(8, 8, 8) == "8 micro-batches (all on this DP rank)"
    assert said(9, 4, 5) == "9 micro-batches over all DP ranks (4 on this one, 5 on the busiest)"
    assert said(1, 1, 1) == "1 micro-batch (all on this DP rank)"  # the README's job read "1 micro-batches"
    s = Scheduler(SkrullConfig(bucket_size=256, cost_model="h100-assumed").scheduler_config(2, 1, lookahead=1),
                  cost_model.preset("llama3-debug"))
    summary = s.schedule([200, 180, 150, 120, 90, 60, 40, 30]).summary()
    assert summary["micro_batches"] >= summary["max_micro_batches"] >= 1  # in all, and the busiest DP rank's
