"""REFERENCE ONLY: slot GDS (cpp/include/skrull/slots.hpp) restated plainly.

Test oracle; the product never calls it. It restates, in the same orders, ties and floating-point
operation order as the core, so that its plans equal the core's exactly, what scheduler.hpp's
schedule_assigned does under Options::slot_gds at DP > 1:

1. the whole batch split into c x dp groups by LPT (gds.hpp split_micro_batches with unit = dp and
   Grouping::kLpt): the count c searched as per rank, each split scored by its slot time;
2. the leader slot (slots.hpp leader_slot), kept when its slot time plus the rest's is strictly lower;
3. the groups put into slots and onto ranks (assign_slots);
then schedule_as_priced's chunked documents (round robin priced by retiming LPT's plan) and the hedge.
Lists are scanned where the core keeps heaps: the same minimum, ties to the lower index.
"""

from __future__ import annotations

from skrull_ext.bench import reference as ref
from skrull_ext.bench import reference_chunked as refc

LEADER_SLOT_WORK = 1 << 24  # slots.hpp kLeaderSlotWork
LEADER_SLOT_TRIES = 2  # slots.hpp kLeaderSlotTries
LEADER_SLOT_SLACK = 0.05  # slots.hpp kLeaderSlotSlack


class Split:
    """A split of positions into groups: each group's positions (ascending), placements and time."""

    def __init__(self, groups: list[list[int]], placements: list[list[int]], times: list[float], unit: int):
        self.groups, self.placements, self.times = groups, placements, times
        ordered = sorted(times, reverse=True)
        self.score = 0.0
        for j in range(0, len(ordered), unit):  # gds.hpp slot_score_us
            self.score += ordered[j]


def split(eff: list[int], seqs: list[int], m: int, cost: ref.RefCost, n: int, bucket: int, dacp_options: dict,
          unit: int) -> Split | None:
    """m groups by LPT (longest first, to the group with the least FLOPs that has room, ties to the lower),
    each placed by DACP; None when a sequence finds no room or a group no placement."""
    groups = ref.lpt_groups(list(range(len(seqs))), [eff[k] for k in seqs], m, bucket * n, cost)  # positions
    if groups is None:
        return None
    placements, times = [], []
    for g in groups:
        if not g:
            placements.append([])
            times.append(0.0)
            continue
        r = ref.dacp_for([eff[seqs[q]] for q in g], cost, n, bucket, **dacp_options)
        if not r.ok:
            return None
        placements.append(r.cp_rank)
        times.append(r.time_us)
    return Split(groups, placements, times, unit)


