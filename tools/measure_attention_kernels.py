"""Dense-mask SDPA vs the tile plan and the segment plan on CPU, one buffer at a time.

    PYTHONPATH=. python tools/measure_attention_kernels.py --repeats 7

One process, CP 1, every sequence local: ``dacp_attention`` forward and
backward over packed buffers of the llama3 debug model's attention shape (16
heads of 16), with ``kernel="dense"`` (one SDPA over the whole buffer with a
document-causal [T, T] mask), ``kernel="tiles"`` (one SDPA per tile of at most
64 queries) and ``kernel="segments"`` (one SDPA per
document). Median wall time over repeats after 2 warm-ups, one torch
thread, and the ratios. The last rows are 256-token buffers (one CP rank's
BucketSize in the README job) drawn from the job's documents (ShareGPT
lengths / 32, 2..512). A measurement script, not a test.
"""

import argparse
import statistics
import time

import torch

from skrull_ext.attention import build_meta, dacp_attention

BUFFERS = [[1024], [2048], [512, 512], [256] * 4, [256] * 8, [512, 384, 128], [64] * 16, [16] * 16, [8] * 32,
           [4] * 64, [2] * 128, [256], [128, 128]]
KERNELS = ("dense", "tiles", "segments")


def job_buffers(n: int, tokens: int = 256, seed: int = 0) -> list[list[int]]:
    """``n`` buffers of ``tokens`` filled in order with the README job's document lengths."""
    import numpy as np

    from skrull_ext import lengths

    pool = np.asarray(lengths.load("sharegpt_v3_conversations.qwen"))
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        buf: list[int] = []
        while sum(buf) < tokens:
            n_tok = int(np.clip(round(pool[rng.integers(len(pool))] / 32), 2, 512))
            buf.append(min(n_tok, tokens - sum(buf)))
        out.append(buf)
    return out


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
    if len(lens) > 4:
        return f"{sum(lens)}: {len(lens)} documents, longest {max(lens)}"
    return " + ".join(map(str, lens))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--job-buffers", type=int, default=6, help="256-token buffers of the README job's documents")
    a = p.parse_args()
    torch.set_num_threads(1)
    print("| buffer (tokens per document) | dense ms | tiles ms | segments ms | tiles / dense | segments / dense |")
    print("|---|---|---|---|---|---|")
    for lens in BUFFERS + job_buffers(a.job_buffers):
        d, t, s = (_time(lens, k, a.heads, a.head_dim, a.repeats) for k in KERNELS)
        print(f"| {_name(lens)} | {d * 1e3:.1f} | {t * 1e3:.1f} | {s * 1e3:.1f} | {t / d:.2f} | {s / d:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
