# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""The profiler's least-squares fits: a line (compute), a polynomial of degree
at most 2 (memory) and a flat-then-linear piecewise model (communication).

Every fit minimises *relative* squared error (weights 1/y^2): the ladders
span one to three orders of magnitude and the scheduler compares micro-batches
of every size, so a 30% miss on a short buffer matters as much as one on a
long buffer. An unweighted fit lets the largest point set the line.

Plain Python, no numpy: 2 or 3 unknowns and a few dozen points. Columns are
scaled to [0, 1] before solving the normal equations, which keeps a quadratic
in tokens (x^2 ~ 1e8) well conditioned.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["FLOOR_TOLERANCE", "HostFloor", "PiecewiseFit", "PolyFit", "fit_piecewise", "fit_poly", "fit_two_rates",
           "floor_fields", "floored", "host_floors", "quality"]


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (a is small and square)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-300:
            raise ValueError("singular fit: the points do not determine the coefficients")
        m[col], m[piv] = m[piv], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


def _weighted_lstsq(cols: list[list[float]], y: Sequence[float], w: Sequence[float]) -> list[float]:
    """argmin_c sum_i w_i (y_i - sum_k c_k cols[k][i])^2."""
    scale = [max(abs(v) for v in col) or 1.0 for col in cols]
    sc = [[v / s for v in col] for col, s in zip(cols, scale)]
    k = len(cols)
    ata = [[sum(wi * sc[p][i] * sc[q][i] for i, wi in enumerate(w)) for q in range(k)] for p in range(k)]
    atb = [sum(wi * sc[p][i] * y[i] for i, wi in enumerate(w)) for p in range(k)]
    return [c / s for c, s in zip(_solve(ata, atb), scale)]


def quality(y: Sequence[float], pred: Sequence[float]) -> tuple[float, float]:
    """(R^2, worst relative error) of predictions against measurements."""
    mean = sum(y) / len(y)
    ss_tot = sum((v - mean) ** 2 for v in y)
    ss_res = sum((v - p) ** 2 for v, p in zip(y, pred))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
    worst = max(abs(p - v) / abs(v) if v else (0.0 if p == v else math.inf) for v, p in zip(y, pred))
    return r2, worst


def _check_points(x: Sequence[float], y: Sequence[float], need: int) -> None:
    if len(x) != len(y):
        raise ValueError(f"x and y differ in length ({len(x)} vs {len(y)})")
    if len(x) < need:
        raise ValueError(f"need at least {need} points, got {len(x)}")
    if not all(math.isfinite(v) for v in (*x, *y)):
        raise ValueError("points must be finite")
    if any(v <= 0 for v in y):
        raise ValueError("measurements must be > 0 (relative-error fit)")


@dataclass(frozen=True)
class PolyFit:
    """y = coef[0] + coef[1] x (+ coef[2] x^2)."""

    coef: tuple[float, ...]
    r2: float
    max_rel_error: float

    def __call__(self, x: float) -> float:
        return sum(c * x**k for k, c in enumerate(self.coef))

    @property
    def slope(self) -> float:
        return self.coef[1]

    @property
    def intercept(self) -> float:
        return self.coef[0]

    @property
    def quadratic(self) -> float:
        return self.coef[2] if len(self.coef) > 2 else 0.0


def fit_poly(x: Sequence[float], y: Sequence[float], degree: int = 1, intercept: bool = True) -> PolyFit:
    """Relative least-squares polynomial of ``degree`` (1 or 2; 0: a constant)
    through (x, y); ``intercept=False`` pins coef[0] to 0 (a fit through the origin)."""
    if degree not in (0, 1, 2) or (degree == 0 and not intercept):
        raise ValueError(f"degree must be 1 or 2 (0 with an intercept), got {degree}")
    _check_points(x, y, degree + int(intercept))
    cols = ([[1.0] * len(x)] if intercept else []) + [[float(v) ** k for v in x] for k in range(1, degree + 1)]
    coef = tuple(_weighted_lstsq(cols, y, [1.0 / v**2 for v in y]))
    if not intercept:
        coef = (0.0, *coef)
    coef = coef + (0.0,) * (2 - len(coef))  # a constant has slope 0
    fit = PolyFit(coef, 0.0, 0.0)
    r2, worst = quality(y, [fit(v) for v in x])
    return PolyFit(coef, r2, worst)


