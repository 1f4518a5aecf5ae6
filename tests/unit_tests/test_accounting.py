"""Every sample read is trained whole, trained cut, or skipped, and counted.

``tests/fixtures/accounting.jsonl`` holds short texts and chats, over-long
texts and chats (cut at ``dataloader.max_len`` 64, loss tokens kept) and
chats whose prompt alone passes 64 tokens (the cut leaves no loss token).
The scheduling dataloader (DP 1 x CP 2, so the CP group's 512 tokens are not
the limit) and torchtitan's batching read it under each over-length policy:
``read = whole + cut + skipped`` must hold per step and per run, each record
must land in the class the table below says, every cut or skip naming its
record's ``file:line``, and nothing be trained without a loss token.
"""

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull_ext.data.steps.accounting import NO_LOSS, OVERLENGTH
from skrull_ext.data.steps.overlength import OverlengthError, check_overlength
from skrull_ext.data.steps.packed import PackedDataLoader
from skrull_ext.data.steps.loader import SkrullDataLoader
from skrull_ext.data.sources.synthetic import IGNORE_INDEX
from skrull_ext.data.sources.tokenizer import LocalTokenizer
from skrull_ext.errors import DataError
from skrull_ext.scheduler import Scheduler, cost_model
from skrull_ext.train.job.skrull_config import SkrullConfig

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "accounting.jsonl")
MAX_LEN = 64
GBS = 4
EPOCHS = 2
# Line of the fixture -> what the policy 'truncate' makes of it at max_len 64
# (tiny_bpe tokens: length, and where the first loss token is).
KINDS = {
    1: "whole",    # chat, 25 tokens
    2: "whole",    # text, 9
    3: "cut",      # text, 135: every token is a loss token
    4: NO_LOSS,    # chat, 193, the reply starts at token 188
    5: "whole",    # chat, 32
    6: NO_LOSS,    # system + user + assistant, 184, the reply starts at token 171
    7: "whole",    # text, 13
    8: "cut",      # chat, 159, a long reply starting at token 23
}


@pytest.fixture(scope="module")
def tok():
    return LocalTokenizer.Config(path="tiny_bpe").build(tokenizer_path="")


def _loader(tok, policy, max_len=MAX_LEN, path=FIXTURE, bucket=256):
    config = SkrullDataLoader.Config(dataset="jsonl", dataset_path=path, max_len=max_len, global_batch_size=GBS)
    loader = config.build(dp_world_size=1, dp_rank=0, tokenizer=tok)
    section = SkrullConfig(bucket_size=bucket, cost_model="h100-assumed", overlength=policy)
    loader.attach(Scheduler(section.scheduler_config(1, 2, lookahead=1), cost_model.preset("llama3-debug")), 0, 2)
    return loader


def _line(where: str) -> int:
    return int(where.rsplit(":", 1)[1])


def test_the_fixture_is_what_the_table_says(tok):
    src = _loader(tok, "truncate").source
    assert len(src) == len(KINDS)
    for r in range(len(src)):
        long, line = len(src.ids_of(r)) > MAX_LEN, _line(src.where_of(r))
        assert long == (KINDS[line] != "whole"), line
        if long:  # a loss token among the first MAX_LEN labels (label k predicts token k + 1) or none
            assert bool(src.mask_of(r)[1 : MAX_LEN + 1].any()) == (KINDS[line] == "cut"), line


