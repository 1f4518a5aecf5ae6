"""Per-step cross-rank plan check and the Skrull metrics logged each step.

Every rank computes the plan of the same global batch on its own. With the
CP-SAT fallback refining only the caller's DP rank, plans may legitimately
differ in *other* DP ranks' placements, so the check is two-level: the GDS
decisions (which sequence goes to which DP rank and micro-batch) must agree
on every rank, the full plan digest within each DP rank's CP group.
"""

import hashlib
import math
import statistics
import struct
from typing import ClassVar

import torch
import torch.distributed as dist
from torchtitan.distributed import utils as dist_utils

from skrull_ext.attention import DacpStats
from skrull_ext.attention.transport import all_gather_single
from skrull_ext.data.steps.accounting import sample_metrics, source_metrics


class PlanMismatchError(RuntimeError):
    """Ranks computed different plans for the same global batch."""


def gds_digest(plan) -> str:
    """Hash of lengths and micro-batches, each with its slot and block of CP groups
    (GDS's split over DP ranks and micro-batches), not the rank sets inside a block."""
    h = hashlib.sha256()
    blocks = [x for mb in plan.micro_batches for x in (mb.slot, mb.first_group, mb.groups)]
    for arr in (plan.lengths, plan.micro_batch, blocks):
        h.update(struct.pack(f"<{len(arr)}q", *arr))
    return h.hexdigest()


def _digest64(hexdigest: str) -> int:
    """The first 8 bytes of a sha256 hex digest as a signed int64 (a tensor element)."""
    return int.from_bytes(bytes.fromhex(hexdigest[:16]), "little", signed=True)


