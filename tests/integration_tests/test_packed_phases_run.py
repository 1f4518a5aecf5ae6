"""The README's main job under torchtitan's batching (``--skrull.no-enable``: PackedTrainer,
train/packed_trainer.py), 2 processes, CP 2, timed by the same phases as Skrull's steps
(train/step_phases.py): every logged step's phases in TensorBoard under the same tags, their
sum within the step, the step line's clause a step later and the same closing lines. Keys and
sums only, no timing (the unit tests drive the phases on a clock of their own:
tests/unit_tests/test_packed_phases.py)."""

import math
import os

import pytest

from tests.integration_tests.launch import REPO, Run, torchrun

JOB = os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu.toml")
STEPS = 3
RAN = ("data", "checks", "mb", "clip", "opt", "log")
"""The phases this job runs every step: every step logged (log_freq 1); no chunked sample."""
IN_STEP = ("checks", "mb", "clip", "opt")
"""What the step as run counts besides its rest: not the data wait, not the logging."""


@pytest.fixture(scope="module")
def packed_run(tmp_path_factory) -> Run:
    work = str(tmp_path_factory.mktemp("packed_phases"))
    dump = os.path.join(work, "run")
    proc = torchrun(2, "skrull_ext.train", [
        "--config-file", JOB, "--parallelism.context_parallel_degree", "2", "--skrull.no-enable",
        "--dump_folder", dump, "--training.steps", str(STEPS), "--metrics.enable_tensorboard",
    ], cwd=work)
    return Run(dump=dump, output=proc.stdout + proc.stderr, grads=None)


@pytest.mark.slow
def test_each_step_is_timed_by_the_same_phases(packed_run):
    """The same tags as a Skrull run's (test_text_run.py), but ``chunk`` (never run here) and the
    measured / predicted ratio (nothing predicted); the phases and the untimed rest sum to the
    step, the step as run is its in-step phases and rest, the per-step term's phases its outside."""
    tags = {f"skrull/phase_{k}_ms" for k in (*RAN, "rest")} | {"skrull/step_outside_ms", "skrull/measured_us"}
    m = {tag: packed_run.scalars(tag) for tag in tags}
    for tag, values in m.items():
        assert len(values) == STEPS and all(math.isfinite(v) for v in values), (tag, values)
    from skrull_ext.bench.train_report import scalars

    written = set(scalars(packed_run.dump))
    assert "skrull/phase_chunk_ms" not in written and "skrull/measured_over_predicted" not in written
    for k in range(STEPS):
        assert all(m[f"skrull/phase_{p}_ms"][k] >= 0 for p in RAN)
        assert m["skrull/phase_rest_ms"][k] >= -1e-6  # the phases' sum is within the step
        outside = sum(m[f"skrull/phase_{p}_ms"][k] for p in ("checks", "clip", "opt"))
        assert math.isclose(m["skrull/step_outside_ms"][k], outside, rel_tol=1e-5)
        as_run = sum(m[f"skrull/phase_{p}_ms"][k] for p in IN_STEP) + m["skrull/phase_rest_ms"][k]
        assert math.isclose(m["skrull/measured_us"][k], as_run * 1e3, rel_tol=1e-4)


@pytest.mark.slow
def test_the_step_line_and_the_closing_lines_say_them(packed_run):
    out = packed_run.output
    for k in range(1, STEPS):
        line = next(x for x in out.splitlines() if f"step {k + 1}: step {k} phases ms: data " in x)
        assert " ms as run, " in line and "predicted" not in line
    assert f"Skrull: step {STEPS} (the last): phases ms: data " in out
    assert f"Skrull: step phases, median ms over {STEPS - 1} steps after the first: data " in out
    assert "outside the micro-batches (checks, clip, opt)" in out
    assert "measured / predicted step time" not in out
