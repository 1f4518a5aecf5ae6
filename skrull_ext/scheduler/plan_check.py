"""``Plan.validate``: every invariant of a plan, re-checked with plain
arithmetic, independently of the core that built it (the times excepted:
they are replayed by the core's one timeline function, timeline.hpp).

A plan breaks an invariant when:
- its per-sequence arrays (micro-batch, length) and its micro-batches
  disagree, or a sequence not dropped is in no micro-batch or in two (a
  rank set is stored on its micro-batch alone: nothing to disagree with);
- a rank set is not one rank, an aligned power-of-two sub-block of one CP
  group, one whole CP group, or the whole block of an aligned power-of-two
  (or all-dp) run of groups inside its micro-batch's block; without
  ``pool`` (policy skrull) only one rank or the whole group, on one group;
- a group runs two micro-batches at one slot;
- a rank's tokens (local whole, sharded as a zigzag shard over its set)
  differ from the plan's or exceed bucket_size;
- a sequence within the limit was truncated or dropped, or one beyond it kept;
- a chunked document (``overlength = "chunk"``) is not beyond the limit, has no
  one DP rank in range, or a time that is not finite and >= 0;
- the slot replay does not give the plan's starts, group times and step.
"""

from __future__ import annotations

import math


class PlanError(ValueError):
    """A plan breaks one of its invariants."""


def shard(s: int, k: int) -> int:
    """Tokens one of k ranks holds of a sequence of s tokens (the core's zigzag rule, restated)."""
    return s if k <= 1 else 2 * -(-s // (2 * k))


def check_plan(plan, dp_rank: int | None = None) -> None:
    """Raise PlanError naming the first broken invariant of ``plan`` (a scheduler.plan.Plan).

    ``dp_rank``: the micro-batches that run on other DP ranks are checked for exactly-once and
    their times only, not each sequence's rank set and tokens: a training rank runs its own
    micro-batches alone and every rank checks its own, so the job checks them all (at DP 128 x
    CP 8 the whole plan's checks cost a rank 7-14 ms a step, its own a small part of that)."""
    if dp_rank is not None and not (isinstance(dp_rank, int) and 0 <= dp_rank < plan.dp):
        raise ValueError(f"dp_rank must be in [0, {plan.dp}), got {dp_rank!r}")
    n = len(plan.input_lengths)
    for name in ("lengths", "micro_batch"):
        if len(getattr(plan, name)) != n:
            raise PlanError(f"plan.{name} has {len(getattr(plan, name))} entries for {n} sequences")
    _check_lengths(plan, n)
    _check_chunked(plan)
    seen = [0] * n
    busy: set[tuple[int, int]] = set()
    for m, mb in enumerate(plan.micro_batches):
        if dp_rank is None or mb.first_group <= dp_rank < mb.first_group + mb.groups:
            _check_micro_batch(plan, m, mb, n, busy)
        elif mb.seqs and not (0 <= min(mb.seqs) and max(mb.seqs) < n):
            raise PlanError(f"micro-batch {m} holds a sequence outside [0, {n})")
        for k in mb.seqs:
            seen[k] += 1
    dropped = set(plan.dropped)
    for k in range(n):
        want = 0 if k in dropped else 1
        if seen[k] != want:
            raise PlanError(f"sequence {k} appears in {seen[k]} micro-batches, expected {want}")
    clock, starts, step = plan._timeline()
    for m, (mb, s) in enumerate(zip(plan.micro_batches, starts)):
        if not math.isclose(mb.start_us, s, rel_tol=1e-9, abs_tol=1e-6):
            raise PlanError(f"micro-batch {m} starts at {mb.start_us}, its slots say {s}")
    for g, (a, b) in enumerate(zip(clock, plan.group_time_us)):
        if not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6):
            raise PlanError(f"DP rank {g}: its micro-batches finish at {a}, the plan says {b}")
    if not math.isclose(plan.makespan_us, step, rel_tol=1e-9, abs_tol=1e-6):
        raise PlanError(f"makespan {plan.makespan_us} is not the {plan.timeline.name.lower()} step time {step} "
                        "of its slots")


def _check_lengths(plan, n: int) -> None:
    limit = plan.limit
    dropped, truncated = set(plan.dropped), set(plan.truncated)
    if len(dropped) != len(plan.dropped) or len(truncated) != len(plan.truncated):
        raise PlanError("dropped or truncated lists repeat an index")
    for k in range(n):
        s_in, s = plan.input_lengths[k], plan.lengths[k]
        if k in dropped:
            if s_in <= limit or plan.micro_batch[k] != -1:
                raise PlanError(f"sequence {k} (length {s_in}) dropped though the limit is {limit}, or placed")
            continue
        if k in truncated:
            if not (s_in > limit and s == limit):
                raise PlanError(f"sequence {k} truncated from {s_in} to {s}, expected to the limit {limit}")
        elif s != s_in:
            raise PlanError(f"sequence {k} length changed from {s_in} to {s} without truncation")
        if s > limit:
            raise PlanError(f"sequence {k} has length {s} > limit {limit}")


