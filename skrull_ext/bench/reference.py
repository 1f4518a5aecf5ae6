"""REFERENCE ONLY: a plain-Python restatement of the C++ core.

Test oracle and the benchmark's comparison point; the product never calls it. It mirrors
cpp/include/skrull/{dacp,dacp_sweep,gds,scheduler}.hpp line by line in meaning (same orders, same
ties, same floating-point operation order), so its plans must equal the core's exactly; its cost model
(cost_model.hpp) is reference_cost.py's RefCost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from skrull_ext.bench.reference_cost import RefCost

DISTRIBUTED = -1
LINEAR_COUNTS = 8  # gds.hpp kLinearCounts
MAX_REFINE_MOVES = 256  # refine.hpp kMaxRefineMoves
MAX_SWEEP_SHARDS = 256  # dacp_sweep.hpp kMaxSweepShards


def shard_tokens(s: int, n: int) -> int:
    return s if n <= 1 else 2 * -(-s // (2 * n))


def max_sequence_length(bucket: int, n: int) -> int:
    return bucket if n <= 1 else max(bucket, 2 * n * (bucket // 2))


@dataclass
class RefDacp:
    ok: bool
    cp_rank: list[int]
    rank_tokens: list[int]
    time_us: float
    rollbacks: int
    moves: int = 0


def score(lengths: list[int], cp_rank: list[int], cost: RefCost, n: int) -> tuple[list[int], float]:
    tokens, ltok, local = [0] * n, [0] * n, [0.0] * n
    dist, dtok, vol = 0.0, 0, 0.0
    for s, r in zip(lengths, cp_rank):
        if r == DISTRIBUTED:
            sh = shard_tokens(s, n)
            tokens = [t + sh for t in tokens]
            dist += cost.flops(s) / n
            dtok += s
            vol += cost.kv_bytes(sh * n)
        else:
            tokens[r] += s
            ltok[r] += s
            local[r] += cost.flops(s)
    local = [cost.local_flops(t, f) for t, f in zip(ltok, local)]
    return tokens, cost.micro_batch(local, cost.dist_flops(dtok, dist, n), vol, max(tokens))


def refine(lengths: list[int], cost: RefCost, n: int, bucket: int, order: list[int], cp_rank: list[int]) -> int:
    """Time-driven local search after DACP (refine.hpp): move or shard the
    bottleneck rank's longest sequence that lowers the predicted time."""
    if n <= 1 or not lengths:
        return 0
    room = [bucket] * n
    local, ltok = [0.0] * n, [0] * n  # as priced: cost.local_flops of the rank's local tokens
    dist, dtok, vol = 0.0, 0, 0.0  # dist as priced: cost.dist_flops
    for i, s in enumerate(lengths):
        if cp_rank[i] == DISTRIBUTED:
            sh = shard_tokens(s, n)
            room = [x - sh for x in room]
            dist += cost.flops(s) / n
            dtok += s
            vol += cost.kv_bytes(sh * n)
        else:
            room[cp_rank[i]] -= s
            local[cp_rank[i]] += cost.flops(s)
            ltok[cp_rank[i]] += s
    local = [cost.local_flops(t, f) for t, f in zip(ltok, local)]
    dist = cost.dist_flops(dtok, dist, n)
    moves = 0
    current = cost.micro_batch(local, dist, vol)
    while moves < min(len(lengths), MAX_REFINE_MOVES):
        comm = cost.per_layer * cost.collective(vol)
        b = 0
        for j in range(1, n):
            if local[j] > local[b]:
                b = j
        if cost.line(local[b]) <= comm:
            break
        lightest = 1 if b == 0 else 0
        for j in range(n):
            if j != b and local[j] < local[lightest]:
                lightest = j
        moved = False
        for x in reversed(order):
            if cp_rank[x] != b:
                continue
            s = lengths[x]
            f = cost.flops(s)
            best, to = current, b
            b_after = cost.local_flops(ltok[b] - s, local[b] - f)
            to_after = cost.local_flops(ltok[lightest] + s, local[lightest] + f)
            dist_after = cost.dist_flops(dtok + s, dist + f / n, n)
            if room[lightest] >= s:
                trial = list(local)
                trial[b] = b_after
                trial[lightest] = to_after
                t = cost.micro_batch(trial, dist, vol)
                if t < best:
                    best, to = t, lightest
            sh = shard_tokens(s, n)
            if room[b] + s >= sh and all(j == b or room[j] >= sh for j in range(n)):
                trial = list(local)
                trial[b] = b_after
                t = cost.micro_batch(trial, dist_after, vol + cost.kv_bytes(sh * n))
                if t < best:
                    best, to = t, DISTRIBUTED
            if to == b:
                continue
            local[b] = b_after
            ltok[b] -= s
            room[b] += s
            if to == DISTRIBUTED:
                for j in range(n):
                    room[j] -= sh
                dist = dist_after
                dtok += s
                vol += cost.kv_bytes(sh * n)
            else:
                local[to] = to_after
                ltok[to] += s
                room[to] -= s
            cp_rank[x] = to
            current = best
            moves += 1
            moved = True
            break
        if not moved:
            break
    return moves


