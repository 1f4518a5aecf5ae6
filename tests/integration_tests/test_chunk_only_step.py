"""A step of chunked documents alone at DP 1 (``overlength = "chunk"``, global batch 1): the
trainer's path with no micro-batch, where the last chunk's backward reduces the gradients
(train/passes.py). The debug job from the shared seed checkpoint, one process, samples up to
2,048 tokens and a BucketSize of 64, so the step's one sample (252 and 72 tokens in the first two
steps) is a document in chunks.

Its model passes are the chunks' (each forward, and each but the last recomputed): no pad micro-batch, which the core's timeline does not charge
at DP 1 (timeline.hpp idle_pad; data/steps/plan_buffers.py rank_buffers). The losses and the
last step's gradients equal the same samples trained whole (BucketSize 512: one micro-batch a
step), the chunks' own rounding aside.
"""

import os

import pytest

from skrull_ext.train.plan_log import read_plan_log
from tests.integration_tests.conftest import SKRULL
from tests.integration_tests.launch import assert_same_grads, train_from_seed
from tests.integration_tests.test_parity_skrull import GRAD, forward_passes

STEPS = 2
JOB = ["--dataloader.max_len", "2048", "--training.seq_len", "2048", "--dataloader.global_batch_size", "1",
       "--skrull.plan_log"]


@pytest.mark.slow
def test_a_step_of_chunks_alone_runs_no_pad_and_trains_as_whole(workdir, seed):
    probe = os.path.join(workdir, "chunk_only.passes")
    chunks = train_from_seed(workdir, "chunk_only", 1, "skrull_ext.train", SKRULL, seed, STEPS,
                             extra=[*JOB, "--skrull.overlength", "chunk", "--skrull.bucket_size", "64"], grads_at=STEPS,
                             env={"SKRULL_PROBE_PASSES": probe})
    whole = train_from_seed(workdir, "chunk_only_whole", 1, "skrull_ext.train", SKRULL, seed, STEPS,
                            extra=[*JOB, "--skrull.bucket_size", "512"], grads_at=STEPS)
    plans = read_plan_log(os.path.join(chunks.dump, "skrull_plans", "rank0.jsonl"))
    passes = forward_passes(probe, 1)[0]
    only = [s for s in range(1, STEPS + 1) if plans[s]["micro_batches"] == 0]
    print(f"plans: {[(s, plans[s]['micro_batches']) for s in plans]}; model forward passes: {passes}")
    assert only, "no step of the data holds chunked documents alone"
    for s in only:
        # each chunk one forward, each but the last once more in its checkpoint's recompute; no pad
        chunk_passes = sum(2 * -(-n // c) - 1 for n, c in zip(plans[s]["chunked_here_lengths"],
                                                              plans[s]["plan_chunked_chunk"]))
        assert passes[s] == chunk_passes, (s, passes, chunk_passes)
    assert "trained whole 2 + trained cut 0 + skipped 0" in chunks.output, chunks.output[-3000:]
    assert max(abs(a - b) for a, b in zip(chunks.losses, whole.losses)) < 1e-4, (chunks.losses, whole.losses)
    worst, rel = assert_same_grads(chunks.grads, whole.grads, **GRAD)
    print(f"losses {chunks.losses} vs whole {whole.losses}; step {STEPS} gradients: max |diff| {worst:.3g}, "
          f"relative norm {rel:.3g}")
