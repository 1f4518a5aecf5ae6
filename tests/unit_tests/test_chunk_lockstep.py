"""Chunked documents under lockstep DP ranks (skrull_ext/scheduler/chunk_lockstep.py): every rank runs as
many chunk passes per position as the rank with the most, pad chunks filling the rest, and a pad
chunk changes neither the document's loss nor any gradient.

Exact cases of the per-position derivation, hypothesis invariants on random plans (every DP rank
the same pass counts, each rank's own documents in the plan's order with their own chunk counts;
chunked_loss feeding the real tokens, labels and positions unchanged before the pad passes),
and the debug llama3 (fp32, CPU) training test_chunked.py's document padded: the same loss and
gradients, the same number of model calls (forward and recompute) as a document of that many chunks;
and train/passes.py at DP 2 lockstep on a fake trainer: what each rank runs and where it syncs.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull_ext.scheduler.chunk_lockstep import PaddedDocument, lockstep_chunks, lockstep_documents, lockstep_pads
from skrull_ext.train.chunked import chunk_bounds, chunked_loss
from tests.unit_tests.test_chunked import CHUNK, _close, _document, _grads, _loss, _model, chunked


def _by(chunk: int):
    return lambda n: chunk


def test_positions_take_the_most_chunks_any_rank_runs_there():
    # DP 2, chunk 100: rank 0 holds 250 (3 chunks) then 120 (2); rank 1 holds 410 (5).
    lengths, groups = [250, 410, 120], [0, 1, 0]
    assert lockstep_chunks(lengths, groups, 2, _by(100)) == [5, 2]
    assert lockstep_documents(lengths, groups, 2, 0, _by(100)) == [PaddedDocument(0, 3, 2), PaddedDocument(2, 2, 0)]
    assert lockstep_documents(lengths, groups, 2, 1, _by(100)) == [PaddedDocument(1, 5, 0), PaddedDocument(None, 0, 2)]
    assert lockstep_pads(lengths, groups, 2, _by(100)) == [2, 2]  # what the plan prices: 7 passes each
    # A rank with none runs all-pad documents; no document anywhere: nothing to run.
    assert lockstep_documents([300], [0], 3, 2, _by(100)) == [PaddedDocument(None, 0, 3)]
    assert lockstep_chunks([], [], 2, _by(100)) == [] and lockstep_documents([], [], 2, 1, _by(100)) == []
    # Each length its own chunk (SchedulerJob.chunk_for): 1000 in chunks of 500 is 2, 600 in 100 is 6.
    assert lockstep_chunks([1000, 600], [0, 1], 2, lambda n: 500 if n > 800 else 100) == [6]
    with pytest.raises(ValueError, match=r"DP rank 2 is outside \[0, 2\)"):
        lockstep_chunks([300], [2], 2, _by(100))
    with pytest.raises(ValueError, match="dp_rank"):
        lockstep_documents([300], [0], 2, 2, _by(100))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4).flatmap(lambda dp: st.tuples(
    st.just(dp), st.lists(st.tuples(st.integers(1, 2000), st.integers(0, dp - 1)), max_size=8),
    st.sampled_from([1, 7, 64, 256]))))
def test_every_rank_runs_the_same_passes_and_its_own_documents_whole(case):
    dp, docs, chunk = case
    lengths, groups = [n for n, _ in docs], [g for _, g in docs]
    n = lockstep_chunks(lengths, groups, dp, _by(chunk))
    for rank in range(dp):
        runs = lockstep_documents(lengths, groups, dp, rank, _by(chunk))
        assert [r.chunks + r.pad_chunks for r in runs] == n  # every rank the same pass count per position
        assert all(r.pad_chunks >= 0 for r in runs)
        own = [r.document for r in runs if r.document is not None]
        assert own == [k for k, g in enumerate(groups) if g == rank]  # each own document, once, in order
        assert all(r.chunks == len(chunk_bounds(lengths[r.document], chunk)) for r in runs if r.document is not None)
        assert all(r.chunks == 0 for r in runs if r.document is None)
        assert lockstep_pads(lengths, groups, dp, _by(chunk))[rank] == sum(r.pad_chunks for r in runs)
    # Each position is as long as some rank's document there needs, no longer.
    assert all(any(lockstep_documents(lengths, groups, dp, r, _by(chunk))[k].pad_chunks == 0 for r in range(dp))
               for k in range(len(n)))


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 60), st.sampled_from([1, 3, 8]), st.integers(0, 4))
def test_pad_chunks_leave_the_real_tokens_as_they_were(length, chunk, pads):
    """What chunked_loss feeds the model, pass by pass (a recording model, no attention layers): the
    document's tokens, labels and positions in order, unchanged, then ``pads`` passes of one token
    (ids 0, labels ignored, positions from 0); the model called once per pass in forward."""
    from skrull_ext.data.sources.synthetic import IGNORE_INDEX

    fed = []

    class Recording(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(()))

        def forward(self, tok, positions, attention_masks):
            fed.append((tok[0].tolist(), positions[0].tolist()))
            return self.w * torch.ones(*tok.shape, 2)

    labels_fed = []

    def loss(pred, labels):
        labels_fed.append(labels[0].tolist())
        return pred.sum()

    tokens = torch.arange(1, length + 1)
    labels = torch.arange(100, 100 + length)
    out = chunked_loss(Recording(), tokens, labels, chunk, loss, layers=[], pad_chunks=pads)
    real = len(chunk_bounds(length, chunk))
    assert len(fed) == real + pads and out.chunks == real
    assert [t for tok, _ in fed[:real] for t in tok] == tokens.tolist()
    assert [p for _, pos in fed[:real] for p in pos] == list(range(length))
    assert [x for lab in labels_fed[:real] for x in lab] == labels.tolist()
    assert fed[real:] == [([0], [0])] * pads and labels_fed[real:] == [[IGNORE_INDEX]] * pads


def test_pad_chunks_change_neither_loss_nor_gradients():
    """The 8-chunk document of test_chunked.py with 3 pad chunks: the loss and gradients of it unpadded."""
    model = _model()
    tokens, labels = _document()
    out = chunked_loss(model, tokens, labels, CHUNK, _loss, pad_chunks=3)
    out.loss.backward()
    assert out.chunks == 8
    loss, grads, _ = chunked()
    _close((out.loss.item(), _grads(model)), (loss, grads))


def test_an_all_pad_document_is_passes_with_nothing_to_learn():
    model = _model()
    empty = torch.zeros(0, dtype=torch.long)
    out = chunked_loss(model, empty, empty.clone(), CHUNK, _loss, pad_chunks=4)
    out.loss.backward()
    assert out.chunks == 0 and out.loss.item() == 0.0
    assert all(float(g.abs().max()) == 0.0 for g in _grads(model).values())


@pytest.mark.parametrize("length, pads", [(251, 0), (160, 3), (20, 7), (0, 8)])
def test_a_position_makes_the_same_model_calls_whatever_its_chunks_are(length, pads):
    """8 passes at one position, whether 8 real chunks, some real and some pad, or all pad: the same
    forwards (one per pass) and recomputes in backward (every pass but the last: the last is kept,
    real or pad), so FSDP's all-gathers and reduce-scatters pair up across lockstep DP ranks."""
    model = _model()
    calls: list[bool] = []  # grad enabled at each model call: a forward, or a recompute in backward
    model.register_forward_pre_hook(lambda *_: calls.append(torch.is_grad_enabled()))
    tokens, labels = _document(length) if length else (torch.zeros(0, dtype=torch.long),) * 2
    out = chunked_loss(model, tokens, labels, CHUNK, _loss, pad_chunks=pads)
    assert len(chunk_bounds(length, CHUNK)) + pads == 8 and len(calls) == 8
    out.loss.backward()
    assert len(calls) == 8 + 7  # each checkpointed pass's recompute: all but the last


