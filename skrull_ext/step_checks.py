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


def step_metrics(step, attention_modules, measured_us: float) -> dict[str, float]:
    """Everything Skrull logs per step (TensorBoard tags ``skrull/*``).

    From the plan (the same on every rank): micro-batches, local share of
    sequences and tokens, roll-backs, refine moves, CP-SAT uses, over-length
    counts, predicted time, per-rank token and FLOP imbalance (max / mean over
    all DP x CP ranks). From this rank: scheduling wall time, measured fwd+bwd
    time of the micro-batches and its ratio to the prediction (the cost
    model's presets assume an H100: on CPU the ratio is large, its trend is
    what to read), and the DACP attention counters summed over layers.
    """
    stats = DacpStats()
    for m in attention_modules:
        for name, value in m.stats.as_dict(prefix="").items():
            setattr(stats, name, getattr(stats, name) + value)
    summary = step.plan.summary()
    out = {f"skrull/{k}": float(v) for k, v in summary.items()}
    out.update({k: float(v) for k, v in stats.as_dict(prefix="skrull/dacp_").items()})
    out["skrull/rank_micro_batches"] = float(len(step.plan.micro_batches(step.dp_rank)))
    out.update({f"skrull/{k}_total": float(v) for k, v in step.overlength_totals.items()})
    out["skrull/schedule_wall_us"] = step.schedule_us
    out["skrull/measured_us"] = measured_us
    predicted = summary["predicted_us"]
    out["skrull/measured_over_predicted"] = measured_us / predicted if predicted > 0 else float("nan")
    return out


def step_log_line(step: int, m: dict[str, float]) -> str:
    """The one console line Skrull adds per logged step."""
    return (
        f"skrull step {step}: {m['skrull/micro_batches']:.0f} micro-batches, local "
        f"{100 * m['skrull/local_seq_share']:.0f}% of seqs / {100 * m['skrull/local_token_share']:.0f}% of tokens, "
        f"predicted {m['skrull/predicted_us'] / 1e3:.2f} ms, measured {m['skrull/measured_us'] / 1e3:.1f} ms "
        f"(x{m['skrull/measured_over_predicted']:.1f}), scheduling {m['skrull/schedule_wall_us']:.0f} us, "
        f"roll-backs {m['skrull/rollbacks']:.0f}, refine moves {m['skrull/refine_moves']:.0f}, "
        f"CP-SAT {m['skrull/cpsat_used']:.0f}, imbalance tokens {m['skrull/rank_token_imbalance']:.2f} "
        f"FLOPs {m['skrull/rank_flop_imbalance']:.2f}"
        + (f", truncated {m['skrull/truncated']:.0f}" if m["skrull/truncated"] else "")
        + (f", dropped {m['skrull/dropped']:.0f}" if m["skrull/dropped"] else "")
    )
