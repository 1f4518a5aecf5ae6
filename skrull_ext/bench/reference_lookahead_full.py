"""REFERENCE ONLY: the look-ahead as it was before issue 54, every candidate planned in full.

Not the core's algorithm any more (that is reference_lookahead.py, restating
cpp/include/skrull/lookahead.hpp): kept as the comparison point of ``bench
latency``'s look-ahead rows, which plan the same windows with both and print
the predicted gain of each side by side, so that what the screening gives up
is measured, not assumed. The same candidates as the core (imported from
reference_lookahead.py: ``candidates``), each priced as the sum of its
steps' full plans (``step_time``), the least summed time
kept (ties to the lower candidate), then a swap search that plans both
steps of every trial in full until ``LOOKAHEAD_SWAP_WORK`` sequences are
planned. Its step plans are the core's (``step_time``), so its time is
about what the C++ version took: nearly all of it is those plans.
"""

from __future__ import annotations

from skrull_ext.bench.reference_lookahead import candidates


def lookahead(batches: list[list[int]], flops, step_time) -> tuple[list[int], float, float, int]:
    """The window's samples (flat, arrival order) to steps.
    ``flops(s)``: one layer's forward FLOPs of a length; ``step_time(lengths)``: one step's predicted time.
    Returns (each sample's step, its long fraction, the summed time, its long steps)."""
    w = len(batches)
    lengths = [s for b in batches for s in b]
    counts = [len(b) for b in batches]
    arrival = [b for b, x in enumerate(batches) for _ in x]
    n = len(lengths)

    def price(step: list[int]) -> float:
        total = 0.0
        for s in range(w):
            members = [lengths[q] for q in range(n) if step[q] == s]
            total += step_time(members) if members else 0.0
        return total

    best, best_us, best_f, best_k = arrival, price(arrival), 0.0, 0
    if w > 1 and n > 1:
        order = sorted(range(n), key=lambda q: (-lengths[q], q))
        for step, f, k in candidates(counts, order, [flops(x) for x in lengths]):  # the core's candidates
            if (t := price(step)) < best_us:
                best, best_us, best_f, best_k = step, t, f, k
        best, best_us = swap_search(lengths, w, best, step_time)
    return best, best_f, best_us, best_k


LOOKAHEAD_SWAP_WORK = 1 << 18  # sequences its swap search may plan per window


def swap_search(lengths: list[int], w: int, step: list[int], step_time) -> tuple[list[int], float]:
    """The swap search planning every trial in full: returns the grouping and its summed time."""
    step = list(step)
    members = [[q for q in range(len(lengths)) if step[q] == s] for s in range(w)]
    times = [step_time([lengths[q] for q in m]) if m else 0.0 for m in members]
    work, improved = 0, True
    while improved and work < LOOKAHEAD_SWAP_WORK:
        improved = False
        for s1 in range(w):
            for s2 in range(s1 + 1, w):
                done = False
                for i in range(len(members[s1])):
                    for j in range(len(members[s2])):
                        if work >= LOOKAHEAD_SWAP_WORK:
                            break
                        q1, q2 = members[s1][i], members[s2][j]
                        if lengths[q1] == lengths[q2]:
                            continue
                        a, b = list(members[s1]), list(members[s2])
                        a[i], b[j] = q2, q1
                        a.sort()
                        b.sort()
                        work += len(a) + len(b)
                        ta, tb = step_time([lengths[q] for q in a]), step_time([lengths[q] for q in b])
                        if not ta + tb < (times[s1] + times[s2]) * (1.0 - 1e-12):
                            continue
                        members[s1], members[s2], times[s1], times[s2] = a, b, ta, tb
                        step[q1], step[q2] = s2, s1
                        improved = done = True
                        break
                    if done or work >= LOOKAHEAD_SWAP_WORK:
                        break
    total = 0.0
    for t in times:
        total += t
    return step, total
