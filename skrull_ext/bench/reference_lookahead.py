"""REFERENCE ONLY: a plain-Python restatement of cpp/include/skrull/lookahead.hpp
and its estimate (cpp/include/skrull/step_estimate.hpp).

Test oracle; the product never calls it (the dataloader and the simulator
call the core through ``Scheduler.lookahead``). The same candidates, the
same estimate (the same floating-point operations in the same order), the
same finalists, budgets, ties and swap search as the core, each step priced
by the caller's ``step_time``, so its groupings must equal the core's
exactly (tests/unit_tests/test_lookahead.py). The look-ahead as it was before
the screening (every candidate planned in full) is reference_lookahead_full.py.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

LOOKAHEAD_FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.35)  # lookahead.hpp kLookaheadFractions
LOOKAHEAD_PLAN_WORK = 1 << 15  # kLookaheadPlanWork: sequences planned beyond arrival order and the first finalist
LOOKAHEAD_SCREEN_WORK = 1 << 16  # kLookaheadScreenWork: swaps screened by the estimate
LOOKAHEAD_TIE = 1e-6  # kLookaheadTie: estimates this close (relative to the least) rank as ties
LOOKAHEAD_SCREEN_SLACK = 0.01  # kLookaheadScreenSlack: a swap is planned unless its estimate rises more
LOOKAHEAD_MIN_SWAPS = 64  # kLookaheadMinSwaps: the search runs where the budget checks this many swaps
LOOKAHEAD_EVERY_K = 8  # kLookaheadEveryK: long-first splits over every k to this, then a ladder
LOOKAHEAD_SWAP_VISITS = 1 << 24  # kLookaheadSwapVisits: pairs of steps and of samples the swap search looks at


@dataclass
class Sketch:
    """step_estimate.hpp StepSketch."""

    count: int = 0
    work: float = 0.0
    tokens: float = 0.0
    c1: float = 0.0
    cp_: float = 0.0
    cp1: float = 0.0


class Estimator:
    """step_estimate.hpp StepEstimator restated (same operations, same order)."""

    def __init__(self, cost, dp: int, cp: int, bucket: int) -> None:
        self.groups = max(1, dp)
        self.per_flop = cost.shape.layers * cost.a_us_per_flop / max(1, cp)
        self.capacity = float(min(bucket * cp * max(1, dp), 1 << 61))  # group_capacity
        self.per_micro_batch = cost.micro_batch_fixed_us + cost.shape.layers * cost.b_us
        self.per_floored_micro_batch = cost.micro_batch_fixed_us + cost.shape.layers * cost.host_floor_us
        self.per_token = cost.token_us / (float(max(1, dp)) * max(1, cp))
        self.step_fixed = cost.step_fixed_us

    def us(self, s: Sketch) -> float:
        if s.count == 0:
            return 0.0
        work = max(s.work / self.groups, s.c1, s.cp_ + s.cp1)
        m = max(1.0, math.ceil(s.tokens / self.capacity))
        return (max(work + m * self.per_micro_batch, m * self.per_floored_micro_batch) + self.per_token * s.tokens
                + self.step_fixed)

    def add(self, s: Sketch, c: float, length: int) -> None:
        s.count += 1
        s.work += c
        s.tokens += float(length)
        if s.count == 1:
            s.c1 = c
        if s.count == self.groups:
            s.cp_ = c
        if s.count == self.groups + 1:
            s.cp1 = c


def kth_after_swap(desc: list[float], k: int, out: int, x: float) -> float:
    """lookahead.hpp detail::kth_after_swap: the k-th largest of ``desc`` with ``desc[out]`` replaced by x."""
    if k >= len(desc):
        return 0.0
    above = bisect.bisect_left([-d for d in desc], -x)  # elements > x
    p = above - (1 if out < above else 0)

    def rest(i: int) -> float:
        return desc[i if i < out else i + 1]

    if k < p:
        return rest(k)
    if k == p:
        return x
    return rest(k - 1)


def screened_steps(w: int) -> list[int]:
    """lookahead.hpp detail::screened_steps: every k to LOOKAHEAD_EVERY_K, then 12, 16, 24, 32, ... below w, then w."""
    ks = list(range(1, min(w, LOOKAHEAD_EVERY_K) + 1))
    p = LOOKAHEAD_EVERY_K
    while p < w:
        ks += [k for k in (p + p // 2, 2 * p) if k < w]
        p *= 2
    return ks + ([w] if w > LOOKAHEAD_EVERY_K else [])


def candidates(counts: list[int], order: list[int], flops: list[float]):
    """lookahead.hpp's candidate groupings of a window, in the core's order: for each long
    fraction f (``LOOKAHEAD_FRACTIONS``, each giving a new count m of the longest samples) and
    each k of ``screened_steps(w)``, the m longest (``order``: by length, longest first, ties by arrival)
    spread over the first k steps by LPT on ``flops`` (gds.hpp split_over_dp, ties to the lower
    step; skipped when a step would take more than its count), the rest filling the steps'
    remaining places in arrival order; then the samples laid out longest first, step after step
    (fraction 1.0, w steps). Yields (each sample's step, f, k)."""
    w, n = len(counts), len(order)
    last_m = 0
    for f in LOOKAHEAD_FRACTIONS:
        m = max(1, int(f * n + 0.5))
        if m == last_m or m >= n:
            continue
        last_m = m
        for k in screened_steps(w):
            step, room, load, ok = [-1] * n, list(counts), [0.0] * k, True
            for q in order[:m]:  # LPT by FLOPs, ties to the lower step
                t = min(range(k), key=lambda i: (load[i], i))
                if room[t] == 0:
                    ok = False
                    break
                room[t] -= 1
                step[q] = t
                load[t] += flops[q]
            if not ok:
                continue
            s = 0
            for q in range(n):
                if step[q] < 0:
                    while room[s] == 0:
                        s += 1
                    step[q] = s
                    room[s] -= 1
            yield step, f, k
    step, s, used = [0] * n, 0, 0
    for q in order:
        while used == counts[s]:
            s, used = s + 1, 0
        step[q] = s
        used += 1
    yield step, 1.0, w


def lookahead(batches: list[list[int]], cost, dp: int, cp: int, bucket: int, step_time) -> dict:
    """lookahead.hpp restated. ``cost``: the core's CostModel (its fields and ``flops``);
    ``step_time(lengths)``: one step's predicted time. Returns step, steps, step_us, window_us,
    long_fraction, long_steps, candidates, screened, swaps, swap_trials,
    swap_visits, planned."""
    w = len(batches)
    lengths = [s for b in batches for s in b]
    counts = [len(b) for b in batches]
    arrival = [b for b, x in enumerate(batches) for _ in x]
    n = len(lengths)
    out = {"candidates": 0, "screened": 0, "swaps": 0, "swap_trials": 0, "swap_visits": 0, "planned": 0,
           "long_fraction": 0.0, "long_steps": 0}

    def members_of(step: list[int]) -> list[list[int]]:
        m = [[] for _ in range(w)]
        for q, s in enumerate(step):
            m[s].append(q)
        return m

    arrival_members = members_of(arrival)
    arrival_us: list[float] = []

    def price(members: list[list[int]]) -> tuple[float, list[float]]:
        total, t = 0.0, []
        for s in range(w):
            if arrival_us and members[s] == arrival_members[s]:
                t.append(arrival_us[s])
            else:
                ls = [lengths[q] for q in members[s]]
                t.append(float(step_time(ls)) if ls else 0.0)
                out["planned"] += len(ls)
            total += t[s]
        out["candidates"] += 1
        return total, t

    window_us, arrival_us = price(arrival_members)
    best = {"step": list(arrival), "steps": arrival_members, "step_us": list(arrival_us), "window_us": window_us}
    if w > 1 and n > 1:
        flops = [cost.flops(s) for s in lengths]
        est = Estimator(cost, dp, cp, bucket)
        sample_cost = [est.per_flop * f for f in flops]
        order = sorted(range(n), key=lambda q: (-lengths[q], q))

        def sketches(step: list[int]) -> list[Sketch]:
            sk = [Sketch() for _ in range(w)]
            for q in order:
                est.add(sk[step[q]], sample_cost[q], lengths[q])
            return sk

        def total(step: list[int]) -> float:
            t = 0.0
            for s in sketches(step):
                t += est.us(s)
            return t

        found = []  # (step, fraction, k, estimate)

        def screened(step: list[int], f: float, k: int) -> None:
            if step == arrival:
                return
            found.append((step, f, k, total(step)))
            out["screened"] += 1

        for step, f, k in candidates(counts, order, flops):
            screened(step, f, k)

        least = min((c[3] for c in found), default=0.0)
        quantum = least * LOOKAHEAD_TIE
        level = [math.floor(c[3] / quantum) if quantum > 0.0 else 0 for c in found]
        rank = sorted(range(len(found)), key=lambda i: (level[i], -(found[i][1] / found[i][2]), i))
        plan_left = LOOKAHEAD_PLAN_WORK
        for r, i in enumerate(rank):
            step, f, k, _ = found[i]
            members = members_of(step)
            size = sum(len(members[t]) for t in range(w) if members[t] != arrival_members[t])
            if r > 0:
                if size > plan_left:
                    break
                plan_left -= size
            t_total, t = price(members)
            if t_total < best["window_us"]:
                best = {"step": list(step), "steps": members, "step_us": t, "window_us": t_total}
                out["long_fraction"], out["long_steps"] = f, k
        _swap_search(lengths, order, sample_cost, est, step_time, plan_left, best, out)
    out.update(best)
    out["arrival_us"] = arrival_us
    return out


def _swap_search(lengths, order, cost, est: Estimator, step_time, plan_left: int, best: dict, out: dict) -> None:
    """lookahead.hpp detail::swap_search restated, on ``best`` in place."""
    steps, step, step_us = best["steps"], best["step"], best["step_us"]
    w = len(steps)
    if plan_left < LOOKAHEAD_MIN_SWAPS * (2 * len(order) // w):
        return
    desc: list[list[float]] = [[] for _ in range(w)]
    pos = [0] * len(lengths)
    sketch = [Sketch() for _ in range(w)]
    for q in order:
        pos[q] = len(desc[step[q]])
        desc[step[q]].append(cost[q])
        est.add(sketch[step[q]], cost[q], lengths[q])
    e = [est.us(s) for s in sketch]

    def swapped(s: int, gone: int, come: int) -> Sketch:
        t = Sketch(sketch[s].count, sketch[s].work, sketch[s].tokens)
        t.work += cost[come] - cost[gone]
        t.tokens += float(lengths[come] - lengths[gone])
        t.c1 = kth_after_swap(desc[s], 0, pos[gone], cost[come])
        t.cp_ = kth_after_swap(desc[s], est.groups - 1, pos[gone], cost[come])
        t.cp1 = kth_after_swap(desc[s], est.groups, pos[gone], cost[come])
        return t

    def rebuild(s: int) -> None:
        by_cost = sorted(steps[s], key=lambda q: -lengths[q])  # stable: ties by arrival
        desc[s] = []
        sketch[s] = Sketch()
        for q in by_cost:
            pos[q] = len(desc[s])
            desc[s].append(cost[q])
            est.add(sketch[s], cost[q], lengths[q])
        e[s] = est.us(sketch[s])

    budget, improved = True, True

    def visit() -> bool:
        nonlocal budget
        if out["swap_visits"] >= LOOKAHEAD_SWAP_VISITS:
            budget = False
            return False
        out["swap_visits"] += 1
        return True

    while improved and budget:
        improved = False
        for s1 in range(w):
            for s2 in range(s1 + 1, w):
                if not visit():
                    break
                i = 0
                while steps[s2] and i < len(steps[s1]) and budget:
                    done = False
                    for j in range(len(steps[s2])):
                        if not visit():
                            break
                        q1, q2 = steps[s1][i], steps[s2][j]
                        if lengths[q1] == lengths[q2]:
                            continue
                        if out["swap_trials"] >= LOOKAHEAD_SCREEN_WORK:
                            budget = False
                            break
                        out["swap_trials"] += 1
                        after = est.us(swapped(s1, q1, q2)) + est.us(swapped(s2, q2, q1))
                        if after > (e[s1] + e[s2]) * (1.0 + LOOKAHEAD_SCREEN_SLACK):
                            continue
                        size = len(steps[s1]) + len(steps[s2])
                        if size > plan_left:
                            budget = False
                            break
                        a, b = list(steps[s1]), list(steps[s2])
                        a[i], b[j] = q2, q1
                        a.sort()
                        b.sort()
                        plan_left -= size
                        out["planned"] += size
                        ta, tb = step_time([lengths[q] for q in a]), step_time([lengths[q] for q in b])
                        if not ta + tb < (step_us[s1] + step_us[s2]) * (1.0 - 1e-12):
                            continue
                        steps[s1], steps[s2], step_us[s1], step_us[s2] = a, b, ta, tb
                        step[q1], step[q2] = s2, s1
                        rebuild(s1)
                        rebuild(s2)
                        out["swaps"] += 1
                        improved = done = True
                        break
                    if done:
                        break
                    i += 1
                if not budget:
                    break
            if not budget:
                break
    total = 0.0
    for t in step_us:
        total += t
    best["window_us"] = total
