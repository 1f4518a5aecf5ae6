# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""All-gather-everything vs DACP attention on this machine, side by side.

    python -m skrull_ext.bench.attention --cp 2 --repeats 10

Both modes call the same ``dacp_attention`` on the same micro-batch and the
same gloo group; only the placement differs:

- ``allgather``: every sequence distributed (zigzag over the CP group, all K/V
  gathered), which is what torchtitan's CP does;
- ``dacp``: sequences up to ``--local-max`` tokens stay whole on one rank
  (greedy on sum of L^2, a stand-in for the scheduler), longer ones are
  distributed.

Reported per mode: bytes each rank receives (forward all-gather, backward
reduce-scatter), forward and forward+backward time per call (the slowest rank
of each repeat; min/median/max over repeats), and the overlap counters. Note
that both modes use dense masks, so the all-gather mode also pays attention
compute across document boundaries; the time ratio mixes that with the
communication saving. This is a script, not a test: nothing is asserted.
"""

import argparse
import os
import random
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from skrull_ext.attention.dacp import dacp_attention
from skrull_ext.attention.meta import DISTRIBUTED, build_meta
from skrull_ext.attention.stats import DacpStats


def backend_for(device: str, world_size: int) -> str:
    """The process group backend for ``world_size`` ranks on ``device``: gloo on
    CPU; on CUDA, NCCL when every rank has a GPU of its own, else gloo, whose
    all-gather and all-reduce (hence reduce-scatter) stage CUDA tensors through
    pinned host memory on their own streams, so one GPU can host a real CP
    group (NCCL refuses two ranks on one device). gloo has no CUDA send/recv:
    such a group must use the ``all_gather`` exchange."""
    if device == "cpu" or torch.cuda.device_count() < world_size:
        return "gloo"
    return "nccl"


def long_tail_lengths(n: int, seed: int) -> list[int]:
    """Mostly short sequences with a few long ones (the SFT shape of docs/design/method.md)."""
    rng = random.Random(seed)
    return [rng.randint(1024, 3072) if rng.random() < 0.15 else rng.randint(32, 512) for _ in range(n)]


def dacp_placement(lengths: list[int], cp_size: int, local_max: int) -> list[int]:
    """Long sequences distributed; short ones local, longest first onto the least loaded rank."""
    placement = [DISTRIBUTED] * len(lengths)
    load = [0] * cp_size
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if lengths[i] <= local_max:
            r = min(range(cp_size), key=lambda r: (load[r], r))
            placement[i] = r
            load[r] += lengths[i] ** 2
    return placement


def _time_mode(args, lengths, placement, rank, group) -> dict:
    meta = build_meta(lengths, placement, rank, args.cp)
    g = torch.Generator().manual_seed(rank)
    t = meta.num_tokens
    q = torch.randn(args.heads, t, args.head_dim, generator=g).requires_grad_()
    k = torch.randn(args.kv_heads, t, args.head_dim, generator=g).requires_grad_()
    v = torch.randn(args.kv_heads, t, args.head_dim, generator=g).requires_grad_()
    go = torch.randn(args.heads, t, args.head_dim, generator=g)
    meta.local_mask(), meta.dist_mask()  # masks are built once per micro-batch, not per layer
    fwd, step = [], []
    stats = DacpStats()
    for i in range(args.warmup + args.repeats):
        if i == args.warmup:
            stats.reset()
        dist.barrier(group)
        t0 = time.perf_counter()
        out = dacp_attention(q, k, v, meta, group, stats=stats)
        t1 = time.perf_counter()
        out.backward(go)
        t2 = time.perf_counter()
        q.grad = k.grad = v.grad = None
        # a step is as slow as its slowest rank
        times = torch.tensor([t1 - t0, t2 - t0], dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)
        if i >= args.warmup:
            fwd.append(times[0].item())
            step.append(times[1].item())
    return dict(tokens=t, fwd=fwd, step=step, stats=stats)


def _worker(rank: int, args, store: str, lengths: list[int]) -> None:
    torch.set_num_threads(args.threads)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=args.cp)
    try:
        modes = {
            "allgather": [DISTRIBUTED] * len(lengths),
            "dacp": dacp_placement(lengths, args.cp, args.local_max),
        }
        res = {name: _time_mode(args, lengths, p, rank, dist.group.WORLD) for name, p in modes.items()}
        if rank == 0:
            _report(args, lengths, modes, res)
    finally:
        dist.destroy_process_group()


def _ms(xs: list[float]) -> str:
    return f"{min(xs) * 1e3:8.1f} {statistics.median(xs) * 1e3:8.1f} {max(xs) * 1e3:8.1f}"


def _report(args, lengths, modes, res) -> None:
    n_dist = sum(p == DISTRIBUTED for p in modes["dacp"])
    print(
        f"CP={args.cp}  heads={args.heads}/{args.kv_heads}  head_dim={args.head_dim}  "
        f"threads/rank={args.threads}  repeats={args.repeats}\n"
        f"micro-batch: {len(lengths)} sequences, {sum(lengths)} tokens; "
        f"dacp distributes {n_dist} (> {args.local_max} tokens)\n"
    )
    print(f"{'mode':10} {'tok/rk0':>8} {'fwd MB':>8} {'bwd MB':>8}   {'fwd ms min/med/max':>26}   "
          f"{'fwd+bwd ms min/med/max':>26}   {'local ms':>8} {'wait ms':>8}")
    for name, r in res.items():
        s, n = r["stats"], args.repeats
        print(
            f"{name:10} {r['tokens']:8d} {s.fwd_bytes / n / 1e6:8.2f} {s.bwd_bytes / n / 1e6:8.2f}   "
            f"{_ms(r['fwd']):>26}   {_ms(r['step']):>26}   "
            f"{s.local_s / n * 1e3:8.1f} {s.fwd_wait_s / n * 1e3:8.1f}"
        )
    a, d = res["allgather"], res["dacp"]
    ab, db = a["stats"].fwd_bytes, d["stats"].fwd_bytes
    print(
        f"\ndacp / allgather: bytes {db / ab if ab else float('nan'):.3f}   "
        f"fwd median {statistics.median(d['fwd']) / statistics.median(a['fwd']):.3f}   "
        f"fwd+bwd median {statistics.median(d['step']) / statistics.median(a['step']):.3f}\n"
        "note: dense masks on CPU, so allgather also computes across document boundaries;\n"
        "      the time ratio mixes that with the communication saving ('wait ms' is the\n"
        "      exchange left exposed after the local part)."
    )


def add_micro_batch_args(p: argparse.ArgumentParser) -> None:
    """The CP group, micro-batch and attention shape options this script and
    ``skrull_ext.bench overlap`` share."""
    p.add_argument("--cp", type=int, default=2, help="CP size (processes); keep <= cores on CPU")
    p.add_argument("--sequences", type=int, default=16, help="sequences in the micro-batch")
    p.add_argument("--lengths", type=int, nargs="*", help="explicit lengths instead of random")
    p.add_argument("--local-max", type=int, default=1024, help="longest sequence kept local")
    p.add_argument("--heads", type=int, default=8, help="query heads")
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads (GQA; divides --heads)")
    p.add_argument("--head-dim", type=int, default=64, help="dimension per head")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (CPU)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random lengths and tensors")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_micro_batch_args(p)
    p.add_argument("--repeats", type=int, default=10, help="timed steps")
    args = p.parse_args()
    lengths = args.lengths or long_tail_lengths(args.sequences, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            _worker, args=(args, os.path.join(tmp, "store"), lengths), nprocs=args.cp, start_method="spawn"
        )


if __name__ == "__main__":
    main()
