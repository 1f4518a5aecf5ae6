"""torchtitan's batching laid out in rows (``[dataloader] packing``): exact
layouts on small cases, stream invariants on random ones, and the loader's
tensors and state (every token trained once, no padding, resumable)."""

import json
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull_ext.errors import DataError
from skrull_ext.data.steps.overlength import limit_step
from skrull_ext.data.steps.packed import PackedDataLoader
from skrull_ext.data.steps.row_layout import best_fit_rows, context_cuts, cut_stream, whole_rows
from skrull_ext.data.steps.loader import SkrullDataLoader
from skrull_ext.data.sources.tokenizer import LocalTokenizer

DEBUG_JOB = os.path.join(os.path.dirname(__file__), "..", "..", "skrull_ext", "jobs", "debug_cpu.toml")


def test_whole_rows_first_fit():
    assert whole_rows([3, 5, 2], rows=2, seq_len=8) == [[(0, 0, 3), (1, 0, 5)], [(2, 0, 2)]]
    with pytest.raises(ValueError, match=r"does not fit 2 rows of seq_len=8; .*packing = 'stream'"):
        whole_rows([7, 7, 7], rows=2, seq_len=8)


def test_cut_stream_fills_rows_and_carries_the_rest():
    rows, rest = cut_stream([(7, 0, 3), (8, 0, 5), (9, 2, 4)], rows=2, row_len=4)
    assert rows == [[(7, 0, 3), (8, 0, 1)], [(8, 1, 5)]]
    assert rest == [(9, 2, 4)]
    rows, rest = cut_stream([(1, 0, 8)], rows=2, row_len=4)
    assert rows == [[(1, 0, 4)], [(1, 4, 8)]] and rest == []
    with pytest.raises(ValueError, match="holds 7 tokens, fewer than 2 rows of 4"):
        cut_stream([(1, 0, 7)], rows=2, row_len=4)


def test_best_fit_rows_places_whole_pieces_carried_first():
    # Drawn, longest first: 5 -> row 0, 4 -> row 1, 3 -> row 0 (8: full), 2 -> row 1 (6), 2 -> row 1 (8).
    rows, left = best_fit_rows([], [(0, 0, 3), (1, 0, 5), (2, 0, 2), (3, 0, 4), (4, 0, 2)], rows=2, row_len=8)
    assert rows == [[(1, 0, 5), (0, 0, 3)], [(3, 0, 4), (2, 0, 2), (4, 0, 2)]] and left == []
    # Best fit, not first fit: the 2 goes where it leaves least room (row 1: 3 free), not row 0 (6 free).
    rows, left = best_fit_rows([(9, 0, 2)], [(5, 0, 6), (6, 0, 5), (7, 0, 2)], rows=2, row_len=8)
    assert rows == [[(9, 0, 2), (5, 0, 6)], [(6, 0, 5), (7, 0, 2)]] and left == []
    # What does not fit is carried, carried ones first, in their given order.
    rows, left = best_fit_rows([(1, 0, 7)], [(2, 0, 3), (3, 0, 8), (4, 0, 6)], rows=2, row_len=8)
    assert rows == [[(1, 0, 7)], [(3, 0, 8)]] and left == [(2, 0, 3), (4, 0, 6)]
    with pytest.raises(ValueError, match="a piece of 9 tokens does not fit a row of 8"):
        best_fit_rows([], [(0, 0, 9)], rows=1, row_len=8)


def test_context_cuts_count_pieces_that_start_mid_document():
    assert context_cuts([[(1, 0, 4), (2, 0, 4)], [(2, 4, 6), (3, 2, 5)], [(3, 5, 9)]]) == (2, 2 + 3 + 4)
    assert context_cuts([[(1, 0, 4)], []]) == (0, 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 64), max_size=30), st.lists(st.integers(1, 64), max_size=30), st.integers(1, 6))
