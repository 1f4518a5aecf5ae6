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

The figure above is the short one. Where the compute ladder has a host
floor, a long micro-batch's host work hides partly under its device work,
so what one more long micro-batch costs lies between 0 and the old 29.1 ms,
and the same loop is timed again where each micro-batch is device-bound
(``device_bound_length``): two documents of the first ladder length above
the floor (its own timing stands above the floor: on run 9's ladder 16,384
tokens, 9.48 ms a layer against the 4.34 ms floor), as one micro-batch and
as two. Documents of the micro-batch's own length rather than short ones,
because short documents carry fewer FLOPs than a ladder point of the same
tokens: 16,384 tokens of 32-token documents price 3.7 ms a layer by run 9's
re-fit, under its floor. The split keeps each document whole, so a
per-document kernel does the same attention either way; the difference of
the two steps less what the cost model prices of it (``priced_calls_us``:
each micro-batch's layer calls at the fit's ``max(floor, a F + b)``, its
documents priced as the kernel attends them, so one more ``layers * b_us``
for a per-document kernel) is the fixed cost there. Without a floor every
size is device-bound, so the ladder's shortest is taken (the CPU profile's
run time stays about as it was). The scheduler gets the device-bound
figure where there is a floor (the floor already prices what short
micro-batches pay on the host; the planner's micro-batches are long), the
short fit's otherwise (three counts, checked against its line, with the
free-running pair beside it): ``MicroBatchResult.fixed_us``, and
``fixed_from`` says which.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch.distributed as dist

from skrull_ext.profile.compute import ComputeResult, flops_of, priced_docs
from skrull_ext.profile.fit import HostFloor, PolyFit, fit_poly, floored
from skrull_ext.profile.model import JobModel
from skrull_ext.profile.options import ProfileOptions
from skrull_ext.profile.ranks import reduce_floats, time_call
from skrull_ext.train.free_running import FreeRunningFSDP

__all__ = ["DEVICE_BOUND_COUNTS", "DeviceBound", "MicroBatchResult", "call_us", "choose_fixed", "device_bound_length",
           "device_bound_split", "fixed_from_fit", "priced_calls_us", "profile_micro_batch"]

DEVICE_BOUND_COUNTS = (1, 2)
"""The device-bound steps: two documents as one micro-batch, then as two (module docstring)."""


@dataclass(frozen=True)
class DeviceBound:
    """The same loop where each micro-batch is device-bound (module docstring)."""

    length: int
    """Tokens of each document and of each micro-batch of the two-way split."""
    us: tuple[float, ...]
    """Step time (wall clock, median over repeats, slowest rank) per count of DEVICE_BOUND_COUNTS."""
    cpu_us: tuple[float, ...]
    """The same steps on the process CPU clock."""
    calls_us: float
    """What the cost model prices of the second step above the first (``priced_calls_us``)."""

    @property
    def fixed_us(self) -> float:
        return fixed_from_fit(self.us[1] - self.us[0], self.calls_us)


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
    device_bound: DeviceBound | None = None
    """The steps where each micro-batch is device-bound; None: not measured (``device_bound_note``)."""
    device_bound_note: str = ""
    """Why the device-bound steps were not measured ('' where they were)."""
    floor: bool = False
    """The compute ladder had a host floor: the scheduler gets the device-bound figure."""

    @property
    def short_fixed_us(self) -> float:
        """The fixed cost of one more short micro-batch: the slope less the layers' calls."""
        return fixed_from_fit(self.fit.slope, self.calls_us)

    @property
    def fixed_us(self) -> float:
        """What the scheduler gets (``[micro_batch] fixed_us``): ``choose_fixed``."""
        return self._chosen[0]

    @property
    def fixed_from(self) -> str:
        """Which steps ``fixed_us`` comes from: "device-bound" or "short"."""
        return self._chosen[1]

    @property
    def _chosen(self) -> tuple[float, str]:
        bound = None if self.device_bound is None else self.device_bound.fixed_us
        return choose_fixed(self.short_fixed_us, bound, self.floor)

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


def choose_fixed(short_us: float, device_bound_us: float | None, floor: bool) -> tuple[float, str]:
    """The scheduler's fixed cost and where it came from: the device-bound steps' where the
    ladder has a host floor and they were measured (the floor prices the short micro-batches'
    host work; the planner's micro-batches are long), else the short fit's (module docstring)."""
    if floor and device_bound_us is not None:
        return device_bound_us, "device-bound"
    return short_us, "short"


def device_bound_length(lengths: Sequence[int], floor: HostFloor | None, limit: int) -> tuple[int | None, str]:
    """Each document (and micro-batch) of the device-bound steps: the first ladder length
    above the host floor (the shortest without one); (None, why) where its two documents
    exceed ``limit`` tokens (BucketSize, the model's context), as every longer one would."""
    ladder = sorted(lengths)
    first = floor.points if floor is not None else 0
    if first < len(ladder) and 2 * ladder[first] <= limit:
        return ladder[first], ""
    return None, (f"no ladder length above the floor's {first} points fits two documents in {limit} tokens "
                  f"(ladder {', '.join(map(str, ladder))})")


