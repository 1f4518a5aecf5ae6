"""REFERENCE ONLY: chunked documents (overlength "chunk") in skrull's plan, restated plainly.

Test oracle; the product never calls it. It restates, in the same orders, ties and floating-point
operation order as the core, so that its answers equal the core's exactly:

- cpp/include/skrull/chunked.hpp: the lockstep passes and pad chunks, their price (lockstep_pad_us), the
  work a DP rank runs after its micro-batches (chunked_after), and a rank's chunked time in FLOPs
  (chunked_flops); a document is (its chunk passes, its length, its last chunk's tokens) here;
- gds.hpp's assign_chunked: LPT over the DP ranks by time;
- timeline.hpp's step_time_us: the step of per-rank micro-batches on either timeline;
- scheduler.hpp's schedule_as_priced and schedule_assigned for the per-rank GDS (not slot GDS):
  the samples planned around LPT's assignment, and round robin tried where LPT's step is above its
  bound; hedge.hpp's reprice_schedule for a cost model with a plan margin.

The samples' GDS + DACP is reference.py's schedule().
"""

from __future__ import annotations

from dataclasses import dataclass

from skrull_ext.bench import reference as ref


def assign_lpt(us: list[float], dp: int) -> list[int]:
    """Longest first (ties by index), each to the DP rank with the least time so far (ties to the lower)."""
    load, out = [0.0] * dp, [0] * len(us)
    for k in sorted(range(len(us)), key=lambda k: (-us[k], k)):
        r = min(range(dp), key=lambda i: (load[i], i))
        out[k] = r
        load[r] += us[k]
    return out


def lockstep_passes(chunks: list[int], rank: list[int], dp: int) -> list[int]:
    """At each position k, the most chunks any rank's k-th document (in the documents' order) takes."""
    held: list[list[int]] = [[] for _ in range(dp)]
    for n, r in zip(chunks, rank):
        held[r].append(n)
    positions = max((len(h) for h in held), default=0)
    return [max(h[k] for h in held if k < len(h)) for k in range(positions)]


def lockstep_pads(chunks: list[int], rank: list[int], dp: int) -> list[int]:
    """Per rank: every position's passes, less its own documents' chunks."""
    total = sum(lockstep_passes(chunks, rank, dp))
    return [total - sum(n for n, r in zip(chunks, rank) if r == i) for i in range(dp)]