def test_best_fit_rows_keeps_every_piece_once_and_whole(carried, drawn, rows):
    carried = [(k, 0, n) for k, n in enumerate(carried)]
    drawn = [(100 + k, 0, n) for k, n in enumerate(drawn)]
    out, left = best_fit_rows(carried, drawn, rows, 64)
    placed = [p for row in out for p in row]
    assert sorted(placed + left) == sorted(carried + drawn)  # each once, never cut
    assert all(sum(e - s for _, s, e in row) <= 64 for row in out)
    free = [64 - sum(e - s for _, s, e in row) for row in out]
    assert all(e - s > max(free) for _, s, e in left)  # nothing left over fits a row's free space
    assert left == [p for p in carried + drawn if p in left]  # carried first, each in its given order


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=40), st.integers(1, 8), st.sampled_from([16, 64, 512]))
def test_cut_stream_keeps_every_token_once_in_order(lengths, rows, row_len):
    pieces = [(k, 0, n) for k, n in enumerate(lengths)]
    if sum(lengths) < rows * row_len:
        return
    out, rest = cut_stream(pieces, rows, row_len)
    assert all(sum(e - s for _, s, e in row) == row_len for row in out)  # full rows
    stream = [(k, t) for k, s, e in [p for row in out for p in row] + rest for t in range(s, e)]
    assert stream == [(k, t) for k, n in enumerate(lengths) for t in range(n)]


@pytest.fixture(scope="module")
def tok():
    return LocalTokenizer.Config(path="tiny_bpe").build(tokenizer_path="")


def _loader(tok, packing, dp=1, rank=0, B=2, S=128):
    loader = PackedDataLoader.Config(dataset="jsonl", dataset_path="tiny_sft", max_len=128, global_batch_size=4,
                                     packing=packing).build(
        dp_world_size=dp, dp_rank=rank, tokenizer=tok, seq_len=S, local_batch_size=B)
    loader.set_overlength("truncate")
    return loader


@pytest.mark.parametrize("dp", [1, 2])
def test_stream_trains_each_drawn_token_once_without_padding(tok, dp):
    # The rows of every step (DP rank 0's, then rank 1's), then the carried
    # pieces, are the global batches drawn, in order, token for token.
    loaders = [_loader(tok, "stream", dp, r) for r in range(dp)]
    its = [iter(x) for x in loaders]
    got_in, got_lab = [], []
    for _ in range(6):
        batches = [next(it) for it in its]
        for inputs, labels in batches:
            assert labels.shape == (2, 128) and (inputs["positions"][:, 0] == 0).all()  # a row starts a document
            got_in.append(inputs["input"].flatten())
            got_lab.append(labels.flatten())
        assert loaders[0].last_tokens == dp * 2 * 128
        # Drawn only when the carry falls short: it never holds a whole global batch more.
        assert sum(e - st for _, st, e in loaders[0].carry) < 4 * 128
        assert [x.step for x in loaders] == [loaders[0].step] * dp and [x.carry for x in loaders] == [loaders[0].carry] * dp
    ref = _loader(tok, "stream", dp)
    want_in, want_lab = [], []
    for _ in range(loaders[0].step):
        kept_idx, kept, _ = limit_step(ref.limit, ref.next_global_batch(), ref.source, ref.step, ref.account)
        want_in += [s.input for s in kept]
        want_lab += [s.labels for s in kept]
    carried = sum(e - st for _, st, e in loaders[0].carry)
    want_in, want_lab = torch.cat([torch.as_tensor(x) for x in want_in]), torch.cat([torch.as_tensor(x) for x in want_lab])
    n = len(want_in) - carried
    assert n == 6 * dp * 2 * 128  # every position a real token
    assert torch.equal(torch.cat(got_in), want_in[:n]) and torch.equal(torch.cat(got_lab), want_lab[:n])


@pytest.mark.parametrize("packing", ["stream", "documents"])
def test_carried_packings_resume_exactly(tok, packing):
    # The third step ends inside a sample (stream) or leaves whole samples unplaced (documents):
    # a loader restored from its state trains the same next steps, token for token.
    run = _loader(tok, packing, B=1, S=96)
    it = iter(run)
    for _ in range(3):
        next(it)
    state = run.state_dict()
    assert json.loads(state["carry"]), "the third step should carry something"
    want = [next(it) for _ in range(4)]
    again = _loader(tok, packing, B=1, S=96)
    again.load_state_dict(state)
    it2 = iter(again)
    for (a_in, a_lab), (b_in, b_lab) in zip(want, [next(it2) for _ in range(4)]):
        assert torch.equal(a_in["input"], b_in["input"]) and torch.equal(a_lab, b_lab)
        assert torch.equal(a_in["positions"], b_in["positions"])


