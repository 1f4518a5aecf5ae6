# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Compute: time forward+backward of the job's transformer layers and fit
T_comp(F) = a * F + b per layer (docs/design/cost_model.md).

F is ``CostModel.flops`` of the buffer's documents, the same number the
scheduler will compute, so whatever the formula leaves out (the FFN width,
norms, RoPE) is absorbed by the fitted a and b for this model. The ladder
buffers hold one sequence each; held-out lengths (timed, not fitted) test
the fit's predictions, and a few multi-document buffers show how far the
attention backend's real cost is from the per-document sum the scheduler
assumes (the CPU dense-mask SDPA attends over the whole buffer).

Two rates: F's attention term (4 h s^2, the whole score matrix) and its
linear terms do not cost the same per FLOP: causal flash attention computes
half the matrix. On a single document they grow together (s^2 against s),
so the ladder alone cannot tell them apart, but a packed buffer of short
documents holds the linear FLOPs of its tokens with little attention. With
packed buffers, the ladder and the packed buffers are fitted together as
T = a * (linear + w * attention) + b, w being the cost model's
``attention_weight``; unweighted (absolute) least squares, since the
trainer's micro-batches are the large buffers and the short ones are
host-bound on a GPU, where no FLOP rate holds (a relative fit let a 2,048
-token point, slower than the 4,096 one, bend both rates). A compiled
Qwen2.5-0.5B on an H200: w = 0.52, packed misses 20% -> 2%. The held-out
lengths stay held out. Without packed buffers, or where the two-rate fit
has a rate or the intercept below 0, the one-rate fit (w = 1) stands.

The host floor: on a GPU the shortest buffers can take the same time whatever
their FLOPs, the host's launch work a layer (compiled block calls, FSDP's
hooks) outlasting the device's. The FSDP-wrapped, compiled Qwen2.5-0.5B on an
H200 took 4.17, 4.51 and 4.38 ms a layer at 2,048, 4,096 and 8,192 tokens, then
9.48 ms at 16,384: a line through all of them (b = 3.0 ms) missed the held-out
12,288 by +18.8% and over-priced every long buffer. Where the ladder's shortest
points sit on such a floor (fit.host_floors: flat within 10% over x2 or more the
FLOPs, the next point above it), the line is fitted on the buffers above it
only, the model is T = max(floor, a F + b) and the floor is recorded
(``[meta.compute] host_floor_us``, and ``[compute] host_floor_us``, which the
scheduler prices: cost_model.hpp comp_us). Above a floor the two-rate fit may be an
exact solve of 3 buffers (the held-out lengths then are its only check: -2.7%
on that H200's). A floor is kept only when the line fitted above it runs under
it at its last point (else those points were not host-bound). The summary says
what the line alone would miss at the ladder's shortest point.

A kernel that attends over each buffer whole (``whole_buffer``: one masked
SDPA over all its documents, which on CPU skips nothing the mask hides: DACP's
``dense`` kernel, ``auto``'s choice on CPU, and torchtitan's dense-mask
attention) computes a packed buffer's full square: 4 x 256 tokens took
what one 1,024-token document took (118.5 against 118.4 ms a layer,
docs/profile.md). Such a buffer is then priced as one sequence of its
length, the work its kernel does, so the packed check tests the fit against
that kernel (it read -36% and -30% against the per-document sum, a miss no
fit can close, on every CPU profile); it tells the two rates nothing a
single document does not, so it is not fitted either. The profile says so
(``[compute] whole_buffer = true``), and the scheduler's cost model then
prices each part of a rank's buffer the same way (``CostModel.whole_buffer``,
docs/design/cost_model.md). The per-document sum, the price a varlen kernel
would get, is still given beside it (``ComputeResult.sum_rel_error``): what
a plan priced per document would miss by on micro-batches of several documents.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from skrull_ext._core import CommModel, CostModel
from skrull_ext.profile.fit import (FLOOR_TOLERANCE, HostFloor, PolyFit, fit_line_nonneg, fit_poly, fit_two_rates,
                                    floored, host_floors, quality)
from skrull_ext.profile.model import JobModel
from skrull_ext.profile.options import ProfileOptions
from skrull_ext.profile.ranks import pick_clock, reduce_floats, time_call

