"""torchtitan's own CP against Skrull, in training, side by side.

    python -m skrull_ext.bench cp                       # debug job, CP=2, 3 repeats
    python -m skrull_ext.bench cp --repeats 5 --steps 12 --out outputs/bench_cp

Every mode trains the same job (model, seed, global batches) at the same CP
degree under torchrun; modes differ only in the flags they add (``--variant
NAME=FLAGS``). The default modes:

- ``torchtitan``: ``--skrull.no-enable``, torchtitan's trainer and batching
  (each global batch packed into ``training.seq_len`` rows, every row sharded
  over the CP group, K/V all-gathered by torchtitan's CP attention);
- ``torchtitan-stream``: the same with ``--dataloader.packing stream`` and
  one row a step: the samples as one stream cut into full rows, no padding,
  a document-causal mask (data/steps/row_layout.py), the strongest baseline
  torchtitan's CP runs on chat data; its steps hold a row's tokens, not a
  global batch, hence the per-token ratios;
- ``torchtitan-documents``: the same rows, whole samples placed best-fit
  decreasing (``--dataloader.packing documents``), none cut, what does not
  fit carried to the next step: the whole-document baseline a fine-tuning
  user would otherwise run;
- ``skrull``: the job's ``[skrull]`` section as written, the default
  configuration (``free_running = "auto"``: free-running where the profile's
  memory account allows): the plan and the DACP attention;
- ``skrull-lockstep``: the same with ``--skrull.no-free_running``: FSDP's
  gathers per micro-batch, the execution the default chose against.

At CP 1 a stream row holds ``training.seq_len`` tokens a rank and Skrull
``bucket_size``: add ``--variant skrull-eqmem=--skrull.bucket_size N`` with
N = seq_len / CP to compare at equal activation memory (docs/benchmarks.md).

Runs alternate (torchtitan, skrull, skrull, torchtitan, ...) so drift in the
machine's load hits both. ``cp_probe`` measures per step and rank the K/V
bytes of the attention exchange, the time blocked on it, the local attention
that DACP runs meanwhile and the step wall time. Reported: bytes per step
(summed over ranks), step time per run (mean over the measured steps of
the slowest rank's time) as min/median/max over repeats, the paired per-repeat
ratio against each baseline (every mode run with ``--skrull.no-enable``, and
each ``--versus`` mode) on time per real token (the loaders count them), and
blocked/overlapped time. A script, not a test: nothing asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

BASELINE = "torchtitan"
DEFAULT_VARIANTS = [
    f"{BASELINE}=--skrull.no-enable",
    f"{BASELINE}-stream=--skrull.no-enable --dataloader.packing stream --training.local_batch_size 1",
    f"{BASELINE}-documents=--skrull.no-enable --dataloader.packing documents --training.local_batch_size 1",
    "skrull=",
    "skrull-lockstep=--skrull.no-free_running",
]
DEFAULT_JOB = os.path.join(os.path.dirname(__file__), "..", "jobs", "debug_cpu.toml")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m skrull_ext.bench cp", description=__doc__.split("\n\n")[0])
    p.add_argument("--config-file", default=os.path.normpath(DEFAULT_JOB), help="job TOML (default: the debug job)")
    p.add_argument("--nproc", type=int, default=2, help="processes (default 2)")
    p.add_argument("--cp", type=int, default=2, help="context-parallel degree (default 2)")
    p.add_argument("--steps", type=int, default=10, help="training steps per run (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the timings (default 2)")
    p.add_argument("--repeats", type=int, default=3, help="runs per mode (default 3)")
    p.add_argument("--out", default="outputs/bench_cp", help="output folder (default outputs/bench_cp)")
    p.add_argument("--timeout", type=int, default=900, help="seconds allowed per run (default 900)")
    p.add_argument("--reuse", action="store_true",
                   help="report runs already complete under --out instead of running them again")
    p.add_argument("--variant", action="append", metavar="NAME=FLAGS",
                   help="a mode to run: a name and the job flags it adds (repeatable; the first is the "
                        f"reference of the K/V ratio). Default: {' '.join(DEFAULT_VARIANTS)}")
    p.add_argument("--versus", action="append", default=[], metavar="MODE",
                   help="also print each mode's paired per-repeat speed-up over MODE, per real token "
                        "(repeatable; every mode run with --skrull.no-enable gets one anyway), e.g. "
                        "--versus skrull to read what --skrull.lookahead buys; default: none)")
    p.add_argument("extra", nargs="*", help="more job flags for every mode, after --")
    a = p.parse_args(argv)
    a.modes = {}
    for v in a.variant or DEFAULT_VARIANTS:
        name, sep, flags = v.partition("=")
        if not sep or not name or name in a.modes:
            p.error(f"--variant {v!r}: expected a new NAME=FLAGS")
        a.modes[name] = flags.split()
    for v in a.versus:
        if v not in a.modes:
            p.error(f"--versus {v!r}: not a mode of this run (modes: {', '.join(a.modes)})")
    for name in ("nproc", "cp", "steps", "repeats"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(a, name)}")
    if a.nproc % a.cp:
        p.error(f"--nproc ({a.nproc}) must be a multiple of --cp ({a.cp})")
    if not 0 <= a.warmup < a.steps - 1:
        p.error(f"--warmup must be in [0, steps - 1) = [0, {a.steps - 1}), got {a.warmup}")
    return a


def read_probe(probe_dir: str, nproc: int) -> list[list[dict]]:
    """The per-rank step records a run's probe wrote (ranks that wrote none are missing)."""
    ranks = []
    for r in range(nproc):
        path = os.path.join(probe_dir, f"rank{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                ranks.append(json.load(f))
    return ranks


def launch(a: argparse.Namespace, mode: str, repeat: int) -> list[list[dict]]:
    """One torchrun of ``mode``; returns the probe's per-rank step records."""
    run_dir = os.path.abspath(os.path.join(a.out, "runs", f"{mode}_{repeat}"))
    probe_dir = os.path.join(run_dir, "probe")
    if a.reuse:
        ranks = read_probe(probe_dir, a.nproc)
        if len(ranks) == a.nproc and all(len(r) == a.steps for r in ranks):
            return ranks
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={a.nproc}",
        "-m", "torchtitan_patches.cp_probe", "skrull_ext.train", "--config-file", os.path.abspath(a.config_file),
        "--parallelism.context_parallel_degree", str(a.cp), "--training.steps", str(a.steps),
        "--dump_folder", run_dir, *a.modes[mode], *a.extra,
    ]
    env = dict(os.environ, SKRULL_BENCH_PROBE_OUT=probe_dir)
    env.setdefault("OMP_NUM_THREADS", "1")
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "log.txt"), "w") as log:
        proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=a.timeout)
    ranks = read_probe(probe_dir, a.nproc)
    complete = len(ranks) == a.nproc and all(len(r) == a.steps for r in ranks)
    if proc.returncode != 0:
        with open(os.path.join(run_dir, "log.txt")) as log:
            text = log.read()
        if not (complete and "Training completed" in text):
            tail = "".join(text.splitlines(keepends=True)[-30:])
            raise SystemExit(f"{mode} run {repeat} failed (exit {proc.returncode}); last lines of "
                             f"{run_dir}/log.txt:\n{tail}\ncommand: {' '.join(cmd)}")
        # Seen about once in 20 runs: gloo aborts in process teardown after the last
        # step (docs/benchmarks.md). Every step was measured, so the run counts.
        print(f"(exit {proc.returncode} after training completed, all steps measured; see {run_dir}/log.txt)",
              end=" ", flush=True)
    if not complete:
        raise SystemExit(f"{mode} run {repeat}: the probe recorded {[len(r) for r in ranks]} steps "
                         f"on {len(ranks)} of {a.nproc} ranks, expected {a.steps} each (under {probe_dir})")
    return ranks


