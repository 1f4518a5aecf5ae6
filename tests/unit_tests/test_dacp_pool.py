# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""DACP attention over rank sets of the world (policy skrull-pool) against the
float64 single-process reference.

One spawn of 4 gloo processes, read as DP 2 x CP 2 (world rank = dp * 2 +
cp: DP groups {0, 1} and {2, 3}), runs every case over the world group. Each
sequence has a rank set [first, first + k): k = 1 is local, k >= 2 sharded
zigzag over those k ranks, e.g. [1, 3) spans both DP groups. Every rank cuts
its buffer with ``shard_set_buffer`` (random pad values, so a leak would
show), runs forward and backward, and the parent reassembles outputs and
dq/dk/dv with ``unshard_set_buffer`` and compares each sequence with causal
attention over that sequence alone (dacp_multiproc.reference); padding must
get exactly zero gradient.
"""

import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st
import torch.distributed as dist
import torch.multiprocessing as mp
from tests.unit_tests.dacp_multiproc import _backward_order, reference, TOLERANCE
from tests.unit_tests.gloo_worker import gloo_group

from skrull_ext.attention import (
    build_meta,
    build_set_meta,
    dacp_attention,
    DacpBatchMeta,
    DacpStats,
    DISTRIBUTED,
    padded_length,
    shard_set_buffer,
    unshard_set_buffer,
)
from skrull_ext.attention.routes import routes_for

WORLD = 4


@dataclass
class PoolCase:
    name: str
    lengths: list[int]
    sets: list[tuple[int, int]]
    """Per sequence: (first world rank, k) of its rank set."""
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 8
    dtype: torch.dtype = torch.float64
    seed: int = 0
    kernel: str = "dense"
    order: bool = False
    """Also record the order of the backward nodes (needs local and distributed parts, dense kernel)."""
    checkpoint: bool = False
    """Run the attention twice as activation checkpointing does (forward, then a
    recomputation inside backward that must reuse the kept K/V)."""
    extra: dict = field(default_factory=dict)

    @property
    def first(self) -> list[int]:
        return [a for a, _ in self.sets]

    @property
    def num(self) -> list[int]:
        return [k for _, k in self.sets]


def random_case(name: str, seed: int, **kw) -> PoolCase:
    """4-9 sequences, each local on a random rank or over a random contiguous range of 2-4 ranks."""
    rng = random.Random(seed)
    lengths, sets = [], []
    for _ in range(rng.randint(4, 9)):
        k = rng.choice([1, 1, 2, 2, 3, 4])
        sets.append((rng.randrange(WORLD - k + 1), k))
        lengths.append(rng.randint(1, 40))
    return PoolCase(name, lengths, sets, seed=seed, **kw)


CASES = [
    # The step: one sequence over ranks 1-2 (DP groups 0 and 1), one over all 4, others local.
    PoolCase("cross_dp_and_world", [13, 30, 5, 7, 9, 4], [(1, 2), (0, 4), (0, 1), (3, 1), (1, 1), (2, 1)],
             order=True),
    # Overlapping sets: rank 1 shares A with 0, B with 2 and D with everyone.
    PoolCase("overlapping_sets", [11, 17, 9, 26, 6], [(0, 2), (1, 2), (2, 2), (0, 4), (3, 1)], seed=1),
    # Ranks 2 and 3 shard nothing and exchange nothing; rank 3 holds nothing at all.
    PoolCase("some_ranks_silent", [10, 5], [(0, 2), (2, 1)], seed=2),
    PoolCase("three_ranks_len1", [1, 3, 22], [(1, 3), (0, 1), (0, 3)], seed=3),  # Lp = 6 for a 1-token sequence
    PoolCase("mqa", [8, 19, 2], [(2, 2), (0, 4), (1, 1)], heads=4, kv_heads=1, seed=4),
    PoolCase("float32", [12, 30, 6, 21], [(0, 1), (1, 2), (3, 1), (0, 4)], dtype=torch.float32, seed=5),
    PoolCase("segments", [13, 30, 5, 7, 9], [(1, 2), (0, 4), (0, 1), (3, 1), (2, 2)], seed=6, kernel="segments"),
    PoolCase("checkpointed", [13, 30, 5, 7], [(1, 2), (0, 4), (0, 1), (3, 1)], seed=7, checkpoint=True),
    *(random_case(f"random{s}", seed=500 + s) for s in range(4)),
]


def global_inputs(case: PoolCase) -> list[dict[str, torch.Tensor]]:
    """Per sequence, q/k/v/grad_out over its padded length (random pads, zero grad_out there)."""
    g = torch.Generator().manual_seed(case.seed)
    seqs = []
    for n, (_, k) in zip(case.lengths, case.sets):
        lp = padded_length(n, k)

        def rnd(h):
            return torch.randn(h, lp, case.head_dim, generator=g, dtype=torch.float64).to(case.dtype)

        go = rnd(case.heads)
        go[:, n:] = 0
        seqs.append(dict(q=rnd(case.heads), k=rnd(case.kv_heads), v=rnd(case.kv_heads), go=go))
    return seqs


def rank_step(case: PoolCase, rank: int) -> dict:
    seqs = global_inputs(case)
    meta = build_set_meta(case.lengths, case.first, case.num, rank, WORLD)

    def buf(x):
        return shard_set_buffer([s[x] for s in seqs], case.first, case.num, rank, WORLD, dim=1)

    q, k, v = (buf(x).requires_grad_() for x in "qkv")
    stats = DacpStats()
    if case.checkpoint:
        from torch.utils.checkpoint import checkpoint

        from skrull_ext.attention import KVReplay

        replay = KVReplay()

        def attend(q, k, v):
            return dacp_attention(q, k, v, meta, dist.group.WORLD, stats=stats, replay=replay, kernel=case.kernel)

        out = checkpoint(attend, q, k, v, use_reentrant=False)
    else:
        out = dacp_attention(q, k, v, meta, dist.group.WORLD, stats=stats, kernel=case.kernel)
    order = _backward_order(out) if case.order else []
    out.backward(buf("go"))
    got = dict(out=out.detach(), dq=q.grad, dk=k.grad, dv=v.grad)
    return dict(**got, stats=stats, order=order)


def _worker(rank: int, store: str, outdir: str) -> None:
    with gloo_group(store, rank, WORLD):
        # Ranks run the cases in one order; a rank with nothing to exchange in a case goes on to the next.
        torch.save([rank_step(c, rank) for c in CASES], Path(outdir) / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[list[dict]]:
    """results[case][rank]."""
    tmp = tmp_path_factory.mktemp("pool")
    mp.start_processes(_worker, args=(str(tmp / "store"), str(tmp)), nprocs=WORLD, start_method="spawn")
    per_rank = [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    return [[per_rank[r][i] for r in range(WORLD)] for i in range(len(CASES))]


@pytest.mark.slow
@pytest.mark.parametrize("idx", range(len(CASES)), ids=[c.name for c in CASES])
def test_pool_attention_matches_single_process(results, idx):
    case, ranks = CASES[idx], results[idx]
    seqs = global_inputs(case)
    ref = reference(case, seqs)
    padded = [s["q"].size(1) for s in seqs]
    for key in ("out", "dq", "dk", "dv"):
        bufs = [r[key] if r[key] is not None else torch.zeros(case.heads if key in ("out", "dq") else case.kv_heads,
                                                               0, case.head_dim, dtype=case.dtype) for r in ranks]
        got = unshard_set_buffer(bufs, padded, case.first, case.num, dim=1)
        for i, (n, g) in enumerate(zip(case.lengths, got)):
            torch.testing.assert_close(g[:, :n], ref[i][key], **TOLERANCE[case.dtype],
                                       msg=lambda m: f"{key} seq {i}: {m}")
            if key != "out":
                assert not g[:, n:].any(), f"{key} seq {i}: nonzero gradient on padding"

    # Bytes moved, counted independently: each rank sends its shard of a k-rank
    # sequence to the k - 1 others, forward, and the same gradient bytes back.
    elem = torch.tensor([], dtype=case.dtype).element_size()
    for r, res in enumerate(ranks):
        s: DacpStats = res["stats"]
        held = [(n, k) for n, (a, k) in zip(case.lengths, case.sets) if k > 1 and a <= r < a + k]
        expected = sum((k - 1) * (padded_length(n, k) // k) for n, k in held) * 2 * case.kv_heads * case.head_dim * elem
        assert s.fwd_bytes == s.bwd_bytes == expected, f"rank {r}"
        assert s.dist_seqs == len(held) and s.all_gathers == (1 if held else 0)
        # Under checkpointing the recomputation took the kept K/V (one gather above, one replay);
        # it may stop early once the saved tensors are back, so its call is not always counted.
        assert s.replays == (1 if case.checkpoint and held else 0), f"rank {r}"


@pytest.mark.slow
def test_backward_overlaps_local_part(results):
    """As over a CP group: the rank-set exchange of dK/dV is issued before the local
    part's backward and waited on after it (order of autograd nodes, not timing)."""
    for case, ranks in zip(CASES, results):
        if case.order:
            for r, res in enumerate(ranks):
                assert res["stats"].local_seqs and res["stats"].dist_seqs, f"rank {r} needs both parts"
                assert res["order"] == ["_WaitExchangeBackward", "local", "_StartExchangeBackward"], f"rank {r}"


