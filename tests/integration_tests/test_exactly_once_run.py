"""Issue 54: a look-ahead run's summary equals what its plan log shows trained, and
torchtitan's batching never continues a checkpoint saved inside a window.

A 3-step run with W = 8 (the debug job, DP 2): the width is capped at the run's 3 steps,
said once at start-up, so its one window is the run and every sample it reads is trained
once. Its checkpoint of step 2 lies inside that window (its last step, 3, comes after the
checkpoint: 3 steps are the fewest that show it): continued with ``--skrull.no-enable`` it
is refused in one line (torchtitan's batching would train some of the window's samples twice
and others never).
Stops inside a window and resumes with another width: test_lookahead_resume.py.
"""

import os
import shutil

import pytest

from tests.integration_tests.exactly_once import check_exactly_once, trained
from tests.integration_tests.launch import REPO, torchrun

JOB = ["--config-file", os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu.toml")]
STEPS = 3


@pytest.mark.slow
def test_a_window_wider_than_the_run_is_capped_and_trains_every_sample_once(tmp_path):
    dump = str(tmp_path / "w8")
    run = torchrun(2, "skrull_ext.train", [*JOB, "--dump_folder", dump, "--training.steps", str(STEPS),
                                           "--skrull.lookahead", "8", "--skrull.plan_log", "--checkpoint.enable",
                                           "--checkpoint.interval", "2"], cwd=str(tmp_path))
    out = run.stdout + run.stderr
    assert out.count(f"skrull.lookahead 8 is wider than the run (training.steps {STEPS}): capped at {STEPS}") == 1
    assert "ends inside look-ahead window" not in out
    check_exactly_once(trained(dump, range(1, STEPS + 1)), out, read_to=STEPS)

    # torchtitan's batching on the checkpoint of step 2, inside the window of steps 1..3: refused.
    resumed = str(tmp_path / "titan")
    shutil.copytree(os.path.join(dump, "checkpoint", "step-2"), os.path.join(resumed, "checkpoint", "step-2"))
    proc = torchrun(2, "skrull_ext.train", [*JOB, "--dump_folder", resumed, "--training.steps", str(STEPS),
                                            "--skrull.no-enable", "--checkpoint.enable"], cwd=str(tmp_path),
                    expect_failure=True, real=False)  # the refusal, not torchrun's summary of it
    out = proc.stdout + proc.stderr
    assert (f"error: the checkpoint of step 2 was saved inside a look-ahead window (steps 1..{STEPS}, "
            f"skrull.lookahead {STEPS}), "
            "whose samples Skrull batching regrouped over those steps") in out, out[-3000:]
    assert "Training starts" not in out
