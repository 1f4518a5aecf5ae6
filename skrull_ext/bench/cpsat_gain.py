"""What the CP-SAT fallback buys: predicted gain per step against its cost.

    python -m skrull_ext.bench cpsat                  # every setting, 50 global batches each
    python -m skrull_ext.bench cpsat --batches 200 --json out/cpsat.json

For each setting it plans the same global batches twice with the default
policy, as a training rank does (``Scheduler.schedule(lengths, dp_rank=0)``):
once with the fallback (``cpsat = true``, the default margin and
deterministic limit) and once without. It reports how many of the rank's
micro-batches the fallback tried (predicted more than ``cpsat_margin``
above their lower bound) and replaced, the predicted gain of the rank's
step time, and the fallback's wall time per step. The default of
``[skrull] cpsat`` follows this table (docs/benchmarks.md, "CP-SAT
fallback").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
from dataclasses import asdict, dataclass

from skrull_ext import Scheduler, SchedulerConfig, lengths
from skrull_ext.scheduler import cost_model as cost_models

CPU_PROFILE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "profiles", "cpu-debug-gloo2.toml")


@dataclass(frozen=True)
class Setting:
    name: str
    dp: int
    cp: int
    per_dp: int
    """Sequences per DP rank in one global batch."""
    bucket_size: int
    dataset: str
    length_scale: float
    max_len: int | None
    cost: str
    """A cost-model preset name, or a profile TOML path."""


SETTINGS: dict[str, Setting] = {
    # The paper's default shape on the assumed H100 (docs/latency.md's batches).
    "paper": Setting("paper", 4, 8, 64, 26624, "mix_sharegpt_conv95+longbench_en5", 1.0, None, "qwen2.5-0.5b"),
    "gpu-cp2": Setting("gpu-cp2", 1, 2, 64, 26624, "mix_sharegpt_conv95+longbench_en5", 1.0, None, "qwen2.5-0.5b"),
    "gpu-cp4-wiki": Setting("gpu-cp4-wiki", 2, 4, 32, 26624, "wikipedia_en_dumpslice.qwen", 1.0, None, "qwen2.5-0.5b"),
    # skrull_ext/jobs/debug_cpu.toml at CP=2 (and DP=2 x CP=2): its data, bucket and measured CPU profile.
    "cpu-job-cp2": Setting("cpu-job-cp2", 1, 2, 8, 256, "sharegpt_v3_conversations.qwen", 32.0, 512, CPU_PROFILE),
    "cpu-job-dp2cp2": Setting("cpu-job-dp2cp2", 2, 2, 4, 256, "sharegpt_v3_conversations.qwen", 32.0, 512, CPU_PROFILE),
}


def _cost(name: str):
    return cost_models.load(name) if name.endswith(".toml") else cost_models.preset(name)


def _pool(s: Setting) -> list[int]:
    """The setting's sequence lengths, scaled and clipped as the synthetic dataset does."""
    out = []
    for raw in lengths.load(s.dataset):
        n = max(1, math.ceil(raw / s.length_scale))
        out.append(n if s.max_len is None else min(n, s.max_len))
    return out


def run_setting(s: Setting, batches: int, seed: int) -> dict:
    cost = _cost(s.cost)
    pool = _pool(s)
    rng = random.Random(seed)
    common = dict(dp=s.dp, cp=s.cp, bucket_size=s.bucket_size, overlength="truncate")
    on = Scheduler(SchedulerConfig(**common, cpsat=True), cost)
    off = Scheduler(SchedulerConfig(**common, cpsat=False), cost)
    tried = [0]
    worth = on._worth_cpsat

    def counting(time_us: float, lower_bound_us: float) -> bool:
        hit = worth(time_us, lower_bound_us)
        tried[0] += hit
        return hit

    on._worth_cpsat = counting
    gains, fallback_ms, step_ms, saved_ms = [], [], [], []
    micro_batches = replaced = 0
    for _ in range(batches):
        batch = [rng.choice(pool) for _ in range(s.dp * s.per_dp)]
        p, q = on.schedule(batch, dp_rank=0), off.schedule(batch, dp_rank=0)
        mine = p.group_micro_batches(0)
        micro_batches += len(mine)
        replaced += sum(1 for mb in mine if mb.path == "cpsat")
        heuristic, refined = q.group_time_us[0], p.group_time_us[0]
        gains.append(1.0 - refined / heuristic if heuristic > 0 else 0.0)
        saved_ms.append((heuristic - refined) / 1e3)
        step_ms.append(heuristic / 1e3)
        fallback_ms.append(p.fallback_us / 1e3)
    return {
        "setting": asdict(s), "batches": batches, "micro_batches": micro_batches,
        "tried": tried[0], "replaced": replaced,
        "mean_gain": statistics.mean(gains), "max_gain": max(gains),
        "predicted_step_ms_mean": statistics.mean(step_ms), "saved_ms_mean": statistics.mean(saved_ms),
        "fallback_ms_mean": statistics.mean(fallback_ms), "fallback_ms_max": max(fallback_ms),
    }


def render(results: list[dict]) -> str:
    rows = [
        "| setting | DP x CP, bucket | cost model | micro-batches (rank 0) | tried | replaced | mean predicted gain "
        "| max gain | predicted step, mean | saved per step, mean | CP-SAT wall per step, mean / max |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        s = r["setting"]
        cost = os.path.basename(s["cost"])
        rows.append(
            f"| {s['name']} | {s['dp']} x {s['cp']}, {s['bucket_size']} | {cost} | {r['micro_batches']} | {r['tried']} | "
            f"{r['replaced']} | {100 * r['mean_gain']:.3f}% | {100 * r['max_gain']:.2f}% | "
            f"{r['predicted_step_ms_mean']:.2f} ms | {1e3 * r['saved_ms_mean']:.1f} us | "
            f"{r['fallback_ms_mean']:.1f} / {r['fallback_ms_max']:.1f} ms |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m skrull_ext.bench cpsat", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS),
                    help="job shapes, data and cost models to measure")
    ap.add_argument("--batches", type=int, default=50, help="global batches per setting")
    ap.add_argument("--seed", type=int, default=0, help="seed of the sampled global batches")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    if args.batches < 1:
        ap.error(f"--batches must be >= 1, got {args.batches}")
    results = [run_setting(SETTINGS[name], args.batches, args.seed) for name in args.settings]
    d = SchedulerConfig(dp=1, cp=2, bucket_size=1)
    print(f"policy {d.policy}, CP-SAT margin {d.cpsat_margin}, limit "
          f"{d.cpsat_deterministic_time} deterministic s, {args.batches} global batches per setting\n")
    print(render(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)
    return 0
