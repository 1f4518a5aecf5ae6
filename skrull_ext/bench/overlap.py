# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""A torch profiler trace of DACP attention and the overlap it shows.

    python -m skrull_ext.bench overlap --cp 2 --out outputs/overlap            # CPU, gloo
    python -m skrull_ext.bench overlap --cp 2 --device cuda --out outputs/overlap

``cp`` processes form a real CP group (gloo on CPU; on CUDA, NCCL when every
rank has a GPU, else gloo staging the CUDA tensors through host memory, so one
GPU hosts the group). Each rank runs a stack of ``--layers`` DACP attention
layers over one micro-batch of mixed local and distributed sequences (long
sequences sharded, short ones whole, bench/attention.py's placement),
forward and backward, ``--steps`` times under torch.profiler after
``--warmup`` steps. Per rank it writes the Chrome trace
(``rank{r}.trace.json.gz``: open it in Perfetto, ui.perfetto.dev, and look
for ``dacp/local`` against ``gloo:*``/NCCL), and trace_overlap.py reads back
from it how much of the exchange ran under the local attention; the table,
``overlap.json`` and ``overlap.png`` (a timeline of rank 0's last step) say it.

The exchange defaults to ``all_gather``: its gloo range spans the transfer on
gloo's worker thread, while a point-to-point range closes only when waited
on (an upper bound). A measurement script: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile, record_function

from skrull_ext.attention import DISTRIBUTED, KERNEL_CHOICES, TRANSPORTS, DacpStats, build_meta, dacp_attention
from skrull_ext.bench.attention import add_micro_batch_args, backend_for, dacp_placement, long_tail_lengths
from skrull_ext.bench.trace_overlap import analyze, load_events

__all__ = ["main", "start_method"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m skrull_ext.bench overlap", description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("outputs/overlap"), help="output folder (traces, report)")
    add_micro_batch_args(p)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the CP group runs")
    p.add_argument("--exchange", default="all_gather", choices=("auto", *TRANSPORTS),
                   help="how K/V travel (p2p: gloo cannot send CUDA tensors)")
    p.add_argument("--kernel", default="auto", choices=KERNEL_CHOICES, help="inner attention kernel")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="default: float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--layers", type=int, default=4, help="attention layers chained per step")
    p.add_argument("--steps", type=int, default=3, help="profiled steps (forward + backward)")
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here")
    if a.kv_heads < 1 or a.heads % a.kv_heads:
        p.error(f"--heads {a.heads} must be a multiple of --kv-heads {a.kv_heads}")
    if a.cp < 2:
        p.error(f"--cp {a.cp}: the exchange needs a CP group of at least 2")
    if a.device == "cuda" and backend_for("cuda", a.cp) == "gloo" and a.exchange != "all_gather":
        p.error(f"--exchange {a.exchange}: {a.cp} ranks share {torch.cuda.device_count()} GPU(s) over gloo, "
                "which moves CUDA tensors only by collectives; use all_gather")
    a.dtype = DTYPES[a.dtype or ("bfloat16" if a.device == "cuda" else "float32")]
    return a


def _step(args, x0: torch.Tensor, scales: torch.Tensor, meta, group, stats: DacpStats) -> None:
    """A chain of attention layers, so backward visits them one by one as a model's would."""
    x = x0
    for layer in range(args.layers):
        with record_function(f"layer{layer}"):
            q = x * scales[layer, 0]
            k, v = x[: args.kv_heads] * scales[layer, 1], x[: args.kv_heads] * scales[layer, 2]
            x = x + dacp_attention(q, k, v, meta, group, stats=stats, exchange=args.exchange, kernel=args.kernel)
    x.float().square().mean().backward()


def _worker(rank: int, args, store: str, lengths: list[int], placement: list[int]) -> None:
    torch.set_num_threads(args.threads)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    device = torch.device("cpu")
    if args.device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    backend = backend_for(args.device, args.cp)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=args.cp)
    try:
        meta = build_meta(lengths, placement, rank, args.cp)
        g = torch.Generator().manual_seed(args.seed + rank)
        x0 = torch.randn(args.heads, meta.num_tokens, args.head_dim, generator=g)
        x0 = x0.to(device, args.dtype).requires_grad_()
        scales = (1 + 0.1 * torch.randn(args.layers, 3, generator=g)).to(device, args.dtype)
        stats = DacpStats()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
        for _ in range(args.warmup):
            _step(args, x0, scales, meta, dist.group.WORLD, stats)
        stats.reset()
        dist.barrier()
        with profile(activities=activities) as prof:
            for s in range(args.steps):
                with record_function(f"step{s}"):
                    _step(args, x0, scales, meta, dist.group.WORLD, stats)
                if args.device == "cuda":
                    torch.cuda.synchronize()
        trace = args.out / f"rank{rank}.trace.json.gz"
        prof.export_chrome_trace(str(trace))
        result = dict(rank=rank, backend=backend, tokens=meta.num_tokens, local_tokens=meta.num_local_tokens,
                      overlap=analyze(load_events(trace)).as_dict(), stats=stats.as_dict(prefix=""))
        (args.out / f"rank{rank}.json").write_text(json.dumps(result, indent=1))
    finally:
        dist.destroy_process_group()


def _row(r: dict, steps: int) -> str:
    o = r["overlap"]
    per = {k: o[k] / steps for k in ("fwd_compute_ms", "bwd_compute_ms", "exchange_ms", "fwd_overlap_ms",
                                      "bwd_overlap_ms", "kv_wait_ms", "grad_wait_ms")}
    return (f"| {r['rank']} | {r['local_tokens']}/{r['tokens']} | {per['fwd_compute_ms']:.2f} | "
            f"{per['bwd_compute_ms']:.2f} | {per['exchange_ms']:.2f} | {per['fwd_overlap_ms']:.2f} | "
            f"{per['bwd_overlap_ms']:.2f} | {100 * o['hidden']:.0f}% | {per['kv_wait_ms']:.2f} | "
            f"{per['grad_wait_ms']:.2f} |")


def report(args, lengths: list[int], placement: list[int], ranks: list[dict]) -> str:
    n_dist = sum(p == DISTRIBUTED for p in placement)
    o0 = ranks[0]["overlap"]
    lines = [
        f"DACP attention, {args.cp} ranks over {ranks[0]['backend']} on {args.device}, {args.layers} layers, "
        f"{str(args.dtype).removeprefix('torch.')}, heads {args.heads}/{args.kv_heads} x {args.head_dim}, "
        f"exchange {args.exchange}, kernel {args.kernel}",
        f"micro-batch: {len(lengths)} sequences, {sum(lengths)} tokens, {n_dist} distributed "
        f"(> {args.local_max} tokens); {args.steps} profiled steps; compute read off the "
        f"{'GPU kernels' if o0['source'] == 'gpu' else 'host ranges'}; exchange: {', '.join(o0['exchange_kinds'])}",
        "",
        "| rank | local/all tokens | local fwd ms | local bwd ms | exchange ms | overlap fwd ms | overlap bwd ms "
        "| exchange hidden | fwd wait ms | bwd wait ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_row(r, args.steps) for r in ranks]
    hidden = [r["overlap"]["hidden"] for r in ranks]
    lines += ["", f"exchange hidden under local attention: median {100 * statistics.median(hidden):.0f}% "
                  f"(min {100 * min(hidden):.0f}%, max {100 * max(hidden):.0f}%) over ranks"]
    if args.exchange == "p2p":
        lines.append("note: p2p ranges close when waited on, so overlap and exchange are upper bounds")
    return "\n".join(lines)


def start_method(device: str) -> str:
    """How the ranks start. CUDA needs fresh processes (spawn). On CPU the ranks are forks of this
    process, which has imported torch and computed nothing with it yet: each spawned rank imported
    torch and the bench again, half the CPU time of the whole run (13.7 -> 7.1 s for
    tools/gpu_checks.sh's dry-run shape at CP 2). Spawned too where this process holds a process
    group (a caller's in-process run): a fork would inherit it, initialised, and fail to make its own."""
    return "spawn" if device == "cuda" or dist.is_initialized() else "fork"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    lengths = args.lengths or long_tail_lengths(args.sequences, args.seed)
    placement = dacp_placement(lengths, args.cp, args.local_max)
    if DISTRIBUTED not in placement or all(p == DISTRIBUTED for p in placement):
        raise SystemExit(f"the micro-batch needs local and distributed sequences; --local-max {args.local_max} "
                         f"makes {sum(p == DISTRIBUTED for p in placement)} of {len(lengths)} distributed")
    print(f"profiling {args.cp} ranks on {args.device} ({args.warmup} warm-up + {args.steps} steps) ...", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_worker, args=(args, os.path.join(tmp, "store"), lengths, placement), nprocs=args.cp,
                           start_method=start_method(args.device))
    ranks = [json.loads((args.out / f"rank{r}.json").read_text()) for r in range(args.cp)]
    text = report(args, lengths, placement, ranks)
    print(text)
    (args.out / "overlap.md").write_text(text + "\n")
    (args.out / "overlap.json").write_text(json.dumps(dict(lengths=lengths, placement=placement, ranks=ranks),
                                                      indent=1))
    try:
        from skrull_ext.bench.overlap_plot import timeline_plot
    except ImportError as e:  # matplotlib is the [bench] extra
        print(f"no plot: {e}")
    else:
        print(f"timeline: {timeline_plot(load_events(args.out / 'rank0.trace.json.gz'), args.out / 'overlap.png')}")
    print(f"traces: {args.out}/rank*.trace.json.gz (Perfetto: ui.perfetto.dev)")
    return 0

