"""Free-running steps (``[skrull] free_running``, issue 23 item 3) on real gloo processes.

DP 2 x CP 2 (4 processes), the debug job from the shared seed checkpoint:
FSDP keeps each step's parameters unsharded from the rank's first forward to
its last backward, gradients are reduce-scattered once, and each DP rank runs
only its own micro-batches. The debug data gives the two DP ranks unequal
micro-batch counts at some step (read from the plan log); the losses and the
check step's gradients must still equal torchtitan's 1-process reference (the
parity standard of test_parity_skrull.py), over 5 steps, so no step used a
stale unsharded parameter after the previous optimizer step.

Every rank counts its model's forward passes per step (probe.py,
``SKRULL_PROBE_PASSES``): free-running, a rank runs exactly its DP rank's own
micro-batches (one pad where it has none); the lockstep run of the same job
(``dp2cp2``) runs the plan's count on every rank, pads included
(test_parity_skrull.py's test_lockstep_runs_the_plans_count_on_every_rank,
beside the parity checks that launch that run).
"""

import os
import re

import pytest

from skrull_ext.train.plan_log import read_plan_log
from tests.integration_tests.conftest import CHECK_STEP, POOL_SUB_STEP, STEPS
from tests.integration_tests.launch import assert_same_grads
from tests.integration_tests.test_parity_skrull import (GRAD, _matches_reference, _matches_reference_losses_and_grads,
                                                        forward_passes, own_counts)

WORLD, CP = 4, 2


def _plans(run, world: int = WORLD) -> dict[int, dict[int, dict]]:
    return {rank: read_plan_log(os.path.join(run.dump, "skrull_plans", f"rank{rank}.jsonl")) for rank in range(world)}


@pytest.mark.slow
def test_free_running_parity_dp2_cp2_unequal_micro_batch_counts(skrull_runs, reference):
    run = skrull_runs["dp2cp2_free"]
    assert "timeline free" in run.output, "the trainer did not plan for the free-running timeline"
    assert "Skrull execution: skrull.free_running = true: free-running; it needs" in run.output, \
        "the memory check against the profile did not run"
    # what free-running holds, as the trainer budgets it, logged per step for the memory report
    held = float(re.search(r"unsharded parameters and gradients ([0-9.]+) MiB", run.output).group(1))
    logged = run.scalars("skrull/free_running_bytes")
    assert len(logged) == STEPS and all(abs(b / 2**20 - held) < 0.1 for b in logged), (held, logged)
    plans, passes = _plans(run), forward_passes(skrull_runs.passes_folder("dp2cp2_free"), WORLD)
    # the start-up line names Skrull's batch, the sequences every step's plan holds
    said = int(re.search(r"Skrull: global batch (\d+) sequences a step", run.output).group(1))
    assert all(len(plans[0][s]["plan_dp_rank"]) == said for s in range(1, STEPS + 1)), said
    counts = {s: own_counts(plans[0][s]) for s in range(1, STEPS + 1)}
    print(f"own micro-batches per DP rank by step: {counts}\nforward passes per world rank: {passes}")
    unequal = [s for s, c in counts.items() if c.get(0, 0) != c.get(1, 0)]
    assert unequal, f"no step gives the DP ranks unequal micro-batch counts: {counts}"
    for rank in range(WORLD):
        for s in range(1, STEPS + 1):
            d = plans[rank][s]["dp_rank"]
            assert d == rank // CP
            assert passes[rank][s] == max(1, counts[s].get(d, 0)), (rank, s, passes[rank][s], counts[s])
    s = unequal[0]
    assert passes[0][s] != passes[WORLD - 1][s], "the DP ranks ran as many passes at an unequal step"
    _matches_reference(run, reference)  # the 5 losses, and the gradients of CHECK_STEP
    # The gradients of a step whose DP ranks accumulated unequal micro-batch counts before the one reduce-scatter.
    assert POOL_SUB_STEP in unequal, f"step {POOL_SUB_STEP} (its gradients saved) has equal counts: {counts}"
    worst, rel = assert_same_grads(run.step_grads[POOL_SUB_STEP], reference.step_grads[POOL_SUB_STEP], **GRAD)
    print(f"step {POOL_SUB_STEP} (DP ranks {counts[POOL_SUB_STEP]} micro-batches) gradients vs torchtitan: "
          f"max |diff| {worst:.3g}, relative norm {rel:.3g}; check step {CHECK_STEP}: {counts[CHECK_STEP]}")


@pytest.mark.slow
def test_replicate_deferred_runs_free_with_unequal_counts(skrull_runs, reference):
    """Replicate-only DP under ``defer_grad_sync`` (``dp2rep_defer``: DP 2 x CP 1, nothing held
    unsharded) plans for the free-running timeline, and runs as planned: each rank exactly its DP
    rank's own micro-batches (one pad where it has none), unequal counts at step 2, and the losses
    and step-2 gradients of torchtitan's 1-process reference. Before, its loader padded every rank
    to the plan's slots, pad passes no free-running plan prices."""
    run = skrull_runs["dp2rep_defer"]
    assert "timeline free" in run.output and "Skrull execution: skrull.free_running = false" in run.output
    world, steps = 2, POOL_SUB_STEP
    plans, with_passes = _plans(run, world), forward_passes(skrull_runs.passes_folder("dp2rep_defer"), world)
    counts = {s: own_counts(plans[0][s]) for s in range(1, steps + 1)}
    print(f"own micro-batches per DP rank by step: {counts}\nforward passes per rank: {with_passes}")
    for rank in range(world):
        for s in range(1, steps + 1):
            assert with_passes[rank][s] == max(1, counts[s].get(rank, 0)), (rank, s, with_passes[rank][s], counts[s])
    assert counts[POOL_SUB_STEP].get(0, 0) != counts[POOL_SUB_STEP].get(1, 0), counts
    _matches_reference_losses_and_grads(run, reference, short=True)