def search(eff: list[int], seqs: list[int], cost: ref.RefCost, dp: int, n: int, bucket: int, dacp_options: dict,
           predicted_time: bool, max_extra: int) -> Split | None:
    """gds.hpp split_micro_batches with unit = dp: counts c of c x dp groups, the first feasible one (one by one
    from the token bound, then galloping, then bisection), then (predicted_time) the next max_extra counts
    whose bound can still win, the lowest slot time kept."""
    if not seqs:
        return Split([], [], [], dp)
    tokens = sum(eff[k] for k in seqs)
    total_flops = 0.0
    for k in seqs:
        total_flops += cost.flops(eff[k])
    size = -(-len(seqs) // dp)
    m0 = min(size, max(1, -(-tokens // (bucket * n * dp))))
    best, best_c = None, 0

    def attempt(c: int) -> bool:
        nonlocal best, best_c
        cand = split(eff, seqs, c * dp, cost, n, bucket, dacp_options, dp)
        if cand is not None:
            best, best_c = cand, c
        return cand is not None

    lo, c = m0 - 1, m0
    while c <= min(size, m0 + ref.LINEAR_COUNTS - 1) and not attempt(c):
        lo, c = c, c + 1
    step = 2
    while best is None:
        if lo >= size:
            return None
        hi = min(size, lo + step)
        if not attempt(hi):
            lo = hi
        step *= 2
    while best_c - lo > 1:
        mid = lo + (best_c - lo) // 2
        if not attempt(mid):
            lo = mid
    if predicted_time:
        for c in range(best_c + 1, min(size, best_c + max_extra) + 1):
            groups = float(min(len(seqs), c * dp))
            bound = max((cost.layers * (cost.a * total_flops / n + groups * cost.b) + groups * cost.fixed) / dp,
                        cost.floored(groups) / dp)
            if bound >= best.score:
                break
            cand = split(eff, seqs, c * dp, cost, n, bucket, dacp_options, dp)
            if cand is not None and cand.score < best.score:
                best, best_c = cand, c
    return best


def worth_trying(times: list[float], dp: int, fixed: float) -> bool:
    """slots.hpp leader_slot_worth_trying: the dp slowest groups leave room under the slowest."""
    if len(times) <= dp:
        return False
    top = sorted(times, reverse=True)[:dp]
    idle = 0.0
    for t in top[1:]:
        idle += top[0] - t
    return idle > LEADER_SLOT_SLACK * max(0.0, top[0] - fixed) * (dp - 1)


def lower_bound(eff: list[int], seqs: list[int], cost: ref.RefCost, dp: int, n: int, bucket: int) -> float:
    """slots.hpp slots_lower_bound_us."""
    if not seqs:
        return 0.0
    f = 0.0
    for k in seqs:
        f += cost.flops(eff[k])
    slots = float(-(-sum(eff[k] for k in seqs) // (bucket * n * dp)))
    return max(cost.layers * cost.a * f / (float(dp) * n) + slots * (cost.layers * cost.b + cost.fixed),
               cost.floored(slots))


class Fill:
    """One group of the leader slot as it fills (slots.hpp detail::FillGroup)."""

    def __init__(self, cost: ref.RefCost, n: int, bucket: int):
        self.cost, self.n = cost, n
        self.members: list[int] = []
        self.where: list[int] = []
        self.local, self.local_tokens, self.room = [0.0] * n, [0] * n, [bucket] * n
        self.dist = self.bytes = self.top = self.time = self.comm_t = 0.0
        self.tokens = self.dist_tokens = 0

    def time_with(self, top: float, comm_t: float, dist: float) -> float:
        c = self.cost
        return c.layers * c.layer(comm_t, top, dist) + c.fixed

    def best_place(self, s: int, f: float) -> tuple[int, float] | None:
        c, n = self.cost, self.n
        if max(self.room) < s and (n == 1 or min(self.room) < ref.shard_tokens(s, n)):
            return None
        found = None
        r = self.local.index(min(self.local))
        if self.room[r] < s:
            r = self.room.index(max(self.room))
        if self.room[r] >= s:
            top = max(self.top, c.local_flops(self.local_tokens[r] + s, self.local[r] + f))
            found = (r, self.time_with(top, self.comm_t, self.dist))
        if n > 1:
            shard = ref.shard_tokens(s, n)
            if min(self.room) >= shard:
                comm_t = c.per_layer * c.collective(self.bytes + c.kv_bytes(shard * n))
                ts = self.time_with(self.top, comm_t, c.dist_flops(self.dist_tokens + s, self.dist + f / n, n))
                if found is None or ts < found[1]:
                    found = (ref.DISTRIBUTED, ts)
        return found

    def add(self, pos: int, s: int, f: float, rank: int, t: float) -> None:
        c, n = self.cost, self.n
        self.members.append(pos)
        self.where.append(rank)
        self.tokens += s
        self.time = t
        if rank != ref.DISTRIBUTED:
            self.local[rank] = c.local_flops(self.local_tokens[rank] + s, self.local[rank] + f)
            self.local_tokens[rank] += s
            self.room[rank] -= s
            self.top = max(self.top, self.local[rank])
            return
        shard = ref.shard_tokens(s, n)
        self.room = [x - shard for x in self.room]
        self.dist = c.dist_flops(self.dist_tokens + s, self.dist + f / n, n)
        self.dist_tokens += s
        self.bytes += c.kv_bytes(shard * n)
        self.comm_t = c.per_layer * c.collective(self.bytes)


def leader_slot(eff: list[int], seqs: list[int], cost: ref.RefCost, dp: int, n: int, bucket: int,
                dacp_options: dict) -> tuple[Split, list[int]] | None:
    """The longest sequence alone (as DACP places it) sets the slot's time; every group of the slot is filled
    longest first, each sequence trying the LEADER_SLOT_TRIES groups of least time (ties to the lower) that
    have token room and can stay within it. Returns the slot (group g for DP rank g) and the sequences
    left, or None when a group stays empty."""
    if len(seqs) < dp or dp < 2:
        return None
    fills = [Fill(cost, n, bucket) for _ in range(dp)]
    leader = len(seqs) - 1
    s0 = eff[seqs[leader]]
    r = ref.dacp_for([s0], cost, n, bucket, **dacp_options)
    limit = r.time_us
    fills[0].add(leader, s0, cost.flops(s0), r.cp_rank[0], limit)

    def at_least(top: float, dist: float, f: float) -> float:
        local = cost.layer(0.0, max(top, f), dist)
        sharded = cost.layer(0.0, top, dist + f / n)
        return cost.layers * min(local, sharded if n > 1 else local) + cost.fixed

    work = 0
    for p in range(leader - 1, -1, -1):
        if work >= LEADER_SLOT_WORK:
            break
        s, f = eff[seqs[p]], cost.flops(eff[seqs[p]])
        tries = 0
        for g in sorted(range(dp), key=lambda g: (fills[g].time, g)):
            if tries >= LEADER_SLOT_TRIES:
                break
            if fills[g].tokens + s > bucket * n:
                continue  # no room: not counted (slots.hpp parks such groups)
            work += 1
            if at_least(fills[g].top, fills[g].dist, f) > limit:
                continue
            tries += 1
            work += n
            placed = fills[g].best_place(s, f)
            if placed is not None and placed[1] <= limit:
                fills[g].add(p, s, f, placed[0], placed[1])
                break
    if any(not fill.members for fill in fills):
        return None
    groups, placements, times = [], [], []
    for fill in fills:
        members = sorted(zip(fill.members, fill.where))
        groups.append([q for q, _ in members])
        placements.append([w for _, w in members])
        times.append(ref.score([eff[seqs[q]] for q, _ in members], placements[-1], cost, n)[1])
    head = Split(groups, placements, times, dp)
    head.score = max(times)
    used = {q for g in groups for q in g}
    return head, [seqs[q] for q in range(len(seqs)) if q not in used]


def assign_slots(times: list[float], empty: list[bool], dp: int, load: list[float] | None) -> tuple[list, list]:
    """Groups by time descending (empty ones last, ties by index), cut into runs of dp: run s is slot s; in a
    slot each group goes to the untaken rank with the least time so far (ties to the lower)."""
    order = sorted(range(len(times)), key=lambda g: (empty[g], -times[g], g))
    rank, slot = [-1] * len(times), [-1] * len(times)
    load = list(load) if load else [0.0] * dp
    first, s = 0, 0
    while first < len(order) and not empty[order[first]]:
        free = list(range(dp))
        for g in order[first:first + dp]:
            best = min(free, key=lambda i: (load[i], i))
            free.remove(best)
            rank[g], slot[g] = best, s
            load[best] += times[g]
        first, s = first + dp, s + 1
    return rank, slot


def plan(lengths: list[int], cost: ref.RefCost, dp: int, n: int, bucket: int, *, worst_fit: bool = False,
         longest_rollback: bool = True, predicted_time: bool = False, max_extra: int = 1,
         overlength: str = "error", refine_: bool = False, sweep: bool = False) -> ref.RefSchedule:
    """The samples' plan under slot GDS at DP > 1 (one model for choices and prices); dp_time_us left at 0."""
    out, live = ref.limited(lengths, bucket, n, overlength)
    eff = out.lengths
    seqs = sorted(live, key=lambda k: (eff[k], k))
    dacp_options = dict(worst_fit=worst_fit, longest_rollback=longest_rollback, sweep=sweep, refine_=refine_)
    main = search(eff, seqs, cost, dp, n, bucket, dacp_options, predicted_time, max_extra)
    head, of = None, seqs
    if worth_trying(main.times, dp, cost.fixed):
        lead = leader_slot(eff, seqs, cost, dp, n, bucket, dacp_options)
        if lead is not None and lead[0].score + lower_bound(eff, lead[1], cost, dp, n, bucket) < main.score:
            tail = search(eff, lead[1], cost, dp, n, bucket, dacp_options, predicted_time, max_extra)
            if tail is not None and lead[0].score + tail.score < main.score:
                head, main, of = lead[0], tail, lead[1]
    empty = [not g for g in main.groups]
    rank, slot = assign_slots(main.times, empty, dp, head.times if head else None)
    out.groups = [[] for _ in range(dp)]
    out.dp_time_us = [0.0] * dp

    def emit(i: int, positions: list[int], placement: list[int], among: list[int]) -> None:
        j = len(out.groups[i])
        out.groups[i].append([among[q] for q in positions])
        for q, c in zip(positions, placement):
            out.dp_rank[among[q]], out.micro_batch[among[q]], out.cp_rank[among[q]] = i, j, c

    for i in range(dp):
        if head is not None:
            emit(i, head.groups[i], head.placements[i], seqs)
        for g in sorted((g for g in range(len(main.groups)) if not empty[g] and rank[g] == i), key=lambda g: slot[g]):
            emit(i, main.groups[g], main.placements[g], of)
    return out


def schedule(lengths: list[int], cost: ref.RefCost, dp: int, n: int, bucket: int, us: list[float],
             chunks: list[int], lockstep: bool, **options) -> refc.RefChunkedSchedule:
    """skrull's plan under slot GDS, with chunked documents: the samples' slots as without them, the documents
    by LPT, or round robin where retiming says it is strictly faster. DP 1 is the per-rank GDS. With a plan
    margin: chosen under cost.planning(), priced under cost."""
    if dp == 1:
        return refc.schedule(lengths, cost, dp, n, bucket, us, chunks, lockstep, **options)
    if cost.margin != 1.0:
        out = schedule(lengths, cost.planning(), dp, n, bucket, us, chunks, lockstep, **options)
        return refc.timed(out.plan, cost, n, us, chunks, out.chunked_dp_rank, lockstep)
    samples = plan(lengths, cost, dp, n, bucket, **options)
    out = refc.timed(samples, cost, n, us, chunks, refc.assign_lpt(us, dp), lockstep)
    if us:
        robin = refc.timed(samples, cost, n, us, chunks, [k % dp for k in range(len(us))], lockstep)
        if robin.makespan_us < out.makespan_us:
            return robin
        out = refc.timed(samples, cost, n, us, chunks, refc.assign_lpt(us, dp), lockstep)
    return out
