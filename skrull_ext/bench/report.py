"""Tables and JSON of a simulation run: the figures docs/benchmarks.md quotes.

Speedup is the paper's figure: mean iteration time of the reference policy
over the policy's, per dataset x model cell; "average" is the arithmetic
mean over cells, "peak" the largest. Gap to bound is the mean over
iterations of time / bound - 1, every policy against the bound of the job's
global batch (``ScenarioResult.gap_to_bound``): the classic bound, and on a
lockstep timeline the lockstep-aware one too (skrull_ext/sim/bound.py).
``winner_line`` names the fastest policy a job can run on equal work (the
same sequences trained whole: a pool policy that trains whole what the others
cut is left out of it); ``legend`` says what each row, column and figure
printed is.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from skrull_ext.scheduler.config import POLICIES
from skrull_ext.sim.policies import LOOKAHEAD
from skrull_ext.sim.policies import get as sim_policy
from skrull_ext.sim.simulator import ScenarioResult

REFERENCES = ("baseline", "sorted", "unpacked")

# The paper's speedups of Skrull (arXiv 2505.19609): over DeepSpeed (average, peak,
# 0.5B average, 7B average) and over sorted batching (average, peak).
PAPER_FIGURES: dict[str, dict[str, float]] = {
    "deepspeed": {"average": 3.76, "peak": 7.54, "qwen2.5-0.5b": 5.50, "qwen2.5-7b": 2.03},
    "sorted": {"average": 3.45, "peak": 6.85},
}


def _cell(r: ScenarioResult) -> str:
    return f"{r.scenario.dataset} / {r.scenario.model}"


def _shape(r: ScenarioResult) -> str:
    s = r.scenario.shape
    return f"{s.dp}x{s.cp}x{s.batch_size}, C={s.bucket_size}"


def policies_of(results: Sequence[ScenarioResult]) -> list[str]:
    return [p for p in results[0].per_policy if p != "bound"] if results else []


def job_setting(policy: str) -> str | None:
    """The ``[skrull]`` keys a job sets to run the row, or None: a ``[skrull] policy`` (the
    scheduler's POLICIES), or ``skrull+lookaheadW`` (policy skrull with ``lookahead = W``). The
    others are references (what torchtitan, DeepSpeed, LongAlign or ChunkFlow users run) or
    variants."""
    if policy in POLICIES:
        return f'[skrull] policy = "{policy}"'
    if policy.startswith(LOOKAHEAD) and policy[len(LOOKAHEAD):].isdigit():
        return f'[skrull] policy = "skrull", lookahead = {policy[len(LOOKAHEAD):]}'
    if policy == "skrull+chunk":
        return '[skrull] policy = "skrull", overlength = "chunk"'
    return None


def runnable(policy: str) -> bool:
    """Whether a job can run it (``job_setting``)."""
    return job_setting(policy) is not None


def _lockstep(results: Sequence[ScenarioResult]) -> bool:
    return bool(results) and results[0].scenario.shape.timeline == "lockstep"


def cell_rows(results: Sequence[ScenarioResult]) -> list[dict]:
    """One row per (cell, policy) with every per-cell figure."""
    rows = []
    for r in results:
        bucket = r.scenario.shape.bucket_size
        for p, ms in r.per_policy.items():
            times = sorted(m.time_us for m in ms)
            row = {
                "dataset": r.scenario.dataset, "model": r.scenario.model, "shape": _shape(r), "policy": p,
                "mean_ms": statistics.fmean(times) / 1e3,
                "p95_ms": times[min(len(times) - 1, int(0.95 * len(times)))] / 1e3,
                "truncated": r.truncated_by_policy.get(p, r.truncated),
            }
            if p != "bound":
                row.update({
                    "gap_to_bound": r.gap_to_bound(p),
                    "gap_to_classic_bound": r.gap_to_bound(p, classic=True),
                    "peak_tokens": max(m.peak_tokens for m in ms),
                    "mean_peak_share": statistics.fmean(m.mean_peak_tokens for m in ms) / bucket,
                    "comm_gb_per_iter": statistics.fmean(m.comm_bytes for m in ms) / 1e9,
                    "local_share": statistics.fmean(m.local_share for m in ms),
                    "overflow_micro_batches": sum(m.overflow for m in ms),
                    "overflow_iterations": sum(m.overflow > 0 for m in ms),
                    "max_micro_batches": max(m.micro_batches for m in ms),
                    "dp_imbalance": statistics.fmean(m.dp_imbalance for m in ms),
                    "scheduler_ms": statistics.fmean(m.scheduler_us for m in ms) / 1e3,
                })
                for ref in REFERENCES:
                    if ref in r.per_policy:
                        row[f"speedup_vs_{ref}"] = r.speedup(p, ref)
            rows.append(row)
    return rows


def summary(results: Sequence[ScenarioResult]) -> dict:
    """Per policy: average / peak / per-model speedups, mean gap, overflow; skrull vs skrull-paper per cell."""
    out: dict = {"policies": {}, "skrull_vs_paper": []}
    models = sorted({r.scenario.model for r in results})
    for p in policies_of(results):
        s: dict = {"gap_to_bound": statistics.fmean(r.gap_to_bound(p) for r in results),
                   "gap_to_classic_bound": statistics.fmean(r.gap_to_bound(p, classic=True) for r in results),
                   "worst_gap_to_classic_bound": max(r.gap_to_bound(p, classic=True) for r in results),
                   "runnable": runnable(p),
                   "overflow_micro_batches": sum(m.overflow for r in results for m in r.per_policy[p]),
                   "scheduler_ms": statistics.fmean(m.scheduler_us for r in results for m in r.per_policy[p]) / 1e3}
        for ref in REFERENCES:
            if ref not in results[0].per_policy:
                continue
            sp = [r.speedup(p, ref) for r in results]
            s[f"vs_{ref}"] = {"average": statistics.fmean(sp), "peak": max(sp), "min": min(sp)}
            for m in models:
                sm = [r.speedup(p, ref) for r in results if r.scenario.model == m]
                s[f"vs_{ref}"][m] = statistics.fmean(sm)
        out["policies"][p] = s
    if results and {"skrull", "skrull-paper"} <= results[0].per_policy.keys():
        for r in results:
            out["skrull_vs_paper"].append({"cell": _cell(r), "shape": _shape(r),
                                           "skrull_paper_ms": r.mean_time_us("skrull-paper") / 1e3,
                                           "skrull_ms": r.mean_time_us("skrull") / 1e3,
                                           "speedup": r.speedup("skrull", "skrull-paper")})
        sp = [c["speedup"] for c in out["skrull_vs_paper"]]
        out["skrull_vs_paper_average"] = statistics.fmean(sp)
        out["skrull_vs_paper_min"] = min(sp)
    return out


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def summary_markdown(results: Sequence[ScenarioResult]) -> str:
    s = summary(results)
    models = sorted({r.scenario.model for r in results})
    refs = [ref for ref in REFERENCES if results and ref in results[0].per_policy]
    lockstep = _lockstep(results)
    head = ["policy", "job can run", "vs baseline avg", "peak", *[f"{m} avg" for m in models],
            *[f"vs {ref} avg" for ref in refs if ref != "baseline"], "gap to classic bound",
            *(["gap to lockstep-aware bound"] if lockstep else []), "overflow mbs", "sched ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p, v in s["policies"].items():
        b = v.get("vs_baseline", {})
        cells = [p, "yes" if v["runnable"] else "no", _fmt(b.get("average"), ".2f") + "x",
                 _fmt(b.get("peak"), ".2f") + "x", *[_fmt(b.get(m), ".2f") + "x" for m in models],
                 *[_fmt(v.get(f"vs_{ref}", {}).get("average"), ".2f") + "x" for ref in refs if ref != "baseline"],
                 f"{100 * v['gap_to_classic_bound']:.1f}%", *([f"{100 * v['gap_to_bound']:.1f}%"] if lockstep else []),
                 str(v["overflow_micro_batches"]), f"{v['scheduler_ms']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    if s["skrull_vs_paper"]:
        lines += ["", "| cell | shape | skrull-paper ms | skrull ms | skrull speedup |", "|---|---|---|---|---|"]
        for c in s["skrull_vs_paper"]:
            lines.append(f"| {c['cell']} | {c['shape']} | {c['skrull_paper_ms']:.1f} | {c['skrull_ms']:.1f} | "
                         f"{c['speedup']:.2f}x |")
        lines.append(f"| **average** | | | | **{s['skrull_vs_paper_average']:.2f}x** "
                     f"(min {s['skrull_vs_paper_min']:.2f}x) |")
    return "\n".join(lines)


def paper_markdown(results: Sequence[ScenarioResult]) -> str:
    """skrull-paper, skrull-fast and skrull over each reference next to the paper's figures (its DeepSpeed
    baseline is compared with both our baseline and unpacked, since the paper does not say which)."""
    s = summary(results)["policies"]
    models = sorted({r.scenario.model for r in results})
    head = ["policy", "over", "average", "peak", *[f"{m} avg" for m in models], "paper (avg / peak / per model)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in ("skrull-paper", "skrull-fast", "skrull"):
        for ref in REFERENCES:
            v = s.get(p, {}).get(f"vs_{ref}")
            if v is None:
                continue
            fig = PAPER_FIGURES["sorted" if ref == "sorted" else "deepspeed"]
            paper = " / ".join(f"{fig[k]:.2f}x" for k in ("average", "peak", *models) if k in fig)
            lines.append("| " + " | ".join([p, ref, f"{v['average']:.2f}x", f"{v['peak']:.2f}x",
                                            *[f"{v[m]:.2f}x" for m in models], paper]) + " |")
    return "\n".join(lines)


def matrix_markdown(results: Sequence[ScenarioResult]) -> str:
    """Cells x policies: speedup over baseline; both bounds (mean ms) and skrull's gap to each."""
    pols = policies_of(results)
    lockstep = _lockstep(results)
    head = ["cell", "shape", "truncated", *pols, "classic bound ms",
            *(["lockstep-aware bound ms"] if lockstep else []), "skrull gap (classic)",
            *(["skrull gap (lockstep-aware)"] if lockstep else [])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        has = "skrull" in r.per_policy
        cells = [_cell(r), _shape(r), str(r.truncated), *[f"{r.speedup(p, 'baseline'):.2f}x" for p in pols],
                 f"{statistics.fmean(r.classic_bounds_us) / 1e3:.1f}",
                 *([f"{statistics.fmean(r.bounds_us) / 1e3:.1f}"] if lockstep else []),
                 f"{100 * r.gap_to_bound('skrull', classic=True):.1f}%" if has else "-",
                 *([f"{100 * r.gap_to_bound('skrull'):.1f}%" if has else "-"] if lockstep else [])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


POOL = ("skrull-pool", "skrull-pool-capped")


def pool_markdown(results: Sequence[ScenarioResult]) -> str:
    """skrull-pool against skrull per cell: like for like (capped inputs), and on the world's inputs."""
    if not results or "skrull" not in results[0].per_policy:
        return ""
    have = [p for p in POOL if p in results[0].per_policy]
    if not have:
        return ""
    head = ["cell", "shape", "skrull ms", "truncated (skrull)"]
    if "skrull-pool-capped" in have:
        head += ["pool-capped ms", "pool-capped / skrull speedup", "pool-capped gap to pool bound"]
    if "skrull-pool" in have:
        head += ["pool ms", "truncated (pool)", "pool gap to pool bound"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    sp = []
    for r in results:
        cells = [_cell(r), _shape(r), f"{r.mean_time_us('skrull') / 1e3:.1f}",
                 str(r.truncated_by_policy.get("skrull", r.truncated))]
        if "skrull-pool-capped" in have:
            sp.append(r.speedup("skrull-pool-capped", "skrull"))
            cells += [f"{r.mean_time_us('skrull-pool-capped') / 1e3:.1f}", f"{sp[-1]:.3f}x",
                      f"{100 * r.gap_to_own_bound('skrull-pool-capped'):.1f}%"]
        if "skrull-pool" in have:
            cells += [f"{r.mean_time_us('skrull-pool') / 1e3:.1f}", str(r.truncated_by_policy.get("skrull-pool", 0)),
                      f"{100 * r.gap_to_own_bound('skrull-pool'):.1f}%"]
        lines.append("| " + " | ".join(cells) + " |")
    if sp:
        lines.append(f"| **speedup over skrull, like for like** | | | | | **average {statistics.fmean(sp):.3f}x, "
                     f"min {min(sp):.3f}x, max {max(sp):.3f}x** | |" + (" | | |" if "skrull-pool" in have else ""))
    return "\n".join(lines)


def chunk_markdown(results: Sequence[ScenarioResult]) -> str:
    """skrull+chunk beside chunkflow+whole per cell: the same whole sequences, those longer than a CP
    group trained in chunks; skrull on the cut sequences for scale. '' unless both ran."""
    if not results or not {"skrull+chunk", "chunkflow+whole"} <= results[0].per_policy.keys():
        return ""
    head = ["cell", "shape", "sequences over C x CP", "skrull+chunk ms", "chunkflow+whole ms",
            "skrull+chunk speedup over chunkflow+whole", "skrull+chunk gap to bound", "chunkflow+whole gap to bound"]
    cut = "skrull" in results[0].per_policy
    if cut:
        head.insert(3, "skrull (cut) ms")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    sp = []
    for r in results:
        sp.append(r.speedup("skrull+chunk", "chunkflow+whole"))
        cells = [_cell(r), _shape(r), f"{r.over_limit:,} of {r.sequences:,}",
                 *([f"{r.mean_time_us('skrull') / 1e3:.1f}"] if cut else []),
                 f"{r.mean_time_us('skrull+chunk') / 1e3:.1f}", f"{r.mean_time_us('chunkflow+whole') / 1e3:.1f}",
                 f"{sp[-1]:.3f}x", f"{100 * r.gap_to_bound('skrull+chunk'):.1f}%",
                 f"{100 * r.gap_to_bound('chunkflow+whole'):.1f}%"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(f"| **over cells** | | |{' |' if cut else ''} | | **average {statistics.fmean(sp):.3f}x, "
                 f"min {min(sp):.3f}x, max {max(sp):.3f}x** | | |")
    return "\n".join(lines)


def detail_markdown(results: Sequence[ScenarioResult]) -> str:
    cols = [("dataset", "dataset", "s"), ("model", "model", "s"), ("shape", "DPxCPxBS, C", "s"),
            ("policy", "policy", "s"), ("mean_ms", "mean ms", ".1f"), ("p95_ms", "p95 ms", ".1f"),
            ("speedup_vs_baseline", "vs baseline", ".2f"), ("gap_to_classic_bound", "gap to classic bound", ".1%"),
            ("gap_to_bound", "gap to timeline's bound", ".1%"),
            ("peak_tokens", "peak tokens", "d"), ("mean_peak_share", "mean peak / C", ".0%"),
            ("comm_gb_per_iter", "comm GB/iter", ".2f"), ("local_share", "local seqs", ".0%"),
            ("overflow_micro_batches", "overflow mbs", "d"), ("max_micro_batches", "max mbs", "d"), ("dp_imbalance", "DP imbalance", ".3f"),
            ("scheduler_ms", "sched ms", ".1f")]
    lines = ["| " + " | ".join(c[1] for c in cols) + " |", "|" + "---|" * len(cols)]
    for row in cell_rows(results):
        lines.append("| " + " | ".join(_fmt(row.get(k), f) if k in row else "-" for k, _, f in cols) + " |")
    return "\n".join(lines)


NOT_A_JOB_POLICY: dict[str, str] = {
    "sorted": "it regroups samples across steps (LongAlign), so each optimizer step trains other samples than the "
              "job's; no [skrull] policy changes what a step trains",
    "sorted+skrull": "it regroups samples across steps as sorted does, then plans each with skrull",
    "skrull-pool-capped": "skrull-pool on the sequences cut at C x CP, the like-for-like comparison with skrull; "
                          "a job gets it from skrull-pool where no sequence is longer than C x CP",
    "chunkflow": "ChunkFlow's chunked execution, which the trainer does not implement",
    "chunkflow+whole": "ChunkFlow's schedule on every sequence whole, the peer of skrull+chunk; the trainer runs "
                       "its chunked documents (train/chunked.py), not its packing of short sequences into chunks",
}
"""Why a row that is not a [skrull] policy is in the table (the others: what torchtitan or DeepSpeed run)."""


def _not_a_policy(p: str) -> str:
    return NOT_A_JOB_POLICY.get(p, "a reference: what torchtitan or DeepSpeed users run")


def unequal_cells(results: Sequence[ScenarioResult], policy: str) -> list[ScenarioResult]:
    """The cells where ``policy`` trains other work than the rest: a pool policy planning whole the
    sequences the others cut at C x CP (its cap is C x CP x DP). Equal counts mean equal sets,
    since a larger cap cuts a subset of what a smaller one cuts."""
    return [r for r in results if r.truncated_by_policy.get(policy, r.truncated) != r.truncated]


def winner_line(results: Sequence[ScenarioResult]) -> str:
    """One line: the fastest policy a job can run on equal work (highest average speed-up over
    baseline among the policies that train the same sequences whole as the others in every cell),
    where it wins, which policy was left out for training other work, and why any faster row is
    not one a job can pick."""
    s = summary(results)["policies"]
    speed = {p: v["vs_baseline"]["average"] for p, v in s.items() if "vs_baseline" in v}
    other_work = {p: unequal_cells(results, p) for p in speed}
    mine = [p for p in speed if runnable(p) and not other_work[p]]
    if not mine:
        return ""
    best = max(mine, key=lambda p: (speed[p], p == "skrull"))
    wins = sum(1 for r in results if min(mine, key=r.mean_time_us) == best)
    line = (f"fastest policy a job can run, on equal work: {best}, {speed[best]:.2f}x the baseline on average "
            f"(the fastest a job can run in {wins} of {len(results)} cells; {job_setting(best)}, "
            f"{results[0].scenario.shape.timeline} timeline)")
    left = [p for p in speed if runnable(p) and other_work[p]]
    if left:
        peer = {"skrull+chunk": "chunkflow+whole is its like-for-like peer (the chunked training table)"}
        line += "; not compared: " + "; ".join(
            f"{p} ({speed[p]:.2f}x), which trains whole, in {len(other_work[p])} of {len(results)} cells, "
            f"{sum(r.truncated - r.truncated_by_policy[p] for r in other_work[p]):,} sequences the others cut at "
            f"C x CP (more work, not the same; {peer.get(p, 'skrull-pool-capped is its like-for-like row')})"
            for p in left)
    faster = sorted((p for p in speed if not runnable(p) and not other_work[p] and speed[p] > speed[best]),
                    key=lambda p: -speed[p])
    if faster:
        line += ". Faster, but not a policy a job can pick: " + "; ".join(
            f"{p} ({speed[p]:.2f}x): {_not_a_policy(p)}" for p in faster)
    return line + "."


def legend(results: Sequence[ScenarioResult]) -> str:
    """What the rows and columns of the tables are."""
    lockstep = _lockstep(results)
    rows = []
    for p in policies_of(results):
        how = job_setting(p) or f"not a [skrull] policy: {_not_a_policy(p)}"
        rows.append(f"- {p}: {sim_policy(p).description} ({how})")
    models = sorted({r.scenario.model for r in results})
    cols = [
        "- cell: dataset / model; shape: DP x CP x global batch size (sequences a step), C = BucketSize "
        "(tokens one CP rank holds per micro-batch)",
        "- truncated: sequences of the cell's global batches cut to C x CP tokens (a CP group's capacity) for "
        "every row but the pool ones",
        "- job can run: whether a job can run it ([skrull] policy names it, or policy skrull with lookahead = W)",
        "- vs X avg / peak: mean iteration time of X over the policy's, per cell; average (peak) over cells",
        *([f"- {', '.join(models)} avg: the average over that model's cells"] if models else []),
        "- per-cell policy columns: the speed-up over baseline in that cell",
        "- skrull-paper ms / skrull ms / skrull speedup: mean iteration time of each and their ratio per cell; "
        "average (min) over cells",
        "- gap to classic bound: mean over iterations of time / bound - 1, against the larger of all work spread "
        "over DP x CP ranks and the longest sequence alone, for the job's global batch (a policy that regroups "
        "samples across steps: its mean time over the mean bound); below 0 where a policy does what the bound "
        "rules out (sorted's regrouping, skrull-pool's sets over several CP groups)",
        *(["- gap to lockstep-aware bound: the same against the larger of the classic bound and the longest "
           "sequence's slot plus the slots the tokens that slot cannot hold need (skrull_ext/sim/bound.py): what "
           "any lockstep plan of the job's batch pays"] if lockstep else []),
        "- classic / lockstep-aware bound ms (per cell): each bound of the job's global batches, mean over "
        "iterations; skrull gap (...): skrull's gap to each",
        "- overflow mbs: micro-batches over the capacity (--capacity, default BucketSize)",
        *(["- chunked training (--overlength chunk): skrull+chunk and chunkflow+whole plan every sequence whole "
           "(their truncated is 0); sequences over C x CP: those the others cut, which these train in chunks; "
           "their gap is to the classic bound of the whole sequences; speedup: chunkflow+whole's mean iteration "
           "time over skrull+chunk's, with its average, min and max over cells in the last row"]
          if any(r.whole for r in results) else []),
        "- sched ms: the planner's wall time per iteration",
        *(["- skrull-pool against skrull: skrull ms and pool ms are mean iteration times; truncated (skrull) / "
           "(pool): sequences each cut, at C x CP and at C x CP x DP (the pool trains longer ones whole); "
           "pool-capped: skrull-pool on skrull's cut sequences, so pool-capped / skrull speedup is like for like, "
           "with its average, min and max over cells in the last row; gap to pool bound: the pool's mean time "
           "over the bound of sets that may span CP groups (skrull_ext/sim/bound.py pool_lower_bound_us), minus 1"]
          if any(p in POOL for p in policies_of(results)) else []),
        "- (N s) after the files written: the simulation's wall time",
        "- hardware profile ..., planned at Mx the exchange (first line): the planner decides with every K/V "
        "exchange at M times the profile's price ([comm] plan_margin) and every figure is priced at 1x",
    ]
    return "\n".join(["Rows:", *rows, "Columns:", *cols])


def truncation_warning(results: Sequence[ScenarioResult]) -> str:
    """One line naming every cell that cut sequences to what a CP group holds, or ''.

    A table column is easy to miss, and the cut changes what is compared:
    every policy but the pool ones plans the cut batches, so a cell with many
    cuts times a different (shorter) dataset than the one named."""
    cut = [r for r in results if r.truncated]
    if not cut:
        return ""
    cells = "; ".join(f"{_cell(r)}: {r.truncated:,} of {r.sequences:,} sequences ({r.truncated / r.sequences:.1%}) "
                      f"cut to {r.scenario.shape.max_length:,} tokens" for r in cut)
    return (f"warning: sequences longer than a CP group holds (bucket size x CP) were cut in {len(cut)} of "
            f"{len(results)} cells: {cells}. Every policy but the pool ones planned the cut batches, so those "
            "cells' speed-ups describe the cut data, not the dataset: raise --bucket-size or --cp")


def markdown(results: Sequence[ScenarioResult], meta: dict) -> str:
    warning = truncation_warning(results)
    return "\n".join([
        "# Simulated iteration time by scheduling policy", "",
        f"Command: `{meta['command']}`  ",
        f"Hardware profile: {meta['profile']}; {meta['iterations']} iterations per cell, seed {meta['seed']}; "
        f"timeline {meta.get('timeline', 'free')} (docs/design/cost_model.md); wall time {meta['wall_s']:.0f} s.", "",
        *([f"**{warning}**", ""] if warning else []),
        "## Summary over cells (speedup = mean iteration time of the reference / policy's)", "",
        winner_line(results), "",
        summary_markdown(results), "",
        legend(results), "",
        "## Against the paper's figures (DeepSpeed figures shown on the baseline and unpacked rows)", "",
        paper_markdown(results), "",
        "## Speedup over baseline per cell", "", matrix_markdown(results), "",
        "## skrull-pool against skrull", "", pool_markdown(results), "",
        "## Chunked training: skrull+chunk against chunkflow+whole", "", chunk_markdown(results), "",
        "## Every cell and policy", "", detail_markdown(results), "",
    ])


def to_json(results: Sequence[ScenarioResult], meta: dict) -> dict:
    return {
        "meta": meta,
        "summary": summary(results),
        "cells": cell_rows(results),
        "iterations": [
            {"dataset": r.scenario.dataset, "model": r.scenario.model, "shape": _shape(r),
             "per_policy": {p: [m.to_dict() for m in ms] for p, ms in r.per_policy.items()}}
            for r in results
        ],
    }


def write(results: Sequence[ScenarioResult], out: Path, meta: dict) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / "results.md", out / "results.json"
    md.write_text(markdown(results, meta))
    js.write_text(json.dumps(to_json(results, meta), separators=(",", ":")))
    return [md, js]
