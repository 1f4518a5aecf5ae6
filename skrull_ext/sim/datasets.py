"""Length streams for the simulator: real files and the paper's distributions.

Two kinds, one registry (``DATASETS``: name -> Dataset):

- real files shipped in ``skrull_ext/lengths`` (provenance in its README),
  read in file order and wrapped around when a run needs more samples;
- samplers for the three distributions of the paper's Table 1 (Wikipedia,
  LMsysChat1M, ChatQA2-Long-SFT), rebuilt from their cumulative shares.

``get`` also takes the path of a user's own lengths file (``bench simulate
--lengths FILE``), in the shipped files' format and read by the same reader
as ``dataloader.lengths`` (skrull_ext/lengths), replayed like a shipped one.

How a paper sampler draws a length: pick a bin with the published share,
then a length log-uniformly inside it. Bin edges are 1K = 1024 tokens, 4K,
8K, 32K and 128K; the first bin starts at ``MIN_LENGTH`` (32 tokens, a short
chat turn with its template) and the last ends at the dataset's documented
longest sample (78K, 1643K, 99K). The paper gives only these shares, so the
shape inside a bin is an assumption; the shares themselves are reproduced
(tests check them on large draws).
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable
from dataclasses import dataclass

from skrull_ext import lengths as length_files

MIN_LENGTH = 32
K = 1024
EDGES = (1 * K, 4 * K, 8 * K, 32 * K, 128 * K)


@dataclass(frozen=True)
class PaperDistribution:
    """Cumulative shares of sequences shorter than each of EDGES, and the longest."""

    name: str
    cumulative: tuple[float, ...]
    """Share (0..1) of sequences shorter than 1K, 4K, 8K, 32K, 128K."""
    longest: int
    """Documented maximum length (tokens); no draw exceeds it."""

    def bins(self) -> list[tuple[int, int, float]]:
        """(lo, hi, probability) of each non-empty bin; lengths in [lo, hi)."""
        lows = (MIN_LENGTH, *EDGES)
        highs = (*EDGES, self.longest + 1)
        shares = (*self.cumulative, 1.0)
        out, prev = [], 0.0
        for lo, hi, cum in zip(lows, highs, shares):
            p, prev = cum - prev, cum
            hi = min(hi, self.longest + 1)
            if p > 0 and hi > lo:
                out.append((lo, hi, p))
        return out

    def sample(self, n: int, rng: random.Random) -> list[int]:
        bins = self.bins()
        weights = [p for _, _, p in bins]
        out = []
        for lo, hi, _ in rng.choices(bins, weights=weights, k=n):
            out.append(min(hi - 1, int(math.exp(rng.uniform(math.log(lo), math.log(hi))))))
        return out


# The paper's Table 1 (arXiv 2505.19609): share of sequences shorter than 1K, 4K, 8K, 32K, 128K; longest.
PAPER_DISTRIBUTIONS: dict[str, PaperDistribution] = {
    d.name: d
    for d in (
        PaperDistribution("wikipedia", (0.8788, 0.9934, 0.9992, 0.9999, 1.0), 78 * K),
        PaperDistribution("lmsyschat1m", (0.8712, 0.9935, 0.9987, 0.9998, 0.9999), 1643 * K),
        PaperDistribution("chatqa2", (0.2192, 0.3148, 0.4043, 0.9986, 1.0), 99 * K),
    )
}


@dataclass(frozen=True)
class Dataset:
    """A named source of sequence lengths in dataset order."""

    name: str
    kind: str
    """'paper' (sampled from Table 1), 'real' (a shipped length file) or 'file' (the user's own)."""
    stream: Callable[[int, int], list[int]]
    """(n, seed) -> the first n lengths of the stream."""


def _paper_stream(dist: PaperDistribution) -> Callable[[int, int], list[int]]:
    return lambda n, seed: dist.sample(n, random.Random(f"{dist.name}:{seed}"))


def _file_stream(name: str) -> Callable[[int, int], list[int]]:
    def stream(n: int, seed: int) -> list[int]:
        data = length_files.load(name)
        # File order, wrapped around; the seed does not matter: real data is replayed as is.
        return [data[i % len(data)] for i in range(n)]

    return stream


DATASETS: dict[str, Dataset] = {
    **{name: Dataset(name, "paper", _paper_stream(d)) for name, d in PAPER_DISTRIBUTIONS.items()},
    **{name: Dataset(name, "real", _file_stream(name)) for name in length_files.names()},
}

# The real files the benchmark reports by default: one per shape (long-tail
# documents, heavy-tail chat, chat + long documents, bimodal), in Qwen tokens
# where a Qwen count exists.
REAL_DEFAULT = (
    "wikipedia_en_dumpslice.qwen",
    "sharegpt_v3_conversations.qwen",
    "mix_sharegpt_conv95+longbench_en5",
    "mix_azureconv90+longbench_en10",
)


def get(name: str) -> Dataset:
    """The named dataset, or the lengths file at path ``name`` (read and checked now:
    a bad file is a DataError naming file:line before any cell runs)."""
    if name in DATASETS:
        return DATASETS[name]
    if os.path.isfile(name):
        length_files.load(name, "--lengths")
        return Dataset(name, "file", _file_stream(name))
    raise ValueError(f"unknown dataset {name!r}; choose one of {sorted(DATASETS)}, or the path of a lengths "
                     "file (--lengths FILE)")
