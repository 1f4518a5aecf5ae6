"""All-gather vs a ring of point-to-point sends for the DACP K/V exchange.

    PYTHONPATH=. python tools/measure_kv_exchange.py --cp 2 4 --repeats 20

Each CP rank holds one shard of the distributed sequences' K/V and needs
everybody's. Two ways to get them, timed on the same process group and
buffers (gloo on CPU, NCCL on CUDA):

- ``allgather``: one tensor-in/tensor-out all-gather (``all_gather_single``,
  the same call skrull_ext.attention.exchange makes; torchtitan's CP
  all-gathers too);
- ``ring``: N-1 rounds, each sending the last received shard to the next rank
  and receiving from the previous (``batch_isend_irecv``), the schedule ring
  attention uses so that compute can start on the first shard.

Per size: the median over repeats of the slowest rank's time, and the ratio
ring / all-gather. A measurement script, not a test.
"""

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from skrull_ext.attention.transport import _all_gather

SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]


def _ring(shard: torch.Tensor, out: list[torch.Tensor], rank: int, n: int) -> None:
    out[rank].copy_(shard)
    for step in range(n - 1):
        send = out[(rank - step) % n]
        recv = out[(rank - step - 1) % n]
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % n), dist.P2POp(dist.irecv, recv, (rank - 1) % n)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()


def _worker(rank: int, n: int, init: str, repeats: int, queue) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=n)
    rows = []
    for size in SIZES:
        shard = torch.randn(size // 4)
        gathered = shard.new_empty(n * shard.numel())
        parts = [shard.new_empty(shard.numel()) for _ in range(n)]
        times = {"allgather": [], "ring": []}
        for i in range(repeats + 2):
            for name in ("allgather", "ring") if i % 2 == 0 else ("ring", "allgather"):
                dist.barrier()
                t0 = time.perf_counter()
                if name == "allgather":
                    _all_gather(gathered, shard)
                else:
                    _ring(shard, parts, rank, n)
                dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(dt, op=dist.ReduceOp.MAX)
                if i >= 2:  # warm-up
                    times[name].append(float(dt))
        if rank == 0:
            # Both ways give the same bytes: check once.
            assert torch.equal(torch.cat(parts), gathered)
            rows.append((size, statistics.median(times["allgather"]), statistics.median(times["ring"])))
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cp", type=int, nargs="+", default=[2, 4])
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    ctx = mp.get_context("spawn")
    print("| CP | shard bytes per rank | all-gather ms | ring ms | ring / all-gather |")
    print("|---|---|---|---|---|")
    for n in a.cp:
        with tempfile.TemporaryDirectory() as tmp:
            queue = ctx.Queue()
            init = f"file://{os.path.join(tmp, 'rdzv')}"
            procs = [ctx.Process(target=_worker, args=(r, n, init, a.repeats, queue)) for r in range(n)]
            for proc in procs:
                proc.start()
            rows = queue.get()
            for proc in procs:
                proc.join()
        for size, ag, ring in rows:
            print(f"| {n} | {size >> 10} KiB | {ag * 1e3:.2f} | {ring * 1e3:.2f} | {ring / ag:.2f} |", flush=True)


if __name__ == "__main__":
    main()