def check_plan_digests(plan, dp_rank: int, device=None) -> None:
    """All-gather (dp_rank, GDS digest, plan digest) over the world; raise on mismatch.

    One tensor all-gather of three int64 per rank (the digests' first 64 bits),
    on ``device`` (the default group's: CPU for gloo, the GPU for NCCL), where
    ``all_gather_object`` pickled and gathered twice (sizes, then bytes):
    4-5 ms a step on the 2-core CPU box, 1% of the README job's step."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    mine = torch.tensor([dp_rank, _digest64(gds_digest(plan)), _digest64(plan.digest())],
                        dtype=torch.int64, device=device)
    gathered = torch.empty(dist.get_world_size() * 3, dtype=torch.int64, device=device)
    all_gather_single(gathered, mine)
    every = [tuple(row) for row in gathered.view(-1, 3).tolist()]
    if len({g for _, g, _ in every}) > 1:
        raise PlanMismatchError(f"GDS plans differ across ranks (rank: dp, gds, plan digest): {_said(every)}")
    for d in {d for d, _, _ in every}:
        if len({p for dd, _, p in every if dd == d}) > 1:
            raise PlanMismatchError(f"plans differ within DP rank {d}'s CP group: {_said(every)}")


def summed_loss(accumulated: torch.Tensor, mesh=None) -> torch.Tensor:
    """``accumulated`` (this rank's loss sum / global loss tokens) summed over ``mesh`` (the loss
    mesh; None: this rank's alone), left on the device: one scalar all-reduce the device waits
    for, not the host (torchtitan's ``dist_sum`` without its read)."""
    if mesh is None:
        return accumulated
    return dist_utils._dist_reduce_tensor(accumulated, dist.ReduceOp.SUM.name, mesh, None)


def loss_and_norm(total: torch.Tensor, grad_norm: torch.Tensor) -> tuple[float, float]:
    """(global loss, gradient norm) on the host, what the finiteness check reads every step:
    ``total`` from ``summed_loss``, the norm as clipping returned it (already global). The step's
    one host sync (the norm is read after it, at no cost). The trainer and the profiler's per-step
    term (profile/step.py) both run it: after the optimizer step is queued where the optimizer
    can skip it on the device (train/optimizer_gate.py), else before."""
    return float(total.item()), float(grad_norm.item())


def _said(every: list[tuple[int, int, int]]) -> list[tuple[int, str, str]]:
    return [(d, f"{g & (2**64 - 1):016x}", f"{p & (2**64 - 1):016x}") for d, g, p in every]


def step_metrics(step, attention_modules) -> dict[str, float]:
    """Everything Skrull logs per step (TensorBoard tags ``skrull/*``).

    From the plan (the same on every rank): micro-batches, local share of
    sequences and tokens, roll-backs, refine moves, CP-SAT uses, predicted
    time, per-rank token and FLOP imbalance (max / mean over all DP x CP
    ranks). ``mean_bound_gap``: the mean of (predicted / lower bound - 1) over
    the micro-batches the scheduler refined, this DP rank's (scheduler.py).
    From this rank: scheduling wall time, the step's whole build time
    (``data_build_ms``: draw, limit, plan, buffers; on the prefetch thread
    under ``dataloader.prefetch_steps``) and the DACP attention counters summed
    over layers. The measured step and its ratio to the prediction come with
    the step's phases, a step later (step_phases.py: ``StepTimes.metrics``).
    From the dataloader (data/steps/accounting.py): samples read, trained whole,
    cut and skipped, this step and since the run began (``samples_*``,
    ``samples_*_total``); ``truncated`` / ``dropped`` are the over-length
    policy's share of them (it runs before the scheduler, so the plan itself
    never truncates or drops). Under ``[skrull] lookahead`` > 1, what the
    step's window did (``lookahead_*``, the same on each of its steps): samples
    moved to another step than they arrived in, the largest delay in steps,
    the window's predicted time regrouped and in arrival order, and the
    difference (``lookahead_saved_ms``).
    """
    stats = DacpStats()
    for m in attention_modules:
        for name, value in m.stats.as_dict(prefix="").items():
            setattr(stats, name, getattr(stats, name) + value)
    summary = step.plan.summary()
    out = {f"skrull/{k}": float(v) for k, v in summary.items()}
    out.update({k: float(v) for k, v in stats.as_dict(prefix="skrull/dacp_").items()})
    out["skrull/rank_micro_batches"] = float(len(step.plan.ranks[step.dp_rank]))
    out.update(sample_metrics(step.account.counts, step.totals))
    out.update(source_metrics(step.account.by_source, step.source_totals))
    out["skrull/schedule_wall_us"] = step.schedule_us
    out["skrull/data_build_ms"] = step.build_us / 1e3
    if (w := getattr(step, "window", None)) is not None:  # [skrull] lookahead > 1: what the step's window did
        out["skrull/lookahead_window"] = float(w.index)
        out["skrull/lookahead_moved"] = float(w.moved)
        out["skrull/lookahead_max_delay"] = float(w.max_delay)
        out["skrull/lookahead_saved_ms"] = w.saved_us / 1e3
        out["skrull/lookahead_predicted_ms"] = w.window_us / 1e3
        out["skrull/lookahead_arrival_ms"] = w.arrival_window_us / 1e3
        out["skrull/lookahead_plan_us"] = w.elapsed_us
    return out


class RatioSpread:
    """The measured/predicted ratios of the steps logged so far: median and
    10th-90th percentile (``skrull/measured_over_predicted_{median,p10,p90}``),
    so one noisy step is read against the run's spread."""

    def __init__(self) -> None:
        self.ratios: list[float] = []
        self._drift_checked = False

    def add(self, metrics: dict[str, float]) -> None:
        r = metrics.get("skrull/measured_over_predicted", math.nan)
        if math.isfinite(r):
            self.ratios.append(r)
        metrics.update({f"skrull/measured_over_predicted_{k}": v for k, v in self.summary().items()})

    def summary(self) -> dict[str, float]:
        if not self.ratios:
            return {"median": math.nan, "p10": math.nan, "p90": math.nan, "steps": 0.0}
        r = sorted(self.ratios)
        q = (lambda f: r[min(len(r) - 1, int(f * len(r)))])  # noqa: E731
        return {"median": statistics.median(r), "p10": q(0.1), "p90": q(0.9), "steps": float(len(r))}

    DRIFT_WARMUP: ClassVar[int] = 1
    """Logged steps of a launch the drift check leaves out: the first pays lazy initialisation
    and the allocator's warm-up (x9.4 its prediction on the 1-process debug job, x1.0 after)."""
    DRIFT_STEPS: ClassVar[int] = 8
    """Steps after the warm-up whose median the drift check decides on, once."""
    DRIFT_WARN: ClassVar[float] = 2.0
    """A median measured/predicted beyond this factor, either way, is a profile of another machine.
    Between x1.5 and x2 is the load of a shared machine: one command's runs read x1.51 and x1.85
    over 5 steps (warm-up included), so a x1.5 line came and went between runs of one command."""
    DRIFT_HOLD: ClassVar[float] = 1.5
    """The second level: three quarters of the window's steps must also be beyond this factor,
    on the same side, so a few slow steps do not carry the median past ``DRIFT_WARN``."""

    def drift_warning(self, cost_model: str, world_size: int,
                      job: str = "--config-file <this job's file>") -> str | None:
        """Once, when ``DRIFT_WARMUP + DRIFT_STEPS`` steps are logged: a warning line if the
        median measured/predicted of the ``DRIFT_STEPS`` after the warm-up is beyond
        ``DRIFT_WARN`` either way and three quarters of them beyond ``DRIFT_HOLD``, naming the cost model and the command that measures this
        machine (a profile describes the machine it was measured on: another host, other load,
        another torch). None otherwise, and on every later call. ``job``: the job's file and
        flags as given (usage.job_args), which the profiler's command takes."""
        if self._drift_checked or len(self.ratios) < self.DRIFT_WARMUP + self.DRIFT_STEPS:
            return None
        self._drift_checked = True
        window = sorted(self.ratios[self.DRIFT_WARMUP:self.DRIFT_WARMUP + self.DRIFT_STEPS])
        median, quarter = statistics.median(window), len(window) // 4
        slow = median > self.DRIFT_WARN and window[quarter] > self.DRIFT_HOLD
        fast = median < 1.0 / self.DRIFT_WARN and window[-1 - quarter] < 1.0 / self.DRIFT_HOLD
        if not (slow or fast):
            return None
        launcher = (f"torchrun --standalone --nproc_per_node {world_size} -m skrull_ext.profile" if world_size > 1
                    else "python -m skrull_ext.profile")
        first = self.DRIFT_WARMUP + 1
        return (f"skrull: measured/predicted step time is x{median:.2f} (median of steps {first}.."
                f"{first + len(window) - 1} of this launch, after the warm-up; beyond x{self.DRIFT_WARN:g} either "
                f"way): the cost model {cost_model!r} does not describe this machine, so the plans are priced wrong; "
                f"measure it here: {launcher} {job} --out <profile.toml> (docs/profile.md), "
                f"then --skrull.cost_model <profile.toml>")

    def line(self) -> str:
        s = self.summary()
        if not s["steps"]:
            return "no step measured"
        return f"median x{s['median']:.2f}, p10-p90 x{s['p10']:.2f}-{s['p90']:.2f} over {s['steps']:.0f} steps"


def micro_batches_said(m: dict[str, float]) -> str:
    """The step's micro-batches, saying whose: the plan's over all DP ranks, this DP
    rank's and the busiest one's (a DP rank runs its own; the others pad to the
    busiest, unless free-running)."""
    total, mine, most = (int(m[f"skrull/{k}"]) for k in ("micro_batches", "rank_micro_batches", "max_micro_batches"))
    what = "micro-batch" if total == 1 else "micro-batches"
    if total == mine:
        return f"{total} {what} (all on this DP rank)"
    return f"{total} {what} over all DP ranks ({mine} on this one, {most} on the busiest)"


def measured_said(times, spread: dict[str, float]) -> str:
    """The previous logged step's phases (step_phases.py: read a logged step late, so timing adds
    no host sync), its time as run against its prediction (where one was made) and the run's
    spread of that ratio; '' on the first logged step."""
    if times is None:
        return ""
    # "measured 2.85x the predicted step", not "x2.85 predicted", which read as a prediction of x2.85
    predicted = (f", measured {times.ratio:.2f}x the predicted step"
                 + (f" (so far median {spread['median']:.2f}x, p10-p90 {spread['p10']:.2f}x-{spread['p90']:.2f}x)"
                    if spread.get("steps", 0) > 1 else "")) if times.predicted_us > 0 else ""
    return (f"step {times.step} {times.clause()}: {times.step_ms:.1f} ms as run{predicted}"
            f", {100 * times.outside_ms / max(times.step_ms, 1e-9):.0f}% outside the micro-batches; ")


def step_log_line(step: int, m: dict[str, float], times=None, spread: dict[str, float] | None = None) -> str:
    """The one console line Skrull adds per logged step; ``times``: the previous step's
    phases (``measured_said``), ``spread``: ``RatioSpread.summary()``."""
    return (
        f"skrull step {step}: {micro_batches_said(m)}, local "
        f"{100 * m['skrull/local_seq_share']:.0f}% of seqs / {100 * m['skrull/local_token_share']:.0f}% of tokens, "
        f"predicted {m['skrull/predicted_us'] / 1e3:.2f} ms; {measured_said(times, spread or {})}"
        f"scheduling {m['skrull/schedule_wall_us']:.0f} us, "
        f"roll-backs {m['skrull/rollbacks']:.0f}, refine moves {m['skrull/refine_moves']:.0f}, "
        f"CP-SAT {m['skrull/cpsat_used']:.0f}, imbalance tokens {m['skrull/rank_token_imbalance']:.2f} "
        f"FLOPs {m['skrull/rank_flop_imbalance']:.2f}, samples {m['skrull/samples_read']:.0f} read = "
        f"{m['skrull/samples_whole']:.0f} whole + {m['skrull/samples_cut']:.0f} cut + "
        f"{m['skrull/samples_skipped']:.0f} skipped"
        + (f" ({m['skrull/chunked']:.0f} of them in chunks, {m['skrull/chunks_per_sample']:.1f} a sample "
           "over the run)" if m.get("skrull/chunked") else "")
        + (f", data wait {m['skrull/data_wait_ms']:.1f} ms" if "skrull/data_wait_ms" in m else "")
        + (f"; look-ahead window {m['skrull/lookahead_window']:.0f}: {m['skrull/lookahead_moved']:.0f} samples "
           f"moved, largest delay {m['skrull/lookahead_max_delay']:.0f} steps, predicted "
           f"{m['skrull/lookahead_saved_ms']:.2f} ms saved ({m['skrull/lookahead_arrival_ms']:.2f} -> "
           f"{m['skrull/lookahead_predicted_ms']:.2f} ms over the window)" if "skrull/lookahead_moved" in m else "")
    )