def fit_line_nonneg(x: Sequence[float], y: Sequence[float]) -> tuple[PolyFit, str]:
    """The relative least-squares line y = a x + b with a, b >= 0 (the
    scheduler's cost model refuses either below 0), and which one was pinned:
    "" (the free fit), "intercept" (through the origin) or "slope" (a
    constant: the time did not grow with the work, as on a host-bound device
    or a loaded CPU running a tiny model). With y > 0 at most one of the two
    can come out negative, and the best fit then lies on that bound."""
    fit = fit_poly(x, y, 1)
    if fit.intercept < 0:
        return fit_poly(x, y, 1, intercept=False), "intercept"
    if fit.slope < 0:
        return fit_poly(x, y, 0), "slope"
    return fit, ""


MAX_ATTENTION_WEIGHT = 4.0
"""The cost model's bound on ``attention_weight`` (cost_model.hpp kMaxAttentionWeight)."""


def fit_two_rates(flops: Sequence[tuple[float, float]], y: Sequence[float],
                  need: int = 4) -> tuple[PolyFit, float] | None:
    """T = a * (linear + w * attention) + b by unweighted least squares over
    buffers of (linear, attention) FLOPs (profile/compute.py says why), as the
    line ``PolyFit((b, a))`` in the weighted FLOPs and the weight ``w``; None
    when a rate or the intercept comes out <= 0 (b < 0), w is over
    MAX_ATTENTION_WEIGHT, or fewer than ``need`` buffers (4: one more than the
    unknowns; 3, an exact solve, only above a host floor, where the held-out
    lengths are the check: profile/compute.py)."""
    _check_points([f[0] for f in flops], y, max(3, need))
    lin, att = [float(f[0]) for f in flops], [float(f[1]) for f in flops]
    try:
        b, a_lin, a_att = _weighted_lstsq([[1.0] * len(y), lin, att], y, [1.0] * len(y))
    except ValueError:  # singular: the buffers do not tell the two apart
        return None
    if not (a_lin > 0 and a_att > 0 and b >= 0 and a_att / a_lin <= MAX_ATTENTION_WEIGHT):
        return None
    w = a_att / a_lin
    fit = PolyFit((b, a_lin, 0.0), 0.0, 0.0)
    r2, worst = quality(y, [fit(l + w * t) for l, t in zip(lin, att)])
    return PolyFit((b, a_lin, 0.0), r2, worst), w


FLOOR_TOLERANCE = 0.10
"""How far a host floor's points may lie from its level, and how far above it the
next point must lie (relative): ``host_floors``."""


@dataclass(frozen=True)
class HostFloor:
    """The shortest ``points`` buffers of a ladder took ``us`` whatever their FLOPs: the
    host's launch work (kernel launches, compiled-call guards, FSDP hooks) outlasts the
    device's there, so a layer costs max(us, a F + b) and the line is fitted above it."""

    us: float
    points: int


def floored(us: float, floor: HostFloor | None) -> float:
    """``us`` (the line's time of a layer call) held up to the floor's level where there is one."""
    return us if floor is None else max(floor.us, us)


def floor_fields(floor: HostFloor | None) -> dict[str, float | int]:
    """A host floor as a profile's keys (``[meta.compute]``, a mode's meta); {} without one."""
    return {} if floor is None else {"host_floor_us": floor.us, "host_floor_points": floor.points}


def host_floors(x: Sequence[float], y: Sequence[float], keep: int = 1) -> list[HostFloor]:
    """Every host floor of a ladder (single-document buffers: FLOPs ``x``, times ``y``),
    longest first; [] when its time grows with its FLOPs from the shortest buffer on.

    A floor is a prefix of at least 2 points, sorted by FLOPs, whose FLOPs grow
    x2 or more while each time lies within FLOOR_TOLERANCE of their level (the
    relative least-squares constant), and whose next point lies more than
    FLOOR_TOLERANCE above it (the time rises there: the device's work shows).
    At least ``keep`` points stay above it. Doubling the FLOPs on a device-bound
    layer moves its time far more than 10%, so a CPU ladder has none."""
    _check_points(x, y, 1)
    pts = sorted(zip((float(v) for v in x), (float(v) for v in y)))
    out = []
    for k in range(len(pts) - max(1, keep), 1, -1):
        ys = [p[1] for p in pts[:k]]
        level = sum(1 / v for v in ys) / sum(1 / v**2 for v in ys)
        if (pts[k - 1][0] >= 2 * pts[0][0] and all(abs(v - level) <= FLOOR_TOLERANCE * level for v in ys)
                and pts[k][1] > (1 + FLOOR_TOLERANCE) * level):
            out.append(HostFloor(level, k))
    return out


