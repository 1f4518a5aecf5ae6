"""Validation right before a free-running step whose DP ranks run different
micro-batch counts: the shipped text job at a global batch of 6 sequences,
DP 2 x CP 1 (free-running, the default), 2 steps, validation after step 1.
Step 2's plan gives DP rank 0 one micro-batch and rank 1 two (asserted from
the plan log, so the test keeps testing what it says if the data or the
scheduler change; at the job's own batch of 8, step 13 was the first such).

A forward-only pass left FSDP's backward-prefetch order behind, and this
step's ranks then all-gathered and reduce-scattered different units: gloo
aborted both ranks ("Received data size doesn't match expected size"). Now
the run completes and trains bitwise as the same job without validation
(both from the job's seed: a launch is reproducible bit for bit on CPU,
test_reproducible.py).
"""

import json
import os

import pytest

from tests.integration_tests.launch import REPO, Run, torchrun

JOB = os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu_text.toml")
HELD_OUT = os.path.join(REPO, "tests", "fixtures", "held_out.jsonl")
STEPS, AT, BATCH = 2, 1, 6


def _launch(workdir: str, name: str, extra: list[str]) -> Run:
    dump = os.path.join(workdir, name)
    proc = torchrun(2, "skrull_ext.train", [
        "--config-file", JOB, "--dump_folder", dump, "--training.steps", str(STEPS),
        "--dataloader.global_batch_size", str(BATCH), "--metrics.enable_tensorboard", "--skrull.plan_log", *extra,
    ], cwd=workdir)
    return Run(dump=dump, output=proc.stdout + proc.stderr, grads=None)


@pytest.mark.slow
def test_validation_before_an_uneven_free_running_step_trains_as_without_it(tmp_path):
    plain = _launch(str(tmp_path), "plain", [])
    assert len(plain.losses) == STEPS
    validated = _launch(str(tmp_path), "validated", ["--validation.enable", "--validation.dataset_path", HELD_OUT,
                                                     "--validation.freq", str(AT)])
    assert "free-running" in validated.output
    with open(os.path.join(validated.dump, "skrull_plans", "rank0.jsonl")) as f:
        plan = next(p for p in map(json.loads, f) if p["step"] == AT + 1)
    counts = [len({m for m, r in zip(plan["plan_micro_batch"], plan["plan_dp_rank"]) if r == rank})
              for rank in (0, 1)]
    assert counts[0] != counts[1], f"step {AT + 1} no longer runs different micro-batch counts: {counts}"
    assert f"validation step {AT}: loss " in validated.output
    assert len(validated.losses) == STEPS and validated.losses == plain.losses, \
        f"{validated.losses} vs {plain.losses}"
