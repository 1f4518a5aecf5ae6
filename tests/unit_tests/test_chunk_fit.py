"""The chunk a chunked document trains in (``overlength = "chunk"``): the largest whose predicted
peak fits a rank (scheduler/chunk_cost.py ``fitting_chunk``), one rule for the scheduler's price
and the trainer's run. Hand-computed on the toy cost model (tests/unit_tests/conftest.py: 1 layer,
K/V 2 bytes a token) and made-up memory models; exactness of training at any chunk size is
tests/unit_tests/test_chunked.py's."""

import dataclasses
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull_ext.data.steps.overlength import scheduler_limit
from skrull_ext.scheduler import Scheduler
from skrull_ext.scheduler.chunk_cost import ChunkRule, ChunkTooLarge, chunk_cost, fitting_chunk
from skrull_ext.scheduler.config import SchedulerConfig
from skrull_ext.scheduler.profile_memory import ProfileMemory
from skrull_ext.train import passes
from tests.unit_tests.conftest import toy_cost

# 10 B a token, no mask, room 200 - 40 = 160 B: BucketSize 16, the limit.
ONE = ProfileMemory(bucket_size=16, a=10.0, b=0.0, c=0.0, usable=200.0, static=40.0, margin=0.0)
# cp 2: a shard also keeps the other rank's K/V (a' = 10 + 2) and attends twice the keys (c' = 2).
TWO = ProfileMemory(bucket_size=8, a=10.0, b=0.0, c=1.0, usable=200.0, static=40.0, margin=0.0, cp=2, kv=2.0)


@pytest.mark.parametrize("length, chunk", [
    # 17: at 16 the last chunk's prefix is 16 (K/V 32 B, held 2x: 64) on 160 of activations = 224 > 160;
    # 12 (prefix 12: 48) = 168 > 160; 11 (prefix 11: 44) = 154 fits.
    (17, 11), (20, 11),
    # 24: 9 leaves a prefix of 18 (90 + max(2 x 36, 3 x 36 - 18) = 180); 8 a prefix of 16: 80 + 80 = 160.
    (24, 8),
])
def test_the_largest_chunk_that_fits(length, chunk):
    assert fitting_chunk(toy_cost(), ONE, length, 16) == chunk


def test_cp_mask_and_gradients():
    # T = 17 over cp 2 with 4 B of gradients: C = 6 (3 tokens a rank): A'(3) = 12 x 3 + 2 x 9 = 54; prefix 12
    # (K/V 24): last chunk 2 x 24 + 3 x 12 (its 3 queries a rank over the prefix) = 84, the one before
    # 3 x 24 - 12 + 3 x 6 + 4 = 82: 138 <= 160. C = 8: A'(4) = 80, prefix 16: 64 + 64 = 208 > 160.
    assert fitting_chunk(toy_cost(), TWO, 17, 16, 2, gradient_bytes=4.0) == 6
    assert fitting_chunk(toy_cost(), TWO, 20, 16, 2, gradient_bytes=4.0) == 4
    for length in (17, 20):  # a multiple of cp, and what the rule remembers
        assert ChunkRule(toy_cost(), TWO, 16, 2, 4.0).chunk(length) % 2 == 0


def test_under_tp_the_chunk_is_a_multiple_of_cp_x_tp():
    """Under TP a rank's share of each chunk is split evenly over the TP ranks (train/chunked.py):
    the rule steps in cp x tp. T = 17 over cp 2 fits 6 (above), not a multiple of 4: in units of
    4, 4; a rule on a TP 2 cost model takes that unit, and without a memory model the limit
    rounded down to it."""
    from skrull_ext._core import CommModel, CostModel, ModelShape

    assert fitting_chunk(toy_cost(), TWO, 17, 16, 2, gradient_bytes=4.0, unit=4) == 4
    tp2 = CostModel(shape=ModelShape(layers=1, hidden=1, kv_width=1, bytes_per_elem=1, tp=2), a_us_per_flop=1.0,
                    b_us=0.0, comm=CommModel(bytes=[1.0], us=[0.0], collectives_per_layer=1.0))
    rule = ChunkRule(tp2, TWO, 16, 2, 4.0)
    assert rule.unit == 4 and rule.chunk(17) % 4 == 0
    assert rule.chunk(17) == fitting_chunk(tp2, TWO, 17, 16, 2, gradient_bytes=4.0, unit=4)
    assert ChunkRule(tp2, None, 18, 2).chunk(10_000) == 16
    with pytest.raises(ValueError, match=r"unit 3 must be positive, the unit a multiple of cp"):
        fitting_chunk(toy_cost(), TWO, 17, 16, 2, unit=3)


def test_the_limit_when_it_fits():
    roomy = dataclasses.replace(ONE, usable=1000.0)
    assert fitting_chunk(toy_cost(), roomy, 40, 16) == 16
    assert ChunkRule(toy_cost(), None, 16).chunk(10_000) == 16  # no measured memory: the limit, unchecked


def test_nothing_fits_names_length_bytes_and_limit():
    # T = 24 over cp 2: even 2-token chunks (A'(1) = 14; prefix 22, K/V 44: 88 + 22 + 4 = 114 / 88 + 22 = 110,
    # the one before 3 x 44 - 4 + 20 + 4 = 152) peak at 166 > 160.
    with pytest.raises(ChunkTooLarge, match=r"a sample of 24 tokens .* K/V alone take 48 B.* chunks of 2 token\(s\) "
                                            r"its predicted peak is 166 B, over the 160 B .*the limit is 16 tokens\. "
                                            r"Cut such samples shorter \(dataloader\.max_len"):
        fitting_chunk(toy_cost(), TWO, 24, 16, 2, gradient_bytes=4.0)