def test_packing_is_checked_and_refused_under_skrull():
    with pytest.raises(ValueError, match=r"dataloader.packing: 'dense' is not one of \['rows', 'stream', 'documents'\]"):
        PackedDataLoader.Config(packing="dense")
    from skrull_ext.train.job.job_file import load_config
    from skrull_ext.train.trainer import JobConfig, SkrullTrainer

    job = ["--config-file", DEBUG_JOB, "--dataloader.packing", "stream"]
    with pytest.raises(ValueError, match=r"dataloader.packing = 'stream' is for torchtitan's batching"):
        load_config(job, check=False)
    config = load_config(job + ["--skrull.no-enable"], check=False)
    assert isinstance(config, JobConfig) and isinstance(config.dataloader, PackedDataLoader.Config)
    assert config.dataloader.packing == "stream"
    assert SkrullDataLoader.Config().packing == "rows"


def test_documents_train_each_sample_once_whole(tok):
    # Every sample drawn is trained exactly once, never cut (positions count 0..n-1 within each),
    # and what a step does not place is what it carries.
    run = _loader(tok, "documents", B=2, S=128)
    layouts = []
    run.on_layout = layouts.append  # each batch's rows, as the trainer's FLOP count receives them
    it = iter(run)
    trained = []
    for step in range(6):
        inputs, labels = next(it)
        assert labels.shape == (2, 128) and len(layouts) == step + 1
        layout = layouts[-1]
        assert context_cuts(layout) == (0, 0)
        pieces = [p for row in layout for p in row]
        assert all(s == 0 and e == min(run.source[k].length, 128) for k, s, e in pieces)
        assert run.last_tokens == sum(e for _, _, e in pieces) <= 2 * 128
        trained += [k for k, _, _ in pieces]
        for b, row in enumerate(layout):
            off = 0
            for k, _, e in row:
                assert torch.equal(inputs["input"][b, off:off + e], torch.as_tensor(run.source[k].input[:e]))
                assert torch.equal(inputs["positions"][b, off:off + e], torch.arange(e))
                off += e
    ref = _loader(tok, "documents")
    drawn = []
    for _ in range(run.step):
        kept_idx, _, _ = limit_step(ref.limit, ref.next_global_batch(), ref.source, ref.step, ref.account)
        drawn += kept_idx
    carried = [k for k, _, _ in run.carry]
    assert sorted(trained + carried) == sorted(drawn) and len(set(drawn)) == len(drawn)


@pytest.mark.parametrize("packing", ["stream", "documents"])
def test_carried_packings_count_what_they_trained_not_what_they_drew(tok, packing):
    # A sample is counted (whole or cut to the limit) by the step that trains its last piece, so a
    # checkpoint's counts hold no sample it carries, and a resumed loader counts each carried one once.
    run = _loader(tok, packing, B=1, S=96)
    layouts = []
    run.on_layout = layouts.append
    it = iter(run)
    finished = []
    for _ in range(3):
        next(it)
        pieces = [p for row in layouts[-1] for p in row]
        done = [k for k, _, e in pieces if e == min(run.source[k].length, run.limit.tokens)]
        finished += done
        c = run.last_counts
        assert c.whole + c.cut == len(done) and c.read == len(done) + c.skipped
    t = run.account.totals
    assert t.whole + t.cut == len(finished) and t.cut == sum(run.source[k].length > run.limit.tokens for k in finished)
    state = run.state_dict()
    carried = {k for k, _, _ in json.loads(state["carry"])}
    assert carried and not carried & set(finished) and state["samples_whole"] + state["samples_cut"] == len(finished)
    again = _loader(tok, packing, B=1, S=96)
    again.load_state_dict(state)
    it2 = iter(again)
    for _ in range(4):
        next(it), next(it2)
    assert again.account.totals.as_dict() == run.account.totals.as_dict()


def test_torchtitans_batching_refuses_a_checkpoint_saved_inside_a_look_ahead_window(tok):
    # Skrull's look-ahead regrouped the window's samples over its steps; this batching would train each
    # global batch at its own step: some twice, others never. At a window's end it continues.
    state = _loader(tok, "rows").state_dict()
    state.update(step=2, lookahead="[[1, 4]]")
    with pytest.raises(DataError, match=r"^the checkpoint of step 2 was saved inside a look-ahead window \(steps "
                                        r"1\.\.4, skrull\.lookahead 4\).* to step 4 or beyond"):
        _loader(tok, "rows").load_state_dict(state)
    state.update(step=4)
    resumed = _loader(tok, "rows")
    resumed.load_state_dict(state)
    assert resumed.step == 4