def summarize_run(ranks: list[list[dict]], warmup: int) -> dict:
    """Figures of one run: per step the slowest rank's time and the bytes summed over ranks,
    averaged over the measured steps. The mean, not the median: steps carry different
    batches (one to eight micro-batches here), and time per step is what training pays."""
    for r, rank in enumerate(ranks):
        for rec in rank:
            if rec.get("dacp_stats_bytes") not in (None, rec["kv_bytes"]):
                raise SystemExit(f"rank {r} step {rec['step']}: the probe counted {rec['kv_bytes']} K/V bytes, "
                                 f"the DACP attention's counters {rec['dacp_stats_bytes']}")
    steps = len(ranks[0])
    measured = [i for i in range(steps) if i > warmup and ranks[0][i]["wall_s"] is not None]
    per_step = lambda key, agg: [agg(r[i][key] for r in ranks) for i in measured]  # noqa: E731
    wall = per_step("wall_s", max)
    tokens = per_step("local_tokens", sum), per_step("dist_tokens", sum)
    step_tokens = [ranks[0][i].get("step_tokens") for i in measured]
    return {
        "step_s": statistics.mean(wall),
        "tokens": statistics.mean(step_tokens) if None not in step_tokens else None,
        "step_s_all": wall,
        "kv_bytes": statistics.mean(per_step("kv_bytes", sum)),
        "blocked_s": statistics.mean(per_step("blocked_s", max)),
        "overlapped_s": statistics.mean(per_step("overlapped_s", max)),
        "local_token_share": sum(tokens[0]) / max(1, sum(tokens[0]) + sum(tokens[1])),
    }


