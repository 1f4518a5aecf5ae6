# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Small process-group helpers: every rank measures, rank 0 writes.

Without a process group (one plain process) these are the identity, so the
measuring code reads the same for one process and for torchrun.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

__all__ = ["is_main", "median_us", "pick_clock", "reduce_floats", "sync", "time_call", "world_size"]


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def sync(device: torch.device) -> None:
    """Wait for queued device work before reading a host clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], None], device: torch.device,
              before: Callable[[], None] | None = None) -> tuple[float, float]:
    """(wall, process CPU) microseconds of one call of ``fn``; ``before`` runs
    untimed first. The CPU clock counts only time this process ran, so on a
    shared host it is immune to being descheduled; for single-threaded CPU
    work it equals the uncontended wall time."""
    if before is not None:
        before()
    sync(device)
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    sync(device)
    return (time.perf_counter() - w0) * 1e6, (time.process_time() - c0) * 1e6


def median_us(fn: Callable[[], None], device: torch.device, warmup: int, repeats: int,
              before: Callable[[], None] | None = None) -> tuple[float, list[float]]:
    """Median wall microseconds of ``fn`` over ``repeats`` calls after
    ``warmup`` untimed ones."""
    samples = [time_call(fn, device, before)[0] for _ in range(warmup + repeats)][warmup:]
    return statistics.median(samples), samples


def pick_clock(name: str, device: torch.device) -> str:
    """'auto': process CPU time for single-threaded CPU runs, else wall."""
    if name == "auto":
        return "cpu" if device.type == "cpu" and torch.get_num_threads() == 1 else "wall"
    if name == "cpu" and device.type != "cpu":
        raise ValueError("--clock cpu times host work only; use wall on an accelerator")
    if name not in ("wall", "cpu"):
        raise ValueError(f"--clock must be auto, wall or cpu, got {name!r}")
    return name


def reduce_floats(values: list[float], op: str, device: torch.device) -> list[float]:
    """Element-wise mean or max of ``values`` over all ranks."""
    if not dist.is_initialized() or not values:
        return list(values)
    dev = device if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor(values, dtype=torch.float64, device=dev)
    if op == "max":
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    elif op == "mean":
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= dist.get_world_size()
    else:
        raise ValueError(f"op must be 'max' or 'mean', got {op!r}")
    return t.tolist()
