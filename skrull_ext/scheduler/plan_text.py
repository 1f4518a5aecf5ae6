"""A plan as text: per CP group (DP rank) and slot, each sequence where it runs (a debugging
reader's view, apart from the plan itself: nothing here decides anything)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from skrull_ext.scheduler.plan import MicroBatchPlan, Plan


def describe(plan: Plan, max_seqs: int = 12) -> str:
    """A readable listing: per CP group and slot, each sequence's index, length and set
    (its CP rank when local, 'D' for the whole group, 'r+k' for the k global ranks from r),
    tokens per rank, predicted time."""
    lines = [
        f"plan: {plan.num_sequences} sequences, dp={plan.dp} cp={plan.cp} bucket_size={plan.bucket_size}, "
        f"{plan.slots} slots, predicted {plan.makespan_us / 1e3:.2f} ms, scheduled in {plan.scheduler_us:.0f} us"
        + (f" (+{plan.fallback_us / 1e3:.1f} ms CP-SAT)" if plan.fallback_us else "")
        + (f"; {plan.widened} widened, {plan.narrowed} narrowed" if plan.pool else "")
    ]
    if plan.dropped or plan.truncated:
        lines.append(f"  over-length: {len(plan.dropped)} dropped {plan.dropped}, "
                     f"{len(plan.truncated)} truncated {plan.truncated}")

    def where(r: int, n: int, mb: MicroBatchPlan) -> str:
        if n == 1:
            return str(r % plan.cp)
        return "D" if n == plan.cp and mb.groups == 1 and r % plan.cp == 0 else f"{r}+{n}"

    for d, group in enumerate(plan.ranks):
        lines.append(f"  DP {d}: {len(group)} micro-batches, {plan.group_time_us[d] / 1e3:.2f} ms")
        for k in plan.chunked_of(d):
            lines.append(f"    chunked document {k}: {plan.chunked[k]} tokens, {plan.chunked_us[k] / 1e3:.2f} ms, "
                         "before its micro-batches")
        for mb in group:
            seqs = [f"{k}:{s}@{where(r, n, mb)}" for k, s, r, n in zip(mb.seqs, mb.lengths, mb.first_rank,
                                                                      mb.num_ranks)]
            more = f" ... (+{len(seqs) - max_seqs})" if len(seqs) > max_seqs else ""
            span = f" groups {mb.first_group}..{mb.first_group + mb.groups - 1}" if mb.groups > 1 else ""
            lines.append(f"    slot {mb.slot}{span} [{mb.path}] {mb.time_us / 1e3:.2f} ms, tokens/rank "
                         f"{list(mb.rank_tokens)}: " + " ".join(seqs[:max_seqs]) + more)
    return "\n".join(lines)