__all__ = ["BufferRun", "ComputeFit", "ComputeResult", "Timing", "fit_compute", "profile_compute", "time_buffers"]


@dataclass(frozen=True)
class Timing:
    docs: tuple[int, ...]
    """Document lengths of the buffer (tokens)."""
    flops: float
    """Forward FLOPs of one layer, summed over the documents."""
    us: float
    """Forward+backward microseconds of one layer on the fit's clock (median over repeats, mean over ranks)."""
    wall_us: float
    """The same on the wall clock (equal to ``us`` when the fit's clock is wall)."""
    sum_flops: float = 0.0
    """The scheduler's price of the buffer: its documents' FLOPs summed, at the fit's weight
    (``flops`` but where the kernel attends over the buffer whole: module docstring)."""

    @property
    def tokens(self) -> int:
        return sum(self.docs)


@dataclass(frozen=True)
class ComputeResult:
    fit: PolyFit
    points: list[Timing]
    held_out: list[Timing]
    packed: list[Timing]
    layers_timed: int
    clock: str
    """'wall' or 'cpu' (process time; see ranks.time_call)."""
    pinned: str
    """"intercept" or "slope" when the free fit's one came out negative and was
    pinned to 0 (profile.fit.fit_line_nonneg); "" otherwise."""
    attention_weight: float = 1.0
    """The cost model's ``attention_weight``: fitted with the packed buffers, else 1.
    Every Timing's ``flops`` counts attention at this weight."""
    whole_buffer: bool = False
    """The kernel attends over each buffer whole: a packed buffer is priced as one sequence of
    its length (module docstring)."""
    floor: HostFloor | None = None
    """The ladder's host floor (module docstring); None: the line alone."""

    def predict(self, flops: float) -> float:
        """A layer's forward+backward: max(floor, line)."""
        return floored(self.fit(flops), self.floor)

    def rel_error(self, t: Timing) -> float:
        return (self.predict(t.flops) - t.us) / t.us

    def sum_rel_error(self, t: Timing) -> float:
        """The miss of the scheduler's price, the sum of the documents' FLOPs (``rel_error`` but
        under a whole-buffer kernel)."""
        return (self.predict(t.sum_flops) - t.us) / t.us

    @property
    def held_out_max_rel_error(self) -> float:
        return max((abs(self.rel_error(t)) for t in self.held_out), default=0.0)

    @property
    def packed_max_rel_error(self) -> float:
        """Worst miss on a multi-document buffer (prediction: the sum of its documents' FLOPs)."""
        return max((abs(self.rel_error(t)) for t in self.packed), default=0.0)


def flops_of(shape, docs: Sequence[int], attention_weight: float = 1.0) -> float:
    """Per-layer forward FLOPs of a buffer, as the scheduler computes them."""
    cm = CostModel(shape=shape, a_us_per_flop=0.0, b_us=0.0, comm=CommModel(bytes=[1.0], us=[0.0]),
                   attention_weight=attention_weight)
    return float(sum(cm.flops(int(s)) for s in docs))


def priced_docs(docs: Sequence[int], whole_buffer: bool) -> tuple[int, ...]:
    """A buffer's documents as its attention computes them: one sequence of the buffer's length
    under a kernel that attends over the buffer whole (module docstring), else each on its own."""
    return (int(sum(docs)),) if whole_buffer else tuple(int(d) for d in docs)


def whole_buffer(jm: JobModel) -> bool:
    """Whether the job's attention computes each buffer whole (one masked SDPA over every
    document of it): DACP's ``dense`` kernel (``auto``'s choice but on CUDA in bf16/fp16), or, in a
    compiled job, the call an all-local buffer traces (``tiles`` traces ``dense``: local_only.py);
    torchtitan's attention but its block-sparse flex and varlen (on CPU, torchtitan_patches'
    dense-mask SDPA, a FlexAttention by class)."""
    from torchtitan.models.common.attention import FlexAttention, VarlenAttention

    from torchtitan_patches.dense_attention import DenseMaskAttention

    if jm.dacp:
        from skrull_ext.attention.local_only import computes_whole_buffer
        from skrull_ext.scheduler.model_shape import model_compiled

        return computes_whole_buffer(jm.config.skrull.attention_kernel, model_compiled(jm.config), jm.device, jm.dtype)
    sparse = [m for m in jm.model.modules() if isinstance(m, (FlexAttention, VarlenAttention))
              and not isinstance(m, DenseMaskAttention)]
    return not sparse