def _check_chunked(plan) -> None:
    """Each chunked document: longer than the limit (else the plan would hold it), one DP rank, a time."""
    k = len(plan.chunked)
    if not len(plan.chunked_us) == len(plan.chunked_group) == k:
        raise PlanError(f"plan has {k} chunked documents, {len(plan.chunked_us)} times and "
                        f"{len(plan.chunked_group)} DP ranks for them")
    for j, (s, t, g) in enumerate(zip(plan.chunked, plan.chunked_us, plan.chunked_group)):
        if s <= plan.limit:
            raise PlanError(f"chunked document {j} has length {s}, within the limit {plan.limit}: a plan holds it")
        if not 0 <= g < plan.dp:
            raise PlanError(f"chunked document {j} is on DP rank {g}, outside [0, {plan.dp})")
        if not (math.isfinite(t) and t >= 0):
            raise PlanError(f"chunked document {j}: predicted time {t} is not finite and non-negative")


def _check_micro_batch(plan, m: int, mb, n: int, busy: set[tuple[int, int]]) -> None:
    cp = plan.cp
    where = f"micro-batch {m} (slot {mb.slot}, DP ranks {mb.first_group}+{mb.groups})"
    if not (mb.groups >= 1 and 0 <= mb.first_group and mb.first_group + mb.groups <= plan.dp):
        raise PlanError(f"{where} spans DP ranks outside [0, {plan.dp})")
    if mb.groups > 1 and not plan.pool:
        raise PlanError(f"{where} spans {mb.groups} CP groups; only skrull-pool plans may")
    if mb.groups > 1 and not (mb.groups == plan.dp or
                              (mb.groups & (mb.groups - 1) == 0 and mb.first_group % mb.groups == 0)):
        raise PlanError(f"{where}: a block of groups must be aligned, a power of two, or all {plan.dp}")
    for g in range(mb.first_group, mb.first_group + mb.groups):
        if (g, mb.slot) in busy:
            raise PlanError(f"{where}: DP rank {g} already runs a micro-batch at slot {mb.slot}")
        busy.add((g, mb.slot))
    lo, hi = mb.first_group * cp, (mb.first_group + mb.groups) * cp
    if not mb.seqs or not (len(mb.seqs) == len(mb.lengths) == len(mb.first_rank) == len(mb.num_ranks)):
        raise PlanError(f"{where} is empty or its per-sequence lists differ in length")
    tokens = [0] * (hi - lo)
    for k, s, r, c in zip(mb.seqs, mb.lengths, mb.first_rank, mb.num_ranks):
        if not 0 <= k < n:
            raise PlanError(f"{where} holds sequence {k}, outside [0, {n})")
        if (plan.micro_batch[k], plan.lengths[k]) != (m, s):
            raise PlanError(f"sequence {k}: the plan's arrays say micro-batch {plan.micro_batch[k]} length "
                            f"{plan.lengths[k]}; {where} holds it with length {s}")
        at = (r - lo) % cp  # offset inside its CP group
        whole_group = c == cp and at == 0
        whole_block = c == hi - lo and r == lo
        sub_group = plan.pool and 2 <= c < cp and c & (c - 1) == 0 and at % c == 0 and at + c <= cp
        if not (c == 1 or sub_group or whole_group or whole_block) or not lo <= r < r + c <= hi:
            allowed = ("one rank, an aligned power-of-two part of a CP group, a CP group or the block"
                       if plan.pool else "one rank or the whole CP group")
            raise PlanError(f"{where}: sequence {k} has rank set [{r}, {r + c}), not {allowed} [{lo}, {hi})")
        for i in range(r - lo, r - lo + c):
            tokens[i] += shard(s, c)
    if tokens != list(mb.rank_tokens):
        raise PlanError(f"{where}: rank tokens {list(mb.rank_tokens)} but its rank sets give {tokens}")
    if max(tokens) > plan.bucket_size:
        raise PlanError(f"{where}: a rank holds {max(tokens)} tokens > bucket_size {plan.bucket_size}")
    if not (math.isfinite(mb.time_us) and mb.time_us >= 0):
        raise PlanError(f"{where}: predicted time {mb.time_us} is not finite and non-negative")
