"""What the simulator predicts for one policy on one iteration (one global batch)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from skrull_ext._core import CostModel
from skrull_ext.scheduler.plan import Plan


@dataclass
class IterationMetrics:
    time_us: float
    """Predicted iteration time: the slowest DP rank (sum of its micro-batches)."""
    bound_us: float = 0.0
    """Lower bound on the time of the global batch this policy planned (skrull_ext/sim/bound.py)."""
    peak_tokens: int = 0
    """Most tokens any CP rank holds in any micro-batch."""
    mean_peak_tokens: float = 0.0
    """Per-rank peak tokens averaged over all DP x CP ranks (how full memory gets)."""
    comm_bytes: float = 0.0
    """K/V bytes through collectives over the whole iteration: per micro-batch the
    exchanged volume x collectives per layer x layers, summed over all DP ranks."""
    overflow: int = 0
    """Micro-batches in which some rank would hold more than the capacity (would run out of memory)."""
    micro_batches: int = 0
    """Most micro-batches of any DP rank."""
    dp_imbalance: float = 1.0
    """Slowest DP rank over the mean DP rank (1.0 = balanced): what a better DP split could win."""
    scheduler_us: float = 0.0
    """Wall time to make the plan (core + CP-SAT fallback, or Python for the baselines)."""
    local_share: float = 0.0
    """Sequences kept whole on one rank over all sequences planned (the rest are sharded
    and exchange K/V): what a larger BucketSize raises."""

    def to_dict(self) -> dict:
        return asdict(self)


def _local_share(micro_batches) -> float:
    seqs = local = 0
    for mb in micro_batches:
        seqs += len(mb.seqs)
        local += mb.num_local
    return local / seqs if seqs else 0.0


def of_plan(plan: Plan, cost: CostModel, capacity: int, bound_us: float) -> IterationMetrics:
    """Figures of one plan; `capacity` is the tokens a rank really holds (BucketSize unless told).
    Peaks are per global rank; a micro-batch over several CP groups counts once."""
    peaks = [0] * plan.world
    per_layer = cost.comm.collectives_per_layer * cost.shape.layers
    for mb in plan.micro_batches:
        for i, t in enumerate(mb.rank_tokens):
            r = mb.first_group * plan.cp + i
            peaks[r] = max(peaks[r], t)
    return IterationMetrics(
        time_us=plan.makespan_us,
        bound_us=bound_us,
        peak_tokens=max(peaks, default=0),
        mean_peak_tokens=sum(peaks) / len(peaks) if peaks else 0.0,
        comm_bytes=sum(mb.comm_bytes for mb in plan.micro_batches) * per_layer,
        overflow=sum(max(mb.rank_tokens, default=0) > capacity for mb in plan.micro_batches),
        micro_batches=plan.slots,
        dp_imbalance=plan.summary()["dp_imbalance"],
        scheduler_us=plan.scheduler_us + plan.fallback_us,
        local_share=_local_share(plan.micro_batches),
    )
