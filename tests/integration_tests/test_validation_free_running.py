"""Validation right before a free-running step whose DP ranks run different
micro-batch counts: the shipped text job, DP 2 x CP 1 (free-running, the
default), 13 steps, validation at step 12. Step 13's plan gives DP rank 0 one
micro-batch and rank 1 two (asserted from the plan log, so the test keeps
testing what it says if the data or the scheduler change).

A forward-only pass left FSDP's backward-prefetch order behind, and this
step's ranks then all-gathered and reduce-scattered different units: gloo
aborted both ranks ("Received data size doesn't match expected size"). Now
the run completes and trains bitwise as the same job without validation.

The run without validation trains the 13 steps and saves a checkpoint at step
11; the run with validation continues from a copy of it (a resume is bitwise on
CPU: test_lookahead_resume.py), so it trains step 12, validates and trains the
uneven step 13 without training steps 1..11 a second time.
"""

import json
import os
import shutil

import pytest

from tests.integration_tests.launch import REPO, Run, torchrun

JOB = os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu_text.toml")
HELD_OUT = os.path.join(REPO, "tests", "fixtures", "held_out.jsonl")
STEPS, AT = 13, 12
SAVED = AT - 1
"""The step whose checkpoint the validated run continues from."""


def _launch(workdir: str, name: str, extra: list[str]) -> Run:
    dump = os.path.join(workdir, name)
    proc = torchrun(2, "skrull_ext.train", [
        "--config-file", JOB, "--dump_folder", dump, "--training.steps", str(STEPS),
        "--metrics.enable_tensorboard", "--skrull.plan_log", "--checkpoint.enable", *extra,
    ], cwd=workdir)
    return Run(dump=dump, output=proc.stdout + proc.stderr, grads=None)


@pytest.mark.slow
def test_validation_before_an_uneven_free_running_step_trains_as_without_it(tmp_path):
    plain = _launch(str(tmp_path), "plain", ["--checkpoint.interval", str(SAVED)])
    assert len(plain.losses) == STEPS
    name = os.path.join("checkpoint", f"step-{SAVED}")
    shutil.copytree(os.path.join(plain.dump, name), os.path.join(tmp_path, "validated", name))
    validated = _launch(str(tmp_path), "validated", ["--validation.enable", "--validation.dataset_path", HELD_OUT,
                                                     "--validation.freq", str(AT), "--checkpoint.load_only"])
    assert f"Training starts at step {SAVED + 1}" in validated.output
    assert "free-running" in validated.output
    with open(os.path.join(validated.dump, "skrull_plans", "rank0.jsonl")) as f:
        plan = next(p for p in map(json.loads, f) if p["step"] == AT + 1)
    counts = [len({m for m, r in zip(plan["plan_micro_batch"], plan["plan_dp_rank"]) if r == rank})
              for rank in (0, 1)]
    assert counts[0] != counts[1], f"step {AT + 1} no longer runs different micro-batch counts: {counts}"
    assert f"validation step {AT}: loss " in validated.output
    assert len(validated.losses) == STEPS - SAVED and validated.losses == plain.losses[SAVED:], \
        f"{validated.losses} vs {plain.losses[SAVED:]}"
