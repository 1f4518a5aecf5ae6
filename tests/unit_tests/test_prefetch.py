"""Steps built ahead (``[dataloader] prefetch_steps``) are the steps built on
demand: same samples, plans, buffers and counts, in the same order; the
checkpointed state is that of the last step handed out, however far the
thread ran ahead; a resume mid-run replays the uninterrupted sequence; a
build error is raised at its step, as without prefetch; the thread ends on
close, on a drop and after an error. And what makes a step cheap enough to
hide: the limit and the loss normaliser read lengths and loss counts, and a
rank builds only its own micro-batches' samples."""

import dataclasses
import gc
import os
import threading
import time

import pytest
import torch

from skrull_ext.data.steps.prefetch import Prefetcher
from skrull_ext.data.steps.loader import PREFETCH_MAX, SkrullDataLoader
from skrull_ext.data.sources.synthetic import IGNORE_INDEX
from skrull_ext.data.sources.tokenizer import LocalTokenizer
from skrull_ext.errors import DataError
from skrull_ext.scheduler import Scheduler, cost_model
from skrull_ext.train.job.skrull_config import SkrullConfig

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "accounting.jsonl")
STEPS = 6

# name -> (dataloader options, [skrull] options, DP, CP, this rank's (dp, cp))
CASES = {
    # synthetic data, DP 2 x CP 2, the last rank: local and distributed sequences, pads
    "synthetic-dp2cp2": (dict(length_scale=32.0, max_len=512, global_batch_size=16, vocab_size=2048),
                         dict(bucket_size=256), 2, 2, (1, 1)),
    "pool-dp2cp2": (dict(length_scale=32.0, max_len=512, global_batch_size=16, vocab_size=2048),
                    dict(bucket_size=128, policy="skrull-pool"), 2, 2, (0, 1)),
    # CP-SAT on every micro-batch (margin 0): the solver runs on the prefetch thread
    "cpsat-cp2": (dict(length_scale=32.0, max_len=512, global_batch_size=8, vocab_size=2048),
                  dict(bucket_size=256, policy="skrull-fast", cpsat=True, cpsat_margin=0.0), 1, 2, (0, 0)),
    # JSONL chats and texts cut and skipped at max_len 64 (test_accounting.py's fixture): events and totals
    "jsonl-truncate": (dict(dataset="jsonl", dataset_path=FIXTURE, max_len=64, global_batch_size=4),
                       dict(bucket_size=256, overlength="truncate"), 1, 2, (0, 1)),
}


@pytest.fixture(scope="module")
def tok():
    return LocalTokenizer.Config(path="tiny_bpe").build(tokenizer_path="")


def _loader(tok, case: str, k: int) -> SkrullDataLoader:
    data, skrull, dp, cp, (d, c) = CASES[case]
    config = SkrullDataLoader.Config(**data, prefetch_steps=k)
    loader = config.build(dp_world_size=dp, dp_rank=d, tokenizer=tok)
    section = SkrullConfig(cost_model="h100-assumed", **skrull)
    loader.attach(Scheduler(section.scheduler_config(dp, cp, lookahead=1), cost_model.preset("llama3-debug")), c, cp)
    return loader


def _same(a, b) -> None:
    """Two SkrullSteps are the same step (everything but the scheduling wall time)."""
    assert (a.step, a.dp_rank, a.samples, a.global_valid_tokens) == (b.step, b.dp_rank, b.samples, b.global_valid_tokens)
    assert a.plan.digest() == b.plan.digest()
    assert (a.account.counts, [e.describe() for e in a.account.events], a.totals) == \
           (b.account.counts, [e.describe() for e in b.account.events], b.totals)
    assert len(a.micro_batches) == len(b.micro_batches)
    for x, y in zip(a.micro_batches, b.micro_batches):
        for name in ("input", "labels", "positions"):
            assert torch.equal(getattr(x, name), getattr(y, name)), name
        assert (x.meta, x.seqs) == (y.meta, y.seqs)


@pytest.mark.parametrize("case", list(CASES))
def test_prefetched_steps_are_the_synchronous_ones(tok, case):
    sync, ahead = _loader(tok, case, 0), _loader(tok, case, 3)
    for n in range(1, STEPS + 1):
        a, b = sync.next_step(), ahead.next_step()
        assert a.step == n
        _same(a, b)
        assert ahead.state_dict() == sync.state_dict()
    assert sync._ahead is None and ahead._ahead.alive
    ahead.close()


