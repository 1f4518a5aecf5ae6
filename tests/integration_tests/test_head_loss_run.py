"""The head and loss in chunks (train/head_loss.py) through the real trainer.

From the parity runs' seed checkpoint, float32, gloo: SkrullTrainer with
``--loss.chunk_tokens 48`` (a Skrull micro-batch of up to 256 tokens a rank
runs its head in up to 6 chunks, the last shorter) at CP 2 (free-running, the
default; the chunks recomputed, ``--loss.head_backward recompute``; 2 steps,
conftest.SHORT) and at DP 2 x CP 2 (FSDP, gradients reduce-scattered once a
step; the chunks' gradients computed in forward, train/head_grad.py, which
"auto" picks; 5 steps: the parity run ``dp2cp2`` of test_parity_skrull.py,
which chunks its head for these checks), against torchtitan's own 1-process
Trainer with the head unchunked: the losses within 1e-4 and the check step's
gradients within the parity standard (test_parity_skrull.py), and the start-up
line says the chunk and why. At TP 2 x CP 2 (vocab-sharded logits, loss
parallel: "auto" recomputes) the parity run ``tp2cp2`` chunks its head:
test_parity_tp.py checks it. Inside ``overlength = "chunk"``'s chunks, 1
process: the same losses.
The compiled runs (blocks and loss, in forward) at CP 2 under both batchings
(torchtitan's: ``--skrull.no-enable``, chunks of 48 tokens across rows of
4 x 256 tokens a CP rank) are test_compile.py's, which checks their chunks
too. LoRA through the trainer: tests/integration_tests/test_lora_parity.py.
"""

import os

import pytest

from tests.integration_tests.launch import REPO, losses, torchrun
from tests.integration_tests.test_parity_skrull import _matches_reference

LINE = ("head and loss in chunks of up to 48 tokens, 6 chunks for the largest micro-batch (256 tokens: "
        "the job's BucketSize)")
IN_FORWARD = "head backward: in_forward (loss.head_backward auto: a plain Linear head, no TP"


@pytest.mark.slow
def test_head_chunks_cp2_matches_reference(skrull_runs, reference):
    run = skrull_runs["cp2_head_chunks"]
    assert LINE in run.output and "forced by loss.chunk_tokens" in run.output
    assert "head backward: recompute (forced by loss.head_backward)" in run.output
    _matches_reference(run, reference, short=True)


@pytest.mark.slow
def test_head_chunks_dp2_cp2_fsdp_matches_reference(skrull_runs, reference):
    run = skrull_runs["dp2cp2"]
    assert LINE in run.output and IN_FORWARD in run.output
    _matches_reference(run, reference)


@pytest.mark.slow
def test_head_chunks_inside_overlength_chunks(tmp_path):
    """``overlength = "chunk"`` (train/chunked.py) calls the loss inside each checkpointed chunk of a long
    document: the head's chunks nest in it. 1 process, 2 steps (the second, after an optimizer step,
    holds the debug data's first samples over 256 tokens), samples up to 2,048 tokens over a BucketSize
    of 256, the head in chunks of 48 tokens and unchunked: the same losses."""
    job = ["--config-file", os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu.toml"), "--skrull.overlength",
           "chunk", "--dataloader.max_len", "2048", "--training.seq_len", "2048", "--training.steps", "2",
           "--metrics.enable_tensorboard"]
    runs = {}
    for name, extra in (("unchunked", []), ("chunked", ["--loss.chunk_tokens", "48"])):
        dump = str(tmp_path / name)
        out = torchrun(1, "skrull_ext.train", [*job, "--dump_folder", dump, *extra], cwd=str(tmp_path))
        assert "of them trained in chunks" in out.stdout + out.stderr
        runs[name] = losses(dump)
    print(runs)
    assert len(runs["chunked"]) == 2
    assert max(abs(a - b) for a, b in zip(runs["chunked"], runs["unchunked"])) < 1e-5, runs