def dacp(lengths: list[int], cost: RefCost, n: int, bucket: int, worst_fit: bool = False,
         longest_rollback: bool = True, refine_: bool = False) -> RefDacp:
    """Corrected Algorithm 1 (worst_fit=True: Algorithm 4), then optionally refine()."""
    cp_rank = [DISTRIBUTED] * len(lengths)
    room = [bucket] * n
    load = [0.0] * n
    local: list[list[int]] = [[] for _ in range(n)]
    rollbacks = 0
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    for k in order:
        s = lengths[k]
        while True:
            if not worst_fit:
                t = load.index(min(load))
                if room[t] >= s:
                    cp_rank[k] = t
                    room[t] -= s
                    load[t] += cost.flops(s)
                    local[t].append(k)
                    break
            t = room.index(max(room))
            if room[t] >= s:
                cp_rank[k] = t
                room[t] -= s
                load[t] += cost.flops(s)
                local[t].append(k)
                break
            sh = shard_tokens(s, n)
            if n > 1 and min(room) >= sh:
                cp_rank[k] = DISTRIBUTED
                for j in range(n):
                    room[j] -= sh
                    load[j] += cost.flops(s) / n
                break
            t = room.index(min(room))
            cands = list(reversed(local[t])) if longest_rollback else list(local[t])
            pick = None
            for x in cands:
                shx = shard_tokens(lengths[x], n)
                if n > 1 and lengths[x] > shx and all(j == t or room[j] >= shx for j in range(n)):
                    pick = x
                    break
            if pick is None:
                tokens, time_us = score(lengths, cp_rank, cost, n)
                return RefDacp(False, cp_rank, tokens, time_us, rollbacks)
            local[t].remove(pick)
            room[t] += lengths[pick]
            load[t] -= cost.flops(lengths[pick])
            shx = shard_tokens(lengths[pick], n)
            cp_rank[pick] = DISTRIBUTED
            for j in range(n):
                room[j] -= shx
                load[j] += cost.flops(lengths[pick]) / n
            rollbacks += 1
    moves = refine(lengths, cost, n, bucket, order, cp_rank) if refine_ else 0
    tokens, time_us = score(lengths, cp_rank, cost, n)
    return RefDacp(True, cp_rank, tokens, time_us, rollbacks, moves)


