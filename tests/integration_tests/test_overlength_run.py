"""Over-length sequences in a real run of the debug job (1 process, CP=1, so
sequences above bucket_size = 256 tokens are over-length): 'error' fails at
start-up, before the first step, naming the sample in one line; the job's
'truncate' trains, and its counts reach TensorBoard and the log."""

import os

import pytest

from skrull_ext.data.steps.overlength import capacity_limit, scan_overlength
from skrull_ext.data.steps.loader import SkrullDataLoader
from skrull_ext.scheduler.capacity import Capacity
from tests.integration_tests.launch import REPO, scalars, torchrun

JOB = ["--config-file", os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu.toml")]
STEPS = 3


def _expected_over(steps: int):
    """What the pre-scan must find: the debug job's data, read in-process."""
    config = SkrullDataLoader.Config(length_scale=32.0, max_len=512, global_batch_size=8, vocab_size=2048)
    loader = config.build(dp_world_size=1, dp_rank=0)
    loader.limit = capacity_limit(Capacity(256, cp=1), "error", 512)
    return scan_overlength(loader, 1, steps).over


@pytest.mark.slow
def test_overlength_error_fails_before_training(tmp_path):
    proc = torchrun(1, "skrull_ext.train", [*JOB, "--dump_folder", str(tmp_path), "--skrull.overlength", "error"],
                    cwd=str(tmp_path), expect_failure=True)
    out = proc.stdout + proc.stderr
    step, index, length = _expected_over(10)[0]
    assert (f"error: sample {index} (step {step}) has length {length}, longer than the 256 "
            "tokens a CP group can hold (bucket_size 256 x cp 1)") in proc.stderr, out[-3000:]
    assert "OverlengthError" not in out  # one line, no traceback of ours
    assert "Training starts" not in out and "step:  1" not in out


@pytest.mark.slow
def test_overlength_truncate_counts_are_logged(tmp_path):
    proc = torchrun(1, "skrull_ext.train", [
        *JOB, "--dump_folder", str(tmp_path), "--training.steps", str(STEPS), "--metrics.enable_tensorboard",
    ], cwd=str(tmp_path))
    out = proc.stdout + proc.stderr
    over = _expected_over(STEPS)
    per_step = [sum(1 for s, _, _ in over if s == k) for k in range(1, STEPS + 1)]
    assert sum(per_step) > 0
    assert f"Skrull over-length: {len(over)} of {8 * STEPS} sequences of steps 1..{STEPS}" in out
    assert scalars(str(tmp_path), "skrull/truncated") == per_step
    assert scalars(str(tmp_path), "skrull/truncated_total") == [sum(per_step[: k + 1]) for k in range(STEPS)]
    for k, n in enumerate(per_step, 1):
        assert (f"Skrull step {k}: {n} cut, 0 skipped of 8 samples read" in out) == (n > 0)
        assert f"samples 8 read = {8 - n} whole + {n} cut + 0 skipped" in out
    assert (f"Run summary: samples read {8 * STEPS} = trained whole {8 * STEPS - sum(per_step)} + trained cut "
            f"{sum(per_step)} + skipped 0") in out