@pytest.mark.parametrize("policy", ["truncate", "drop"])
def test_read_equals_whole_plus_cut_plus_skipped(tok, policy):
    loader = _loader(tok, policy)
    src = loader.source
    steps = [loader.next_step() for _ in range(EPOCHS * len(KINDS) // GBS)]
    seen: dict[int, list[str]] = {}
    for step in steps:
        c = step.account.counts
        assert c.read == GBS == c.whole + c.cut + c.skipped
        assert len(step.samples) == c.whole + c.cut == len(step.plan.input_lengths)
        assert max(step.plan.input_lengths) <= MAX_LEN  # the limit is max_len, not the CP group's 512
        cut = {e.index for e in step.account.events if e.kept}
        for i, n in zip(step.samples, step.plan.input_lengths):  # trained: the record, or its first 64 tokens
            assert n == (MAX_LEN if i in cut else src.length(i))
            assert i in cut or src.length(i) <= MAX_LEN
        # Nothing trained without a loss token; the normaliser counts what is trained.
        want = sum(int((src[i].labels[:MAX_LEN] != IGNORE_INDEX).sum()) for i in step.samples)
        assert step.global_valid_tokens == want > 0
        for i in step.samples:
            assert (src[i].labels[:MAX_LEN] != IGNORE_INDEX).any()
        for e in step.account.events:
            seen.setdefault(_line(e.where), []).append("cut" if e.kept else e.reason)
            assert e.where == src.location(e.index) and os.path.samefile(e.where.rsplit(":", 1)[0], FIXTURE)
            assert e.length == src.length(e.index) > MAX_LEN and e.kept in (0, MAX_LEN)
    t = loader.account.totals
    assert t.read == EPOCHS * len(KINDS) == t.whole + t.cut + t.skipped
    whole = EPOCHS * list(KINDS.values()).count("whole")
    if policy == "truncate":  # cut, or skipped for want of a loss token: never trained as zero
        assert seen == {n: [k] * EPOCHS for n, k in KINDS.items() if k != "whole"}
        assert (t.whole, t.cut, t.skipped_overlength, t.skipped_no_loss) == (whole, 4, 0, 4)
    else:  # every over-long record is skipped as over-length
        assert seen == {n: [OVERLENGTH] * EPOCHS for n, k in KINDS.items() if k != "whole"}
        assert (t.whole, t.cut, t.skipped_overlength, t.skipped_no_loss) == (whole, 0, 8, 0)
    summary = loader.account.summary()
    assert summary.startswith(f"samples read 16 = trained whole {whole} + trained cut {t.cut} + "
                              f"skipped {t.skipped} ({t.skipped_overlength} over-length, "
                              f"{t.skipped_no_loss} with no loss tokens)")
    assert f"{src.path}:" in summary


def test_chunked_records_train_as_cut_and_counted(tok):
    """Under 'chunk' a record longer than the CP group (bucket_size 16 x cp 2) trains whole in chunks
    up to ``dataloader.max_len`` (150) and is cut to it beyond: the sample a rank runs in chunks is
    the counted one (lines 4 and 6 are skipped: their first 150 tokens hold no loss token). The
    loader handed out the whole record (159-193 tokens), whose positions ran past the RoPE cache
    (``training.seq_len`` = max_len): the shipped text job crashed on its 520-token record under
    --skrull.overlength chunk."""
    max_len = 150
    loader = _loader(tok, "chunk", max_len=max_len, bucket=16)
    src = loader.source
    chunked = []
    for step in [loader.next_step() for _ in range(EPOCHS * len(KINDS) // GBS)]:
        here = step.samples[len(step.plan.input_lengths):]  # the step's chunked records, after the rest
        assert [s.length for s in step.chunked] == [step.plan.chunked[k] for k in step.plan.chunked_of(0)]
        for i, sample in zip(here, step.chunked):
            n = min(src.length(i), max_len)
            assert sample.length == n and torch.equal(sample.labels, src[i].labels[:n])
            chunked.append((_line(src.location(i)), sample.length))
        cut = {e.index: e.kept for e in step.account.events if e.kept}
        assert {i: max_len for i in here if src.length(i) > max_len} == cut
        built = list(step.chunked) + [src[i] for i in step.samples[:len(step.plan.input_lengths)]]
        assert step.global_valid_tokens == sum(int((s.labels[:max_len] != IGNORE_INDEX).sum()) for s in built)
    assert sorted(set(chunked)) == [(3, 135), (8, 150)]
    t = loader.account.totals
    assert (t.whole, t.cut, t.skipped_no_loss, t.chunked) == (10, 2, 4, 4)  # lines 3 and 8 twice in chunks
    # the pre-scan foresees the cuts and the skips (it had said every one "trained whole in chunks")
    report = check_overlength(_loader(tok, "chunk", max_len=max_len, bucket=16), 1, 4)
    assert (len(report.over), report.cut, report.no_loss) == (8, 6, 4)


@pytest.mark.parametrize("max_len, bucket", [(32, 16), (MAX_LEN, 256)])
def test_chunk_at_a_max_len_the_ranks_hold_cuts_every_long_record(tok, caplog, max_len, bucket):
    """dataloader.max_len at or below what the CP group holds (16 x 2, 256 x 2): under 'chunk' every
    longer record is cut to it, none chunked, as the pre-scan says (at 32 one had trained whole,
    past max_len; at 64 the pre-scan said they would train whole in chunks, and foresaw no skip)."""
    loader = _loader(tok, "chunk", max_len=max_len, bucket=bucket)
    report = check_overlength(loader, 1, 4)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Skrull over-length:")]
    assert len(said) == 1 and (f"and will be truncated to {max_len} tokens, dataloader.max_len: none trains in "
                               "chunks, but 4 of them would keep no loss token (a prompt longer than the "
                               "cut)") in said[0]
    steps = [loader.next_step() for _ in range(4)]
    assert all(not s.chunked and max(s.plan.input_lengths) <= max_len for s in steps)
    t = loader.account.totals
    assert t.chunked == 0 and t.cut + t.skipped == 8 == report.cut and t.skipped == 4 == report.no_loss


def test_the_pre_scan_says_what_chunk_cuts(tok, caplog):
    check_overlength(_loader(tok, "chunk", max_len=150, bucket=16), 1, 4)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Skrull over-length:")]
    assert len(said) == 1 and ("are longer than 32 tokens (bucket_size 16 x cp 2) and will be trained whole in chunks "
                               "of 32 tokens; 6 of them, longer than dataloader.max_len 150, will be cut to it "
                               "first, but 4 of them would keep no loss token (a prompt longer than the cut) and will "
                               "be skipped (skrull.overlength = 'chunk')") in said[0], said


def test_the_pre_scan_foresees_what_the_steps_do(tok):
    loader = _loader(tok, "truncate")
    report = check_overlength(loader, 1, 4)  # logs, does not raise
    steps = [loader.next_step() for _ in range(4)]
    assert len(report.over) == sum(s.account.counts.cut + s.account.counts.skipped for s in steps) == 8
    assert report.no_loss == sum(s.account.counts.skipped_no_loss for s in steps) == 4


def test_totals_per_step_and_across_a_resume(tok):
    loader = _loader(tok, "truncate")
    steps = [loader.next_step() for _ in range(2)]
    assert steps[1].totals["read"] == 2 * GBS
    assert steps[1].totals == {k: steps[0].account.counts.as_dict()[k] + steps[1].account.counts.as_dict()[k]
                               for k in steps[1].totals}
    resumed = _loader(tok, "truncate")
    resumed.load_state_dict(loader.state_dict())
    rest = [loader.next_step() for _ in range(2)]
    assert [s.totals for s in rest] == [resumed.next_step().totals for _ in range(2)]
    assert resumed.account.totals.read == 4 * GBS


@pytest.mark.parametrize("new, said", [
    (GBS, None),
    (2, "dataloader.global_batch_size = 2: the checkpoint of step 3 read 12 samples (4 a step), and the steps after "
        "it number theirs by the new size, so samples 6..11 are trained again; continue with "
        "--dataloader.global_batch_size 4 to train each sample once"),
    (8, "so samples 12..23 are never trained; continue with --dataloader.global_batch_size 4"),
])
def test_a_resume_at_another_global_batch_size_says_what_it_costs(tok, caplog, new, said):
    """It continued without a word: step 4 at 2 a step read samples 6..7, trained at step 2."""
    loader = _loader(tok, "truncate")
    for _ in range(3):
        loader.next_step()
    resumed = SkrullDataLoader.Config(dataset="jsonl", dataset_path=FIXTURE, max_len=MAX_LEN,
                                      global_batch_size=new).build(dp_world_size=1, dp_rank=0, tokenizer=tok)
    caplog.clear()
    resumed.load_state_dict(loader.state_dict())
    lines = [r.getMessage() for r in caplog.records if "global_batch_size" in r.getMessage()]
    assert (lines == []) if said is None else (len(lines) == 1 and said in lines[0])


def test_error_names_the_record_and_max_len_before_training(tok):
    loader = _loader(tok, "error")
    src = loader.source
    with pytest.raises(OverlengthError) as e:
        check_overlength(loader, 1, 2)
    step, i = min((s, i) for s in (1, 2) for i in src.global_batch(s, GBS) if src.length(i) > MAX_LEN)
    assert str(e.value).startswith(
        f"{src.location(i)}: sample {i} (step {step}) has length {src.length(i)}, longer than "
        f"dataloader.max_len {MAX_LEN}; raise dataloader.max_len, or set skrull.overlength to 'truncate' or 'drop'")
    assert isinstance(e.value, DataError)  # the launcher prints it as one line
    with pytest.raises(OverlengthError, match=r"accounting.jsonl:\d+: sample \d+ \(step 1\)"):  # also per step
        loader.next_step()


def test_a_step_with_nothing_to_train_is_refused(tok, tmp_path):
    # Lines 4 and 6 only (prompts alone pass max_len): every sample of a step is skipped.
    with open(FIXTURE) as f:
        lines = f.readlines()
    path = tmp_path / "prompts.jsonl"
    path.write_text(lines[3] + lines[5])
    loader = _loader(tok, "truncate", path=str(path))
    with pytest.raises(DataError, match=r"step 1: every sample of the global batch was skipped.*"
                                        r"prompts.jsonl:\d: skipped \(\d+ tokens\), no loss tokens"):
        loader.next_step()
    assert loader.account.totals.skipped_no_loss == GBS


def test_max_len_above_the_cp_group_leaves_the_cp_limit(tok):
    loader = _loader(tok, "truncate", max_len=4096)
    steps = [loader.next_step() for _ in range(2)]
    assert loader.limit.tokens == 512 and loader.limit.source == "bucket_size 256 x cp 2"
    assert sum(s.account.counts.whole for s in steps) == 2 * GBS  # the fixture's records all fit 512


def test_torchtitan_batching_counts_the_same_way(tok):
    config = PackedDataLoader.Config(dataset="jsonl", dataset_path=FIXTURE, max_len=MAX_LEN, global_batch_size=GBS)
    loader = config.build(dp_world_size=1, dp_rank=0, tokenizer=tok, seq_len=128, local_batch_size=4)
    loader.set_overlength("truncate")
    assert loader.limit.tokens == MAX_LEN and loader.limit.source == f"dataloader.max_len {MAX_LEN}"
    it = iter(loader)
    for _ in range(EPOCHS * len(KINDS) // GBS):
        _, labels = next(it)
        assert (labels != IGNORE_INDEX).any()
    t = loader.account.totals
    assert (t.read, t.whole, t.cut, t.skipped_overlength, t.skipped_no_loss) == (16, 8, 4, 0, 4)
    assert loader.state_dict()["samples_read"] == 16
    # Under 'error' the same record is refused, naming it.
    strict = config.build(dp_world_size=1, dp_rank=0, tokenizer=tok, seq_len=128, local_batch_size=4)
    with pytest.raises(OverlengthError, match=r"accounting.jsonl:\d+: sample \d+ \(step \d\) has length \d+, "
                                              r"longer than dataloader.max_len 64"):
        for _ in range(EPOCHS * len(KINDS) // GBS):
            next(iter(strict))


def test_a_stream_steps_cut_warning_names_the_training_step(tok, caplog):
    """Under 'stream' packing a step draws global batches until its rows are full (two for
    step 1 here: 98 tokens of the first after the limit, 128 a row), so the loader's step
    counts global batches, not training steps: the cut warning said 'Skrull step 38' in a
    3-step run. It names the step PackedTrainer is at (``_count_like_skrull`` tells the
    loader), which a resume restores with no key of the loader's."""
    from types import SimpleNamespace

    from skrull_ext.train.packed_trainer import PackedTrainer

    config = PackedDataLoader.Config(dataset="jsonl", dataset_path=FIXTURE, max_len=MAX_LEN, global_batch_size=GBS,
                                     packing="stream")
    job = SimpleNamespace(skrull=SimpleNamespace(overlength="truncate"), training=SimpleNamespace(steps=6))

    def trainer(step: int, state: dict | None = None) -> PackedTrainer:
        t = PackedTrainer.__new__(PackedTrainer)
        t.step = step
        t.dataloader = config.build(dp_world_size=1, dp_rank=0, tokenizer=tok, seq_len=128, local_batch_size=1)
        if state is not None:
            t.dataloader.load_state_dict(state)
        t.optimizers = SimpleNamespace(register_step_pre_hook=lambda hook: None,
                                       register_step_post_hook=lambda hook: None)
        t.document_meter = SimpleNamespace(add=lambda lengths, *cuts: None)
        t._count_like_skrull(job)
        return t

    def train(t: PackedTrainer, steps: int) -> list[int]:
        """The steps the warnings named, as torchtitan's loop counts a step before drawing its batch."""
        caplog.clear()
        with caplog.at_level("WARNING"):
            for _ in range(steps):
                t.step += 1
                t.dataloader._pack()
        return [int(m.split(":")[0].removeprefix("Skrull step ")) for r in caplog.records
                if (m := r.getMessage()).startswith("Skrull step ")]

    first = trainer(0)
    named = train(first, 4)
    assert first.dataloader.step > first.step  # more global batches drawn than steps
    assert named and set(named) <= {1, 2, 3, 4} and named == sorted(set(named)), named
    resumed = trainer(4, first.dataloader.state_dict())
    named = train(resumed, 2)
    assert named and set(named) <= {5, 6}, named


def test_a_resumed_runs_summary_tells_this_launch_from_the_run():
    """Issue 50: a resumed run put 'samples read 320' (the run) beside 'over 24 steps' (this
    launch) without saying which was which. The loaded totals are kept; the launch's are the rest."""
    from skrull_ext.data.steps.accounting import Counts, RunAccount, StepAccount

    def step(read, cut):
        a = StepAccount(counts=Counts(read=read, whole=read - cut, cut=cut))
        return a

    before = RunAccount()
    before.add(step(8, 3))
    before.add(step(8, 1))
    resumed = RunAccount()
    resumed.load_state_dict({"step": 2, **before.state_dict()})  # as the loaders checkpoint it
    assert resumed.launch().as_dict() == Counts().as_dict()
    resumed.add(step(8, 2))
    snapshot = resumed.copy()  # what the loader hands on with each step
    assert (snapshot.totals.read, snapshot.totals.cut) == (24, 6)
    assert snapshot.launch().as_dict() == Counts(read=8, whole=6, cut=2).as_dict()
    assert (snapshot.loaded_step, RunAccount().loaded_step) == (2, 0)  # this launch began at step 3
    assert snapshot.summary(" over the run").startswith(
        "samples read 24 = trained whole 18 + trained cut 6 + skipped 0 (0 over-length, 0 with no loss tokens) "
        "over the run")


def test_a_resumed_launch_is_told_by_its_training_steps_not_the_loaders():
    """Under 'stream' and 'documents' packing a loader's step counts the data's global batches,
    several a training step: resumed at step 2 with the loader at its 38th, the summary said "this
    launch trained no step" after training step 3 (tools/job_combinations.py, seed 9). The launch's
    first step is the trainer's, noted when its loop first asks whether to go on."""
    from types import SimpleNamespace

    from skrull_ext.data.steps.accounting import Counts, RunAccount, StepAccount
    from skrull_ext.train.job_trainer import JobTrainer

    before = RunAccount()
    before.add(StepAccount(counts=Counts(read=240, whole=240)))
    account = RunAccount()
    account.load_state_dict({"step": 38, **before.state_dict()})  # a stream loader's checkpoint of step 2
    trainer = object.__new__(JobTrainer)
    trainer.config, trainer.step = SimpleNamespace(training=SimpleNamespace(steps=3)), 2
    assert trainer._launch_label(account) == " over the run, steps 1..2 (every launch); this launch trained no step"
    assert trainer.should_continue_training()
    trainer.step = 3
    account.add(StepAccount(counts=Counts(read=60, whole=59, cut=1)))
    assert not trainer.should_continue_training() and trainer.launch_first_step == 3  # noted once
    assert trainer._launch_label(account) == (" over the run, steps 1..3 (every launch); this launch, steps 3..3: "
                                              "samples read 60 = trained whole 59 + trained cut 1 + skipped 0")
    fresh = object.__new__(JobTrainer)
    fresh.config, fresh.step = trainer.config, 0
    assert fresh.should_continue_training() and fresh.launch_first_step == 1


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_counts_by_training_step_keep_every_sample_once(data):
    """``by_training_step`` on random windows: each arrival step reads samples (some cut, some
    skipped), the kept ones are dealt over the window's steps at random keeping each step's count.
    Every prefix of steps counts exactly the samples it trains (plus the skips of its arrival
    steps), each cut named at the step that trains it; the whole window counts as it arrived."""
    from skrull_ext.data.steps.accounting import Counts, Event, StepAccount, by_training_step

    w = data.draw(st.integers(1, 5))
    kinds = data.draw(st.lists(st.lists(st.sampled_from("wcsn"), min_size=1, max_size=6), min_size=w, max_size=w))
    arrived, kept, index = [], [], 0
    for batch in kinds:
        a, mine = StepAccount(), []
        a.counts.read = len(batch)
        for k in batch:
            if k == "w":
                a.counts.whole += 1
            else:
                a.record(Event(index, f"sample {index}", 9, 4 if k == "c" else 0, NO_LOSS if k == "n" else OVERLENGTH,
                               ""))
            if k in "wc":
                mine.append(index)
            index += 1
        arrived.append(a)
        kept.append(mine)
    pool = data.draw(st.permutations([i for m in kept for i in m]))
    trained, at = [], 0
    for m in kept:
        trained.append(list(pool[at : at + len(m)]))
        at += len(m)
    out = by_training_step(arrived, trained)
    cuts = {e.index for a in arrived for e in a.events if e.kept}
    for j in range(w):
        c = out[j].counts
        assert c.whole + c.cut == len(trained[j]) and c.cut == len(cuts & set(trained[j]))
        assert c.skipped == arrived[j].counts.skipped and c.read == len(trained[j]) + c.skipped
        assert {e.index for e in out[j].events if e.kept} == cuts & set(trained[j])
    total, want = Counts(), Counts()
    for a, b in zip(out, arrived):
        total.add(a.counts)
        want.add(b.counts)
    assert total.as_dict() == want.as_dict()
