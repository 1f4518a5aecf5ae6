"""``bench latency``'s look-ahead rows: planning one window against the steps it plans.

For each job shape and length file it draws windows of W global batches
(each sample limited to what a CP group holds, as training limits them),
regroups each with the core (``Scheduler.lookahead``) and reports the
planning time against the window's predicted time (the regrouped steps,
each priced by the full step planner): the share the issue bounds at 5%.
Beside it, one global batch's ``schedule()`` against its predicted step.

With ``--lookahead-reference`` the same windows are also regrouped by the
look-ahead as it was before its screening (every candidate planned in full;
skrull_ext/bench/reference_lookahead_full.py, a labelled reference, never the
product), so that the predicted gain of each (arrival order's predicted time
over the chosen grouping's) is printed side by side. Its time is reported as
the step plans it made, and those plans priced at this run's ``schedule()``
CPU time (its Python bookkeeping is left out: the C++ version had little).

Timing: the wall time of the call and the calling thread's CPU time (the
core runs on the caller's thread with the GIL released); on a loaded machine
the CPU time is the one that says what one core needs.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import asdict, dataclass

from skrull_ext import Scheduler, SchedulerConfig, _core, lengths
from skrull_ext.bench import reference_lookahead_full as full_pricing


@dataclass(frozen=True)
class Shape:
    name: str
    dp: int
    cp: int
    per_dp: int  # sequences per DP rank in one global batch


def draw_windows(pool: list[int], shape: Shape, bucket: int, width: int, windows: int, seed: int) -> list[list[list[int]]]:
    """``windows`` windows of ``width`` global batches, each sample at most what a CP group holds."""
    rng = random.Random(seed)
    limit = _core.max_sequence_length(bucket, shape.cp)
    k = shape.dp * shape.per_dp
    return [[[min(limit, rng.choice(pool)) for _ in range(k)] for _ in range(width)] for _ in range(windows)]


def _timed(fn):
    wall, cpu = time.perf_counter(), time.thread_time()
    out = fn()
    return out, time.perf_counter() - wall, time.thread_time() - cpu


def run_shape(shape: Shape, dataset: str, cost: _core.CostModel, bucket: int, args) -> dict:
    """One row: the core's windows (and the full-pricing reference's, if asked) on the same draws."""
    cfg = SchedulerConfig(dp=shape.dp, cp=shape.cp, bucket_size=bucket, policy="skrull", overlength="truncate",
                          timeline=args.lookahead_timeline)
    sched = Scheduler(cfg, cost)
    opts = cfg.core_options()
    windows = draw_windows(lengths.load(dataset), shape, bucket, args.lookahead_width, args.lookahead_windows,
                           args.seed)
    sched.lookahead(windows[0][:2])  # warm-up (allocations, page faults)
    wall, cpu, predicted, arrival, planned_steps = [], [], [], [], []
    for window in windows:
        a, w_s, c_s = _timed(lambda: sched.lookahead(window))
        wall.append(w_s)
        cpu.append(c_s)
        predicted.append(a.window_us / 1e6)
        arrival.append(a.arrival_window_us / 1e6)
        planned_steps.append(a.planned / (sum(map(len, window)) / len(window)))
    step_wall, step_cpu, step_us = [], [], []
    for batch in windows[0]:
        s, w_s, c_s = _timed(lambda: _core.schedule(batch, cost, opts))
        step_wall.append(w_s)
        step_cpu.append(c_s)
        step_us.append(s.makespan_us / 1e6)
    row = {
        "shape": asdict(shape), "dataset": dataset, "windows": len(windows), "width": args.lookahead_width,
        "wall_s": statistics.median(wall), "cpu_s": statistics.median(cpu),
        "predicted_s": statistics.median(predicted),
        "share_wall": sum(wall) / sum(predicted), "share_cpu": sum(cpu) / sum(predicted),
        "gain": sum(arrival) / sum(predicted), "planned_steps": statistics.median(planned_steps),
        "schedule_s": statistics.median(step_wall), "schedule_cpu_s": statistics.median(step_cpu),
        "step_s": statistics.median(step_us),
        "schedule_share": sum(step_wall) / sum(step_us), "schedule_share_cpu": sum(step_cpu) / sum(step_us),
    }
    if args.lookahead_reference:
        ref_chosen = 0.0
        plans = []
        for window in windows:
            calls = [0]

            def step_time(ls, calls=calls):
                calls[0] += 1
                return _core.schedule(ls, cost, opts).makespan_us

            _, _, total, _ = full_pricing.lookahead(window, cost.flops, step_time)
            ref_chosen += total / 1e6
            plans.append(calls[0])
        # Arrival order is priced by the same full plans on both sides: the core's sum serves both.
        row["reference"] = {"gain": sum(arrival) / ref_chosen, "plans": statistics.median(plans),
                            "est_s": statistics.median(plans) * row["schedule_cpu_s"]}
    return row


def render(rows: list[dict]) -> str:
    has_ref = any("reference" in r for r in rows)
    head = ("| DP x CP | length file | windows | planning ms (wall / CPU) | steps planned in full | predicted window ms "
            "| share (wall / CPU) | predicted gain |")
    rule = "|---|---|---:|---:|---:|---:|---:|---:|"
    if has_ref:
        head += " full-pricing reference: gain | its steps planned | its planning ms at schedule()'s CPU ms |"
        rule += "---:|---:|---:|"
    head += " schedule() ms (wall / CPU) | predicted step ms | share (wall / CPU) |"
    rule += "---:|---:|---:|"
    out = [head, rule]
    for r in rows:
        s = r["shape"]
        line = (f"| {s['dp']} x {s['cp']} | {r['dataset']} | {r['windows']} | {1e3 * r['wall_s']:.0f} / "
                f"{1e3 * r['cpu_s']:.0f} | {r['planned_steps']:.0f} | {1e3 * r['predicted_s']:.0f} | "
                f"{100 * r['share_wall']:.1f}% / {100 * r['share_cpu']:.1f}% | x{r['gain']:.3f} |")
        if has_ref:
            ref = r.get("reference")
            line += (f" x{ref['gain']:.3f} | {ref['plans']:.0f} | {1e3 * ref['est_s']:.0f} |" if ref else " - | - | - |")
        line += (f" {1e3 * r['schedule_s']:.1f} / {1e3 * r['schedule_cpu_s']:.1f} | {1e3 * r['step_s']:.0f} | "
                 f"{100 * r['schedule_share']:.2f}% / {100 * r['schedule_share_cpu']:.2f}% |")
        out.append(line)
    return "\n".join(out)