@dataclass(frozen=True)
class PiecewiseFit:
    """Collective latency as the scheduler's C++ ``CommModel`` evaluates it:
    ``floor_us`` below ``threshold_bytes``, else the line a*V + b (clamped to
    its value at ``first_bytes`` between the threshold and the first table
    point). ``table(sizes)`` gives the profile's bytes/us arrays."""

    floor_us: float
    threshold_bytes: float
    a_us_per_byte: float
    b_us: float
    first_bytes: float
    r2: float
    max_rel_error: float

    def line(self, v: float) -> float:
        return self.a_us_per_byte * v + self.b_us

    def __call__(self, v: float) -> float:
        if v <= 0:
            return 0.0
        if v < self.threshold_bytes:
            return self.floor_us
        return self.line(max(v, self.first_bytes))

    def table(self, sizes: Sequence[float]) -> tuple[list[float], list[float]]:
        """(bytes, us) for the profile: the line at the threshold (when there is
        a flat part) and at every measured size above it."""
        xs = sorted({float(self.first_bytes), *(float(s) for s in sizes if s > self.first_bytes)})
        # Where the threshold is the line's crossing of the floor, line(threshold)
        # may round one ulp below the floor; the table must never fall (the
        # scheduler's lower bound assumes latency grows with size).
        return xs, [max(self.line(v), self.floor_us) for v in xs]


def fit_piecewise(x: Sequence[float], y: Sequence[float]) -> PiecewiseFit:
    """Latency floor then a line: T = t0 below V_threshold, a*V + b above.

    Tries every split of the sorted points (the first k flat, the rest on the
    line, at least two on the line), fits both parts by relative least
    squares, puts the threshold where the line reaches the floor (or, when
    the line is above the floor already at the last flat point, at the
    geometric midpoint of the two points) and keeps the split with the
    smallest relative squared error over all points. Splits whose line is
    falling, or still below the floor at the first linear point, are
    skipped: the scheduler's lower bound assumes latency never falls with
    size.
    """
    _check_points(x, y, 2)
    pts = sorted(zip((float(v) for v in x), (float(v) for v in y)))
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    if len(set(xs)) != len(xs):
        raise ValueError("message sizes must be distinct")
    best: tuple[float, PiecewiseFit] | None = None
    for k in range(0, len(xs) - 1):
        line = fit_poly(xs[k:], ys[k:], 1)
        a, b = line.slope, line.intercept
        if a <= 0:
            continue
        if k == 0:
            floor, thr, first = 0.0, 0.0, xs[0]
        else:
            # argmin_f sum ((y - f) / y)^2 over the flat points
            floor = sum(1 / v for v in ys[:k]) / sum(1 / v**2 for v in ys[:k])
            cross = (floor - b) / a
            if cross > xs[k] * (1 + 1e-9):
                continue  # the line is below the floor at its first point: not monotone
            # Where the line meets the floor; if it is above the floor already at the
            # last flat point, the step lies somewhere between the two: take the
            # geometric midpoint.
            thr = min(cross, xs[k]) if cross > xs[k - 1] else math.sqrt(xs[k - 1] * xs[k])
            first = thr
        cand = PiecewiseFit(floor, thr, a, b, first, 0.0, 0.0)
        pred = [cand(v) for v in xs]
        if any(p <= 0 for p in pred):
            continue
        err = sum(((p - v) / v) ** 2 for p, v in zip(pred, ys))
        if best is None or err < best[0] * (1 - 1e-9):
            best = (err, cand)
    if best is None:  # no rising line (flat or noisy data): one flat level
        floor = sum(1 / v for v in ys) / sum(1 / v**2 for v in ys)
        cand = PiecewiseFit(floor, 0.0, 1e-30, floor, xs[0], 0.0, 0.0)
    else:
        cand = best[1]
    r2, worst = quality(ys, [cand(v) for v in xs])
    return PiecewiseFit(cand.floor_us, cand.threshold_bytes, cand.a_us_per_byte, cand.b_us,
                        cand.first_bytes, r2, worst)
