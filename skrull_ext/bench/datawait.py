"""Data wait per step, with and without prefetch (``[dataloader] prefetch_steps``).

    python -m skrull_ext.bench datawait                      # T = 500 ms, 8 steps, K = 2
    python -m skrull_ext.bench datawait --step-ms 200 --prefetch 4 --json out/datawait.json
    python -m skrull_ext.bench datawait --indexed-lengths    # lengths from an index, as a tokenized source

A training loop whose step takes T ms (``time.sleep``, standing in for the
GPU's forward and backward) asks Skrull's dataloader for each step, as the
trainer does, and times how long it waited. The dataloader is the one a
training rank runs: rank (dp 0, cp 0) of the ``large`` shape of ``bench
latency`` (DP 128 x CP 8, 8192 sequences per global batch, BucketSize
26624), synthetic samples drawn from a shipped length distribution, its cost
model (a preset or a measured profile) and the CP-SAT fallback on. Each step
is drawn, limited, planned, validated and this rank's buffers built. The same
steps are run with prefetch off (K = 0: built when asked) and on (K steps
built ahead on a thread while the loop sleeps), side by side in one run. As
in the trainer, the thread starts the next build once the loop has its step
(``hold_builds``, ``resume_building``: the trainer resumes it once the step's
micro-batches are queued), not while the loop still runs Python on it.

It reports per-step wait (mean, p50, max, in ms and as a share of T) and the
time the data path itself took per step (``SkrullStep.build_us``) and the
CP-SAT fallback's share of it (``--cpsat-margin 0`` tries the solver on
every micro-batch of the rank: the worst case). The first
step of each mode is a warm-up: nothing can be ahead of it, so it is reported
on its own and left out of the statistics.

The synthetic source draws each sample's length from a numpy generator
seeded for it (about 20 us a sample): at 8,192 samples a step that is most
of the data path. ``--indexed-lengths`` reads them from a list made before
the run, as a tokenized source reads its index, so the data path times what
a real source's rank runs: the limit, the plan, its validation, the buffers.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time

from skrull_ext import lengths
from skrull_ext.bench.args import profile_path
from skrull_ext.bench.latency import SETTINGS, cost_model_of, pct
from skrull_ext.data.steps.loader import PREFETCH_MAX, SkrullDataLoader
from skrull_ext.scheduler import Scheduler
from skrull_ext.scheduler import cost_model as cost_models
from skrull_ext.train.job.skrull_config import SkrullConfig

SHAPE = SETTINGS["large"]
"""DP 128 x CP 8, 64 sequences per DP rank, BucketSize 26624 (bench latency's large setting)."""

VOCAB = 151936
"""Token ids of the synthetic samples (Qwen2.5's vocabulary: the preset's model)."""


class IndexedLengths:
    """The synthetic source with its samples' lengths read from a list made before the run,
    as a tokenized source reads them from its index (data/sources/text.py ``_lengths``). The
    synthetic source draws each length from a numpy generator seeded for the sample, about 20
    us, 8,192 a step at this shape: most of the data path, and a cost no real source pays.
    Everything else (tokens, loss counts, the batches' indices) is the synthetic source's."""

    def __init__(self, source, lengths: list[int]) -> None:
        self._source = source
        self._lengths = lengths

    def length(self, index: int) -> int:
        return self._lengths[index] if index < len(self._lengths) else self._source.length(index)

    def __getitem__(self, index: int):
        return self._source[index]

    def __getattr__(self, name: str):
        return getattr(self._source, name)


def _unattached(args, prefetch: int) -> SkrullDataLoader:
    config = SkrullDataLoader.Config(dataset="synthetic", lengths=args.dataset, vocab_size=VOCAB, seed=args.seed,
                                     global_batch_size=SHAPE.dp * SHAPE.per_dp, prefetch_steps=prefetch)
    return config.build(dp_world_size=SHAPE.dp, dp_rank=0)


def length_index(args) -> list[int]:
    """``--indexed-lengths``: the synthetic lengths of every sample the run reads (the warm-up,
    the timed steps and what prefetch builds ahead), drawn once before it."""
    source = _unattached(args, 0).source
    return [source.length(i) for i in range((args.steps + 2 + args.prefetch) * SHAPE.dp * SHAPE.per_dp)]


def build_loader(args, prefetch: int, index: list[int] | None = None) -> SkrullDataLoader:
    """Rank (dp 0, cp 0)'s dataloader of the ``large`` shape, CP-SAT fallback on; with ``index``
    (``length_index``) its source reads the lengths from it."""
    loader = _unattached(args, prefetch)
    if index is not None:
        loader.source = IndexedLengths(loader.source, index)
    section = SkrullConfig(bucket_size=SHAPE.bucket_size, cpsat=not args.no_cpsat,  # [skrull] cpsat = true
                           cpsat_margin=args.cpsat_margin,
                           overlength="truncate")  # as bench latency: the tail past a CP group is cut
    loader.attach(Scheduler(section.scheduler_config(SHAPE.dp, SHAPE.cp, lookahead=1), cost_model_of(args)[0]), 0, SHAPE.cp)
    return loader


def run_mode(args, prefetch: int, index: list[int] | None = None) -> dict:
    """Warm-up + ``args.steps`` steps of a loop that sleeps ``args.step_ms`` per step."""
    loader = build_loader(args, prefetch, index)
    loader.hold_builds = True  # as the trainer: the next step is built once this one is queued (resume_building)
    waits, builds, solver, replaced, first = [], [], [], [], None
    try:
        for n in range(args.steps + 1):
            start = time.perf_counter()
            step = loader.next_step()
            wait_ms = (time.perf_counter() - start) * 1e3
            if n == 0:
                first = {"wait_ms": wait_ms, "build_ms": step.build_us / 1e3}
            else:
                waits.append(wait_ms)
                builds.append(step.build_us / 1e3)
                solver.append(step.plan.fallback_us / 1e3)
                replaced.append(step.plan.summary()["cpsat_used"])
            loader.resume_building()  # the trainer's micro-batches queued: the thread builds while the device runs
            time.sleep(args.step_ms / 1e3)  # the GPU's step
            del step  # freed before the next wait is timed (as the trainer does)
    finally:
        loader.close()
    T = args.step_ms
    return {
        "prefetch_steps": prefetch, "steps": len(waits), "first": first,
        "wait_ms": {"mean": statistics.mean(waits), "p50": pct(waits, 50), "max": max(waits)},
        "wait_pct_of_step": {"mean": 100 * statistics.mean(waits) / T, "p50": 100 * pct(waits, 50) / T,
                             "max": 100 * max(waits) / T},
        "build_ms": {"mean": statistics.mean(builds), "max": max(builds)},
        "cpsat_ms": {"mean": statistics.mean(solver), "max": max(solver)},
        "cpsat_replaced_per_step": statistics.mean(replaced),
    }


def render(results: list[dict], step_ms: float) -> str:
    rows = ["| prefetch_steps | wait mean | wait p50 | wait max | wait mean / T | wait max / T | "
            "data path per step, mean / max | of which CP-SAT, mean / max | first step (wait) |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        w, p, b, c = r["wait_ms"], r["wait_pct_of_step"], r["build_ms"], r["cpsat_ms"]
        rows.append(f"| {r['prefetch_steps']}{' (off)' if not r['prefetch_steps'] else ''} | {w['mean']:.2f} ms | "
                    f"{w['p50']:.2f} ms | {w['max']:.2f} ms | {p['mean']:.3f}% | {p['max']:.3f}% | "
                    f"{b['mean']:.0f} / {b['max']:.0f} ms | {c['mean']:.1f} / {c['max']:.1f} ms | "
                    f"{r['first']['wait_ms']:.0f} ms |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m skrull_ext.bench datawait", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--step-ms", type=float, default=500.0, help="T: the training step's time (a sleep)")
    ap.add_argument("--steps", type=int, default=8, help="steps timed per mode (after one warm-up step)")
    ap.add_argument("--prefetch", type=int, default=2, help="prefetch_steps K of the prefetching run")
    ap.add_argument("--dataset", default="mix_sharegpt_conv95+longbench_en5", choices=lengths.names(),
                    help="shipped length distribution the synthetic samples follow")
    ap.add_argument("--model", default="qwen2.5-0.5b", choices=sorted(cost_models.MODEL_PRESETS),
                    help="cost-model preset")
    ap.add_argument("--profile", type=profile_path, help="a profile TOML from python -m skrull_ext.profile (overrides --model)")
    ap.add_argument("--no-cpsat", action="store_true", help="the CP-SAT fallback off ([skrull] cpsat = false)")
    ap.add_argument("--cpsat-margin", type=float, default=SkrullConfig().cpsat_margin,
                    help="[skrull] cpsat_margin: 0 tries CP-SAT on every micro-batch of the rank (the worst case)")
    ap.add_argument("--seed", type=int, default=0, help="dataloader seed")
    ap.add_argument("--indexed-lengths", action="store_true",
                    help="read the samples' lengths from a list made before the run, as a tokenized source reads "
                         "its index, instead of drawing each from a generator seeded for it (the synthetic "
                         "source's way, most of the data path at this shape)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error(f"--steps must be >= 1, got {args.steps}")
    if not 1 <= args.prefetch <= PREFETCH_MAX:
        ap.error(f"--prefetch must be in 1..{PREFETCH_MAX}, got {args.prefetch}")
    if args.step_ms <= 0:
        ap.error(f"--step-ms must be > 0, got {args.step_ms}")
    try:  # the section's own range check, before any loader is built
        SkrullConfig(cpsat_margin=args.cpsat_margin)
    except ValueError as e:
        ap.error(f"--cpsat-margin: {e}")
    if not args.no_cpsat:  # imported at its first solve (0.4 s, once a run): not inside one mode's timed steps
        importlib.import_module("ortools.sat.python.cp_model")
    index = length_index(args) if args.indexed_lengths else None
    results = [run_mode(args, 0, index), run_mode(args, args.prefetch, index)]
    cfg = build_loader(args, 0).scheduler.job
    print(f"rank (dp 0, cp 0) of DP {SHAPE.dp} x CP {SHAPE.cp}, {SHAPE.dp * SHAPE.per_dp} sequences per step "
          f"({args.dataset}), bucket {SHAPE.bucket_size}, policy {cfg.policy.name}, CP-SAT "
          f"{'on' if cfg.uses_cpsat else 'off'} (margin {cfg.cpsat_margin:g}, limit {cfg.cpsat_deterministic_time:g} "
          f"deterministic s; {statistics.mean(r['cpsat_replaced_per_step'] for r in results):.1f} of the rank's "
          f"micro-batches replaced per step), cost model: {cost_model_of(args)[1]}; step T = {args.step_ms:g} ms, "
          f"{args.steps} steps per mode after one warm-up; the samples' lengths "
          f"{'read from an index made before the run' if args.indexed_lengths else 'drawn per sample (synthetic)'}\n")
    print(render(results, args.step_ms))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)
    return 0
