"""Sample accounting and the non-finite-loss stop in real runs of the
real-text job (skrull_ext/jobs/debug_cpu_text.toml, 1 process, CP=1).

On the committed fixture tests/fixtures/accounting.jsonl (8 records, one
epoch per step of the job's global batch of 8) with ``--dataloader.max_len
64``, the job's 'truncate' trains 4 records whole, cuts 2 (over-long, loss
tokens kept) and skips 2 (chats whose prompt alone passes 64 tokens) every
step: the counts reach TensorBoard and the console with ``read = whole + cut
+ skipped``, and the run ends with a summary naming the first record of each
kind by ``file:line``.

A NaN loss injected at a step that is not logged (probe.py) stops that step
before the optimizer runs, under Skrull's and torchtitan's batching, naming
the step and its samples' records.
"""

import os

import pytest

from skrull_ext import assets
from tests.integration_tests.launch import PROBE, REPO, scalars, torchrun

JOB = ["--config-file", os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu_text.toml")]
FIXTURE = os.path.join(REPO, "tests", "fixtures", "accounting.jsonl")
STEPS = 3


@pytest.mark.slow
@pytest.mark.parametrize("batching", ["skrull", "torchtitan"])
def test_counts_reach_tensorboard_console_and_summary(tmp_path, batching):
    """The same skrull/samples_* tags under both batchings (torchtitan's had none)."""
    proc = torchrun(1, "skrull_ext.train", [
        *JOB, "--dump_folder", str(tmp_path), "--training.steps", str(STEPS), "--dataloader.max_len", "64",
        "--dataloader.dataset_path", FIXTURE, "--metrics.enable_tensorboard",
        *(["--skrull.no-enable"] if batching == "torchtitan" else []),
    ], cwd=str(tmp_path))
    out = proc.stdout + proc.stderr
    m = {k: scalars(str(tmp_path), f"skrull/samples_{k}") for k in ("read", "whole", "cut", "skipped",
                                                                     "skipped_no_loss", "read_total")}
    assert (m["read"], m["whole"], m["cut"], m["skipped"]) == ([8.0] * STEPS, [4.0] * STEPS, [2.0] * STEPS,
                                                               [2.0] * STEPS), m
    assert m["skipped_no_loss"] == m["skipped"] and m["read_total"] == [8.0 * k for k in range(1, STEPS + 1)]
    for k in range(1, STEPS + 1):
        assert batching != "skrull" or (f"skrull step {k}: " in out and "samples 8 read = 4 whole + 2 cut + 2 skipped"
                                        in out)
        assert (f"Skrull step {k}: 2 cut, 2 skipped of 8 samples read (limit 64, dataloader.max_len 64; "
                "skrull.overlength = 'truncate')") in out
    assert ("Skrull over-length: 12 of 24 sequences of steps 1..3 are longer than 64 tokens (dataloader.max_len 64) "
            "and will be truncated to 64 tokens, but 6 of them would keep no loss token") in out, out[-3000:]
    assert (f"Run summary: samples read {8 * STEPS} = trained whole {4 * STEPS} + trained cut {2 * STEPS} + "
            f"skipped {2 * STEPS} (0 over-length, {2 * STEPS} with no loss tokens) over the run, steps 1..{STEPS}, "
            f"all in this launch; cut: over-length, first "
            f"{FIXTURE}:") in out
    assert "; skipped: no loss tokens, first " in out


@pytest.mark.slow
@pytest.mark.parametrize("batching", ["skrull", "torchtitan"])
def test_non_finite_loss_stops_the_step_before_the_optimizer(tmp_path, batching):
    stepped = tmp_path / "optimizer_steps.txt"
    proc = torchrun(1, PROBE, [
        "skrull_ext.train", *JOB, "--dump_folder", str(tmp_path / "run"), "--training.steps", str(STEPS),
        "--metrics.log_freq", "10",  # step 2 is not a logged step
        *(["--skrull.no-enable"] if batching == "torchtitan" else []),
    ], cwd=str(tmp_path), expect_failure=True, real=False,  # the trainer's stop, not torchrun's summary of it
        env={"SKRULL_PROBE_NAN": f"2:{stepped}"})
    out = proc.stdout + proc.stderr
    what = "loss nan, gradient norm nan" if batching == "skrull" else "the gradients are not finite"
    # the debug job's fused AdamW skips the step on the device (train/optimizer_gate.py)
    assert (f"NonFiniteLossError: step 2: {what}; the optimizer's update skipped on the device (the weights are "
            "those of step 1)") in out, out[-3000:]
    assert "Samples of the step: " in out and f"({assets.text_path('tiny_sft')}:" in out
    assert stepped.read_text().splitlines() == ["1 changed", "2 unchanged"], "the NaN step changed the weights"
    assert ("(step 2 stopped before its optimizer update: its 8 samples are counted as read but did not change "
            "the weights)") in out