def priced_calls_us(layer_us: Callable[[float], float], attention_weight: float, shape, fewer: Sequence[Sequence[int]],
                    more: Sequence[Sequence[int]], whole_buffer: bool) -> float:
    """What the cost model prices of a step split as ``more`` above the same documents split as
    ``fewer`` (each a list of micro-batches' documents): every micro-batch's layer calls at
    ``layer_us`` (the fit's max(floor, a F + b)), its documents as the kernel attends them
    (compute.priced_docs)."""
    def step(split) -> float:
        return sum(layer_us(flops_of(shape, priced_docs(mb, whole_buffer), attention_weight)) for mb in split)

    return shape.layers * (step(more) - step(fewer))


def device_bound_split(length: int) -> dict[int, list[list[int]]]:
    """The device-bound steps' micro-batches per count: two documents of ``length``."""
    docs = (length,) * 2
    return {m: [list(docs[j::m]) for j in range(m)] for m in DEVICE_BOUND_COUNTS}


def profile_micro_batch(jm: JobModel, opts: ProfileOptions, compute: ComputeResult, tick: Callable[[str], None],
                        limit: int | None = None, timer=time_call) -> MicroBatchResult:
    """Time the micro-batch loop at each count (round-robin over warmup + repeats
    rounds, median per count, slowest rank; wall clock: the gathers' waits are
    the cost; the process CPU time kept beside it) and fit the line; then the
    device-bound steps in the same rounds (module docstring). ``limit``: the most
    tokens a step may hold (BucketSize; None: the model's context). ``timer``:
    ranks.time_call's signature (tests time a synthetic step)."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    skrull = getattr(jm.config, "skrull", None)
    defer = bool(skrull is not None and getattr(skrull, "defer_grad_sync", False))
    counts = tuple(opts.micro_batch_counts)
    docs = (opts.micro_batch_doc,) * max(counts)
    steps = {("short", m): [jm.buffer(list(docs[j::m]), seed=opts.seed + j) for j in range(m)] for m in counts}
    cap = min(jm.max_len, limit) if limit is not None else jm.max_len
    length, note = device_bound_length([t.docs[0] for t in compute.points], compute.floor, cap)
    split = device_bound_split(length) if length is not None else {}
    steps.update({("bound", m): [jm.buffer(mb, seed=opts.seed + j) for j, mb in enumerate(split[m])] for m in split})

    free = FreeRunningFSDP([jm.model]) if world > 1 else None

    def run(key, free_running: bool = False) -> None:
        bufs = steps[key]
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

    walls: dict = {k: [] for k in steps}
    cpus: dict = {k: [] for k in steps}
    frees: dict[int, list[float]] = {m: [] for m in counts}
    rounds = opts.warmup + opts.micro_batch_repeats
    for r in range(rounds):
        for key in steps:
            kind, m = key
            tick(f"micro-batches x{m}{' device-bound' if kind == 'bound' else ''} ({r + 1}/{rounds})")
            wall, cpu = timer(lambda: run(key), jm.device, before=before)  # noqa: B023
            if free and kind == "short":
                free_wall, _ = timer(lambda: run(key, True), jm.device, before=before)  # noqa: B023
            if r >= opts.warmup:
                walls[key].append(wall)
                cpus[key].append(cpu)
                if free and kind == "short":
                    frees[m].append(free_wall)
    jm.model.zero_grad(set_to_none=True)
    keys = list(steps)
    us_all = reduce_floats([statistics.median(walls[k]) for k in keys], "max", jm.device)
    cpu_all = reduce_floats([statistics.median(cpus[k]) for k in keys], "max", jm.device)
    n = len(counts)
    us, cpu_us = us_all[:n], cpu_all[:n]
    fit = fit_poly([float(m) for m in counts], us, 1)
    free_us, free_fit = (), None
    if free:
        free_us = tuple(reduce_floats([statistics.median(frees[m]) for m in counts], "max", jm.device))
        free_fit = fit_poly([float(m) for m in counts], list(free_us), 1)
    bound = None
    if length is not None:
        calls = priced_calls_us(compute.predict, compute.attention_weight, jm.shape, split[DEVICE_BOUND_COUNTS[0]],
                                split[DEVICE_BOUND_COUNTS[1]], compute.whole_buffer)
        bound = DeviceBound(length, tuple(us_all[n:]), tuple(cpu_all[n:]), calls)
    layer_call = call_us(compute.fit.intercept, compute.floor)
    return MicroBatchResult(counts, us, docs, fit, jm.shape.layers * layer_call, world, defer, tuple(cpu_us),
                            free_us, free_fit, bound, note, compute.floor is not None)
