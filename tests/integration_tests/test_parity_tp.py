"""Skrull under torchtitan's tensor parallelism matches torchtitan's 1-process training.

From the shared seed checkpoint, float32, gloo, 4 processes each: TP 2 x CP 2
(DACP exchanging each TP rank's own heads' K/V over its CP group) and DP 2 x
TP 2 (FSDP over the DP ranks, every sequence local), against the same
1-process reference and to the same standard as test_parity_skrull.py: each
step's loss within 1e-4 and every parameter's gradient at the check step within
GRAD, here over POOL_SUB_STEP steps, the last the check step (conftest.SHORT:
each 4-rank TP step costs much, in DTensor's sharding propagation).
torchtitan's TP plan splits the attention heads and MLP columns, runs
sequence-parallel norms and vocab-sharded logits (skrull_ext/train/job/tensor_parallel.py).
TP 2 x CP 2 computes its head and loss in chunks of 48 tokens (train/head_loss.py; the
reference's head is whole), DP 2 x TP 2 unchunked: the one TP 2 x CP 2 run serves the parity
and the chunked head's checks (test_head_loss_run.py has the other shapes').
"""

import os
from collections import Counter

import pytest

from skrull_ext.train.plan_log import read_plan_log
from tests.integration_tests.conftest import POOL_SUB_STEP
from tests.integration_tests.test_head_loss_run import LINE
from tests.integration_tests.test_parity_skrull import _matches_reference_losses_and_grads

HEAD_DIM, KV_HEADS, ELEM = 16, 16, 4
"""The debug model's K/V: 16 heads of 16 float32 values (MHA, dim 256)."""


def _kv_bytes_per_dist_token(run) -> list[float]:
    """Rank 0's K/V bytes sent per distributed token, per step (over all layers' calls)."""
    sent, tokens = run.scalars("skrull/dacp_fwd_bytes"), run.scalars("skrull/dacp_dist_tokens")
    return [b / t for b, t in zip(sent, tokens) if t]


@pytest.mark.slow
def test_tp_parity_tp2_cp2(skrull_runs, reference):
    """Losses and gradients as the reference; local and distributed sequences at the
    check step; each TP rank gathers only its own 8 of the 16 K/V heads over its CP
    group: (cp - 1) x K and V x 8 heads x 16 x 4 bytes per distributed token."""
    run = skrull_runs["tp2cp2"]
    assert "DP 1 x CP 2 x TP 2" in run.output
    _matches_reference_losses_and_grads(run, reference, short=True)
    assert sum(run.scalars("skrull/truncated")) == sum(run.scalars("skrull/dropped")) == 0
    k = POOL_SUB_STEP - 1  # the TP-priced plan (FLOPs and K/V bytes halved) mixes local and distributed there
    assert run.scalars("skrull/dacp_local_seqs")[k] > 0 and run.scalars("skrull/dacp_dist_seqs")[k] > 0
    per_token = _kv_bytes_per_dist_token(run)
    print(f"K/V bytes sent per distributed token, rank 0, per step: {per_token}")
    assert per_token and all(b == (2 - 1) * 2 * (KV_HEADS // 2) * HEAD_DIM * ELEM for b in per_token), per_token


@pytest.mark.slow
def test_head_chunks_tp2_cp2(skrull_runs):
    """Under TP the head module passes the Replicate hidden states through as well, and each chunk's linear
    of them and the Shard(0) weight gives the Shard(-1) logits for loss_parallel (head_loss.py); the
    run's losses and gradients are the reference's (test_tp_parity_tp2_cp2)."""
    run = skrull_runs["tp2cp2"]
    assert LINE in run.output
    assert "the head module runs in the model's forward, its weight applied per chunk" in run.output
    assert "head backward: recompute (loss.head_backward auto: TP shards the head's weight" in run.output


@pytest.mark.slow
def test_tp_parity_dp2_tp2(skrull_runs, reference):
    """FSDP over 2 DP ranks x TP 2 (no CP: every sequence whole on its rank, bucket_size
    512 so that none is cut), gradients reduce-scattered once per step as in
    test_parity_skrull's dp2cp2. Each rank's buffers as fed (the plan log's) are its micro-batches each
    padded to a multiple of the TP degree (data/steps/buffers.py pad_to_multiple: compiled blocks failed
    on an uneven sequence-parallel shard, docs/design/buffer_layout.md), step 2's 357 tokens fed as 358."""
    run = skrull_runs["dp2tp2"]
    assert "DP 2 x CP 1 x TP 2" in run.output and LINE not in run.output  # the head whole
    _matches_reference_losses_and_grads(run, reference, short=True)
    assert sum(run.scalars("skrull/truncated")) == sum(run.scalars("skrull/dropped")) == 0
    assert sum(run.scalars("skrull/dacp_fwd_bytes")) == 0
    odd = 0  # micro-batches whose real tokens are odd: each fed one token longer (data/steps/buffers.py)
    for rank in range(4):  # world rank r: DP rank r // 2, TP rank r % 2
        for step, rec in read_plan_log(os.path.join(run.dump, "skrull_plans", f"rank{rank}.jsonl")).items():
            real = {}  # this DP rank's micro-batches (the plan's index) -> their tokens
            for n, d, m in zip(rec["lengths"], rec["plan_dp_rank"], rec["plan_micro_batch"]):
                if d == rank // 2:
                    real[m] = real.get(m, 0) + n
            fed = rec["buffer_lengths"]
            print(f"rank {rank} step {step}: real {sorted(real.values())} fed {fed}")
            assert all(n % 2 == 0 for n in fed), (rank, step, fed)  # TP 2: every buffer a multiple of 2
            assert not Counter(n + n % 2 for n in real.values()) - Counter(fed), (rank, step, real, fed)
            odd += sum(n % 2 for n in real.values())
    assert odd > 0  # the padding is exercised
