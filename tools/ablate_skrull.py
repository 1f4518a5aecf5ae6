"""Which of skrull's changes over skrull-paper pay, measured in the simulator.

    PYTHONPATH=. python tools/ablate_skrull.py [--iterations 30]

Each variant is 'skrull' with one knob set back to the paper's choice
(skrull_ext.scheduler.config.POLICIES, registered here in this process only), run on
the default benchmark cells (paper and real suites, paper shapes, assumed
H100). Prints a markdown table: mean iteration time of each variant over
skrull's (1.000 = no effect, above = skrull's knob helps), skrull's gap to
the bound, and its DP imbalance (slowest / mean DP rank), which tells
whether a DP split by predicted time could pay.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace

from skrull_ext import _core
from skrull_ext.scheduler import config
from skrull_ext.scheduler import cost_model as cost_models
from skrull_ext.sim import policies as sim_policies
from skrull_ext.sim import scenarios, simulator

BASE = config.POLICIES["skrull"]
VARIANTS = {
    "no sweep": replace(BASE, dacp_search=_core.DacpSearch.HEURISTIC),
    "no refine": replace(BASE, refine=False),
    "neither": replace(BASE, refine=False, dacp_search=_core.DacpSearch.HEURISTIC),
    "no CP-SAT": replace(BASE, fallback=False),
    "smallest m": replace(BASE, micro_batch_count=_core.MicroBatchCount.SMALLEST_FEASIBLE),
    "shortest roll-back": replace(BASE, rollback=_core.Rollback.SHORTEST),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    names = []
    for label, policy in VARIANTS.items():
        name = "ablate:" + label
        config.POLICIES[name] = replace(policy, name=name)
        sim_policies.SIM_POLICIES[name] = sim_policies.SimPolicy(name, sim_policies.core_policy(name), label)
        names.append(name)
    run = ["skrull", *names, "skrull-paper", "bound"]
    profile = cost_models.hardware()
    started = time.perf_counter()
    rows = []
    for cell in scenarios.grid(scenarios.SUITES["all"], scenarios.MODELS):
        res = simulator.simulate(cell, run, args.iterations, args.seed, profile)
        ours = res.mean_time_us("skrull")
        imbalance = statistics.fmean(m.dp_imbalance for m in res.per_policy["skrull"])
        rows.append((f"{cell.dataset} / {cell.model}",
                     [res.mean_time_us(n) / ours for n in [*names, "skrull-paper"]],
                     res.gap_to_bound("skrull"), imbalance, statistics.fmean(
                         m.scheduler_us for m in res.per_policy["skrull"]) / 1e3))
    head = ["cell", *VARIANTS, "skrull-paper", "skrull gap", "skrull DP imbalance", "sched ms"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for cell, ratios, gap, imbalance, sched in rows:
        print(f"| {cell} | " + " | ".join(f"{r:.3f}" for r in ratios)
              + f" | {100 * gap:.1f}% | {imbalance:.3f} | {sched:.1f} |")
    means = [statistics.fmean(r[1][i] for r in rows) for i in range(len(VARIANTS) + 1)]
    print("| **mean** | " + " | ".join(f"**{m:.3f}**" for m in means)
          + f" | **{100 * statistics.fmean(r[2] for r in rows):.1f}%** | "
          + f"**{statistics.fmean(r[3] for r in rows):.3f}** | |")
    print(f"\n{len(rows)} cells x {args.iterations} iterations, {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