def test_whole_world_sets_describe_the_cp_layout():
    """Every sequence over the whole group: the pool meta's tokens, gathered K/V and
    masks are the CP-group meta's (the skrull layout is the special case)."""
    lengths, placement = [5, 13, 7, 4, 9, 20], [0, DISTRIBUTED, 3, 1, DISTRIBUTED, 2]
    first = [0 if p == DISTRIBUTED else p for p in placement]
    num = [WORLD if p == DISTRIBUTED else 1 for p in placement]
    for r in range(WORLD):
        pool, cp = build_set_meta(lengths, first, num, r, WORLD), build_meta(lengths, placement, r, WORLD)
        assert (pool.local_lens, pool.dist_lens, pool.shard_lens) == (cp.local_lens, cp.dist_lens, cp.shard_lens)
        assert pool.peers == list(range(WORLD))
        for a, b in zip(pool.gathered_doc_positions(), cp.gathered_doc_positions()):
            assert torch.equal(a, b)
        assert torch.equal(pool.dist_mask(), cp.dist_mask())


def test_pool_meta_rank_sets():
    """Rank 1 of the overlapping case: which sequences it holds, its peers and what it shares with each."""
    case = CASES[1]
    meta = build_set_meta(case.lengths, case.first, case.num, 1, WORLD)
    assert meta.local_lens == [] and meta.dist_sets == [(0, 2), (1, 2), (2, 2), (0, 4)]
    assert meta.held() == [0, 1, 3] and meta.peers == [0, 1, 2, 3]
    assert [meta.shared_with(p) for p in range(WORLD)] == [[0, 3], [0, 1, 3], [1, 3], [3]]
    assert meta.dist_lens == [12, 20, 12, 32] and meta.shard_lens == [12 // 2, 20 // 2, 32 // 4]
    with pytest.raises(ValueError, match=r"rank set \[3, 5\) is not a non-empty range of \[0, 4\)"):
        build_set_meta([4, 4], [0, 3], [2, 2], 0, WORLD)
    with pytest.raises(ValueError, match=r"rank set \[3, 5\) must hold 2 or more ranks of \[0, 4\)"):
        DacpBatchMeta(0, WORLD, [], [8], dist_sets=[(3, 2)])
    with pytest.raises(ValueError, match="dist length 6 over 2 ranks must be a multiple of 4"):
        DacpBatchMeta(0, WORLD, [], [6], dist_sets=[(0, 2)])


@st.composite
def _pool_micro_batch(draw):
    world = draw(st.integers(2, 8))
    n = draw(st.integers(1, 8))
    sets = []
    for _ in range(n):
        k = draw(st.integers(1, world))
        sets.append((draw(st.integers(0, world - k)), k))
    return world, draw(st.lists(st.integers(1, 60), min_size=n, max_size=n)), sets


@settings(max_examples=60, deadline=None)
@given(_pool_micro_batch())
def test_rank_set_routes_agree_and_gather_every_position_once(mb):
    """For any rank sets: what rank r expects from q is what q sends to r (both ends
    derive the block sizes without a message), a rank's gathered K/V hold every
    position of each sequence it holds exactly once, and its buffer's tokens are
    its local sequences plus its shards (the sum over ranks: every padded token once)."""
    world, lengths, sets = mb
    first, num = [a for a, _ in sets], [k for _, k in sets]
    metas = [build_set_meta(lengths, first, num, r, world) for r in range(world)]
    routes = [routes_for(m) for m in metas]
    for r, (m, rt) in enumerate(zip(metas, routes)):
        assert list(rt.peers) == m.peers and (not m.held() or r in rt.peers)
        for q, count, idx in zip(rt.peers, rt.counts, rt.index):
            back = routes[q]
            assert count == back.counts[back.peers.index(r)] == idx.numel()
            assert idx.numel() == 0 or int(idx.max()) < m.num_dist_tokens
        docs, pos = m.gathered_doc_positions()
        for i in m.held():
            got = sorted(pos[docs == i].tolist())
            assert got == list(range(m.dist_lens[i])), f"rank {r}, sequence {i}"
        assert set(docs.tolist()) == set(m.held())
    padded = sum(padded_length(n, k) if k > 1 else n for n, k in zip(lengths, num))
    assert sum(m.num_tokens for m in metas) == padded
