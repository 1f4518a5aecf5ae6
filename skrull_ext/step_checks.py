"""Per-step cross-rank plan check and the Skrull metrics logged each step.

Every rank computes the plan of the same global batch on its own. With the
CP-SAT fallback refining only the caller's DP rank, plans may legitimately
differ in *other* DP ranks' placements, so the check is two-level: the GDS
decisions (which sequence goes to which DP rank and micro-batch) must agree
on every rank, the full plan digest within each DP rank's CP group.
"""

import hashlib
import struct

import torch.distributed as dist

from skrull_ext.attention import DacpStats


class PlanMismatchError(RuntimeError):
    """Ranks computed different plans for the same global batch."""


def gds_digest(plan) -> str:
    """Hash of lengths, DP ranks and micro-batches (not CP placements)."""
    h = hashlib.sha256()
    for arr in (plan.lengths, plan.dp_rank, plan.micro_batch):
        h.update(struct.pack(f"<{len(arr)}q", *arr))
    return h.hexdigest()


def check_plan_digests(plan, dp_rank: int) -> None:
    """All-gather (dp_rank, GDS digest, plan digest) over the world; raise on mismatch."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    mine = (dp_rank, gds_digest(plan), plan.digest())
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if len({g for _, g, _ in every}) > 1:
        raise PlanMismatchError(f"GDS plans differ across ranks (rank: dp, gds, plan): {every}")
    for d in {d for d, _, _ in every}:
        if len({p for dd, _, p in every if dd == d}) > 1:
            raise PlanMismatchError(f"plans differ within DP rank {d}'s CP group: {every}")


def step_metrics(step, attention_modules) -> dict[str, float]:
    """Plan summary and this rank's DACP counters for the metrics logger."""
    stats = DacpStats()
    for m in attention_modules:
        for name, value in m.stats.as_dict(prefix="").items():
            setattr(stats, name, getattr(stats, name) + value)
    out = {f"skrull/{k}": float(v) for k, v in step.plan.summary().items()}
    out.update({k: float(v) for k, v in stats.as_dict(prefix="skrull/dacp_").items()})
    out["skrull/rank_micro_batches"] = float(len(step.plan.micro_batches(step.dp_rank)))
    return out
