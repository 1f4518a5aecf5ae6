"""torchtitan's batching laid out in rows (``[dataloader] packing``): exact
layouts on small cases, stream invariants on random ones, and the loader's
tensors (same loss tokens as the padded rows, every piece its own document)."""

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchtitan.models.common.attention import get_document_mask_mod

from skrull_ext.datasets.packed import PackedDataLoader
from skrull_ext.datasets.row_layout import stream_rows, whole_rows
from skrull_ext.datasets.scheduling import SkrullDataLoader
from skrull_ext.datasets.synthetic import IGNORE_INDEX
from skrull_ext.tokenizer import LocalTokenizer

DEBUG_JOB = os.path.join(os.path.dirname(__file__), "..", "..", "skrull_ext", "jobs", "debug_cpu.toml")


def test_whole_rows_first_fit():
    layout = whole_rows([3, 5, 2], dp=1, local_batch_size=2, seq_len=8, multiple=1)
    assert layout.row_len == 8
    assert layout.rows == [[(0, 0, 3), (1, 0, 5)], [(2, 0, 2)]]
    with pytest.raises(ValueError, match=r"does not fit 2 rows of seq_len=8; .*packing = 'stream'"):
        whole_rows([7, 7, 7], dp=1, local_batch_size=2, seq_len=8, multiple=1)


def test_stream_rows_cut_across_samples():
    # 10 tokens, rows of at most 8: 2 rows of 5, rounded up to 6 (multiple 2).
    layout = stream_rows([3, 5, 2], dp=1, local_batch_size=4, seq_len=8, multiple=2)
    assert layout.row_len == 6
    assert layout.rows == [[(0, 0, 3), (1, 0, 3)], [(1, 3, 5), (2, 0, 2)]]
    # 618 tokens at CP 2 (blocks of 256): 3 rows of 256 hold them in fewer
    # positions (768) than 2 rows of 512 (1024).
    layout = stream_rows([300, 318], dp=1, local_batch_size=4, seq_len=512, multiple=256)
    assert layout.row_len == 256 and layout.rows == [[(0, 0, 256)], [(0, 256, 300), (1, 0, 212)], [(1, 212, 318)]]
    # DP 2: rows come in multiples of 2; 21 tokens in 2 rows of 11 -> 12.
    layout = stream_rows([21], dp=2, local_batch_size=1, seq_len=16, multiple=4)
    assert layout.row_len == 12 and layout.rows == [[(0, 0, 12)], [(0, 12, 21)]]
    # A step of nothing still gives each DP rank a (padding) row.
    assert stream_rows([], dp=2, local_batch_size=1, seq_len=16, multiple=4).rows == [[], []]
    with pytest.raises(ValueError, match=r"training.seq_len \(10\) must be a multiple of 4"):
        stream_rows([3], dp=1, local_batch_size=1, seq_len=10, multiple=4)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 300), max_size=40), st.sampled_from([1, 2, 3, 4]), st.sampled_from([1, 2, 4, 8]),
       st.sampled_from([64, 128, 512]))
def test_stream_rows_hold_every_token_once_with_padding_under_a_rounding(lengths, dp, multiple, seq_len):
    layout = stream_rows(lengths, dp=dp, local_batch_size=1, seq_len=seq_len, multiple=multiple)
    rows, n = layout.rows, len(layout.rows)
    assert n % dp == 0 and layout.row_len % multiple == 0 and layout.row_len <= seq_len
    assert all(sum(e - s for _, s, e in row) <= layout.row_len for row in rows)
    pieces = [p for row in rows for p in row]
    stream = [(k, t) for k, s, e in pieces for t in range(s, e)]
    assert stream == [(k, t) for k, length in enumerate(lengths) for t in range(length)]  # in order, once
    total = sum(lengths)
    fewest = dp * max(1, -(-(-(-total // seq_len)) // dp))  # rows of seq_len, a multiple of dp
    assert fewest <= n <= 2 * fewest
    assert n * layout.row_len - total < n * multiple or total == 0  # padding: the rounding only
    # No row count in range has fewer positions.
    for r in range(fewest, 2 * fewest + 1, dp):
        assert n * layout.row_len <= r * max(multiple, -(-(-(-total // r)) // multiple) * multiple)


@pytest.fixture(scope="module")
def tok():
    return LocalTokenizer.Config(path="tiny_bpe").build(tokenizer_path="")


def _batches(tok, packing, dp, steps=3):
    out = []
    for rank in range(dp):
        loader = PackedDataLoader.Config(dataset="jsonl", dataset_path="tiny_sft", max_len=512, global_batch_size=8,
                                         packing=packing).build(
            dp_world_size=dp, dp_rank=rank, tokenizer=tok, seq_len=512, local_batch_size=4)
        loader.set_overlength("truncate")
        loader.row_multiple = 4
        it = iter(loader)
        out.append([next(it) for _ in range(steps)])
    return out


@pytest.mark.parametrize("dp", [1, 2])
def test_stream_loader_trains_the_same_tokens_without_the_padding(tok, dp):
    rows, stream = _batches(tok, "rows", dp), _batches(tok, "stream", dp)
    for step in range(3):
        def gathered(b):
            return torch.cat([b[r][step][1].flatten() for r in range(dp)])

        assert sorted(gathered(stream)[gathered(stream) != IGNORE_INDEX].tolist()) == sorted(
            gathered(rows)[gathered(rows) != IGNORE_INDEX].tolist())
        real = int((torch.cat([b[step][0]["input"].flatten() for b in rows]) != 0).sum())
        shapes = {b[step][0]["input"].shape for b in stream}
        assert len(shapes) == 1  # every DP rank the same rows
        (B, L), = shapes
        assert L % 4 == 0 and L <= 512 and dp * B * L < real + dp * B * 4 + 4 * 64
        assert dp * B * L < dp * 4 * 512  # fewer positions than the padded rows
        for r in range(dp):
            inputs, labels = stream[r][step]
            pos = inputs["positions"]
            # Each piece is a document: positions restart at 0 where it starts, so
            # torchtitan's document mask keeps it apart from its neighbours.
            doc = get_document_mask_mod(pos)
            b, q, k = torch.tensor(0), torch.tensor(L - 1), torch.tensor(0)
            assert bool(doc(b, None, k, k)) and pos[0, 0] == 0
            assert bool(doc(b, None, q, k)) == bool((pos[0, 1:] != 0).all())


def test_packing_is_checked_and_refused_under_skrull():
    with pytest.raises(ValueError, match=r"dataloader.packing: 'dense' is not one of \['rows', 'stream'\]"):
        PackedDataLoader.Config(packing="dense")
    from skrull_ext.job_file import load_config
    from skrull_ext.trainer import SkrullTrainer

    job = ["--config-file", DEBUG_JOB, "--dataloader.packing", "stream"]
    with pytest.raises(ValueError, match=r"dataloader.packing = 'stream' is for torchtitan's batching"):
        load_config(job, check=False)
    config = load_config(job + ["--skrull.no-enable"], check=False)
    assert isinstance(config, SkrullTrainer.Config) and isinstance(config.dataloader, PackedDataLoader.Config)
    assert config.dataloader.packing == "stream"
    assert SkrullDataLoader.Config().packing == "rows"
