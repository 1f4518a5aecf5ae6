"""gloo's collectives against point-to-point sends, for the K/V exchange and FSDP.

    PYTHONPATH=. python tools/measure_transports.py --world 2 4 --repeats 20

Two moves, both made by DACP's K/V exchange (every layer) and by FSDP
(every unit: parameters forward, gradients at the end of the step):

- ``gather``: every rank's shard on every rank;
- ``scatter_sum``: each rank gets the sum over ranks of its slice of a full
  buffer (a reduce-scatter).

Each is timed through the two transports of skrull_ext.attention.transport on
the same gloo group and buffers, alternating: ``all_gather`` (the
collectives, ``all_gather_single`` and ``reduce_scatter_single``, what FSDP
and torchtitan's CP call by default) and ``p2p`` (every pair at once in one
``batch_isend_irecv``; the sum in rank order). Sizes are the full buffer per
rank: a gather's output, a reduce-scatter's input. The debug model's FSDP
units are 0.5-4 MiB a buffer; its K/V exchange moves 0.1-1 MiB a layer.

Per size: the median over repeats of the slowest rank's time, and p2p /
collective. Both transports' results are checked equal once. A measurement
script, not a test.
"""

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from skrull_ext.attention.transport import TRANSPORTS

SIZES = [256 << 10, 1 << 20, 4 << 20, 16 << 20]
OPS = ("gather", "scatter_sum")


def _run(name: str, op: str, out: torch.Tensor, src: torch.Tensor) -> None:
    getattr(TRANSPORTS[name], op)(out, src, None).wait()


def _worker(rank: int, n: int, init: str, repeats: int, queue) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=n)
    torch.set_num_threads(1)
    rows = []
    for size in SIZES:
        full = torch.randn(size // 4, generator=torch.Generator().manual_seed(rank))
        for op in OPS:
            # gather: shard in, full out; scatter_sum: full in, shard out
            src = full[: full.numel() // n].clone() if op == "gather" else full
            outs = {name: full.new_empty(full.numel() if op == "gather" else full.numel() // n)
                    for name in ("all_gather", "p2p")}
            times = {name: [] for name in outs}
            for i in range(repeats + 2):
                for name in ("all_gather", "p2p") if i % 2 == 0 else ("p2p", "all_gather"):
                    dist.barrier()
                    t0 = time.perf_counter()
                    _run(name, op, outs[name], src)
                    dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
                    if i >= 2:  # warm-up
                        times[name].append(float(dt))
            assert torch.equal(outs["all_gather"], outs["p2p"]) or n > 2 and torch.allclose(
                outs["all_gather"], outs["p2p"], rtol=1e-6, atol=1e-6)  # sums in another order above 2 ranks
            rows.append((op, size, statistics.median(times["all_gather"]), statistics.median(times["p2p"])))
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, nargs="+", default=[2, 4], help="group sizes (processes on this machine)")
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    ctx = mp.get_context("spawn")
    print("| ranks | move | buffer per rank | collective ms | p2p ms | p2p / collective |")
    print("|---|---|---|---|---|---|")
    for n in a.world:
        with tempfile.TemporaryDirectory() as tmp:
            queue = ctx.Queue()
            init = f"file://{os.path.join(tmp, 'rdzv')}"
            procs = [ctx.Process(target=_worker, args=(r, n, init, a.repeats, queue)) for r in range(n)]
            for proc in procs:
                proc.start()
            rows = queue.get()
            for proc in procs:
                proc.join()
        for op, size, col, p2p in rows:
            print(f"| {n} | {op} | {size >> 10} KiB | {col * 1e3:.2f} | {p2p * 1e3:.2f} | {p2p / col:.2f} |", flush=True)


if __name__ == "__main__":
    main()