@settings(max_examples=60, deadline=None)
@given(a=st.floats(1.0, 20.0), c=st.floats(0.0, 2.0), kv=st.floats(0.0, 4.0), grads=st.floats(0.0, 50.0),
       cp=st.sampled_from([1, 2, 4]), room=st.floats(100.0, 2000.0), lengths=st.lists(st.integers(17, 200),
                                                                                     min_size=2, max_size=6))
def test_the_chunk_never_grows_with_the_length(a, c, kv, grads, cp, room, lengths):
    pm = ProfileMemory(bucket_size=16, a=a, b=0.0, c=c, usable=room, static=0.0, margin=0.0, cp=cp, kv=kv)
    rule = ChunkRule(toy_cost(), pm, 16, cp, grads)
    chunks = []
    for n in sorted(lengths):
        try:
            chunks.append(rule.chunk(n))
        except ChunkTooLarge:
            chunks.append(0)  # and every longer one fails too
    assert chunks == sorted(chunks, reverse=True)
    assert all(0 <= k <= 16 and k % cp == 0 for k in chunks)


def test_the_scheduler_prices_the_chunk_the_trainer_runs(monkeypatch):
    toy = toy_cost()
    job = Scheduler(SchedulerConfig(dp=1, cp=1, bucket_size=16, timeline="free", overlength="chunk"), toy).job
    job = dataclasses.replace(job, chunk_rule=ChunkRule(toy, ONE, job.capacity.group_limit, 1, 0.0))
    lengths = [17, 24, 20]
    plan = Scheduler(job).schedule([3, 5], chunked=lengths)

    ran = []

    def fake_chunked_loss(model, tokens, labels, chunk, loss_fn, **kw):
        ran.append((tokens.numel(), chunk))
        return SimpleNamespace(loss=torch.zeros((), requires_grad=True))

    monkeypatch.setattr(passes, "chunked_loss", fake_chunked_loss)
    trainer = SimpleNamespace(
        skrull_job=job, device=torch.device("cpu"), free_running=None,
        config=SimpleNamespace(skrull=SimpleNamespace(defer_grad_sync=False)), train_context=nullcontext,
        model_parts=[None], loss_fn=None, dacp_attention=[], cp_group=None, ntokens_seen=0,
        chunk_path=SimpleNamespace(traced=False), parallel_dims=SimpleNamespace(cp=1, tp=1))
    step = SimpleNamespace(micro_batches=[], plan=plan, dp_rank=0, chunked=[
        SimpleNamespace(input=torch.zeros(n, dtype=torch.long), labels=torch.zeros(n, dtype=torch.long), length=n)
        for n in lengths])
    passes.chunked_samples(trainer, step, torch.ones(()))
    assert ran == [(17, 11), (24, 8), (20, 11)]
    assert plan.chunked_chunk == [c for _, c in ran]  # what the plan log writes
    assert plan.chunked_us == pytest.approx([chunk_cost(toy, n, c).us for n, c in ran])
    limit = scheduler_limit(job, None)  # the run's account counts the same chunks
    assert [limit.chunks(n) for n in lengths] == [2, 3, 2]


def _chunk_loader(memory: ProfileMemory):
    from skrull_ext.data.steps.loader import SkrullDataLoader
    from skrull_ext.scheduler import cost_model
    from skrull_ext.train.job.skrull_config import SkrullConfig

    config = SkrullDataLoader.Config(length_scale=32.0, max_len=2048, global_batch_size=8, vocab_size=2048)
    loader = config.build(dp_world_size=1, dp_rank=0)
    section = SkrullConfig(bucket_size=256, cost_model="h100-assumed", overlength="chunk", lookahead=1)
    job = Scheduler(section.scheduler_config(1, 1), cost_model.preset("llama3-debug")).job
    job = dataclasses.replace(job, chunk_rule=ChunkRule(job.cost_model, memory, 256, 1, 0.0))
    loader.attach(Scheduler(job), 0, 1)
    return loader


def test_a_document_no_chunk_fits_stops_the_run_at_start_up():
    from skrull_ext.data.steps.overlength import OverlengthError, check_overlength, scan_overlength

    tight = ProfileMemory(bucket_size=256, a=1.0, b=0.0, c=0.0, usable=1000.0, static=0.0, margin=0.0)
    loader = _chunk_loader(tight)
    over = scan_overlength(loader, 1, 6).over
    step, index, length = max(over, key=lambda o: (o[2], o[0], o[1]))
    with pytest.raises(OverlengthError, match=rf"^sample {index} \(step {step}\), skrull.overlength = 'chunk' at "
                                              rf"bucket_size 256 x cp 1: a sample of {length} tokens cannot "
                                              r"be trained in chunks on one rank: .* the limit is 256 tokens\."):
        check_overlength(loader, 1, 6, quiet=True)  # the check start-up's look-ahead pricing runs too
    roomy = dataclasses.replace(tight, usable=1e12)
    assert check_overlength(_chunk_loader(roomy), 1, 6).over == over
