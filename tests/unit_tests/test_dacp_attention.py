# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""DACP attention against single-process document-masked causal attention.

Multi-process cases run on real gloo processes (one spawn per CP size, see
dacp_multiproc.py) and compare outputs and dq/dk/dv per token, padding
included (its gradient must be exactly zero). The ``segments_*`` cases run
the varlen segment plan (kernels.py's CPU executor) through the same exchange. Single-process cases cover
cp_size 1, the torchtitan-shaped module and argument checks.
"""

from dataclasses import replace

import pytest
import torch

from skrull_ext.attention import (
    DISTRIBUTED,
    DacpAttention,
    DacpStats,
    SideStream,
    build_meta,
    dacp_attention,
)
from tests.unit_tests.dacp_multiproc import Case, compare, random_case, rank_step, run_multiproc

D = DISTRIBUTED

CASES = {
    2: [
        Case("mixed_gqa", [5, 13, 7, 4, 9], [0, D, 1, 1, D], order=True),
        Case("mha", [6, 11, 3], [1, D, 0], heads=2, kv_heads=2, seed=1),
        Case("mqa_batched", [8, 17, 2], [D, 0, D], heads=4, kv_heads=1, batched=True, seed=2),
        Case("rank0_no_local", [9, 10, 3], [1, D, 1], seed=3),
        Case("all_distributed", [7, 12, 1], [D, D, D], seed=4),
        Case("all_local", [7, 12, 5], [0, 1, 0], seed=5),
        Case("float32", [12, 30, 6, 21], [0, D, 1, D], dtype=torch.float32, seed=6),
        *(random_case(f"random{s}", 2, seed=100 + s) for s in range(4)),
        # The varlen segment plan through the real exchange (kernels.py's CPU reference executor).
        Case("segments_mixed_gqa", [5, 13, 7, 4, 9], [0, D, 1, 1, D], kernel="segments"),
        Case("segments_mqa_batched", [8, 17, 2], [D, 0, D], heads=4, kv_heads=1, batched=True, seed=2,
             kernel="segments"),
        *(random_case(f"segments_random{s}", 2, seed=300 + s, kernel="segments") for s in range(2)),
        # The CPU default: tiles of 64 queries; the 150 and 70 are cut (a local 70 into 6 + 64).
        Case("tiles_long", [150, 13, 70, 9, 200], [D, 0, 1, D, 0], heads=4, kv_heads=2, seed=7, kernel="tiles"),
        random_case("tiles_random", 2, seed=500, kernel="tiles"),
    ],
    4: [
        Case("mixed_gqa", [5, 13, 7, 4, 9, 20], [0, D, 3, 1, D, 2], order=True),
        Case("some_ranks_empty", [6, 1], [D, 2], seed=1),  # ranks 0, 1, 3: distributed only
        Case("len1_distributed", [1, 3], [D, 0], seed=2),  # Lp = 8, seven pad tokens
        Case("all_local_one_rank", [4, 5], [3, 3], seed=3),  # ranks 0-2 hold nothing
        Case("float32", [12, 30, 6, 21], [0, D, 1, D], dtype=torch.float32, seed=6),
        *(random_case(f"random{s}", 4, seed=200 + s) for s in range(4)),
        Case("segments_mixed_gqa", [5, 13, 7, 4, 9, 20], [0, D, 3, 1, D, 2], kernel="segments"),
        Case("segments_some_ranks_empty", [6, 1], [D, 2], seed=1, kernel="segments"),
        Case("segments_len1_distributed", [1, 3], [D, 0], seed=2, kernel="segments"),
        *(random_case(f"segments_random{s}", 4, seed=400 + s, kernel="segments") for s in range(2)),
        Case("tiles_long", [300, 13, 70, 9], [D, 0, 3, D], heads=4, kv_heads=2, seed=7, kernel="tiles"),
    ],
}
# The cases above run with exchange "auto", which on gloo is p2p; these run
# the collectives (the NCCL choice) through the same comparison.
for _n, _names in {2: ("mixed_gqa", "float32", "random0"), 4: ("mixed_gqa", "some_ranks_empty", "random1")}.items():
    CASES[_n] += [replace(c, name=f"{c.name}_all_gather", exchange="all_gather") for c in CASES[_n] if c.name in _names]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """results(cp_size)[case][rank]: one spawn per CP size, on first use, for the module."""
    cache: dict[int, list] = {}

    def get(cp_size: int) -> list:
        if cp_size not in cache:
            tmp = tmp_path_factory.mktemp(f"cp{cp_size}")
            cache[cp_size] = run_multiproc(CASES[cp_size], cp_size, tmp)
        return cache[cp_size]

    return get


@pytest.mark.slow
@pytest.mark.parametrize(
    "cp_size, idx",
    [(n, i) for n, cs in CASES.items() for i in range(len(cs))],
    ids=[f"cp{n}-{c.name}" for n, cs in CASES.items() for c in cs],
)
def test_matches_single_process(results, cp_size, idx):
    case = CASES[cp_size][idx]
    ranks = results(cp_size)[idx]
    compare(case, cp_size, ranks)
    assert {r["transport"] for r in ranks} == {"p2p" if case.exchange == "auto" else case.exchange}

    check_counters(case, cp_size, ranks)


def check_counters(case: Case, cp_size: int, ranks: list[dict]) -> None:
    """Counters agree with the layout, and only the distributed part is exchanged
    (a case whose sequences are all local exchanges nothing)."""
    kv_heads, d = case.kv_heads, case.head_dim
    elem = torch.tensor([], dtype=case.dtype).element_size()
    for r, res in enumerate(ranks):
        meta = build_meta(case.lengths, case.placement, r, cp_size)
        s: DacpStats = res["stats"]
        assert (s.calls, s.local_seqs, s.local_tokens) == (1, len(meta.local_lens), meta.num_local_tokens)
        assert (s.dist_seqs, s.dist_tokens) == (len(meta.dist_lens), meta.num_dist_tokens)
        expected = (cp_size - 1) * 2 * kv_heads * meta.num_dist_tokens * d * elem
        assert s.fwd_bytes == s.bwd_bytes == expected


@pytest.mark.slow
@pytest.mark.parametrize("cp_size", [2, 4])
def test_backward_overlaps_local_part(results, cp_size):
    """The reduce-scatter of dK/dV is issued before the local part's backward and
    waited on after it (order of autograd nodes, not timing)."""
    for case, ranks in zip(CASES[cp_size], results(cp_size)):
        if case.order:
            for res in ranks:
                if res["stats"].local_seqs:
                    assert res["order"] == ["_WaitExchangeBackward", "local", "_StartExchangeBackward"]


# ---- single process: cp_size 1, module, checks --------------------------------


@pytest.mark.parametrize(
    "case",
    [
        Case("mixed", [5, 13, 7], [0, D, 0]),
        Case("local_only", [5, 3], [0, 0], seed=1),
        Case("dist_only_gqa", [4, 9], [D, D], heads=6, kv_heads=2, seed=2),
        Case("batched_f32", [8, 2, 5], [D, 0, D], dtype=torch.float32, batched=True, seed=3),
    ],
    ids=lambda c: c.name,
)
def test_cp1_matches_single_process(case):
    res = rank_step(case, 0, 1, None)  # no process group: cp_size 1 never communicates
    compare(case, 1, [res])
    assert res["stats"].fwd_bytes == 0


def test_module_takes_torchtitan_layout():
    """DacpAttention is called like torchtitan's inner attention: (B, L, N, H)."""
    case = Case("module", [5, 7, 3], [0, D, 0])
    meta = build_meta(case.lengths, case.placement, 0, 1)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 15, 4, 8, generator=g, dtype=torch.float64)
    k = torch.randn(1, 15, 2, 8, generator=g, dtype=torch.float64)
    v = torch.randn(1, 15, 2, 8, generator=g, dtype=torch.float64)
    mod = DacpAttention()
    out = mod(q, k, v, attention_masks=meta, scale=0.3, enable_gqa=True)
    expected = dacp_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), meta, scale=0.3)
    assert out.shape == q.shape
    torch.testing.assert_close(out, expected.transpose(1, 2))
    assert mod.stats.calls == 1
    with pytest.raises(TypeError, match="DacpBatchMeta"):
        mod(q, k, v, attention_masks=None)


