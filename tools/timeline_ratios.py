"""Measured step time against both timelines' predictions, from a run's TensorBoard logs.

    torchrun --standalone --nproc_per_node 2 -m skrull_ext.train --config-file skrull_ext/jobs/debug_cpu.toml \\
        --parallelism.data_parallel_shard_degree 2 --parallelism.context_parallel_degree 1 \\
        --metrics.enable_tensorboard --metrics.save_for_all_ranks --dump_folder outputs/dp2_lockstep
    python tools/timeline_ratios.py outputs/dp2_lockstep [more dump folders ...]

Per dump folder: every logged step's ``skrull/measured_us`` (the trainer's
step as run, train/step_phases.py, the fwd+bwd window before 2026-11-29; with
``--metrics.save_for_all_ranks`` the slowest rank's),
over ``skrull/predicted_lockstep_us`` and ``skrull/predicted_free_us``
(the plan's step on each timeline, docs/design/cost_model.md "Timelines"):
median and 10th-90th percentile over the steps after ``--skip`` (default 1:
the first step warms up), and the steps whose DP ranks had unequal
micro-batch counts (``skrull/rank_micro_batches`` differing across ranks;
the console's ``skrull step N: M micro-batches`` is the slowest rank's).
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
from collections import defaultdict

TAGS = ("skrull/measured_us", "skrull/predicted_us", "skrull/predicted_lockstep_us", "skrull/predicted_free_us",
        "skrull/rank_micro_batches", "skrull/micro_batches")


def read_run(folder: str) -> dict[int, dict[str, list[float]]]:
    """step -> tag -> values over the ranks that logged it (every events file under ``folder``)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    files = sorted(glob.glob(os.path.join(folder, "**", "events.out.tfevents.*"), recursive=True))
    if not files:
        raise SystemExit(f"{folder}: no TensorBoard events (run with --metrics.enable_tensorboard)")
    for path in files:
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        for tag in TAGS:
            if tag in acc.Tags()["scalars"]:
                for ev in acc.Scalars(tag):
                    steps[ev.step][tag].append(ev.value)
    return steps


def quantiles(xs: list[float]) -> tuple[float, float, float]:
    r = sorted(xs)
    q = lambda f: r[min(len(r) - 1, int(f * len(r)))]  # noqa: E731  (as skrull_ext.train.step_checks.RatioSpread)
    return statistics.median(r), q(0.1), q(0.9)


def summarize(folder: str, skip: int) -> str:
    steps = read_run(folder)
    kept = sorted(steps)[skip:]
    rows = []
    for s in kept:
        t = steps[s]
        measured = max(t["skrull/measured_us"])  # the slowest rank's window
        rows.append((s, measured, t["skrull/predicted_lockstep_us"][0], t["skrull/predicted_free_us"][0],
                     t["skrull/predicted_us"][0], sorted(int(x) for x in t["skrull/rank_micro_batches"])))
    lock = quantiles([m / lk for _, m, lk, _, _, _ in rows])
    free = quantiles([m / fr for _, m, _, fr, _, _ in rows])
    unequal = sum(1 for *_, mbs in rows if len(set(mbs)) > 1)
    ranks = max(len(mbs) for *_, mbs in rows)
    fmt = lambda q: f"x{q[0]:.2f} (p10-p90 x{q[1]:.2f}-{q[2]:.2f})"  # noqa: E731
    lines = [f"{folder}: {len(rows)} steps (first {skip} left out), {ranks} rank(s) logged, "
             f"{unequal} step(s) with unequal micro-batch counts across ranks",
             f"  measured / predicted_lockstep  {fmt(lock)}",
             f"  measured / predicted_free      {fmt(free)}",
             f"  mean step: measured {statistics.mean(m for _, m, *_ in rows) / 1e3:.0f} ms, predicted lockstep "
             f"{statistics.mean(r[2] for r in rows) / 1e3:.0f} ms, free {statistics.mean(r[3] for r in rows) / 1e3:.0f} ms"]
    for s, m, lk, fr, pred, mbs in rows:
        lines.append(f"    step {s}: micro-batches per rank {mbs}, measured {m / 1e3:.0f} ms, lockstep {lk / 1e3:.0f} ms "
                     f"(x{m / lk:.2f}), free {fr / 1e3:.0f} ms (x{m / fr:.2f})")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", help="dump folders of runs with --metrics.enable_tensorboard")
    p.add_argument("--skip", type=int, default=1, help="first steps left out (default 1)")
    a = p.parse_args()
    for folder in a.folders:
        print(summarize(folder, a.skip))


if __name__ == "__main__":
    main()