def pad_us(docs: list[tuple[int, int, int]], rank: list[int], dp: int, cp: int, cost: ref.RefCost) -> list[float]:
    """chunked.hpp lockstep_pad_us: per rank, what its pads add (``docs``: each document's chunk passes, length
    and last chunk's tokens): at position k its k-th document padded from its length rounded up to cp, its
    last chunk then recomputed, or an all-pad document from 0 (summed from the last position back, as the
    core sums them)."""
    out = [0.0] * dp
    if dp <= 1 or not docs:
        return out
    chunks = [d[0] for d in docs]
    passes = lockstep_passes(chunks, rank, dp)
    held: list[list[int]] = [[] for _ in range(dp)]
    for k, r in enumerate(rank):
        held[r].append(k)
    suffix = [0.0] * (len(passes) + 1)
    for p in reversed(range(len(passes))):
        suffix[p] = cost.pad_chunks(0, passes[p], cp) + suffix[p + 1]
    for i in range(dp):
        total = 0.0
        for p, k in enumerate(held[i]):
            pads = passes[p] - docs[k][0]
            if pads == 0:
                continue
            t, a = docs[k][2], docs[k][1] - docs[k][2]
            total += cost.pad_chunks(-(-docs[k][1] // cp) * cp, pads, cp) + \
                (cost.chunk_pass(a, t, cp, True) - cost.chunk_pass(a, t, cp, False))
        out[i] = total + suffix[len(held[i])]
    return out


def after(us: list[float], docs: list[tuple[int, int, int]], rank: list[int], dp: int, cp: int, lockstep: bool,
          cost: ref.RefCost) -> list[float]:
    """Per rank: its documents' times summed in order, then (lockstep, DP > 1) its pad chunks' price."""
    out = [0.0] * dp
    for t, r in zip(us, rank):
        out[r] += t
    if lockstep and dp > 1 and us:
        out = [a + p for a, p in zip(out, pad_us(docs, rank, dp, cp, cost))]
    return out


def step_time(rank_us: list[list[float]], lockstep: bool, pad_us: float, step_us: float,
              after_us: list[float]) -> float:
    """Free-running: the slowest rank's micro-batches then its work after them. Lockstep: each slot's slowest
    (a pad pass where a rank has none), then the most work after them. Plus a step's fixed cost once where
    anything runs."""
    slots = max((len(r) for r in rank_us), default=0)
    busy_after = any(a > 0.0 for a in after_us)
    if slots == 0 and not busy_after:
        return 0.0
    out = 0.0
    if not lockstep:  # at DP > 1 a rank with no micro-batch runs one pad pass
        for times, a in zip(rank_us, after_us):
            total = 0.0
            for t in times:
                total += t
            total = total + a if busy_after else total
            if len(rank_us) > 1 and not times:
                total += pad_us
            out = max(out, total)
        return out + step_us
    for j in range(slots):
        out += max(r[j] if j < len(r) else pad_us for r in rank_us)
    if busy_after:
        out += max(after_us)
    return out + step_us


@dataclass
class RefChunkedSchedule:
    plan: ref.RefSchedule  # the samples' plan; dp_time_us includes each rank's work after its micro-batches
    chunked_dp_rank: list[int]
    makespan_us: float


def timed(plan: ref.RefSchedule, cost: ref.RefCost, n: int, us: list[float], chunks: list[int], rank: list[int],
          lockstep: bool) -> RefChunkedSchedule:
    """hedge.hpp time_schedule: each micro-batch scored under `cost`, each rank's sum plus its work after them,
    and the step."""
    rank_us = [[ref.score([plan.lengths[k] for k in g], [plan.cp_rank[k] for k in g], cost, n)[1] for g in groups]
               for groups in plan.groups]
    work = after(us, chunks, rank, len(rank_us), n, lockstep, cost)
    runs = any(rank_us) or any(a > 0.0 for a in work)
    for i, times in enumerate(rank_us):
        total = 0.0
        for t in times:
            total += t
        plan.dp_time_us[i] = total + work[i]
        if not lockstep and len(rank_us) > 1 and runs and not times:  # timeline.hpp add_idle_pads
            plan.dp_time_us[i] += cost.pad()
    return RefChunkedSchedule(plan, list(rank), step_time(rank_us, lockstep, cost.pad(), cost.step, work))


def schedule(lengths: list[int], cost: ref.RefCost, dp: int, n: int, bucket: int, us: list[float],
             chunks: list[int], lockstep: bool, **options) -> RefChunkedSchedule:
    """skrull's plan of a batch with chunked documents (per-rank GDS; `options` as reference.schedule's).
    LPT's assignment with the samples' LPT over the ranks started at each rank's chunked time in FLOPs; at
    DP > 1, round robin (document k on rank k mod dp) with the samples planned as without documents, where
    LPT's step is above round robin's bound (its busiest rank's work after the micro-batches and the step's
    fixed cost); the strictly shorter step wins. With a plan margin: chosen under cost.planning(), priced
    under cost."""
    if cost.margin != 1.0:
        out = schedule(lengths, cost.planning(), dp, n, bucket, us, chunks, lockstep, **options)
        return timed(out.plan, cost, n, us, chunks, out.chunked_dp_rank, lockstep)

    def assigned(rank: list[int], around: bool) -> RefChunkedSchedule:
        initial = None
        if around and us:
            per_flop = cost.layers * cost.a / n
            load = [0.0] * dp
            for t, r in zip(us, rank):
                load[r] += t
            initial = [x / per_flop if per_flop > 0.0 else 0.0 for x in load]
        plan = ref.schedule(lengths, cost, dp, n, bucket, initial=initial, **options)
        return timed(plan, cost, n, us, chunks, rank, lockstep)

    out = assigned(assign_lpt(us, dp), True)
    if dp > 1 and us:
        robin = [k % dp for k in range(len(us))]
        bound = max(after(us, chunks, robin, dp, n, lockstep, cost)) + cost.step
        if not lockstep:  # scheduler.hpp least_pass_us: every rank runs a micro-batch or its pad pass
            least = cost.pad()
            if lengths:
                limit = max(bucket, 2 * n * (bucket // 2)) if n > 1 else bucket  # max_sequence_length
                least = min(least, ref.lower_bound([min(min(lengths), limit)], cost, n))
            bound += least
        if out.makespan_us > bound:
            other = assigned(robin, False)
            if other.makespan_us < out.makespan_us:
                out = other
    return out
