# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""The segment plan (segments.py) and the attention kernels (kernels.py).

The plan is what this project writes for the varlen kernel, and varlen only
runs on CUDA; so the plan is tested on CPU two ways:

- structurally: expanding the plan's bottom-right causal segments back to a
  dense [Tq, Tk] mask over the key source must give exactly meta's mask;
- numerically: the ``segments`` reference executor against ``dense`` on one
  rank's two parts, with the gathered K/V of every rank built here in
  rank-major order (no process group needed), outputs and q/k/v gradients at
  float64, padding gradients exactly zero.

The real exchange with the ``segments`` kernel runs in test_dacp_attention.py
(gloo, CP 2 and 4). The varlen kernel's check against dense waits for CUDA.
"""

import inspect
import sys
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull_ext.attention import (
    DISTRIBUTED,
    DacpAttention,
    build_meta,
    build_segment_plan,
    dacp_attention,
    kernels,
    shard_buffer,
    unshard_buffer,
)
from skrull_ext.attention.tiles import build_tile_plan
from skrull_ext.attention.kernels import KERNEL_CHOICES, KERNELS, auto_kernel, resolve_kernel
from skrull_ext.train.job.skrull_config import SkrullConfig
from tests.unit_tests.dacp_multiproc import Case, compare, global_inputs, rank_step, reference

D = DISTRIBUTED
PARTS = ("local", "dist")


def plan_mask(plan, n_keys: int) -> torch.Tensor:
    """The dense [Tq, n_keys] mask a plan stands for, over the key source."""
    idx = torch.arange(n_keys) if plan.key_index is None else plan.key_index.cpu()
    mask = torch.zeros(plan.cu_q[-1], n_keys, dtype=torch.bool)
    for s in range(plan.num_segments):
        qa, qb, ka, kb = plan.cu_q[s], plan.cu_q[s + 1], plan.cu_k[s], plan.cu_k[s + 1]
        for i in range(qb - qa):
            seen = idx[ka : kb - (qb - qa) + i + 1]  # bottom-right: the last query sees all kb - ka
            assert not mask[qa + i, seen].any(), "a key appears twice in one query's range"
            mask[qa + i, seen] = True
    return mask


def check_plans_match_masks(meta) -> None:
    if meta.num_local_tokens:
        plan = meta.local_plan()
        assert plan.key_index is None  # a local sequence attends its own range
        assert torch.equal(plan_mask(plan, meta.num_local_tokens), meta.local_mask())
    if meta.dist_lens:
        plan = meta.dist_plan()
        assert torch.equal(plan_mask(plan, meta.num_dist_tokens * meta.cp_size), meta.dist_mask())
        assert plan.max_q == max(plan.cu_q[s + 1] - plan.cu_q[s] for s in range(plan.num_segments))
        assert plan.max_k == max(plan.cu_k[s + 1] - plan.cu_k[s] for s in range(plan.num_segments))
        assert plan.cu_seq_q.dtype == plan.cu_seq_k.dtype == torch.int32
        assert plan.cu_seq_q.tolist() == list(plan.cu_q) and plan.cu_seq_k.tolist() == list(plan.cu_k)


# ---- the plan by hand and as a mask ------------------------------------------


def test_plan_by_hand():
    # N=2; distributed Lp=16 (c=4) and Lp=12 (c=3). Rank 0 holds chunks 0 and 3.
    m = build_meta([5, 13, 7, 4, 9], [0, D, 1, 1, D], 0, 2)
    p = m.dist_plan()
    assert p.cu_q == (0, 4, 8, 11, 14)  # four query chunks: 4, 4, 3, 3 tokens
    assert p.cu_k == (0, 4, 20, 23, 35)  # keys of positions [0, 4), [0, 16), [0, 3), [0, 12)
    # Gathered: rank 0 = seq0 [0-3, 12-15], seq1 [0-2, 9-11]; rank 1 (from 14) = seq0 [4-11], seq1 [3-8].
    assert p.key_index.tolist() == [
        0, 1, 2, 3,
        0, 1, 2, 3, 14, 15, 16, 17, 18, 19, 20, 21, 4, 5, 6, 7,
        8, 9, 10,
        8, 9, 10, 22, 23, 24, 25, 26, 27, 11, 12, 13,
    ]  # fmt: skip
    assert (p.max_q, p.max_k) == (4, 16)
    # Rank 1 holds chunks 1 and 2: adjacent, so one segment per sequence.
    p1 = build_meta([5, 13, 7, 4, 9], [0, D, 1, 1, D], 1, 2).dist_plan()
    assert (p1.cu_q, p1.cu_k) == ((0, 8, 14), (0, 12, 21))
    # Local part: one segment per sequence, keys = its own range.
    lp = build_meta([5, 13, 7, 4, 9], [0, D, 1, 1, D], 1, 2).local_plan()
    assert (lp.cu_q, lp.cu_k, lp.key_index) == ((0, 7, 11), (0, 7, 11), None)


def test_plans_are_cached_per_micro_batch():
    m = build_meta([5, 13], [0, D], 0, 2)
    assert m.local_plan() is m.local_plan(torch.device("cpu"))
    assert m.dist_plan() is m.dist_plan()


def test_a_device_plan_is_the_host_plan_copied_once(monkeypatch):
    """The plan is built once, on the host (where the prefetch thread builds it ahead:
    MicroBatchBuffer.staged); another device gets a copy of it, once ("meta" stands for a GPU)."""
    from skrull_ext.attention import meta as meta_module

    m = build_meta([5, 13], [0, D], 0, 2)
    host = m.dist_plan()
    monkeypatch.setattr(meta_module, "build_segment_plan", None)  # no second build
    dev = m.dist_plan(torch.device("meta"))
    assert dev is m.dist_plan(torch.device("meta")) and dev is not host
    assert dev.cu_seq_q.device.type == dev.key_index.device.type == "meta"
    assert (dev.cu_q, dev.cu_k, dev.max_q, dev.max_k) == (host.cu_q, host.cu_k, host.max_q, host.max_k)
    assert dev.cu_seq_q.shape == host.cu_seq_q.shape and dev.key_index.shape == host.key_index.shape


def test_plan_rejects_a_key_source_without_every_position():
    d = torch.tensor([0, 0, 0])
    with pytest.raises(ValueError, match="exactly once"):
        build_segment_plan(d, torch.tensor([0, 1, 2]), d, torch.tensor([0, 2, 2]))
    with pytest.raises(ValueError, match="no key"):
        build_segment_plan(d, torch.tensor([0, 1, 2]), d[:2], torch.tensor([0, 1]))


@pytest.mark.parametrize("cp_size", [1, 2, 4])
@pytest.mark.parametrize(
    "lengths, placement",
    [([5, 3, 8], "local"), ([5, 3, 8], "dist"), ([5, 13, 7, 1, 9], "mixed")],
    ids=["local", "dist", "mixed"],
)
def test_plan_is_the_mask(cp_size, lengths, placement):
    for r in range(cp_size):
        check_plans_match_masks(build_meta(lengths, _placement(placement, len(lengths), cp_size), r, cp_size))


def _placement(kind: str, n: int, cp_size: int) -> list[int]:
    return {
        "local": [i % cp_size for i in range(n)],
        "dist": [D] * n,
        "mixed": [D if i % 2 else (i // 2) % cp_size for i in range(n)],
    }[kind]


# ---- segments executor vs dense, one rank, gathered K/V built here -----------


def part_inputs(case: Case, cp_size: int, cp_rank: int) -> dict[str, dict]:
    """Per part of rank ``cp_rank``: q, k, v (the part's key source: the rank's local
    tokens, or every rank's distributed part rank-major), grad_out, and which q and
    k/v tokens are padding."""
    seqs = global_inputs(case, cp_size)
    metas = [build_meta(case.lengths, case.placement, r, cp_size) for r in range(cp_size)]
    bufs = [
        {x: shard_buffer([s[x] for s in seqs], case.placement, r, cp_size, dim=1) for x in ("q", "k", "v", "go")}
        for r in range(cp_size)
    ]
    true_dist = [n for n, p in zip(case.lengths, case.placement) if p == D]

    def is_pad(meta, r):  # of rank r's distributed tokens
        doc, pos = meta.dist_doc_positions(r)
        return pos >= torch.tensor(true_dist, dtype=torch.long)[doc] if true_dist else pos.bool()

    meta, mine = metas[cp_rank], bufs[cp_rank]
    n = meta.num_local_tokens
    out = {}
    if n:
        no_pad = torch.zeros(n, dtype=torch.bool)
        out["local"] = dict(
            q=mine["q"][:, :n], k=mine["k"][:, :n], v=mine["v"][:, :n], go=mine["go"][:, :n],
            q_pad=no_pad, k_pad=no_pad,
        )  # fmt: skip
    if meta.dist_lens:
        gathered = {x: torch.cat([b[x][:, m.num_local_tokens :] for b, m in zip(bufs, metas)], 1) for x in "kv"}
        out["dist"] = dict(
            q=mine["q"][:, n:], k=gathered["k"], v=gathered["v"], go=mine["go"][:, n:],
            q_pad=is_pad(meta, cp_rank), k_pad=torch.cat([is_pad(meta, r) for r in range(cp_size)]),
        )  # fmt: skip
    return out


def run_part(kernel: str, meta, part: str, inp: dict, scale=None) -> dict:
    kern = KERNELS[kernel]
    q, k, v = (inp[x].detach().clone().requires_grad_() for x in "qkv")
    out = kern.run(q, k, v, kern.prepare(meta, part, q.device), scale)
    out.backward(inp["go"])
    return dict(out=out.detach(), dq=q.grad, dk=k.grad, dv=v.grad)


def check_equals_dense(kernel: str, case: Case, cp_size: int, cp_rank: int, scale=None) -> None:
    meta = build_meta(case.lengths, case.placement, cp_rank, cp_size)
    for part, inp in part_inputs(case, cp_size, cp_rank).items():
        want = run_part("dense", meta, part, inp, scale)
        got = run_part(kernel, meta, part, inp, scale)
        for key in ("out", "dq", "dk", "dv"):
            torch.testing.assert_close(
                got[key], want[key], atol=1e-12, rtol=1e-12, msg=lambda m: f"{kernel} {part} {key}: {m}"
            )
        # Nothing flows into padding (its grad_out is zero, and no real query sees a pad key).
        assert not got["dq"][:, inp["q_pad"]].any()
        assert not got["dk"][:, inp["k_pad"]].any() and not got["dv"][:, inp["k_pad"]].any()


@pytest.mark.parametrize("kernel, rows", [("segments", None), ("tiles", 64), ("tiles", 3), ("tiles", 8)])
@pytest.mark.parametrize("cp_size", [1, 2, 4])
@pytest.mark.parametrize("kind", ["local", "dist", "mixed"])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa", "mqa"])
def test_kernel_equals_dense(kernel, rows, cp_size, kind, heads, kv_heads, monkeypatch):
    """tiles at 3 and 8 rows cut every segment but the 1-token one; at 64, none."""
    if rows is not None:
        monkeypatch.setattr(kernels, "TILE_ROWS", rows)
    lengths = [5, 13, 7, 1, 9, 22]
    case = Case(kind, lengths, _placement(kind, len(lengths), cp_size), heads=heads, kv_heads=kv_heads, seed=7)
    for r in range(cp_size):
        check_equals_dense(kernel, case, cp_size, r, scale=0.3 if kind == "mixed" else None)


@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    cp_size=st.sampled_from([1, 2, 3, 4]),
    heads=st.sampled_from([(2, 2), (4, 2), (4, 1)]),
    rows=st.integers(1, 40),
)
def test_kernels_equal_dense_property(data, cp_size, heads, rows):
    n = data.draw(st.integers(1, 6), label="n")
    lengths = data.draw(st.lists(st.integers(1, 30), min_size=n, max_size=n), label="lengths")
    placement = data.draw(
        st.lists(st.sampled_from([D, *range(cp_size)]), min_size=n, max_size=n), label="placement"
    )
    cp_rank = data.draw(st.integers(0, cp_size - 1), label="cp_rank")
    case = Case("prop", lengths, placement, heads=heads[0], kv_heads=heads[1], seed=len(lengths))
    meta = build_meta(lengths, placement, cp_rank, cp_size)
    check_plans_match_masks(meta)
    check_tiles_match_masks(meta, rows)
    check_equals_dense("segments", case, cp_size, cp_rank)
    with mock.patch.object(kernels, "TILE_ROWS", rows):
        check_equals_dense("tiles", case, cp_size, cp_rank)


# ---- the tile plan -------------------------------------------------------------


def tile_mask(tiles, n_queries: int, n_keys: int) -> torch.Tensor:
    """The dense [Tq, n_keys] mask a tile plan stands for, over the key source."""
    idx = torch.arange(n_keys) if tiles.key_index is None else tiles.key_index.cpu()
    mask = torch.zeros(n_queries, n_keys, dtype=torch.bool)
    covered = 0
    for (qa, qb, ka, kb), m in zip(tiles.bounds, tiles.masks):
        assert qa == covered and m.shape == (qb - qa, kb - ka)  # in order, no gap, no overlap
        covered = qb
        for i in range(qb - qa):
            seen = idx[ka:kb][m[i]]
            assert not mask[qa + i, seen].any(), "a key appears twice in one query's row"
            mask[qa + i, seen] = True
    assert covered == n_queries
    return mask


def check_tiles_match_masks(meta, rows: int) -> None:
    parts = [("local", meta.local_plan(), meta.local_mask())] if meta.num_local_tokens else []
    if meta.num_dist_tokens:
        parts.append(("dist", meta.dist_plan(), meta.dist_mask()))
    for part, plan, mask in parts:
        tiles = build_tile_plan(plan, rows)
        assert all(qb - qa <= rows for qa, qb, _, _ in tiles.bounds), part
        assert torch.equal(tile_mask(tiles, *mask.shape), mask), part


def test_tiles_cut_long_segments_and_pack_short_ones():
    """rows 4 over local sequences 2, 1, 9, 3: the 9 is cut 1 + 4 + 4 (the remainder
    first, its keys 0..0, then 0..4, 0..8); the 1-token piece joins the 2 and the 1
    before it (4 rows); the 3 after the last full piece starts a new tile."""
    plan = build_meta([2, 1, 9, 3], [0, 0, 0, 0], 0, 1).local_plan()
    tiles = build_tile_plan(plan, 4)
    assert tiles.bounds == ((0, 4, 0, 4), (4, 8, 3, 8), (8, 12, 3, 12), (12, 15, 12, 15))
    assert tiles.masks[0].tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    assert tiles.masks[1].tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert build_tile_plan(plan, 64).bounds == ((0, 15, 0, 15),)  # one tile: the dense mask's
    with pytest.raises(ValueError, match="rows must be >= 1, got 0"):
        build_tile_plan(plan, 0)


def test_tiles_are_cached_per_micro_batch():
    m = build_meta([5, 13], [0, D], 0, 2)
    kern = KERNELS["tiles"]
    assert kern.prepare(m, "dist", torch.device("cpu")) is kern.prepare(m, "dist", None)
    assert kern.prepare(m, "local", None) is not kern.prepare(m, "dist", None)


def test_padding_keys_sit_only_in_pad_queries_ranges():
    """A distributed sequence of length 1 at CP 4 is 7/8 padding: the plan gives its
    real query one key, itself."""
    m = build_meta([1], [D], 0, 4)
    p = m.dist_plan()  # rank 0: chunks 0 and 7 (c = 1)
    assert p.cu_q == (0, 1, 2) and p.cu_k == (0, 1, 9)
    assert p.key_index[:1].tolist() == [0]  # position 0 is rank 0's first gathered token


# ---- through dacp_attention, selection, config -------------------------------


@pytest.mark.parametrize(
    "case",
    [
        Case("mixed", [5, 13, 7], [0, D, 0]),
        Case("dist_only_gqa", [4, 9], [D, D], heads=6, kv_heads=2, seed=2),
        Case("batched_f32", [8, 2, 5], [D, 0, D], dtype=torch.float32, batched=True, seed=3),
    ],
    ids=lambda c: c.name,
)
def test_cp1_segments_kernel_matches_single_process(case):
    case.kernel = "segments"  # Case instances are made per test, so this changes nothing shared
    compare(case, 1, [rank_step(case, 0, 1, None)])


def test_auto_is_dense_on_cpu_and_dense_is_unchanged():
    import types

    assert auto_kernel(torch.empty(0, dtype=torch.bfloat16)) == "dense"
    assert auto_kernel(torch.empty(0)) == "dense"
    assert auto_kernel(types.SimpleNamespace(is_cuda=True, dtype=torch.float32)) == "dense"
    assert auto_kernel(types.SimpleNamespace(is_cuda=True, dtype=torch.float16)) == "varlen"
    m = build_meta([5, 13, 7], [0, D, 0], 0, 1)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(h, 25, 8, generator=g) for h in (4, 2, 2))
    assert torch.equal(dacp_attention(q, k, v, m), dacp_attention(q, k, v, m, kernel="dense"))
    assert resolve_kernel("auto", q) is KERNELS["dense"]
    cpu = torch.device("cpu")
    assert kernels.kernel_name("auto", cpu, torch.float32) == "auto (dense)"
    assert kernels.kernel_name("dense", cpu, torch.float32) == "dense"
    assert kernels.kernel_name("auto", torch.device("cuda"), torch.bfloat16) == "auto (varlen)"


def test_bad_kernel_names_the_choices():
    m = build_meta([5], [0], 0, 1)
    q = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match=r"^attention_kernel: 'flex' is not one of \['auto', 'dense', 'tiles', "
                                         r"'segments', 'varlen', 'cudnn', 'cudnn-expanded'\]$"):
        dacp_attention(q, q, q, m, kernel="flex")
    with pytest.raises(ValueError, match=r"^attention_kernel: 'flex' is not one of "):
        DacpAttention(kernel="flex")
    with pytest.raises(ValueError, match=r"^kv_exchange: 'ring' is not one of \['auto', 'all_gather', 'p2p'\]$"):
        DacpAttention(exchange="ring")
    with pytest.raises(ValueError, match=r"^skrull.kv_exchange: 'ring' is not one of \['auto', 'all_gather', 'p2p'\]$"):
        SkrullConfig(cost_model="h100-assumed", kv_exchange="ring")
    with pytest.raises(ValueError, match=r"skrull.attention_kernel: 'flex' is not one of \['auto', 'dense'"):
        SkrullConfig(cost_model="h100-assumed", attention_kernel="flex")
    assert SkrullConfig(cost_model="h100-assumed").attention_kernel == "auto"
    assert KERNEL_CHOICES == ("auto", "dense", "tiles", "segments", "varlen", "cudnn", "cudnn-expanded")


def test_varlen_refuses_cpu():
    m = build_meta([5], [0], 0, 1)
    q = torch.randn(2, 5, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="bf16/fp16 CUDA"):
        dacp_attention(q, q, q, m, kernel="varlen")


# varlen_attn's keywords after the seven positional arguments: torch 2.11's (the
# PyTorch of the GPU image this project is lent) and torch 2.13's (pinned here).
VARLEN_KEYWORDS = {
    "2.11": {"return_aux", "scale", "window_size"},
    "2.13": {"return_aux", "scale", "window_size", "enable_gqa", "seqused_k", "block_table", "num_splits"},
}


def test_varlen_kwargs_follow_the_installed_signature():
    from torch.nn.attention.varlen import varlen_attn

    here = set(list(inspect.signature(varlen_attn).parameters)[7:])
    assert here in VARLEN_KEYWORDS.values(), f"varlen_attn changed: {sorted(here)}; check kernels._varlen_kwargs"
    new, old = VARLEN_KEYWORDS["2.13"], VARLEN_KEYWORDS["2.11"]
    assert kernels._varlen_kwargs(True, new) == {"num_splits": 1, "enable_gqa": True}  # FA2: split forced
    assert kernels._varlen_kwargs(False, new) == {"num_splits": 1}  # MHA: no enable_gqa
    assert kernels._varlen_kwargs(True, old) == {}


def test_varlen_num_splits_as_torchtitan(monkeypatch):
    """FA3/FA4 choose their own split unless torchtitan's batch-invariant mode is on."""
    import torch.nn.attention

    utils = pytest.importorskip("torchtitan.distributed.utils")

    params = ("num_splits", "enable_gqa")
    monkeypatch.setattr(torch.nn.attention, "current_flash_attention_impl", lambda: "FA3")
    assert kernels._varlen_kwargs(False, params) == {}
    monkeypatch.setattr(utils, "_batch_invariant_enabled", True)
    assert kernels._varlen_kwargs(False, params) == {"num_splits": 1}
    monkeypatch.delitem(sys.modules, "torchtitan.distributed.utils")  # not loaded: the mode cannot be on
    assert kernels._varlen_kwargs(False, params) == {}


# ---- CUDA: varlen vs dense (not run in a CPU-only session) -------------------


def check_equals_dense_on_cuda(kernel: str, cp_size: int, dtype: torch.dtype) -> None:
    """``kernel`` against ``dense`` on CUDA, each part of each rank, GQA, at 3e-2 in bf16/fp16; no gradient
    into padding (test_cudnn_kernel.py checks the cuDNN kernels with it)."""
    lengths = [5, 130, 70, 1, 93, 220]
    case = Case("cuda", lengths, _placement("mixed", len(lengths), cp_size), heads=8, kv_heads=2, head_dim=64)
    for r in range(cp_size):
        meta = build_meta(case.lengths, case.placement, r, cp_size)
        for part, inp in part_inputs(case, cp_size, r).items():
            inp = {x: t.to("cuda", dtype) if t.is_floating_point() else t.cuda() for x, t in inp.items()}
            want = run_part("dense", meta, part, inp)
            got = run_part(kernel, meta, part, inp)
            for key in ("out", "dq", "dk", "dv"):
                torch.testing.assert_close(
                    got[key].float(), want[key].float(), atol=3e-2, rtol=3e-2, msg=lambda m: f"{part} {key}: {m}"
                )
            assert not got["dk"][:, inp["k_pad"]].any() and not got["dq"][:, inp["q_pad"]].any()


def check_cp1_against_reference_on_cuda(kernel: str) -> None:
    """``kernel`` through ``dacp_attention`` at CP 1 in bf16 against the float64 single-process reference."""
    lengths, placement = [5, 13, 7, 40], [0, D, 0, D]
    case = Case("cuda", lengths, placement, dtype=torch.bfloat16, device="cuda", head_dim=64, kernel=kernel)
    res = rank_step(case, 0, 1, None)
    ref_case = Case("ref", lengths, placement, head_dim=64)  # same seed: same values before rounding
    seqs = global_inputs(ref_case, 1)
    ref = reference(ref_case, seqs)
    padded = [s["q"].size(1) for s in seqs]
    for key in ("out", "dq", "dk", "dv"):
        got = unshard_buffer([res[key].double()], padded, placement, dim=1)
        for i, n in enumerate(lengths):
            torch.testing.assert_close(got[i][:, :n], ref[i][key], atol=5e-2, rtol=5e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cp_size", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_varlen_equals_dense_on_cuda(cp_size, dtype):
    assert auto_kernel(torch.empty(0, device="cuda", dtype=dtype)) == "varlen"
    check_equals_dense_on_cuda("varlen", cp_size, dtype)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cp1_varlen_through_dacp_attention_on_cuda():
    """``auto`` picks varlen for bf16 on CUDA; against the float64 single-process reference."""
    check_cp1_against_reference_on_cuda("auto")
