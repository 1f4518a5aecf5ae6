"""Scheduler latency: how long one global batch takes to plan, and one look-ahead window.

    python -m skrull_ext.bench latency                 # paper default + large setting, look-ahead rows
    python -m skrull_ext.bench latency --reps 500 --json out/latency.json
    python -m skrull_ext.bench latency --settings large --chunked 0 4 --timelines free --lookahead-settings
    python -m skrull_ext.bench latency --settings --profile profiles/h200-qwen2.5-0.5b.toml \
        --lookahead-reference                          # look-ahead rows only, against full pricing

For each setting it draws global batches from a real length file and times,
on the same batches in one run: the C++ core (wall time of the Python call,
conversions included, and the core's own clock), the plain-Python reference
of the same algorithm, and the CP-SAT exact solve of the batch's
micro-batches (for scale). It prints p50/p99 per global batch and ratios.
Times drift on a shared machine; the ratios are the result.

Then the look-ahead rows (lookahead_latency.py): one window of W global
batches regrouped by the core at DP 4, 16, 64 and 128 x CP 8, its planning
time against the predicted time of the steps it plans.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass

from tqdm import tqdm

from skrull_ext import POLICIES, Scheduler, SchedulerConfig, _core, lengths
from skrull_ext.bench import lookahead_latency
from skrull_ext.bench.args import at_least, profile_path
from skrull_ext.bench import reference as ref
from skrull_ext.bench import reference_chunked as ref_chunked
from skrull_ext.bench import reference_slots as ref_slots
from skrull_ext.scheduler import cost_model as cost_models
from skrull_ext.scheduler.config import TIMELINES
from skrull_ext.scheduler.cpsat import solve_dacp
from skrull_ext.scheduler.scheduler import chunked_docs


@dataclass(frozen=True)
class Setting:
    name: str
    dp: int
    cp: int
    per_dp: int  # sequences per DP rank
    bucket_size: int


SETTINGS: dict[str, Setting] = {
    "paper": Setting("paper", dp=4, cp=8, per_dp=64, bucket_size=26624),  # <DP=4, CP=8, BS=64>, 0.5B
    "dp16": Setting("dp16", dp=16, cp=8, per_dp=64, bucket_size=26624),
    "dp64": Setting("dp64", dp=64, cp=8, per_dp=64, bucket_size=26624),
    "large": Setting("large", dp=128, cp=8, per_dp=64, bucket_size=26624),  # 8192 sequences
}
DEFAULT_SETTINGS = ("paper", "large")
"""Shapes of the per-batch table by default (the look-ahead rows take every one)."""


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def draw(pool: list[int], n: int, rng: random.Random) -> list[int]:
    return [rng.choice(pool) for _ in range(n)]


def cost_model_of(args) -> tuple[_core.CostModel, str]:
    """The measured profile if one is given, else the named preset on the assumed H100."""
    if args.profile:
        return cost_models.load(args.profile), f"measured profile {args.profile}"
    return cost_models.preset(args.model), f"preset {args.model} on h100-assumed (assumed, not measured)"


def run_setting(s: Setting, args, pool: list[int]) -> dict:
    cost, _ = cost_model_of(args)
    rng = random.Random(args.seed)
    k = s.dp * s.per_dp
    batches = [draw(pool, k, rng) for _ in range(args.reps)]
    limit = _core.max_sequence_length(s.bucket_size, s.cp)
    out: dict = {"setting": asdict(s), "sequences": k, "policies": {}}
    for policy, timeline, n_chunked in [(p, t, c) for p in args.policies for t in args.timelines for c in args.chunked]:
        cfg = SchedulerConfig(dp=s.dp, cp=s.cp, bucket_size=s.bucket_size, policy=policy,
                              overlength="chunk" if n_chunked else "truncate", timeline=timeline)
        opts = cfg.core_options()
        p = cfg.policy_spec
        if n_chunked and p.pool:
            continue  # the pool's plans take chunked documents after the core (Scheduler.schedule)
        # overlength = "chunk": each batch's documents of 2-6x what a CP group holds, with its own samples beyond
        # that, priced as the loader does; the rest planned.
        docs = [[x for x in b if x > limit] + [rng.randint(2 * limit, 6 * limit) for _ in range(n_chunked)]
                for b in batches] if n_chunked else [[] for _ in batches]
        planned = [[x for x in b if x <= limit] for b in batches] if n_chunked else batches
        pricer = Scheduler(cfg, cost)
        t0 = time.perf_counter_ns()
        docs_us = [(priced.us, priced.passes, d, priced.last)
                   for priced, d in ((chunked_docs(pricer.job, d), d) for d in docs)]
        price_us = (time.perf_counter_ns() - t0) / 1e3 / len(batches)
        core = _core.schedule_pool if p.pool else _core.schedule
        rcost = ref.RefCost.of(cost)
        for b, d in list(zip(planned, docs_us))[:3]:  # warm-up
            core(b, cost, opts, *d) if n_chunked else core(b, cost, opts)
        wall, inner, alone = [], [], []
        for b, d in tqdm(list(zip(planned, docs_us)), desc=f"{s.name}/{policy} C++", leave=False):
            t0 = time.perf_counter_ns()
            sched = core(b, cost, opts, *d) if n_chunked else core(b, cost, opts)
            wall.append((time.perf_counter_ns() - t0) / 1e3)
            inner.append(sched.elapsed_us)
            if n_chunked:  # the same planned samples without the documents, interleaved: the ratio is the result
                alone.append(core(b, cost, opts).elapsed_us)
        py_reps = max(1, min(args.reps, args.python_reps if s.name == "paper" else max(1, args.python_reps // 10)))
        py = []
        if p.pool:  # skrull-pool has no Python reference
            py_reps = 0
        ref_options = dict(worst_fit=p.placement == _core.Placement.WORST_FIT,
                           longest_rollback=p.rollback == _core.Rollback.LONGEST,
                           predicted_time=p.micro_batch_count == _core.MicroBatchCount.PREDICTED_TIME,
                           max_extra=cfg.max_extra_micro_batches, overlength="truncate", refine_=p.refine,
                           sweep=p.dacp_search == _core.DacpSearch.SHARD_SWEEP)
        lockstep = opts.timeline == _core.Timeline.LOCKSTEP
        for b, d in tqdm(list(zip(planned, docs_us))[:py_reps], desc=f"{s.name}/{policy} Python", leave=False):
            t0 = time.perf_counter_ns()
            if opts.slot_gds or n_chunked:  # the references of slot GDS and of chunked documents
                (ref_slots if opts.slot_gds else ref_chunked).schedule(
                    b, rcost, s.dp, s.cp, s.bucket_size, list(d[0]), list(zip(d[1], d[2], d[3])), lockstep,
                    **ref_options)
            else:
                ref.schedule(b, rcost, s.dp, s.cp, s.bucket_size, **ref_options)
            py.append((time.perf_counter_ns() - t0) / 1e3)
        facade = []
        fb_cfg = SchedulerConfig(dp=s.dp, cp=s.cp, bucket_size=s.bucket_size, policy=policy,
                                 overlength="chunk" if n_chunked else "truncate", cpsat=True,
                                 timeline=timeline)  # the fallback on (off by default): what it costs
        sched_py = Scheduler(fb_cfg, cost)
        for b, d in list(zip(planned, docs))[: args.facade_reps]:
            t0 = time.perf_counter_ns()
            sched_py.schedule(b, chunked=d)
            facade.append((time.perf_counter_ns() - t0) / 1e3)
        label = f"{policy} ({timeline})" + (f" +{n_chunked} chunked" if n_chunked else "")
        mean_docs = sum(map(len, docs)) / len(docs)
        out["policies"][label] = {
            "chunked": n_chunked, "chunk_pricing_us": price_us if n_chunked else None, "mean_documents": mean_docs,
            "without_documents_core_us": {"p50": pct(alone, 50), "min": min(alone)} if alone else None,
            "cpp_wall_us": {"p50": pct(wall, 50), "p99": pct(wall, 99), "max": max(wall), "n": len(wall)},
            "cpp_core_us": {"p50": pct(inner, 50), "p99": pct(inner, 99), "max": max(inner), "min": min(inner)},
            "python_ref_us": {"p50": pct(py, 50) if py else None, "p99": pct(py, 99) if py else None, "n": len(py)},
            "facade_us": {"p50": pct(facade, 50), "max": max(facade), "n": len(facade),
                          "cpsat": sched_py.job.uses_cpsat},
            "speedup_p50": pct(py, 50) / pct(wall, 50) if py else None,
        }
    # CP-SAT exact solve of the same batches' micro-batches, for scale.
    cfg = SchedulerConfig(dp=s.dp, cp=s.cp, bucket_size=s.bucket_size, policy="skrull", overlength="truncate", cpsat=False)
    sched = Scheduler(cfg, cost)
    solve_us, gains, n_mb = [], [], 0
    for b in tqdm(batches[: args.cpsat_batches], desc=f"{s.name} CP-SAT", leave=False):
        plan = sched.schedule(b)
        t0 = time.perf_counter_ns()
        for mb in plan.micro_batches[: args.cpsat_max_mb]:
            res = solve_dacp(mb.lengths, cost, s.cp, s.bucket_size, args.cpsat_time, hint=mb.cp_rank)
            n_mb += 1
            if res.cp_rank is not None:
                r = _core.evaluate_placement(mb.lengths, res.cp_rank, cost, s.cp, s.bucket_size)
                gains.append(1.0 - min(r.time_us, mb.time_us) / mb.time_us)
        solve_us.append((time.perf_counter_ns() - t0) / 1e3)
    out["cpsat"] = {
        "per_batch_us_p50": pct(solve_us, 50) if solve_us else None,
        "micro_batches": n_mb,
        "deterministic_limit_s": args.cpsat_time,
        "mean_predicted_gain": statistics.mean(gains) if gains else None,
    }
    return out


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def render(results: list[dict]) -> str:
    rows = [
        "| setting | seqs | policy | C++ p50 us | C++ p99 us | C++ max us | core p50 us | Python p50 us | Python/C++ | facade p50 us |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        for policy, p in r["policies"].items():
            priced = p.get("chunk_pricing_us")
            if priced is not None:  # the loader prices a step's documents (chunk_cost) before the core
                alone = p["without_documents_core_us"]
                policy += (f" ({p['mean_documents']:.1f} a batch, priced in {priced:.0f} us; core "
                           f"{p['cpp_core_us']['min'] / alone['min']:.2f}x (min), "
                           f"{p['cpp_core_us']['p50'] / alone['p50']:.2f}x (p50) the same samples without them)")
            rows.append(
                f"| {r['setting']['name']} | {r['sequences']} | {policy} | {p['cpp_wall_us']['p50']:.1f} | "
                f"{p['cpp_wall_us']['p99']:.1f} | {p['cpp_wall_us']['max']:.1f} | {p['cpp_core_us']['p50']:.1f} | "
                f"{_fmt(p['python_ref_us']['p50'], '.0f')} | {_fmt(p['speedup_p50'], '.0f')}x | "
                f"{p['facade_us']['p50']:.0f}"
                f"{' (CP-SAT on)' if p['facade_us']['cpsat'] else ''} |"
            )
    rows.append("")
    rows.append("| setting | CP-SAT exact, per global batch p50 | micro-batches solved | mean predicted gain vs heuristic |")
    rows.append("|---|---:|---:|---:|")
    for r in results:
        c = r["cpsat"]
        if c["per_batch_us_p50"] is None:
            continue
        gain = f"{100 * c['mean_predicted_gain']:.2f}%" if c["mean_predicted_gain"] is not None else "n/a"
        rows.append(f"| {r['setting']['name']} | {c['per_batch_us_p50'] / 1e3:.1f} ms (limit {c['deterministic_limit_s']} det. s "
                    f"per micro-batch) | {c['micro_batches']} | {gain} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m skrull_ext.bench latency", description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--dataset", default="mix_sharegpt_conv95+longbench_en5", choices=lengths.names(),
                    help="shipped length distribution the global batches are drawn from")
    ap.add_argument("--model", default="qwen2.5-0.5b", choices=sorted(cost_models.MODEL_PRESETS),
                    help="cost-model preset")
    ap.add_argument("--profile", type=profile_path,
                    help="a profile TOML from python -m skrull_ext.profile (overrides --model)")
    ap.add_argument("--settings", nargs="*", default=list(DEFAULT_SETTINGS), choices=list(SETTINGS),
                    help="job shapes (DP x CP, batch) of the per-batch table (none: the look-ahead rows only)")
    ap.add_argument("--policies", nargs="+", default=["skrull", "skrull-paper"], choices=sorted(POLICIES),
                    help="scheduling policies to time")
    ap.add_argument("--timelines", nargs="+", default=["lockstep", "free"], choices=sorted(TIMELINES),
                    help="timelines to plan for: lockstep uses the slot GDS where the policy has it, free the "
                         "per-rank GDS")
    ap.add_argument("--chunked", nargs="+", type=int, default=[0], metavar="K",
                    help="overlength = 'chunk': K documents of 2-6x what a CP group holds added to each global batch, "
                         "its own samples beyond that chunked too: a row per K (0: the plain rows, over-length "
                         "samples truncated); the core assigns the documents and plans around them")
    ap.add_argument("--reps", type=int, default=200, help="global batches timed per setting and policy")
    ap.add_argument("--python-reps", type=at_least(0), default=30, help="batches for the Python reference (a tenth at 'large')")
    ap.add_argument("--facade-reps", type=at_least(1), default=10, help="batches through the full Scheduler (CP-SAT fallback on)")
    ap.add_argument("--cpsat-batches", type=at_least(0), default=2, help="global batches timed with CP-SAT on every micro-batch")
    ap.add_argument("--cpsat-max-mb", type=at_least(0), default=16, help="micro-batches solved per batch")
    ap.add_argument("--cpsat-time", type=float, default=0.2, help="deterministic seconds per micro-batch")
    ap.add_argument("--seed", type=int, default=0, help="seed of the sampled global batches")
    ap.add_argument("--lookahead-settings", nargs="*", default=list(SETTINGS), choices=list(SETTINGS),
                    help="job shapes of the look-ahead rows (none: no look-ahead rows)")
    ap.add_argument("--lookahead-datasets", nargs="+", default=["mix_sharegpt_conv95+longbench_en5"],
                    choices=lengths.names(), help="length files the look-ahead windows are drawn from")
    ap.add_argument("--lookahead-width", type=int, default=8, help="global batches in one window (W)")
    ap.add_argument("--lookahead-windows", type=int, default=3, help="windows timed per shape and length file")
    ap.add_argument("--lookahead-timeline", default="lockstep", choices=sorted(TIMELINES),
                    help="timeline the look-ahead's steps are planned for")
    ap.add_argument("--lookahead-reference", action="store_true",
                    help="also regroup the same windows by the look-ahead before its screening (every candidate "
                         "planned in full; a Python reference, slow at DP 128) and print its predicted gain beside")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error(f"--reps must be >= 1, got {args.reps}")
    if any(c < 0 for c in args.chunked):
        ap.error(f"--chunked must be >= 0, got {args.chunked}")
    if not 1 <= args.lookahead_width <= _core.MAX_LOOKAHEAD:
        ap.error(f"--lookahead-width must be in [1, {_core.MAX_LOOKAHEAD}], got {args.lookahead_width}")
    if not args.cpsat_time > 0:
        ap.error(f"--cpsat-time must be > 0 (deterministic seconds), got {args.cpsat_time}")
    if args.lookahead_windows < 1:
        ap.error(f"--lookahead-windows must be >= 1, got {args.lookahead_windows}")
    pool = lengths.load(args.dataset)
    results = [run_setting(SETTINGS[name], args, pool) for name in tqdm(args.settings, desc="settings")]
    cost, cost_label = cost_model_of(args)
    if results:
        print(f"dataset {args.dataset}, cost model: {cost_label}, "
              f"{args.reps} global batches per setting and policy\n")
        print(render(results))
    windows = []
    if args.lookahead_settings:
        bucket = lookahead_bucket(args)
        windows = [lookahead_latency.run_shape(lookahead_latency.Shape(s.name, s.dp, s.cp, s.per_dp), dataset, cost,
                                               bucket, args)
                   for dataset in args.lookahead_datasets for s in map(SETTINGS.get, args.lookahead_settings)]
        print(f"\nLook-ahead: windows of {args.lookahead_width} global batches, {args.lookahead_timeline}, cost model: "
              f"{cost_label}, BucketSize {bucket}, skrull; median over {args.lookahead_windows} windows (shares "
              f"and gains: summed over them)\n")
        print(lookahead_latency.render(windows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results, "lookahead": windows}, f, indent=2)
    return 0


def lookahead_bucket(args) -> int:
    """BucketSize of the look-ahead rows: the profile's [memory] bucket_size where it has one
    (what a job on that hardware plans with), else the settings' 26,624."""
    if args.profile:
        from skrull_ext.scheduler.profile_file import Profile

        bucket = Profile.load(args.profile).bucket_size
        if bucket:
            return int(bucket)
    return SETTINGS["paper"].bucket_size