@pytest.mark.parametrize("defer", [False, True])
def test_the_trainer_runs_each_rank_padded_and_syncs_in_the_same_pass(monkeypatch, defer):
    """train/passes.py's chunked samples at DP 2 lockstep on a plan of documents 12, 9, 6 in chunks of 5
    (DP 0: 12; DP 1: 9 then 6, test_chunked_schedule.py): each rank the same passes per position,
    its own documents padded, an all-pad one (chunk: cp tokens) where it has none; under
    ``defer_grad_sync`` both ranks sync in their last position only (a step with no micro-batch)."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    from skrull_ext.scheduler import Scheduler
    from skrull_ext.scheduler.config import SchedulerConfig
    from skrull_ext.train import passes
    from tests.unit_tests.conftest import toy_cost

    sched = Scheduler(SchedulerConfig(dp=2, cp=1, bucket_size=5, timeline="lockstep", overlength="chunk"),
                      toy_cost())
    plan = sched.schedule([], chunked=[12, 9, 6])
    assert plan.chunked_group == [0, 1, 1]
    ran = []

    def fake_chunked_loss(model, tokens, labels, chunk, loss_fn, pad_chunks=0, **kw):
        ran.append((tokens.numel(), chunk, pad_chunks))
        return SimpleNamespace(loss=torch.zeros((), requires_grad=True))

    monkeypatch.setattr(passes, "chunked_loss", fake_chunked_loss)
    per_rank = {}
    for rank in range(2):
        ran.clear()
        syncs = []
        trainer = SimpleNamespace(
            skrull_job=sched.job, device=torch.device("cpu"), free_running=None, parallel_dims=SimpleNamespace(cp=1, tp=1),
            config=SimpleNamespace(skrull=SimpleNamespace(defer_grad_sync=defer)), train_context=nullcontext,
            model_parts=[None], loss_fn=None, dacp_attention=[], cp_group=None, ntokens_seen=0,
            chunk_path=SimpleNamespace(traced=False),
            _set_grad_sync=syncs.append)
        docs = [plan.chunked[k] for k in plan.chunked_of(rank)]
        step = SimpleNamespace(micro_batches=[], plan=plan, dp_rank=rank, chunked=[
            SimpleNamespace(input=torch.zeros(n, dtype=torch.long), labels=torch.zeros(n, dtype=torch.long), length=n)
            for n in docs])
        passes.chunked_samples(trainer, step, torch.ones(()))
        per_rank[rank] = (list(ran), syncs, trainer.ntokens_seen)
    assert per_rank[0] == ([(12, 5, 0), (0, 1, 2)], [False, True] if defer else [], 12)
    assert per_rank[1] == ([(9, 5, 1), (6, 5, 0)], [False, True] if defer else [], 15)