def split_flops(shape, docs: Sequence[int]) -> tuple[float, float]:
    """(linear, attention) forward FLOPs of a buffer: the cost model's own terms, told
    apart by pricing it at attention weights 1 and 0.5."""
    whole, half = flops_of(shape, docs), flops_of(shape, docs, 0.5)
    attention = 2.0 * (whole - half)
    return whole - attention, attention


class BufferRun:
    """One packed buffer ready to time: inputs, masks and a gradient for the
    output of ``layers`` transformer blocks (0: all of them)."""

    def __init__(self, jm: JobModel, docs: Sequence[int], layers: int, seed: int = 0) -> None:
        self.jm, self.docs = jm, tuple(int(d) for d in docs)
        self.blocks = jm.layers[:layers] if layers else jm.layers
        buf = jm.buffer(list(docs), seed=seed)
        self.masks, self.positions = buf["attention_masks"], buf["positions"]
        g = torch.Generator(device="cpu").manual_seed(seed)
        x = torch.randn(1, sum(docs), jm.shape.hidden, generator=g)
        self.x = x.to(jm.device, jm.dtype).requires_grad_()
        self.grad = torch.randn(x.shape, generator=g).to(jm.device, jm.dtype)

    def _step(self) -> None:
        h = self.x
        for block in self.blocks:
            h = block(h, self.masks, self.positions)
        h.backward(self.grad)

    def _prepare(self) -> None:
        self.x.grad = None
        self.jm.model.zero_grad(set_to_none=True)
        # Untimed: lets per-mask work cached across layers (the CPU dense mask
        # is built once per forward and shared by every layer) happen here.
        with torch.no_grad():
            self.blocks[0](self.x, self.masks, self.positions)

    def time_us(self) -> tuple[float, float]:
        """(wall, CPU) microseconds of one forward+backward, per block."""
        wall, cpu = time_call(self._step, self.jm.device, before=self._prepare)
        return wall / len(self.blocks), cpu / len(self.blocks)


def time_buffers(jm: JobModel, buffers: Sequence[Sequence[int]], opts: ProfileOptions,
                 tick: Callable[[str], None]) -> tuple[list[float], list[float]]:
    """Per-block (wall, CPU) microseconds of each buffer: ``warmup`` untimed
    rounds, then ``repeats`` timed rounds, each round visiting every buffer
    once, and the median per buffer. Round-robin spreads a burst of load
    from other processes over all lengths instead of skewing the few it
    lands on."""
    runs = [BufferRun(jm, docs, opts.layers, opts.seed) for docs in buffers]
    wall: list[list[float]] = [[] for _ in runs]
    cpu: list[list[float]] = [[] for _ in runs]
    for r in range(opts.warmup + opts.repeats):
        for i, run in enumerate(runs):
            tick(f"compute {'+'.join(map(str, run.docs))} ({r + 1}/{opts.warmup + opts.repeats})")
            w, c = run.time_us()
            if r >= opts.warmup:
                wall[i].append(w)
                cpu[i].append(c)
    return [statistics.median(s) for s in wall], [statistics.median(s) for s in cpu]


