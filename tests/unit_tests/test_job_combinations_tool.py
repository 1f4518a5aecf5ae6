"""tools/job_combinations.py: how a launch's output is sorted, and how a resumed run is compared."""

import random

from tests.unit_tests.tool_module import load_tool

STEP = "[titan] 2026-12-01 08:18:18,789 - root - INFO - step:  {}  loss:  {}  grad_norm:  {}  memory:  0.68GiB(2.87%)"


SUMMARY = ("[titan] 2026-12-01 08:22:14,854 - root - INFO - Run summary: samples read 24 = trained whole {} + trained "
           "cut {} + skipped 0 (0 over-length, 0 with no loss tokens) over the run, steps 1..3{}")


def _log(*steps: tuple[int, str, str], whole: int = 24, cut: int = 0, launch: str = ", all in this launch") -> str:
    return "\n".join([*(STEP.format(*s) for s in steps), SUMMARY.format(whole, cut, launch)])


def test_a_resumed_run_is_compared_with_the_run_without_a_stop_past_its_checkpoint():
    tool = load_tool("job_combinations")
    full = _log((1, "8.03686", "0.0370"), (2, "8.03282", "0.0354"), (3, "8.06587", "0.0299"))
    assert tool.resume_differences(_log((2, "8.03282", "0.0354"), (3, "8.06587", "0.0299")), full, after=1) == []
    # steps up to the checkpoint are not the resumed launch's to log
    assert tool.resume_differences(_log((3, "8.06587", "0.0299")), full, after=2) == []
    assert tool.resume_differences(_log((2, "8.03282", "0.0354"), (3, "8.06588", "0.0299")), full, after=1) == [
        "step 3: loss, grad_norm ('8.06588', '0.0299') resumed, ('8.06587', '0.0299') without a stop"]
    assert tool.resume_differences(_log((2, "8.03282", "0.0355")), full, after=1) == [  # a grad norm, a lost step
        "step 2: loss, grad_norm ('8.03282', '0.0355') resumed, ('8.03282', '0.0354') without a stop",
        "step 3: loss, grad_norm None resumed, ('8.06587', '0.0299') without a stop"]
    # the run's totals over every launch, the resumed launch's own share beside them
    again = " (every launch); this launch, steps 2..3: samples read 16 = trained whole 16 + trained cut 0 + skipped 0"
    tail = [(2, "8.03282", "0.0354"), (3, "8.06587", "0.0299")]
    assert tool.resume_differences(_log(*tail, launch=again), full, after=1) == []
    assert tool.resume_differences(_log(*tail, whole=23, cut=1, launch=again), full, after=1) == [
        "run summary: samples read 24 = trained whole 23 + trained cut 1 + skipped 0 (0 over-length, 0 with no loss "
        "tokens) resumed, samples read 24 = trained whole 24 + trained cut 0 + skipped 0 (0 over-length, 0 with no "
        "loss tokens) without a stop"]


def test_outcomes_tell_a_refusal_from_a_defect():
    tool = load_tool("job_combinations")
    assert tool.outcome(0, "fine", 2) == "ok"
    assert tool.outcome(2, "error: [skrull] policy = 'x': not one of ...", 1) == "refused"
    assert tool.outcome(1, "[rank1]: Traceback (most recent call last):", 2) == "BUG"
    assert tool.outcome(1, "Traceback (most recent call last):", 1) == "BUG"  # one process: its own
    assert tool.outcome("timeout", "", 2) == "BUG"


def test_draws_name_a_shipped_job_and_a_world_of_one_to_four_processes():
    tool = load_tool("job_combinations")
    rng = random.Random(3)
    for _ in range(50):
        job, n, flags = tool.draw(rng, [])
        assert (tool.ROOT / "skrull_ext" / "jobs" / job).is_file()
        degrees = [int(tool.flag(flags, f"--parallelism.{key}_degree", "")) for key in
                   ("data_parallel_shard", "context_parallel", "tensor_parallel")]
        assert 1 <= n == degrees[0] * degrees[1] * degrees[2] <= 4, flags


def test_a_run_resumed_on_another_world_is_held_to_its_count_of_samples_read():
    tool = load_tool("job_combinations")
    full = _log((1, "8.03686", "0.0370"), (2, "8.03282", "0.0354"))
    # another CP group cuts otherwise and sums in another order: only the samples read are compared
    assert tool.read_differences(_log((2, "8.1", "0.1"), whole=22, cut=2), full, after=1) == []
    short = full.replace("samples read 24", "samples read 16")
    assert tool.read_differences(short, full, after=1) == [
        "samples read over the run: 16 resumed after step 1 on another world, 24 without a stop"]
    flags = ["--training.steps", "3", "--parallelism.context_parallel_degree", "2"]
    assert tool.with_value(flags, "--parallelism.context_parallel_degree", "1") == [
        "--training.steps", "3", "--parallelism.context_parallel_degree", "1"]
    assert tool.with_value(flags, "--job.dump_folder", "/x") == [*flags, "--job.dump_folder", "/x"]
