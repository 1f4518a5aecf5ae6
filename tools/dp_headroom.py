"""How much of a policy's gap to the bound could a better DP split win at all?

    PYTHONPATH=. python tools/dp_headroom.py outputs/simulate/results.json [--policy skrull]

Reads a `python -m skrull_ext.bench simulate` results.json (every iteration's
time, bound and DP imbalance = slowest / mean DP rank) and rebuilds the same
global batches (dataset, shape, seed from the file) to tell which term of the
bound (skrull_ext/sim/bound.py) is binding: total work spread over DP x CP,
or the longest sequence's own time. Per cell it prints:

- gap: mean over iterations of time / bound - 1 (the benchmark's figure);
- DP imb.: mean of slowest / mean DP rank time;
- DP headroom: mean of (time - max(time / imbalance, bound)) / bound, the part
  of the gap above both the mean DP rank and the bound. Spreading the same
  work evenly cannot end below the mean DP rank, and no plan ends below the
  bound, so this is what a DP split by predicted time could remove at most
  (an estimate, not a proof: a new split also regroups the micro-batches);
- long-seq iters: share of iterations whose bound is the longest sequence's
  own time, with the gap and imbalance of those iterations and of the others.

Reads only; the scheduler is not run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from skrull_ext.scheduler import cost_model as cost_models
from skrull_ext.sim import bound, simulator
from skrull_ext.sim.packing import Shape


def _shape(text: str, timeline: str) -> Shape:
    dims, c = text.split(", C=")
    dp, cp, bs = (int(x) for x in dims.split("x"))
    return Shape(dp=dp, cp=cp, batch_size=bs, bucket_size=int(c), timeline=timeline)


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="results.json of a simulate run")
    ap.add_argument("--policy", default="skrull")
    args = ap.parse_args(argv)
    data = json.loads(Path(args.results).read_text())
    seed, iterations = data["meta"]["seed"], data["meta"]["iterations"]
    timeline = data["meta"].get("timeline", "free")  # runs before timelines were the paper's
    profile = cost_models.hardware()
    head = ["cell", "gap", "DP imb.", "DP headroom", "long-seq iters", "gap (long-seq / other)",
            "DP imb. (long-seq / other)"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    all_rows = []
    for cell in data["iterations"]:
        ms = cell["per_policy"][args.policy]
        shape = _shape(cell["shape"], timeline)
        cost = profile.cost_model(cost_models.shape(cell["model"]), repr(cell["model"]))
        batches, _ = simulator.global_batches(cell["dataset"], shape, iterations, seed)
        gap, imb, head_room, long_gap, long_imb, other_gap, other_imb = [], [], [], [], [], [], []
        for m, batch in zip(ms, batches):
            b = m["bound_us"]
            work = bound.work_bound_us(batch, cost, shape.dp, shape.cp, shape.bucket_size)
            longest = bound.longest_bound_us(batch, cost, shape.cp, shape.bucket_size)
            want = bound.lower_bound_us(batch, cost, shape.dp, shape.cp, shape.bucket_size, timeline)
            assert abs(want - b) <= 1e-6 * b, "results.json does not match the rebuilt batches"
            g = m["time_us"] / b - 1.0
            gap.append(g)
            imb.append(m["dp_imbalance"])
            head_room.append(max(0.0, m["time_us"] - max(m["time_us"] / m["dp_imbalance"], b)) / b)
            (long_gap if longest >= work else other_gap).append(g)
            (long_imb if longest >= work else other_imb).append(m["dp_imbalance"])
        row = (f"{cell['dataset']} / {cell['model']}", _mean(gap), _mean(imb), _mean(head_room),
               len(long_gap) / len(ms), _mean(long_gap), _mean(other_gap), _mean(long_imb), _mean(other_imb))
        all_rows.append(row)
        print(f"| {row[0]} | {_pct(row[1])} | {_ratio(row[2])} | {_pct(row[3])} | {100 * row[4]:.0f}% | "
              f"{_pct(row[5])} / {_pct(row[6])} | {_ratio(row[7])} / {_ratio(row[8])} |")
    print(f"| **mean** | **{_pct(_mean([r[1] for r in all_rows]))}** | **{_ratio(_mean([r[2] for r in all_rows]))}** "
          f"| **{_pct(_mean([r[3] for r in all_rows]))}** | {100 * _mean([r[4] for r in all_rows]):.0f}% | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