def test_argument_checks():
    meta = build_meta([4, 3], [0, D], 0, 1)
    q = torch.randn(2, 7, 8)
    with pytest.raises(ValueError, match="tokens"):
        dacp_attention(q[:, :6], q[:, :6], q[:, :6], meta)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        dacp_attention(torch.randn(3, 7, 8), q, q, meta)
    with pytest.raises(ValueError, match="batch size 1"):
        dacp_attention(q.expand(2, -1, -1, -1), q[None], q[None], meta)


def test_side_stream_is_a_no_op_on_cpu():
    s = SideStream(torch.device("cpu"))
    assert not s.enabled
    x = torch.ones(2)
    with s.fork(x):
        y = x * 2
    s.join(y)
    assert y.tolist() == [2.0, 2.0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cp1_cuda_side_stream(dtype):
    """The local part runs on the side stream; results must match the CPU reference."""
    case = Case("cuda", [5, 13, 7, 40], [0, D, 0, D], dtype=dtype, device="cuda")
    res = rank_step(case, 0, 1, None)
    compare(case, 1, [res])


# ---- CUDA: a real CP group on the GPU (not run in a CPU-only session) --------
# NCCL when every rank has a GPU, else gloo staging CUDA tensors through host
# memory (skrull_ext.bench.attention.backend_for): with one GPU, CP 2 and 4 still run
# real processes, the side stream and an asynchronous exchange in flight.


def cuda_cases(cp_size: int) -> list[Case]:
    lengths = [5, 130, 70, 1, 93, 220]
    placement = [0, D, cp_size - 1, D, 1 % cp_size, D]
    return [
        *(replace(c, name=f"cuda_{c.name}", device="cuda", exchange="all_gather")
          for c in CASES[cp_size] if c.exchange == "auto" and c.name in ("mixed_gqa", "float32", "random0",
                                                                          "segments_mixed_gqa")),
        Case("cuda_varlen_bf16", lengths, placement, heads=8, kv_heads=2, head_dim=64, dtype=torch.bfloat16,
             device="cuda", exchange="all_gather", kernel="auto"),
        Case("cuda_varlen_fp16_mha", lengths, placement, heads=4, kv_heads=4, head_dim=64, dtype=torch.float16,
             device="cuda", exchange="all_gather", kernel="varlen", seed=1),
    ]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cp_size", [2, 4])
def test_cuda_cp_group_matches_single_process(cp_size, tmp_path):
    cases = cuda_cases(cp_size)
    for case, ranks in zip(cases, run_multiproc(cases, cp_size, tmp_path)):
        compare(case, cp_size, ranks)
        assert {r["transport"] for r in ranks} == {"all_gather"}
        check_counters(case, cp_size, ranks)