def dacp_sweep(lengths: list[int], cost: RefCost, n: int, bucket: int) -> RefDacp:
    """Shard the k longest, LPT the rest, for every k; fastest predicted wins (dacp_sweep.hpp)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    monotone = cost.floor <= cost.ys[0] if cost.threshold > 0.0 else True
    monotone = monotone and all(b >= a for a, b in zip(cost.ys, cost.ys[1:]))
    best = None
    prefix, dist, vol = 0, 0.0, 0.0
    for k in range(min(len(lengths), MAX_SWEEP_SHARDS) + 1):
        if k > 0:
            s = lengths[order[k - 1]]
            sh = shard_tokens(s, n)
            prefix += sh
            if prefix > bucket:
                break
            dist += cost.flops(s) / n
            vol += cost.kv_bytes(sh * n)
            if best is not None and monotone and \
                    cost.layers * cost.layer(cost.per_layer * cost.collective(vol), 0.0, dist) + cost.fixed >= best[1]:
                break
        cp_rank = [DISTRIBUTED] * len(lengths)
        room = [bucket - prefix] * n
        load = [0.0] * n
        ok = True
        for i in order[k:]:
            s = lengths[i]
            t = load.index(min(load))
            if room[t] < s:
                t = room.index(max(room))
            if room[t] >= s:
                cp_rank[i] = t
                room[t] -= s
                load[t] += cost.flops(s)
                continue
            sh = shard_tokens(s, n)
            ok = min(room) >= sh
            if not ok:
                break
            for j in range(n):
                room[j] -= sh
        if not ok:
            continue
        tokens, time_us = score(lengths, cp_rank, cost, n)
        if best is None or time_us < best[1]:
            best = (cp_rank, time_us, tokens)
    if best is None:
        tokens, time_us = score(lengths, [DISTRIBUTED] * len(lengths), cost, n)
        return RefDacp(False, [DISTRIBUTED] * len(lengths), tokens, time_us, 0)
    return RefDacp(True, best[0], best[2], best[1], 0)


def lower_bound(lengths: list[int], cost: RefCost, n: int) -> float:
    """CostModel::micro_batch_lower_bound_us."""
    total = 0.0
    tokens = 0.0
    longest = 0
    for s in lengths:
        total += cost.flops(s)
        tokens += float(s)
        longest = max(longest, s)
    if total <= 0.0:
        return 0.0
    bound = max(cost.a * total / n + cost.b, cost.host_floor)
    monotone = cost.floor <= cost.ys[0] if cost.threshold > 0.0 else True
    monotone = monotone and all(b >= a for a, b in zip(cost.ys, cost.ys[1:]))
    if monotone and n > 1:
        f = cost.flops(longest)
        as_local = cost.comp(f)
        as_dist = cost.layer(cost.per_layer * cost.collective(cost.kv_bytes(longest)), 0.0, f / n)
        bound = max(bound, min(as_local, as_dist))
    return cost.layers * bound + cost.fixed + cost.token * tokens / n


def dacp_for(lengths: list[int], cost: RefCost, n: int, bucket: int, worst_fit: bool, longest_rollback: bool,
             sweep: bool, refine_: bool = False, sweep_margin: float = 0.01) -> RefDacp:
    """Algorithm 1 (or 4, refined), and with `sweep` also dacp_sweep, the faster kept (dacp_sweep.hpp dacp_for);
    with a plan margin, chosen under cost.planning() and scored under cost (hedge.hpp)."""
    if cost.margin != 1.0:
        r = dacp_for(lengths, cost.planning(), n, bucket, worst_fit, longest_rollback, sweep, refine_, sweep_margin)
        r.rank_tokens, r.time_us = score(lengths, r.cp_rank, cost, n)
        return r
    r = dacp(lengths, cost, n, bucket, worst_fit, longest_rollback, refine_)
    # The margin is on the part a placement changes (dacp_sweep.hpp): not the fixed cost.
    gap = (1.0 + sweep_margin) * (lower_bound(lengths, cost, n) - cost.fixed)
    if sweep and n > 1 and (not r.ok or r.time_us - cost.fixed > gap):
        s = dacp_sweep(lengths, cost, n, bucket)
        if s.ok and (not r.ok or s.time_us < r.time_us):
            r = s
    return r


@dataclass
class RefSchedule:
    lengths: list[int]
    dp_rank: list[int]
    micro_batch: list[int]
    cp_rank: list[int]
    groups: list[list[list[int]]] = field(default_factory=list)  # per DP rank, per micro-batch: global indices
    dp_time_us: list[float] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    truncated: list[int] = field(default_factory=list)


def limited(lengths: list[int], bucket: int, n: int, overlength: str) -> tuple[RefSchedule, list[int]]:
    """A schedule's start: each sequence over the limit refused, dropped or truncated (in out.lengths); the rest."""
    limit, live = max_sequence_length(bucket, n), []
    out = RefSchedule(list(lengths), [-1] * len(lengths), [-1] * len(lengths), [DISTRIBUTED] * len(lengths))
    for k, s in enumerate(lengths):
        if s > limit and overlength == "error":
            raise ValueError(f"sequence {k} has length {s} > {limit}")
        if s > limit and overlength == "drop":
            out.dropped.append(k)
            continue
        if s > limit:
            out.lengths[k] = limit
            out.truncated.append(k)
        live.append(k)
    return out, live


def lpt_groups(items: list[int], length: list[int], m: int, cap: int, cost: RefCost) -> list[list[int]] | None:
    """gds.hpp form_groups, Grouping::kLpt: ``items`` from the last (the longest) each to the group with the least
    FLOPs that has ``cap`` tokens of room (ties to the lower group); members in items order, None if one has none."""
    load, room, where = [0.0] * m, [cap] * m, [0] * len(items)
    for q in range(len(items) - 1, -1, -1):
        s = length[items[q]]
        if not (fits := [j for j in range(m) if room[j] >= s]):
            return None
        j = min(fits, key=lambda j: (load[j], j))
        where[q] = j
        room[j] -= s
        load[j] += cost.flops(s)
    return [[k for q, k in enumerate(items) if where[q] == j] for j in range(m)]


def schedule(lengths: list[int], cost: RefCost, dp: int, n: int, bucket: int, *, worst_fit: bool = False,
             longest_rollback: bool = True, predicted_time: bool = False, max_extra: int = 1,
             overlength: str = "error", refine_: bool = False, sweep: bool = False,
             initial: list[float] | None = None, free_running: bool = False) -> RefSchedule:
    """GDS (Algorithm 2, loop fixed) + DACP for one global batch; with a plan margin, planned under
    cost.planning() and priced under cost (hedge.hpp). `initial`: each DP rank's FLOPs before the LPT split
    (its chunked documents, reference_chunked.py). `free_running`: the schedule's free-running timeline,
    where at DP > 1 a rank with no micro-batch runs a pad pass (timeline.hpp add_idle_pads)."""
    out = _schedule(lengths, cost, dp, n, bucket, worst_fit=worst_fit, longest_rollback=longest_rollback,
                    predicted_time=predicted_time, max_extra=max_extra, overlength=overlength, refine_=refine_,
                    sweep=sweep, initial=initial)
    if free_running and dp > 1 and any(out.groups):
        out.dp_time_us = [t + cost.pad() if not g else t for t, g in zip(out.dp_time_us, out.groups)]
    return out