def test_state_is_that_of_the_last_step_handed_out(tok):
    sync, ahead = _loader(tok, "jsonl-truncate", 0), _loader(tok, "jsonl-truncate", 3)
    for _ in range(2):
        sync.next_step(), ahead.next_step()
    # Wait on what is asserted: three steps on the queue (each put after its build
    # returned), not the cursor, which moves when a build starts.
    assert ahead._ahead.wait_ready(3, timeout=120), "the thread did not build steps 3..5"
    assert ahead._cursor.step == 5 and ahead._ahead._out.qsize() == 3  # and no further: at most 3 ahead
    assert ahead.state_dict() == sync.state_dict() == {"step": 2, "carry": "[]", "lookahead": "[]",
                                                          **sync.account.state_dict(),
                                                          "data_order": sync.data_order.to_json()}
    assert sync.account.totals.read == 8 and ahead._cursor.account.totals.read == 20
    assert ahead.account.summary() == sync.account.summary()  # the run summary too
    ahead.close()


@pytest.mark.parametrize("fresh", [False, True], ids=["same-loader", "new-loader"])
def test_resume_mid_run_replays_the_uninterrupted_steps(tok, fresh):
    want = [s for s, _ in zip(_loader(tok, "jsonl-truncate", 0), range(STEPS))]
    run = _loader(tok, "jsonl-truncate", 3)
    for _ in range(3):
        run.next_step()
    saved = run.state_dict()
    for _ in range(2):  # trained on, then preempted: steps 4, 5 and what was built ahead are lost
        run.next_step()
    if fresh:
        run.close()
        run = _loader(tok, "jsonl-truncate", 3)
    run.load_state_dict(saved)
    assert run.state_dict() == saved
    for w in want[3:]:
        _same(run.next_step(), w)
    run.close()


class _FailingAt:
    """The source, raising a DataError when asked for ``step``'s global batch."""

    def __init__(self, source, step: int) -> None:
        self.source, self.step = source, step

    def __getattr__(self, name):
        return getattr(self.source, name)

    def __getitem__(self, index):
        return self.source[index]

    def global_batch(self, step: int, size: int) -> list[int]:
        if step == self.step:
            raise DataError(f"data.jsonl:7: broken record (step {step})")
        return self.source.global_batch(step, size)


@pytest.mark.parametrize("k", [0, 3])
def test_a_build_error_is_raised_at_its_step(tok, k):
    loader = _loader(tok, "jsonl-truncate", k)
    loader.builder = dataclasses.replace(loader.builder, source=_FailingAt(loader.source, 3))
    assert [loader.next_step().step for _ in range(2)] == [1, 2]
    thread = loader._ahead._thread if k else None
    with pytest.raises(DataError, match=r"^data\.jsonl:7: broken record \(step 3\)$"):
        loader.next_step()
    assert loader.step == 3 and loader.account.totals.read == 8  # as built on demand: step 3 drew nothing
    assert loader._ahead is None and (thread is None or not thread.is_alive())
    assert loader.next_step().step == 4  # goes on after it, as without prefetch


@pytest.mark.parametrize("value", [-1, PREFETCH_MAX + 1, 2.0, True])
def test_bad_prefetch_steps_is_named(value):
    with pytest.raises(ValueError, match=rf"^dataloader\.prefetch_steps: {value!r} is outside 0\.\.{PREFETCH_MAX} "):
        SkrullDataLoader.Config(vocab_size=2048, prefetch_steps=value)


def test_close_and_drop_end_the_thread(tok):
    loader = _loader(tok, "synthetic-dp2cp2", 2)
    assert loader.next_step().step == 1
    thread = loader._ahead._thread
    loader.close()
    assert not thread.is_alive()
    assert loader.next_step().step == 2  # starts again from the state handed out
    thread = loader._ahead._thread
    del loader
    gc.collect()
    thread.join(10)
    assert not thread.is_alive(), "a dropped dataloader left its prefetch thread running"


def _counter():
    """A producer of 1, 2, 3, ... and the list of what it made (thread-safe)."""
    made, lock = [], threading.Lock()

    def produce():
        with lock:
            made.append(len(made) + 1)
            return made[-1]

    return produce, made


def test_prefetcher_keeps_order_and_depth():
    produce, made = _counter()
    p = Prefetcher(produce, depth=2)
    assert p.wait_ready(2, timeout=60), "two results"
    time.sleep(0.3)  # room to over-produce, if it would
    assert len(made) == 2
    assert [p.get() for _ in range(5)] == [1, 2, 3, 4, 5]
    p.close()
    assert not p.alive
    with pytest.raises(ValueError, match="depth must be >= 1, got 0"):
        Prefetcher(produce, depth=0)


