# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""What a metered training run measured, against what the profile predicts.

Plain data and arithmetic, apart from the trainer (train_check.py), so the
verdict can be tested without a process group:

    measured  = static tensors of the rank + peak above the step's start
    predicted = ProfileMemory.budget(tokens of the rank's largest buffer)

A rank passes when every one of its steps is within the budget for the
tokens that step held.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from skrull_ext._core import CostModel
from skrull_ext.scheduler.chunk_cost import chunk_cost
from skrull_ext.scheduler.profile_memory import ProfileMemory

__all__ = ["ChunkedMemory", "RankVerdict", "StepMemory", "chunked_predicted", "format_chunked", "format_report",
           "report"]


@dataclass(frozen=True)
class StepMemory:
    """One step of one rank."""

    rank: int
    step: int
    micro_batches: int
    plan_tokens: int
    """Most tokens the plan gave this rank in one micro-batch (<= BucketSize)."""
    buffer_tokens: int
    """Length of this rank's largest micro-batch buffer (plan tokens + zigzag padding)."""
    start: float
    """Resident (CPU) or allocated (CUDA) bytes when the step began."""
    peak: float
    """Peak bytes above ``start`` during the step (all micro-batches, clipping, optimizer)."""
    static: float
    """Local parameter, gradient and optimizer-state bytes after the step."""

    @property
    def measured(self) -> float:
        return self.static + self.peak


@dataclass(frozen=True)
class RankVerdict:
    """One rank over the whole run."""

    rank: int
    plan_tokens: int
    buffer_tokens: int
    """Most tokens the rank held in one micro-batch (its longest buffer)."""
    bucket_size: int
    measured: float
    """Highest measurement of any step."""
    predicted: float
    """The profile's budget for ``buffer_tokens`` (the highest of any step)."""
    usable: float
    ok: bool
    """Every step within the budget for its own tokens."""


@dataclass(frozen=True)
class ChunkedMemory:
    """One step's chunked samples (``overlength = "chunk"``) on one rank, metered apart from the
    step's micro-batches: they run before them (train/passes.py ``chunked_samples``)."""

    rank: int
    step: int
    lengths: list[int]
    chunk: int
    """Tokens per chunk (``SchedulerJob.chunk_for``: at most the limit, BucketSize x cp; the
    smallest of the step's, the longest sample's), sharded over ``cp`` ranks."""
    cp: int
    above_step_start: float
    """Bytes held when the chunked samples began, above the step's start."""
    peak: float
    """Peak bytes above that level while they ran."""
    static: float
    us: float
    """Their forward + backward, wall clock."""
    cpu_us: float
    """The same on the process CPU clock (a CPU profile's clock with one thread: other load
    on a shared host does not count)."""
    predicted_us: float
    """Sum of ``chunk_cost(...).us``."""
    predicted: float
    """The profile's static account + (A(chunk / cp) + peak_bytes_beyond_chunk) / (1 - margin), the
    largest over the samples (they run one after the other)."""

    @property
    def measured(self) -> float:
        return self.static + self.above_step_start + self.peak

    @property
    def ok(self) -> bool:
        return self.measured <= self.predicted


def chunked_predicted(cost: CostModel, pm: ProfileMemory, lengths: list[int], chunk: int | Sequence[int], cp: int,
                      gradient_bytes: float, dense_fit: bool = False, *,
                      unsharded_bytes: float = 0.0) -> tuple[float, float]:
    """(time, bytes) the profile predicts for a step's chunked samples on one rank: their
    ``chunk_cost`` times summed; the static account plus the worst sample's activations (one
    chunk's share, A(chunk / cp), + peak_bytes_beyond_chunk), grown by the margin as ``budget`` is.
    ``chunk``: one for every sample, or each sample's (``SchedulerJob.chunk_for``);
    ``unsharded_bytes``: FSDP's unsharded parameters, held in a checkpointed chunk's recompute."""
    chunks = [chunk] * len(lengths) if isinstance(chunk, int) else list(chunk)
    costs = [chunk_cost(cost, n, c, cp, mask_bytes_per_token2=pm.c, gradient_bytes=gradient_bytes,
                        unsharded_bytes=unsharded_bytes,
                        dense_fit=dense_fit) for n, c in zip(lengths, chunks, strict=True)]
    act = max(pm.activation_any(c // cp) + k.peak_bytes_beyond_chunk for c, k in zip(chunks, costs))
    return sum(k.us for k in costs), pm.static + act / (1.0 - pm.margin)


def format_chunked(records: list[ChunkedMemory]) -> str:
    """One line per step and rank with chunked samples: measured against predicted, time and bytes."""
    mib = lambda v: f"{v / 2**20:.1f}"  # noqa: E731
    lines = ["step rank  chunked samples (chunks of C over cp)  measured MiB  predicted MiB  ratio  "
             "wall ms  cpu ms  chunk_cost ms  wall/cost  cpu/cost"]
    for r in sorted(records, key=lambda r: (r.step, r.rank)):
        what = f"{'+'.join(map(str, r.lengths))} ({r.chunk} over {r.cp})"
        lines.append(f"{r.step:4d} {r.rank:4d}  {what:<36} {mib(r.measured):>13} {mib(r.predicted):>14} "
                     f"{r.measured / r.predicted:6.2f} {r.us / 1e3:8.1f} {r.cpu_us / 1e3:7.1f} "
                     f"{r.predicted_us / 1e3:14.1f} {r.us / r.predicted_us:10.2f} {r.cpu_us / r.predicted_us:9.2f}  "
                     f"{'OK' if r.ok else 'OVER'}")
    ok = all(r.ok for r in records)
    lines.append(f"chunked samples in training: {'OK' if ok else 'FAILED'} (measured = static tensors + held at "
                 "their start + their peak; predicted = static account + (A(chunk / cp) + chunk_cost's "
                 "peak_bytes_beyond_chunk) / (1 - margin); time is not a verdict)")
    return "\n".join(lines)


def report(records: list[StepMemory], pm: ProfileMemory) -> list[RankVerdict]:
    """Per rank: most tokens held, highest measurement, and whether every step
    stayed within the profile's budget for the tokens it held."""
    out = []
    for rank in sorted({r.rank for r in records}):
        mine = [r for r in records if r.rank == rank]
        most = max(r.buffer_tokens for r in mine)
        out.append(RankVerdict(
            rank=rank, plan_tokens=max(r.plan_tokens for r in mine), buffer_tokens=most,
            bucket_size=pm.bucket_size, measured=max(r.measured for r in mine), predicted=pm.budget(most),
            usable=pm.usable, ok=all(r.measured <= pm.budget(r.buffer_tokens) for r in mine),
        ))
    return out


def format_report(verdicts: list[RankVerdict], records: list[StepMemory], pm: ProfileMemory) -> str:
    mib = lambda v: f"{v / 2**20:.1f}"  # noqa: E731
    lines = ["step rank  mbs  plan tok  buffer tok  static MiB  peak+ MiB  measured MiB  predicted MiB",
             *(f"{r.step:4d} {r.rank:4d} {r.micro_batches:4d} {r.plan_tokens:9d} {r.buffer_tokens:11d} "
               f"{mib(r.static):>11} {mib(r.peak):>10} {mib(r.measured):>13} {mib(pm.budget(r.buffer_tokens)):>14}"
               for r in sorted(records, key=lambda r: (r.step, r.rank))),
             "",
             "rank  max plan tok  max buffer tok  BucketSize  measured peak MiB  predicted MiB  usable MiB"]
    for v in verdicts:
        lines.append(f"{v.rank:4d} {v.plan_tokens:13d} {v.buffer_tokens:15d} {v.bucket_size:11d} "
                     f"{mib(v.measured):>18} {mib(v.predicted):>14} {mib(v.usable):>11}  "
                     f"{'OK' if v.ok else 'OVER'}")
    ok = all(v.ok for v in verdicts)
    lines.append(f"BucketSize {pm.bucket_size} in training: {'OK' if ok else 'FAILED'} "
                 "(measured = static tensors + step peak; predicted = static account + activation fit / (1 - margin))")
    return "\n".join(lines)
