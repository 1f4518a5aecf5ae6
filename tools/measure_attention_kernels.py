"""Dense-mask SDPA vs the segment plan's per-segment SDPA on CPU, one buffer at a time.

    PYTHONPATH=. python tools/measure_attention_kernels.py --repeats 7

One process, CP 1, every sequence local: ``dacp_attention`` forward and
backward over packed buffers of the llama3 debug model's attention shape (16
heads of 16), with ``kernel="dense"`` (one SDPA over the whole buffer with a
document-causal [T, T] mask) and ``kernel="segments"`` (one SDPA per
document). Median wall time over repeats after 2 warm-ups, one torch
thread, and the ratio. A measurement script, not a test.
"""

import argparse
import statistics
import time

import torch

from skrull_ext.attention import build_meta, dacp_attention

BUFFERS = [[1024], [2048], [512, 512], [256] * 4, [256] * 8, [512, 384, 128], [64] * 16, [16] * 16, [8] * 32,
           [4] * 64, [2] * 128]


def _time(lens: list[int], kernel: str, heads: int, head_dim: int, repeats: int) -> float:
    meta = build_meta(lens, [0] * len(lens), 0, 1)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(heads, sum(lens), head_dim, generator=g, requires_grad=True) for _ in range(3))
    times = []
    for i in range(repeats + 2):
        t0 = time.perf_counter()
        dacp_attention(q, k, v, meta, kernel=kernel).sum().backward()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _name(lens: list[int]) -> str:
    if len(set(lens)) == 1:
        return f"{len(lens)} x {lens[0]}" if len(lens) > 1 else str(lens[0])
    return " + ".join(map(str, lens))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=16)
    a = p.parse_args()
    torch.set_num_threads(1)
    print("| buffer (tokens per document) | dense ms | segments ms | segments / dense |")
    print("|---|---|---|---|")
    for lens in BUFFERS:
        d = _time(lens, "dense", a.heads, a.head_dim, a.repeats)
        s = _time(lens, "segments", a.heads, a.head_dim, a.repeats)
        print(f"| {_name(lens)} | {d * 1e3:.1f} | {s * 1e3:.1f} | {s / d:.2f} |", flush=True)


if __name__ == "__main__":
    main()