def spread(xs: list[float], scale: float = 1.0, fmt: str = "{:.1f}") -> str:
    """'median (min-max)' of a list."""
    f = lambda x: fmt.format(x * scale)  # noqa: E731
    return f"{f(statistics.median(xs))} ({f(min(xs))}-{f(max(xs))})"


def baselines(modes: dict[str, list[str]], versus: Sequence[str] = ()) -> list[str]:
    """The modes that get a ratio column: those that run torchtitan's batching, then ``versus``."""
    own = [m for m, flags in modes.items() if "--skrull.no-enable" in flags]
    return own + [m for m in versus if m not in own]


def per_token(run: dict) -> float:
    """Seconds per real token of a run: modes whose steps hold different tokens
    (the 'stream' packing trains full rows, not a global batch) compare by this."""
    return run["step_s"] / run["tokens"] if run.get("tokens") else run["step_s"]


def table(results: dict[str, list[dict]], baselines: list[str]) -> str:
    """One row per mode; one paired ratio column per baseline, on time per real token."""
    reference = next(iter(results))
    base_mib = statistics.mean(b["kv_bytes"] for b in results[reference]) / 2**20
    rows = [
        f"| mode | real tokens/step | K/V MiB/step (all ranks) | vs {reference} | mean step ms, median (min-max) "
        "over runs | ms per 1K tokens | "
        + "".join(f"speed-up over {b} per token, per repeat | " for b in baselines)
        + "blocked on exchange ms/step | local attention ms/step (overlaps the exchange) | local token share |",
        "|---|---|---|---|---|---|" + "---|" * len(baselines) + "---|---|---|",
    ]
    for mode, runs in results.items():
        mib = statistics.mean(r["kv_bytes"] for r in runs) / 2**20
        tokens = [r["tokens"] for r in runs if r.get("tokens")]
        ratios = "".join(
            spread([per_token(b) / per_token(r) for b, r in zip(results[name], runs)], fmt="{:.2f}") + " | "
            for name in baselines)
        vs_base = f"{mib / base_mib:.2f}x" if base_mib else "-"  # no K/V moved by the baseline (CP 1)
        rows.append(
            f"| {mode} | {f'{statistics.mean(tokens):.0f}' if tokens else '-'} | "
            f"{mib:.2f} | {vs_base} | {spread([r['step_s'] for r in runs], 1e3)} "
            f"| {spread([per_token(r) for r in runs], 1e6) if tokens else '-'} | {ratios}"
            f"{spread([r['blocked_s'] for r in runs], 1e3)} | {spread([r['overlapped_s'] for r in runs], 1e3)} "
            f"| {100 * statistics.mean(r['local_token_share'] for r in runs):.0f}% |"
        )
    return "\n".join(rows)


def plot(results: dict[str, list[dict]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.3 * len(results) + 2.5, 4))
    data = [[s * 1e3 for r in runs for s in r["step_s_all"]] for runs in results.values()]
    ax.boxplot(data, tick_labels=list(results), showmeans=True)  # the mean is what the table reports
    ax.tick_params(axis="x", labelrotation=20)
    ax.set_ylabel("step time, slowest rank (ms)")
    ax.set_title("Step time, every measured step of every run\n(box: quartiles, triangle: mean)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    results: dict[str, list[dict]] = {m: [] for m in a.modes}
    order = [m for r in range(a.repeats) for m in (list(a.modes) if r % 2 == 0 else list(a.modes)[::-1])]
    t_start = time.perf_counter()
    for i, mode in enumerate(order):
        repeat = len(results[mode])
        t0 = time.perf_counter()
        print(f"[{i + 1}/{len(order)}] {mode} run {repeat + 1}/{a.repeats} ...", end=" ", flush=True)
        results[mode].append(summarize_run(launch(a, mode, repeat), a.warmup))
        print(f"{time.perf_counter() - t0:.0f} s (mean step {results[mode][-1]['step_s'] * 1e3:.0f} ms)", flush=True)
    md = table(results, baselines(a.modes, a.versus))
    header = (f"{a.config_file}, {a.nproc} processes, DP={a.nproc // a.cp} x CP={a.cp}, {a.steps} steps "
              f"(first {a.warmup + 1} not timed), "
              f"{a.repeats} runs per mode, {time.perf_counter() - t_start:.0f} s in all\n\n")
    with open(os.path.join(a.out, "bench_cp.md"), "w") as f:
        f.write(header + md + "\n")
    with open(os.path.join(a.out, "bench_cp.json"), "w") as f:
        json.dump({"args": vars(a), "results": results}, f, indent=1)
    plot(results, os.path.join(a.out, "bench_cp.png"))
    print("\n" + header + md)
    print(f"\nwrote {a.out}/bench_cp.md, .json, .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