def test_a_held_slot_is_built_only_once_resumed_or_at_the_next_get():
    """get(hold=True): the result replacing the one handed out is not started until resume()
    (the trainer: its micro-batches queued), or the next get() gives the slot back itself."""
    produce, made = _counter()
    p = Prefetcher(produce, depth=2)
    assert p.wait_ready(2, timeout=60)
    assert p.get(hold=True) == 1
    time.sleep(0.3)  # room to build the third, if it would
    assert len(made) == 2
    p.resume()
    assert p.wait_ready(2, timeout=60) and len(made) == 3
    p.resume()  # nothing held: nothing more
    assert p.get(hold=True) == 2 and p.get(hold=True) == 3  # the second get gave back the first's slot
    assert p.wait_ready(1, timeout=60) and len(made) == 4  # one slot still held
    time.sleep(0.3)
    assert len(made) == 4
    assert [p.get() for _ in range(3)] == [4, 5, 6]
    p.close()


@pytest.mark.parametrize("case", ["synthetic-dp2cp2", "jsonl-truncate"])
def test_loss_counts_without_tokens_are_the_labels(tok, case):
    """What the limit and the loss normaliser read instead of building every sample."""
    source = _loader(tok, case, 0).source
    for i in range(12):
        labels, length = source[i].labels, source.length(i)
        assert len(labels) == length
        for n in range(1, length + 1):  # cut to n: the first n labels (the last one predicts token n)
            assert source.loss_tokens(i, n, length) == int((labels[:n] != IGNORE_INDEX).sum()), (i, n)


class _Counting:
    """The source, counting the samples built."""

    def __init__(self, source) -> None:
        self.source, self.built = source, []

    def __getattr__(self, name):
        return getattr(self.source, name)

    def __getitem__(self, index):
        self.built.append(index)
        return self.source[index]


def test_a_rank_builds_only_its_own_samples(tok):
    loader = _loader(tok, "synthetic-dp2cp2", 0)
    counting = _Counting(loader.source)
    loader.builder = dataclasses.replace(loader.builder, source=counting)
    step = loader.next_step()
    mine = sorted(i for mb in step.micro_batches for i in mb.seqs)
    assert 0 < len(mine) < 16 and sorted(counting.built) == mine


def test_bench_datawait_runs(capsys):
    from skrull_ext.bench.datawait import main

    assert main(["--steps", "1", "--step-ms", "1", "--prefetch", "3"]) == 0
    out = capsys.readouterr().out
    assert "DP 128 x CP 8, 8192 sequences per step" in out and "CP-SAT on" in out
    assert "\n| 0 (off) | " in out and "\n| 3 | " in out


def test_bench_datawait_indexed_lengths_plan_the_same_steps(capsys):
    """--indexed-lengths reads the synthetic samples' lengths from a list made before the run (as a
    tokenized source reads its index): the same lengths, so the same plans and buffers."""
    import argparse

    from skrull_ext.bench import datawait

    args = argparse.Namespace(dataset="mix_sharegpt_conv95+longbench_en5", seed=0, no_cpsat=True, cpsat_margin=0.1,
                              profile=None, model="qwen2.5-0.5b", steps=1, prefetch=1)
    drawn = datawait.build_loader(args, 0)
    indexed = datawait.build_loader(args, 0, datawait.length_index(args))
    assert isinstance(indexed.source, datawait.IndexedLengths) and not isinstance(drawn.source, datawait.IndexedLengths)
    for _ in range(2):
        a, b = drawn.next_step(), indexed.next_step()
        assert a.samples == b.samples and a.plan.micro_batch == b.plan.micro_batch and a.tokens == b.tokens > 0
        assert [mb.num_tokens for mb in a.micro_batches] == [mb.num_tokens for mb in b.micro_batches]
    assert indexed.source.length(10**7) == drawn.source.length(10**7)  # past the list: drawn
    assert datawait.main(["--steps", "1", "--step-ms", "1", "--indexed-lengths"]) == 0
    assert "the samples' lengths read from an index made before the run" in capsys.readouterr().out


def test_only_the_steps_handed_out_warn(tok, caplog):
    """Issue 50: --training.steps 1 warned 'Skrull step 2: 3 cut' and 'Skrull step 3: 1 cut ...
    run so far: 4 cut' for the steps the thread built ahead, which never trained, while the
    run summary said 'trained cut 0'. The warning is logged when its step is handed out."""
    import logging

    loader = _loader(tok, "jsonl-truncate", 2)
    sync = _loader(tok, "jsonl-truncate", 0)
    with caplog.at_level(logging.WARNING):
        first = loader.next_step()
        assert loader._ahead.wait_ready(2, timeout=60)  # the thread has built steps 2 and 3
        warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Skrull step")]
        assert first.account.counts.cut + first.account.counts.skipped > 0
        assert warned == [first.account.warning]
        assert warned[0].startswith("Skrull step 1: ")
        caplog.clear()
        second = loader.next_step()
        warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Skrull step")]
        assert [w.split(":")[0] for w in warned] == ["Skrull step 2"]
        assert loader.account.totals.cut == first.account.counts.cut + second.account.counts.cut
    loader.close()
    sync.next_step(), sync.next_step()
    assert sync.account.summary() == loader.account.summary()  # the summary counts what was warned
