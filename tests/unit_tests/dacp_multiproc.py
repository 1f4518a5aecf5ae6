# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Run DACP attention cases on real gloo processes and compare with one process.

One spawn per CP size runs a whole list of cases in one process group, because
starting a Python process with torch costs about a second on a small machine
and the cases themselves take milliseconds.

Every rank builds the same global data from the case's seed, cuts out its own
buffer with ``shard_buffer`` (pad tokens get random values, so a leak would
show), runs forward and backward, and saves its output and input-gradient
buffers. The parent puts the ranks' buffers back together with
``unshard_buffer`` and compares each sequence against single-process causal
attention over that sequence alone.
"""

import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from skrull_ext.attention import (
    DISTRIBUTED,
    DacpStats,
    build_meta,
    dacp_attention,
    padded_length,
    resolve_transport,
    shard_buffer,
    unshard_buffer,
)
from skrull_ext.bench.attention import backend_for


@dataclass
class Case:
    name: str
    lengths: list[int]
    placement: list[int]
    """Per sequence: CP rank holding it whole, or DISTRIBUTED."""
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 8
    dtype: torch.dtype = torch.float64
    batched: bool = False
    """Pass [1, H, T, D] instead of [H, T, D]."""
    seed: int = 0
    order: bool = False
    """Also record the order of the backward nodes (needs local and distributed parts)."""
    device: str = "cpu"
    exchange: str = "auto"
    """How K/V travel (skrull_ext.attention.transport); auto on gloo: p2p."""
    kernel: str = "dense"
    """Inner attention kernel (skrull_ext.attention.kernels); dense is what the
    backward-order hooks in _backward_order expect."""
    extra: dict = field(default_factory=dict)


def random_case(name: str, cp_size: int, seed: int, **kw) -> Case:
    """A micro-batch of 3-8 sequences, each local on a random rank or distributed."""
    rng = random.Random(seed)
    n = rng.randint(3, 8)
    lengths = [rng.randint(1, 40) for _ in range(n)]
    placement = [rng.choice([DISTRIBUTED, *range(cp_size)]) for _ in range(n)]
    return Case(name, lengths, placement, seed=seed, **kw)


def global_inputs(case: Case, cp_size: int) -> list[dict[str, torch.Tensor]]:
    """Per sequence, q/k/v/grad_out over its padded length ([heads, Lp, D]).

    Pad tokens of q/k/v are random; grad_out is zero there, as a loss that
    ignores pad labels would make it.
    """
    g = torch.Generator().manual_seed(case.seed)
    seqs = []
    for n, p in zip(case.lengths, case.placement):
        lp = padded_length(n, cp_size) if p == DISTRIBUTED else n

        def rnd(h):
            return torch.randn(h, lp, case.head_dim, generator=g, dtype=torch.float64).to(case.dtype)

        go = rnd(case.heads)
        go[:, n:] = 0
        seqs.append(dict(q=rnd(case.heads), k=rnd(case.kv_heads), v=rnd(case.kv_heads), go=go))
    return seqs


def reference(case: Case, seqs: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """Single-process causal attention over each sequence alone, at its true length."""
    out = []
    for n, s in zip(case.lengths, seqs):
        q, k, v = (s[x][:, :n].detach().clone().requires_grad_() for x in "qkv")
        o = F.scaled_dot_product_attention(
            q[None], k[None], v[None], is_causal=True, enable_gqa=case.heads != case.kv_heads
        )[0]
        o.backward(s["go"][:, :n])
        out.append(dict(out=o.detach(), dq=q.grad, dk=k.grad, dv=v.grad))
    return out


def _backward_order(out: torch.Tensor) -> list[str]:
    """Hook the local attention's backward node and the exchange's two nodes;
    returns a list that fills, in execution order, during backward."""
    order: list[str] = []
    cat = out.grad_fn
    local_sdpa = cat.next_functions[0][0].next_functions[0][0]  # cat <- squeeze <- sdpa
    local_sdpa.register_hook(lambda *_: order.append("local"))
    seen, stack = set(), [cat]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        name = node.name()
        if name in ("_StartExchangeBackward", "_WaitExchangeBackward"):
            node.register_hook(lambda *_, n=name: order.append(n))
        stack.extend(f for f, _ in node.next_functions)
    return order


def rank_step(case: Case, cp_rank: int, cp_size: int, group) -> dict:
    """Forward + backward of one case on this rank; returns its buffers and counters."""
    seqs = global_inputs(case, cp_size)
    meta = build_meta(case.lengths, case.placement, cp_rank, cp_size)

    def buf(x):
        b = shard_buffer([s[x] for s in seqs], case.placement, cp_rank, cp_size, dim=1)
        return b.to(case.device)

    q, k, v = (buf(x).requires_grad_() for x in "qkv")
    go = buf("go")
    stats = DacpStats()
    args = (q[None], k[None], v[None]) if case.batched else (q, k, v)
    out = dacp_attention(*args, meta, group, stats=stats, kernel=case.kernel, exchange=case.exchange)
    order = _backward_order(out) if case.order else []
    out.backward(go[None] if case.batched else go)
    if case.batched:
        out = out[0]
    # A rank with an empty buffer leaves k, v out of the graph: their grads stay None.
    got = dict(out=out.detach(), dq=q.grad, dk=k.grad, dv=v.grad)
    cpu = {x: None if t is None else t.cpu() for x, t in got.items()}
    transport = resolve_transport(case.exchange, group).name if group is not None else None
    return dict(**cpu, stats=stats, order=order, transport=transport)


def _worker(rank: int, cp_size: int, store: str, cases: list[Case], outdir: str) -> None:
    torch.set_num_threads(1)  # several ranks share two cores
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    devices = {c.device for c in cases}
    if len(devices) != 1:
        raise ValueError(f"one spawn runs cases of one device, got {sorted(devices)}")
    device = devices.pop()
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend_for(device, cp_size), init_method=f"file://{store}", rank=rank,
                            world_size=cp_size)
    try:
        results = [rank_step(c, rank, cp_size, dist.group.WORLD) for c in cases]
        torch.save(results, Path(outdir) / f"rank{rank}.pt")
        dist.barrier()  # as gloo_worker.gloo_group: no rank leaves while a peer still exchanges
    finally:
        dist.destroy_process_group()


def run_multiproc(cases: list[Case], cp_size: int, tmpdir: Path) -> list[list[dict]]:
    """Spawn ``cp_size`` gloo processes running all ``cases``; returns results[case][rank]."""
    tmpdir = Path(tmpdir)
    mp.start_processes(
        _worker,
        args=(cp_size, str(tmpdir / "store"), cases, str(tmpdir)),
        nprocs=cp_size,
        start_method="spawn",
    )
    per_rank = [torch.load(tmpdir / f"rank{r}.pt", weights_only=False) for r in range(cp_size)]
    return [[per_rank[r][i] for r in range(cp_size)] for i in range(len(cases))]


TOLERANCE = {
    torch.float64: dict(atol=1e-10, rtol=1e-10),
    torch.float32: dict(atol=2e-5, rtol=1e-4),
    # against the float64 reference over the same rounded inputs (compare)
    torch.bfloat16: dict(atol=5e-2, rtol=5e-2),
    torch.float16: dict(atol=1e-2, rtol=1e-2),
}


def compare(case: Case, cp_size: int, ranks: list[dict]) -> None:
    """Assert the ranks' buffers equal the single-process reference, sequence by sequence."""
    seqs = global_inputs(case, cp_size)
    low = case.dtype in (torch.bfloat16, torch.float16)
    # bf16/fp16: the float64 reference over the same rounded inputs
    ref = reference(case, [{x: t.double() for x, t in s.items()} for s in seqs] if low else seqs)
    padded = [s["q"].size(1) for s in seqs]
    tol = TOLERANCE[case.dtype]
    for key in ("out", "dq", "dk", "dv"):
        got = unshard_buffer([r[key].double() if low else r[key] for r in ranks], padded, case.placement, dim=1)
        for i, (n, g) in enumerate(zip(case.lengths, got)):
            torch.testing.assert_close(g[:, :n], ref[i][key], **tol, msg=lambda m: f"{key} seq {i}: {m}")
            if key != "out":  # nothing may flow into pad tokens
                assert not g[:, n:].any(), f"{key} seq {i}: nonzero gradient on padding"
