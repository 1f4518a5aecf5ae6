# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Activation checkpointing reuses the forward's K/V exchange (replay.py).

A two-layer toy model of DacpAttention blocks runs on 2 real gloo processes
without AC and under torchtitan's own FullAC and SelectiveAC (applied with
``ActivationCheckpointing.apply``, as torchtitan does). Outputs and every
gradient must equal the run without AC, the recomputation must issue no
all-gather (one per layer per micro-batch, as without AC) and still one
reduce-scatter per layer, and nothing may stay kept after backward. Two
micro-batches in flight with distinct metas replay each their own K/V; the
same meta object used twice before backward is ambiguous and gathers again.
"""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from skrull_ext.attention import build_meta, DacpAttention, DacpStats, DISTRIBUTED, shard_buffer
from tests.unit_tests.gloo_worker import gloo_group

D = DISTRIBUTED
CP = 2
LENGTHS, PLACEMENT = [5, 13, 7, 4, 9], [0, D, 1, 1, D]
DIM, HEADS, KV_HEADS, HEAD_DIM = 16, 4, 2, 4


class Block(nn.Module):
    def __init__(self, group) -> None:
        super().__init__()
        self.wq = nn.Linear(DIM, HEADS * HEAD_DIM, bias=False, dtype=torch.float64)
        self.wk = nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False, dtype=torch.float64)
        self.wv = nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False, dtype=torch.float64)
        self.wo = nn.Linear(HEADS * HEAD_DIM, DIM, bias=False, dtype=torch.float64)
        self.attn = DacpAttention(group)

    def forward(self, x: torch.Tensor, meta) -> torch.Tensor:
        t = x.size(1)
        q = self.wq(x).view(1, t, HEADS, HEAD_DIM)
        k = self.wk(x).view(1, t, KV_HEADS, HEAD_DIM)
        v = self.wv(x).view(1, t, KV_HEADS, HEAD_DIM)
        return x + self.wo(self.attn(q, k, v, attention_masks=meta).reshape(1, t, -1))


class Toy(nn.Module):
    def __init__(self, group) -> None:
        super().__init__()
        torch.manual_seed(0)  # same weights on every rank and in every run
        self.layers = nn.ModuleDict({str(i): Block(group) for i in range(2)})

    def forward(self, x: torch.Tensor, meta) -> torch.Tensor:
        for layer in self.layers.values():
            x = layer(x, meta=meta)
        return x

    def attention(self) -> list[DacpAttention]:
        return [m for m in self.modules() if isinstance(m, DacpAttention)]


def _inputs(rank: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randn(n, DIM, generator=g, dtype=torch.float64) for n in LENGTHS]
    return shard_buffer(seqs, PLACEMENT, rank, CP)[None]


def _run(ac: str, rank: int, group, metas: list, seeds: list[int]) -> dict:
    """Forward every (meta, input) pair, then one backward of their sum."""
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    model = Toy(group)
    if ac != "none":
        cls = FullAC if ac == "full" else SelectiveAC
        cls(cls.Config()).apply(model)
    xs = [_inputs(rank, s).requires_grad_() for s in seeds]
    outs = [model(x, meta) for x, meta in zip(xs, metas)]
    loss = sum((o * torch.arange(o.numel(), dtype=o.dtype).view_as(o).sin()).sum() for o in outs)
    loss.backward()
    stats = DacpStats()
    for m in model.attention():
        for name, value in m.stats.as_dict(prefix="").items():
            setattr(stats, name, getattr(stats, name) + value)
    grads = {n.replace("_checkpoint_wrapped_module.", ""): p.grad for n, p in model.named_parameters()}
    return dict(
        outs=[o.detach() for o in outs], dx=[x.grad for x in xs], grads=grads, stats=stats,
        kept=sum(len(m.replay) for m in model.attention()),
    )


def _scenarios(rank: int) -> dict[str, tuple[list, list[int]]]:
    meta = build_meta(LENGTHS, PLACEMENT, rank, CP)
    twin = build_meta(LENGTHS, PLACEMENT, rank, CP)  # equal to meta, another object
    return {
        "one": ([meta], [1]),
        "two_micro_batches": ([meta, twin], [1, 2]),
        "same_meta_twice": ([meta, meta], [1, 2]),
    }


def _worker(rank: int, store: str, outdir: str) -> None:
    with gloo_group(store, rank, CP):
        res = {
            (name, ac): _run(ac, rank, dist.group.WORLD, metas, seeds)
            for name, (metas, seeds) in _scenarios(rank).items()
            for ac in ("none", "full", "selective")
        }
        torch.save(res, Path(outdir) / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("replay")
    mp.start_processes(_worker, args=(str(tmp / "store"), str(tmp)), nprocs=CP, start_method="spawn")
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(CP)]


def _same(got: dict, ref: dict) -> None:
    tol = dict(rtol=1e-12, atol=1e-12)
    for key in ("outs", "dx"):
        for a, b in zip(got[key], ref[key], strict=True):
            torch.testing.assert_close(a, b, **tol)
    assert got["grads"].keys() == ref["grads"].keys()
    for name, g in ref["grads"].items():
        torch.testing.assert_close(got["grads"][name], g, **tol, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["one", "two_micro_batches"])
@pytest.mark.parametrize("ac", ["full", "selective"])
def test_parity_recompute_reuses_the_exchange(results, scenario, ac):
    for res in results:
        plain, got = res[(scenario, "none")], res[(scenario, ac)]
        _same(got, plain)
        p, s = plain["stats"], got["stats"]
        forwards = 2 * len(plain["outs"])  # layers x micro-batches, all with distributed sequences
        assert p.all_gathers == p.reduce_scatters == p.calls == forwards and p.recomputes == 0
        assert s.calls == s.recomputes == forwards, "AC re-runs each layer once"
        assert s.all_gathers == s.replays == s.reduce_scatters == forwards, s
        assert s.fwd_bytes == p.fwd_bytes and s.bwd_bytes == p.bwd_bytes
        assert got["kept"] == plain["kept"] == 0, "kept K/V outlived backward"


@pytest.mark.slow
@pytest.mark.parametrize("ac", ["full", "selective"])
def test_parity_same_meta_twice_gathers_again(results, ac):
    """Two forwards with one meta object before backward: which recomputation
    owns which K/V is ambiguous, so none replays (correct, not cheaper)."""
    for res in results:
        plain, got = res[("same_meta_twice", "none")], res[("same_meta_twice", ac)]
        _same(got, plain)
        s = got["stats"]
        assert s.replays == 0 and s.all_gathers == 2 * plain["stats"].all_gathers == 8, s
        assert got["kept"] == 0