def _schedule(lengths: list[int], cost: RefCost, dp: int, n: int, bucket: int, *, worst_fit: bool,
              longest_rollback: bool, predicted_time: bool, max_extra: int, overlength: str, refine_: bool,
              sweep: bool, initial: list[float] | None) -> RefSchedule:
    """schedule() without the idle ranks' pad passes."""
    if cost.margin != 1.0:
        out = _schedule(lengths, cost.planning(), dp, n, bucket, worst_fit=worst_fit,
                        longest_rollback=longest_rollback, predicted_time=predicted_time, max_extra=max_extra,
                        overlength=overlength, refine_=refine_, sweep=sweep, initial=initial)
        for d, groups in enumerate(out.groups):
            t = 0.0
            for g in groups:
                t += score([out.lengths[k] for k in g], [out.cp_rank[k] for k in g], cost, n)[1]
            out.dp_time_us[d] = t
        return out
    out, live = limited(lengths, bucket, n, overlength)
    eff = out.lengths
    # DP split: LPT by FLOPs.
    bins: list[list[int]] = [[] for _ in range(dp)]
    load = list(initial) if initial else [0.0] * dp
    for k in sorted(live, key=lambda i: (-eff[i], i)):
        t = load.index(min(load))
        bins[t].append(k)
        load[t] += cost.flops(eff[k])
    cap = bucket * n

    def split(share: list[int], m: int, lpt: bool = False):
        groups = lpt_groups(share, eff, m, cap, cost) if lpt else [share[j::m] for j in range(m)]
        if groups is None or not all(sum(eff[k] for k in g) <= cap for g in groups):
            return None
        res = []
        for g in groups:
            r = dacp_for([eff[k] for k in g], cost, n, bucket, worst_fit, longest_rollback, sweep, refine_)
            if not r.ok:
                return None
            res.append(r)
        t = 0.0
        for r in res:
            t += r.time_us
        return (t, groups, res)

    def search(share: list[int], lpt: bool):
        """gds.hpp split_micro_batches with unit 1: the first feasible count, then the extra ones."""
        best = None
        if share:
            size = len(share)
            m0 = min(size, max(1, -(-sum(eff[k] for k in share) // cap)))
            total_flops = 0.0
            for k in share:
                total_flops += cost.flops(eff[k])
            # First feasible count: LINEAR_COUNTS one by one, then galloping
            # steps up to len(share) (always feasible), then bisection.
            lo, m = m0 - 1, m0
            while m <= size and m < m0 + LINEAR_COUNTS:
                best = split(share, m, lpt)
                if best is not None:
                    break
                lo, m = m, m + 1
            step = 2
            while best is None and lo < size:
                hi = min(size, lo + step)
                best = split(share, hi, lpt)
                if best is None:
                    lo = hi
                step *= 2
            while best is not None and len(best[1]) - lo > 1:
                mid = lo + (len(best[1]) - lo) // 2
                cand = split(share, mid, lpt)
                if cand is None:
                    lo = mid
                else:
                    best = cand
            if best is not None and predicted_time:
                for m in range(len(best[1]) + 1, min(size, len(best[1]) + max_extra) + 1):
                    if max(cost.layers * (cost.a * total_flops / n + m * cost.b) + m * cost.fixed,
                           cost.floored(m)) >= best[0]:
                        break
                    cand = split(share, m, lpt)
                    if cand is not None and cand[0] < best[0]:
                        best = cand
        return best

    for d in range(dp):
        share = sorted(bins[d], key=lambda i: (eff[i], i))
        best = search(share, False)
        # scheduler.hpp split_share: LPT groups too where the strided count is above the token bound.
        if best is not None and predicted_time:
            bound = -(-sum(eff[k] for k in share) // cap)
            if len(best[1]) > bound:
                cand = search(share, True)
                if cand is not None and cand[0] < best[0]:
                    best = cand
        t, groups, res = best if best is not None else (0.0, [], [])
        out.groups.append(groups)
        out.dp_time_us.append(t)
        for j, (g, r) in enumerate(zip(groups, res)):
            for k, c in zip(g, r.cp_rank):
                out.dp_rank[k], out.micro_batch[k], out.cp_rank[k] = d, j, c
    return out