def profile_compute(jm: JobModel, opts: ProfileOptions, tick: Callable[[str], None]) -> ComputeResult:
    """Time the fit ladder, the held-out lengths and the packed buffers
    (together, round-robin); fit the ladder; mean over ranks."""
    buffers = [(s,) for s in opts.lengths] + [(s,) for s in opts.held_out] + [tuple(p) for p in opts.packed or ()]
    clock = pick_clock(opts.clock, jm.device)
    wall, cpu = time_buffers(jm, buffers, opts, tick)
    wall = reduce_floats(wall, "mean", jm.device)
    us = reduce_floats(cpu, "mean", jm.device) if clock == "cpu" else wall
    whole = whole_buffer(jm)

    def timing(docs, u, w, weight=1.0) -> Timing:
        return Timing(tuple(int(d) for d in docs), flops_of(jm.shape, priced_docs(docs, whole), weight), u, w,
                      flops_of(jm.shape, docs, weight))

    timings = [timing(docs, u, w) for docs, u, w in zip(buffers, us, wall)]
    n, h = len(opts.lengths), len(opts.held_out)
    points, held_out, packed = timings[:n], timings[n:n + h], timings[n + h:]
    layers_timed = opts.layers or len(jm.layers)
    cf = fit_compute(jm.shape, [(t.docs[0], t.us) for t in points], [(t.docs, t.us) for t in packed], whole)
    if cf.attention_weight != 1.0:
        points, held_out, packed = ([timing(t.docs, t.us, t.wall_us, cf.attention_weight) for t in group]
                                    for group in (points, held_out, packed))
    return ComputeResult(cf.fit, points, held_out, packed, layers_timed, clock, cf.pinned, cf.attention_weight,
                         whole_buffer=whole, floor=cf.floor)


@dataclass(frozen=True)
class ComputeFit:
    """What ``fit_compute`` found: the line in FLOPs at ``attention_weight`` (its r2 and
    worst error over the points it describes, the floor's among them) and the host floor."""

    fit: PolyFit
    attention_weight: float = 1.0
    pinned: str = ""
    floor: HostFloor | None = None

    def __call__(self, flops: float) -> float:
        return floored(self.fit(flops), self.floor)


def _line(shape, ladder, packed, two: bool, need: int) -> tuple[PolyFit, float] | None:
    """The free line through single documents ``ladder`` and, for two rates, ``packed``:
    both rates (at least ``need`` buffers), else one rate on the ladder (at least 2 points,
    slope > 0 and intercept >= 0); None when neither holds."""
    if two and len(ladder) + len(packed) >= need:
        both = [([n], u) for n, u in ladder] + list(packed)
        fitted = fit_two_rates([split_flops(shape, d) for d, _ in both], [u for _, u in both], need)
        if fitted is not None:
            return fitted
    if len(ladder) < 2:
        return None
    fit = fit_poly([flops_of(shape, [n]) for n, _ in ladder], [u for _, u in ladder], 1)
    return (fit, 1.0) if fit.slope > 0 and fit.intercept >= 0 else None


def fit_compute(shape, ladder: Sequence[tuple[int, float]], packed: Sequence[tuple[Sequence[int], float]],
                whole: bool = False) -> ComputeFit:
    """The profile's compute model from a ladder of single documents (length, us) and packed
    buffers (documents, us) (module docstring): two rates where packed buffers are given and the
    kernel does not attend over each buffer whole, else one; above a host floor where the ladder
    has one, else through every point (a negative coefficient pinned to 0: fit.fit_line_nonneg)."""
    ladder = sorted((int(n), float(u)) for n, u in ladder)
    packed = [(tuple(int(d) for d in docs), float(u)) for docs, u in packed]
    two = bool(packed) and not whole
    ys = [u for _, u in ladder]
    for floor in host_floors([flops_of(shape, [n]) for n, _ in ladder], ys, keep=1 if two else 2) if ladder else []:
        top = (1 + FLOOR_TOLERANCE) * floor.us
        above = [p for p in packed if p[1] > top] if two else []
        fitted = _line(shape, ladder[floor.points:], above, two, need=3)
        if fitted is None:
            continue
        line, w = fitted
        if line(flops_of(shape, [ladder[floor.points - 1][0]], w)) > top:
            continue  # the line is above the "floor" there: those points were not host-bound
        described = [([n], u) for n, u in ladder] + (packed if w != 1.0 else [])
        pred = [floored(line(flops_of(shape, d, w)), floor) for d, _ in described]
        r2, worst = quality([u for _, u in described], pred)
        return ComputeFit(PolyFit(line.coef, r2, worst), w, "", floor)
    if two:
        both = [([n], u) for n, u in ladder] + packed
        fitted = fit_two_rates([split_flops(shape, d) for d, _ in both], [u for _, u in both])
        if fitted is not None:
            return ComputeFit(*fitted)
    fit, pinned = fit_line_nonneg([flops_of(shape, [n]) for n, _ in ladder], ys)
    return ComputeFit(fit, 1.0, pinned)
