# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""The DACP buffer layout: zigzag shard/unshard, meta offsets, masks.

Hand-checked small cases pin the layout of docs/design/buffer_layout.md;
hypothesis checks the round trips on random micro-batches.
"""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from skrull_ext.attention import (
    build_meta,
    DacpBatchMeta,
    DISTRIBUTED,
    document_causal_mask,
    padded_length,
    shard_buffer,
    unshard_buffer,
    zigzag_positions,
    zigzag_shard,
    zigzag_unshard,
)


def test_padded_length():
    assert padded_length(5, 2) == 8
    assert padded_length(8, 2) == 8
    assert padded_length(1, 4) == 8
    assert padded_length(9, 4) == 16
    assert padded_length(5, 1) == 5  # CP=1: no padding
    with pytest.raises(ValueError, match="length"):
        padded_length(0, 2)


def test_zigzag_by_hand():
    # N=2, Lp=8, c=2: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
    x = torch.arange(8)
    assert zigzag_shard(x, 0, 2).tolist() == [0, 1, 6, 7]
    assert zigzag_shard(x, 1, 2).tolist() == [2, 3, 4, 5]
    assert zigzag_positions(8, 0, 2).tolist() == [0, 1, 6, 7]
    assert zigzag_positions(8, 1, 2).tolist() == [2, 3, 4, 5]
    # N=4, Lp=8, c=1: rank r holds r and 7-r.
    assert [zigzag_shard(x, r, 4).tolist() for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    # CP=1: the whole sequence, any length.
    assert zigzag_shard(torch.arange(5), 0, 1).tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="multiple"):
        zigzag_shard(torch.arange(6), 0, 2)


def test_zigzag_other_dim():
    x = torch.arange(24).view(3, 8)
    shards = [zigzag_shard(x, r, 2, dim=1) for r in range(2)]
    assert shards[0].tolist()[0] == [0, 1, 6, 7]
    assert torch.equal(zigzag_unshard(shards, dim=1), x)


@settings(max_examples=60, deadline=None)
@given(length=st.integers(1, 50), cp_size=st.integers(1, 6))
def test_zigzag_round_trip(length, cp_size):
    lp = padded_length(length, cp_size)
    x = torch.arange(lp)
    shards = [zigzag_shard(x, r, cp_size) for r in range(cp_size)]
    assert torch.equal(zigzag_unshard(shards), x)
    # every rank holds the same number of tokens, and positions match contents
    assert {s.numel() for s in shards} == {lp // cp_size}
    for r, s in enumerate(shards):
        assert torch.equal(zigzag_positions(lp, r, cp_size), s)


def test_build_meta_by_hand():
    lengths = [5, 3, 7, 2]
    placement = [0, DISTRIBUTED, 1, DISTRIBUTED]
    m0 = build_meta(lengths, placement, 0, 2)
    m1 = build_meta(lengths, placement, 1, 2)
    assert (m0.local_lens, m0.dist_lens) == ([5], [4, 4])
    assert (m1.local_lens, m1.dist_lens) == ([7], [4, 4])
    assert m0.shard_lens == [2, 2]
    assert (m0.num_local_tokens, m0.num_dist_tokens, m0.num_tokens) == (5, 4, 9)
    assert m0.local_offsets == [0, 5]
    assert m0.dist_offsets == [5, 7, 9]
    assert m1.dist_offsets == [7, 9, 11]


def test_meta_validation():
    with pytest.raises(ValueError, match="cp_rank"):
        DacpBatchMeta(cp_rank=2, cp_size=2, local_lens=[], dist_lens=[])
    with pytest.raises(ValueError, match="dist_lens"):
        DacpBatchMeta(cp_rank=0, cp_size=2, local_lens=[], dist_lens=[6])
    with pytest.raises(ValueError, match="local_lens"):
        DacpBatchMeta(cp_rank=0, cp_size=2, local_lens=[0], dist_lens=[])
    with pytest.raises(ValueError, match="placement"):
        build_meta([3], [2], 0, 2)


def test_document_causal_mask_by_hand():
    m = DacpBatchMeta(cp_rank=0, cp_size=1, local_lens=[2, 3], dist_lens=[])
    expected = [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 1, 1, 1],
    ]
    assert m.local_mask().int().tolist() == expected
    # same from the generic builder
    d = torch.tensor([0, 0, 1, 1, 1])
    p = torch.tensor([0, 1, 0, 1, 2])
    assert document_causal_mask(d, p, d, p).int().tolist() == expected


def test_dist_mask_by_hand():
    # One distributed sequence, Lp=4, N=2, c=1: rank 0 holds positions [0, 3],
    # rank 1 holds [1, 2]. Gathered keys are rank-major: positions [0, 3, 1, 2].
    m0 = DacpBatchMeta(cp_rank=0, cp_size=2, local_lens=[3], dist_lens=[4])
    m1 = DacpBatchMeta(cp_rank=1, cp_size=2, local_lens=[], dist_lens=[4])
    assert m0.dist_mask().int().tolist() == [[1, 0, 0, 0], [1, 1, 1, 1]]
    assert m1.dist_mask().int().tolist() == [[1, 0, 1, 0], [1, 0, 1, 1]]
    # Two distributed sequences never see each other.
    m = DacpBatchMeta(cp_rank=0, cp_size=2, local_lens=[], dist_lens=[4, 4])
    # queries: seq0 pos [0, 3], seq1 pos [0, 3]; keys: r0 (s0: 0,3; s1: 0,3), r1 (s0: 1,2; s1: 1,2)
    assert m.dist_mask().int().tolist() == [
        [1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 1, 1, 0, 0],
        [0, 0, 1, 0, 0, 0, 0, 0],
        [0, 0, 1, 1, 0, 0, 1, 1],
    ]


def test_masks_are_cached_per_device():
    m = DacpBatchMeta(cp_rank=0, cp_size=2, local_lens=[3], dist_lens=[4])
    assert m.local_mask() is m.local_mask(torch.device("cpu"))
    assert m.dist_mask() is m.dist_mask()


@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    cp_size=st.integers(1, 4),
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=8),
)
def test_shard_unshard_buffer_round_trip(data, cp_size, lengths):
    placement = data.draw(
        st.lists(st.integers(-1, cp_size - 1), min_size=len(lengths), max_size=len(lengths))
    )
    seqs = [torch.randn(2, n) for n in lengths]  # tokens on dim 1
    bufs = [shard_buffer(seqs, placement, r, cp_size, dim=1) for r in range(cp_size)]
    for r, b in enumerate(bufs):
        assert b.size(1) == build_meta(lengths, placement, r, cp_size).num_tokens
    back = unshard_buffer(bufs, lengths, placement, dim=1)
    assert all(torch.equal(a, b) for a, b in zip(seqs, back))
