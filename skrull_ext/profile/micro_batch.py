# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""The fixed cost of one micro-batch (``CostModel.micro_batch_fixed_us``).

Every micro-batch pays time that no layer's FLOPs explain: FSDP all-gathers
each unit's parameters for the forward and again for the backward, and
reduce-scatters the gradients (unless ``[skrull] defer_grad_sync``), once per
micro-batch whatever it holds; the embedding, the head and the loss are
called once more. The scheduler trades micro-batches against it (GDS), so
it is measured here, in the job's own setting: the job's model as the
trainer wraps it (model.py: torchtitan's parallelize function, FSDP over
all ranks of this launch with the job's dtypes and reshard policy, one rank
included, where FSDP's gathers are copies and casts), then the
micro-batch loop the trainer runs (forward, loss, backward per micro-batch),
timed for the same tokens split into 1, 2 and 4 micro-batches.

The documents are short (``--micro-batch-doc``, 32 tokens, 4 of them): the
step is then mostly the fixed cost, and the CPU dense-mask attention, which
costs more for one packed buffer than for its documents apart, adds little.
With the tokens equal, the step time's slope over the micro-batch count is
the cost of one more micro-batch; the cost model already prices ``layers *
b_us`` of it (one more call per layer), so

    fixed = slope - layers * b_us   (clamped at 0).

Where the compute ladder sits on a host floor (compute.py), a layer call of
these short micro-batches costs the floor, not b_us: FSDP-wrapped and compiled
on an H200, one more micro-batch of the same 128 tokens took 101.8 ms, 24
layers at the 4.34 ms floor 104.2 of it, so ``layers * floor`` is subtracted instead
(``call_us``) and the fixed cost came out 0 where ``layers * b_us`` (3.0 ms,
the line pulled by the floor) had left 29.1 ms to every micro-batch, long
ones included, whose host work partly hides under the device's
(docs/profile.md, "The host floor").

Short micro-batches expose FSDP's gathers that a long micro-batch's compute
would partly hide (FSDP prefetches the next unit): the number is the fixed
cost where it matters most, an upper estimate for long micro-batches.

The step is timed on the wall clock: most of the fixed cost is time a rank
sleeps in FSDP's collectives, which no CPU clock counts. So it must be
measured on a quiet host: on a shared one the wall clock also counts the
time other processes held the cores. The process CPU time of the same
steps is kept beside it (``cpu_us``); the report prints the wall/CPU ratio,
which other load raises (the figures: docs/profile.md, "The fixed cost of a
micro-batch").

Free-running execution (``[skrull] free_running``: train/free_running.py)
pays FSDP's gathers once per step and reduces the gradients once, so the
same loop is timed a second time, free-running, interleaved with the
lockstep one (same rounds, same tokens): its slope, less ``layers * b_us``,
is the cost of one more micro-batch there
(``[micro_batch] free_running_fixed_us``), and its intercept above the
lockstep loop's is what the step pays once (``free_running_step_us``: the
first micro-batch's gathers and the gradient reduction, which no further
micro-batch pays). With one process only the lockstep loop is timed (the
scheduler's timeline has no free-running DP rank to weigh there).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch.distributed as dist

from skrull_ext.profile.fit import PolyFit, fit_poly, floored
from skrull_ext.profile.model import JobModel
from skrull_ext.profile.options import ProfileOptions
from skrull_ext.profile.ranks import reduce_floats, time_call
from skrull_ext.train.free_running import FreeRunningFSDP

__all__ = ["MicroBatchResult", "call_us", "fixed_from_fit", "profile_micro_batch"]


@dataclass(frozen=True)
class MicroBatchResult:
    counts: tuple[int, ...]
    """Micro-batches per step, the fit's x."""
    us: list[float]
    """Step time (the micro-batch loop, wall clock, median over repeats, slowest rank) per count."""
    docs: tuple[int, ...]
    """The step's documents (tokens), split evenly over the micro-batches."""
    fit: PolyFit
    """step_us = intercept + slope * count."""
    calls_us: float
    """What the layers of one more micro-batch cost: layers * call_us (module docstring)."""
    fsdp_degree: int
    """Ranks FSDP shards over here (1: one process, FSDP's unshard a copy)."""
    defer_grad_sync: bool
    cpu_us: tuple[float, ...] = ()
    """The same steps on the process CPU clock (median, slowest rank): it leaves out the
    collectives' waits, so it is below ``us`` even on an idle host; far below, other load."""
    free_us: tuple[float, ...] = ()
    """The same steps run free-running (wall clock, median, slowest rank); empty with no FSDP."""
    free_fit: PolyFit | None = None
    """free step_us = intercept + slope * count; None with no FSDP."""

    @property
    def fixed_us(self) -> float:
        return fixed_from_fit(self.fit.slope, self.calls_us)

    @property
    def free_running_fixed_us(self) -> float | None:
        """Cost of one more micro-batch in a free-running step, less what the cost model prices."""
        return None if self.free_fit is None else fixed_from_fit(self.free_fit.slope, self.calls_us)

    @property
    def free_running_step_us(self) -> float | None:
        """What a free-running step pays once: its intercept above the lockstep loop's (>= 0)."""
        return None if self.free_fit is None else max(0.0, self.free_fit.intercept - self.fit.intercept)


def call_us(b_us: float, floor=None) -> float:
    """A layer call of a micro-batch of a few short documents: the line's b_us, or the
    compute ladder's host floor (fit.HostFloor) where it has one (module docstring)."""
    return floored(b_us, floor)


def fixed_from_fit(slope_us: float, calls_us: float) -> float:
    """The fixed cost of one micro-batch: the measured cost of one more, less what
    the cost model already prices of it; never below 0 (the core's range)."""
    return max(0.0, slope_us - calls_us)


def profile_micro_batch(jm: JobModel, opts: ProfileOptions, layer_call_us: float,
                        tick: Callable[[str], None]) -> MicroBatchResult:
    """Time the micro-batch loop at each count (round-robin over warmup + repeats
    rounds, median per count, slowest rank; wall clock: the gathers' waits are
    the cost; the process CPU time kept beside it) and fit the line."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    skrull = getattr(jm.config, "skrull", None)
    defer = bool(skrull is not None and getattr(skrull, "defer_grad_sync", False))
    counts = tuple(opts.micro_batch_counts)
    docs = (opts.micro_batch_doc,) * max(counts)
    steps = {m: [jm.buffer(list(docs[j::m]), seed=opts.seed + j) for j in range(m)] for m in counts}

    free = FreeRunningFSDP([jm.model]) if world > 1 else None

    def run(m: int, free_running: bool = False) -> None:
        bufs = steps[m]
        if free_running:
            free.begin()
        for j, buf in enumerate(bufs):
            if free_running:
                if j == len(bufs) - 1:
                    free.last()
            elif defer:  # as the trainer's _set_grad_sync, one rank included
                jm.model.set_requires_gradient_sync(j == len(bufs) - 1)
            out = jm.model(buf["tokens"], buf["positions"], buf["attention_masks"])
            loss, _ = jm.loss_fn(out, buf["labels"])
            loss.backward()
        if free_running:
            free.end()

    def before() -> None:
        jm.model.zero_grad(set_to_none=True)
        if dist.is_initialized():
            dist.barrier()  # every rank starts the step together, as in training

    walls: dict[int, list[float]] = {m: [] for m in counts}
    cpus: dict[int, list[float]] = {m: [] for m in counts}
    frees: dict[int, list[float]] = {m: [] for m in counts}
    rounds = opts.warmup + opts.micro_batch_repeats
    for r in range(rounds):
        for m in counts:
            tick(f"micro-batches x{m} ({r + 1}/{rounds})")
            wall, cpu = time_call(lambda: run(m), jm.device, before=before)  # noqa: B023
            if free:
                free_wall, _ = time_call(lambda: run(m, True), jm.device, before=before)  # noqa: B023
            if r >= opts.warmup:
                walls[m].append(wall)
                cpus[m].append(cpu)
                if free:
                    frees[m].append(free_wall)
    jm.model.zero_grad(set_to_none=True)
    us = reduce_floats([statistics.median(walls[m]) for m in counts], "max", jm.device)
    cpu_us = reduce_floats([statistics.median(cpus[m]) for m in counts], "max", jm.device)
    fit = fit_poly([float(m) for m in counts], us, 1)
    free_us, free_fit = (), None
    if free:
        free_us = tuple(reduce_floats([statistics.median(frees[m]) for m in counts], "max", jm.device))
        free_fit = fit_poly([float(m) for m in counts], list(free_us), 1)
    return MicroBatchResult(counts, us, docs, fit, jm.shape.layers * layer_call_us, world, defer, tuple(cpu_us),
                            free_us, free_fit)
