"""Worst-case scheduler time on adversarial global batches.

    python -m skrull_ext.bench adversarial                       # 1K, 10K, 50K sequences
    python -m skrull_ext.bench adversarial --sizes 1000 100000 --json out/adversarial.json

Each family is built to push one loop of the core to its bound: the
micro-batch count search (sequences that must sit alone, so the feasible
count is far above the token bound), DACP's roll-backs, the refinement's
moves, the shard sweep's candidates, zigzag padding. For every family, size and policy it times
``_core.schedule`` (wall time of the call, conversions included, and the
core's own clock) and prints the slowest of ``--reps`` calls. The bounds
these figures test are argued in cpp/include/skrull/{dacp,gds}.hpp and
docs/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from skrull_ext.bench.args import at_least
from skrull_ext import POLICIES, SchedulerConfig, _core
from skrull_ext.scheduler import cost_model as cost_models

C = 26624  # BucketSize of Qwen2.5-0.5B in the paper


@dataclass(frozen=True)
class Family:
    name: str
    dp: int
    cp: int
    bucket: Callable[[int], int]  # from the number of sequences
    lengths: Callable[[int, int, int], list[int]]  # (n, cp, bucket) -> lengths
    note: str


def _limit(bucket: int, cp: int) -> int:
    return _core.max_sequence_length(bucket, cp)


FAMILIES: list[Family] = [
    Family("all_equal", 4, 8, lambda n: C, lambda n, cp, b: [4096] * n, "every sequence 4096 tokens"),
    Family("just_above_C_over_N", 4, 8, lambda n: C, lambda n, cp, b: [b // cp + 1] * n,
           "BucketSize/N + 1: one token too many for N per rank"),
    Family("just_above_C", 4, 8, lambda n: C, lambda n, cp, b: [b + 1] * n,
           "BucketSize + 1: none fits one rank, all sharded"),
    Family("giant_plus_tiny", 1, 8, lambda n: C, lambda n, cp, b: [_limit(b, cp)] + [1] * (n - 1),
           "one sequence filling the CP group, n-1 of one token"),
    Family("all_at_limit", 4, 8, lambda n: C, lambda n, cp, b: [_limit(b, cp)] * n,
           "every sequence fills the CP group: one per micro-batch"),
    Family("bucket_plus_one_cp2", 1, 2, lambda n: 13312, lambda n, cp, b: [b + 1] * n,
           "CP=2, BucketSize + 1: one per micro-batch, count bound n/2"),
    Family("zigzag_padding", 1, 8, lambda n: 4, lambda n, cp, b: [2 * cp + 1] * n,
           "2N + 1 tokens on a 4-token bucket: padding fills every rank"),
    Family("rollback_storm", 1, 2, lambda n: 2 * (n - 1) + 600, lambda n, cp, b: [4] * (n - 1) + [1201],
           "n-1 four-token sequences, then one needing room: roll-back after roll-back"),
    Family("tiny_one_group", 1, 8, lambda n: n + 64, lambda n, cp, b: [8] * n,
           "n eight-token sequences in one micro-batch: the shard sweep's candidates"),
    Family("ramp_one_group", 1, 8, lambda n: -(-n * (n + 1) // 2 // 8) + n, lambda n, cp, b: list(range(1, n + 1)),
           "lengths 1..n in one micro-batch: the refinement's longest search"),
]


def run(sizes: list[int], reps: int, policies: list[str], model: str) -> list[dict]:
    cost = cost_models.preset(model)
    rows = []
    for fam in FAMILIES:
        for n in sizes:
            bucket = min(fam.bucket(n), _core.MAX_BUCKET_SIZE)
            lengths = fam.lengths(n, fam.cp, bucket)
            for policy in policies:
                cfg = SchedulerConfig(dp=fam.dp, cp=fam.cp, bucket_size=bucket, policy=policy, overlength="truncate",
                                      cpsat=False)
                opts = cfg.core_options()
                wall, core = [], []
                for _ in range(reps):
                    t0 = time.perf_counter()
                    s = _core.schedule(lengths, cost, opts)
                    wall.append((time.perf_counter() - t0) * 1e3)
                    core.append(s.elapsed_us / 1e3)
                rows.append({
                    "family": fam.name, "sequences": n, "dp": fam.dp, "cp": fam.cp, "bucket_size": bucket,
                    "policy": policy, "micro_batches": len(s.micro_batches), "rollbacks": s.rollbacks,
                    "moves": s.moves, "max_wall_ms": max(wall), "max_core_ms": max(core),
                })
                print(f"  {fam.name:22s} n={n:<7d} {policy:12s} {max(wall):9.2f} ms", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    out = ["| family | seqs | policy | micro-batches | roll-backs | moves | max wall ms | max core ms |",
           "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['family']} | {r['sequences']} | {r['policy']} | {r['micro_batches']} | {r['rollbacks']} | "
                   f"{r['moves']} | {r['max_wall_ms']:.2f} | {r['max_core_ms']:.2f} |")
    worst = max(rows, key=lambda r: r["max_wall_ms"])
    out.append(f"\nworst case: {worst['max_wall_ms']:.2f} ms ({worst['family']}, {worst['sequences']} sequences, "
               f"{worst['policy']})")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m skrull_ext.bench adversarial", description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--sizes", type=at_least(1), nargs="+", default=[1000, 10000, 50000], help="sequences per global batch")
    ap.add_argument("--reps", type=at_least(1), default=3, help="calls per case; the slowest is reported")
    ap.add_argument("--policies", nargs="+", default=sorted(POLICIES), choices=sorted(POLICIES),
                    help="scheduling policies to time")
    ap.add_argument("--model", default="qwen2.5-0.5b", choices=sorted(cost_models.MODEL_PRESETS),
                    help="cost-model preset")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    rows = run(args.sizes, args.reps, args.policies, args.model)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sizes": args.sizes, "reps": args.reps, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
