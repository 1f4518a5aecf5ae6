"""The bar of issue 55 in a real run: the debug job on 1 process with
``--skrull.overlength chunk``, a BucketSize of 256 and samples up to 2,048
tokens trains; nothing is cut or dropped, the samples over 256 tokens are
trained whole in chunks, and the step lines, TensorBoard and the run summary
count them with their chunks."""

import os

import pytest

from skrull_ext.data.steps.overlength import capacity_limit, scan_overlength
from skrull_ext.data.steps.loader import SkrullDataLoader
from skrull_ext.scheduler.capacity import Capacity
from tests.integration_tests.launch import REPO, scalars, torchrun

JOB = ["--config-file", os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu.toml"), "--skrull.overlength", "chunk",
       "--dataloader.max_len", "2048", "--training.seq_len", "2048"]
STEPS = 3


@pytest.mark.slow
def test_chunk_trains_long_samples_whole_and_counts_them(tmp_path):
    config = SkrullDataLoader.Config(length_scale=32.0, max_len=2048, global_batch_size=8, vocab_size=2048)
    loader = config.build(dp_world_size=1, dp_rank=0)
    loader.limit = capacity_limit(Capacity(256, cp=1), "chunk", 2048)
    over = scan_overlength(loader, 1, STEPS).over
    per_step = [sum(1 for s, _, _ in over if s == k) for k in range(1, STEPS + 1)]
    chunks = sum(-(-n // 256) for _, _, n in over)
    assert sum(per_step) > 0

    proc = torchrun(1, "skrull_ext.train", [
        *JOB, "--dump_folder", str(tmp_path), "--training.steps", str(STEPS), "--metrics.enable_tensorboard",
    ], cwd=str(tmp_path))
    out = proc.stdout + proc.stderr
    assert (f"Run summary: samples read {8 * STEPS} = trained whole {8 * STEPS} + trained cut 0 + skipped 0 "
            f"(0 over-length, 0 with no loss tokens)") in out
    assert f"{sum(per_step)} of them trained in chunks ({chunks} chunks" in out
    assert scalars(str(tmp_path), "skrull/chunked_total")[-1] == sum(per_step)
    assert scalars(str(tmp_path), "skrull/truncated_total")[-1] == 0
    assert scalars(str(tmp_path), "skrull/dropped_total")[-1] == 0
