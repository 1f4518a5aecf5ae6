"""The shipped ShareGPT job (skrull_ext/jobs/sharegpt_cpu.toml) trains on what
``prepare --to-jsonl`` writes from the package's file, here from the real cut
of it in tests/fixtures (five records, one an empty conversation, and the
package's cut tail): 2 processes, 2 steps of 4 conversations. The empty
conversation is skipped and counted (the job's on_bad_record = "skip"); every
other record is read once and trained."""

import os

import pytest

from skrull_ext.prepare import main as prepare
from tests.integration_tests.launch import REPO, Run, torchrun

JOB = os.path.join(REPO, "skrull_ext", "jobs", "sharegpt_cpu.toml")
FIXTURE = os.path.join(REPO, "tests", "fixtures", "sharegpt_v3_cut.json")


@pytest.mark.slow
def test_sharegpt_job_trains_on_the_prepared_conversations(tmp_path):
    data = str(tmp_path / "sharegpt.jsonl")
    assert prepare(["--to-jsonl", FIXTURE, data, "--drop-cut-tail"]) == 0
    dump = str(tmp_path / "run")
    proc = torchrun(2, "skrull_ext.train", [
        "--config-file", JOB, "--dump_folder", dump, "--dataloader.dataset_path", data,
        "--training.steps", "2", "--dataloader.global_batch_size", "4", "--metrics.log_freq", "1", "--metrics.enable_tensorboard",
    ], cwd=str(tmp_path))
    run = Run(dump=dump, output=proc.stdout + proc.stderr, grads=None)
    assert len(run.losses) == 2
    assert "1 of 5 records skipped as bad" in run.output and "sharegpt.jsonl:3: 'conversations' must be" in run.output
    assert "samples read 8 = trained whole 8 + trained cut 0 + skipped 0" in run.output  # 4 records, 2 epochs
