"""The real-text job end to end: skrull_ext/jobs/debug_cpu_text.toml (the
shipped JSONL fixture, the shipped tiny BPE tokenizer) at CP=2, 2 processes:
it trains, the loss goes down, and the real-text batches run both local and
distributed sequences."""

import os

import pytest

from tests.integration_tests.launch import REPO, Run, torchrun

JOB = os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu_text.toml")
STEPS = 4


@pytest.fixture(scope="module")
def text_run(tmp_path_factory) -> Run:
    work = str(tmp_path_factory.mktemp("text"))
    dump = os.path.join(work, "run")
    proc = torchrun(2, "skrull_ext.train", [
        "--config-file", JOB, "--dump_folder", dump, "--training.steps", str(STEPS),
        "--parallelism.context_parallel_degree", "2", "--metrics.enable_tensorboard",
    ], cwd=work)
    return Run(dump=dump, output=proc.stdout + proc.stderr, grads=None)


@pytest.mark.slow
def test_text_job_trains_on_local_and_distributed_sequences(text_run):
    losses = text_run.losses
    print(f"real-text losses {losses}")
    assert len(losses) == STEPS and losses[-1] < losses[0]
    assert "Loading tokenizer from tokenizer.json" in text_run.output
    assert sum(text_run.scalars("skrull/dacp_local_seqs")) > 0
    assert sum(text_run.scalars("skrull/dacp_dist_seqs")) > 0
