"""One table of a ``bench cp`` run's modes: what each trained per second,
at what MFU and memory, which documents it cut, how often it recompiled,
and, for Skrull, how the cost model's step time and
the profile's memory account compare with the measurement.

    python -m skrull_ext.bench train-report outputs/bench_cp [--profile P.toml] [--before OLD.toml] [--warmup 8]
        [--until 44]
    python -m skrull_ext.bench train-report outputs/run_a outputs/run_b    # training dump folders

A folder is a ``bench cp`` output (one mode per ``runs/<mode>_0``) or a
training run's ``dump_folder`` (one mode, named after the folder; it needs
``--metrics.enable_tensorboard``). A dump folder has no probe: its steps are
read from rank 0's ``time_metrics/end_to_end(s)`` (each logged step's mean
over the steps since the last log, so exact at ``metrics.log_freq = 1``) and
``n_tokens_seen`` (rank 0's tokens, where the probe counts every rank's), so
its tokens/s is compared with other dump folders, not with ``bench cp``'s.

Reads what the runs already wrote (no process is started): the probe's per
step wall time and real tokens (``torchtitan_patches/cp_probe.py``; padding
excluded, so padded batching is charged for its pad tokens) and rank 0's
TensorBoard scalars: torchtitan's loss, ``mfu(%)`` (its FLOPs per *input*
token, pads included: an upper bound for padded batching), the
document-aware ``documents/tflops`` and ``documents/mfu(%)`` (attention
priced from each trained document or cut piece: skrull_ext/train/doc_flops.py;
over the kept steps weighted by their wall time, as real tokens/s is),
the run's ``documents/cut_documents`` and ``documents/context_lost_tokens``,
``compile/graphs`` (recompiles after warm-up: its rise after ``--warmup``) and
``memory/max_reserved(GiB)`` / ``max_active`` (the step's peak, reset each
logged step), and Skrull's ``skrull/predicted_us``, ``skrull/measured_us``
(the whole step as run), ``skrull/max_rank_tokens`` and the step by phase
(``skrull/phase_<key>_ms``, ``skrull/step_outside_ms``: train/step_phases.py,
under either batching, torchtitan's predicting nothing; the table gives each
phase's median and the median share outside the micro-batches), and what a
Skrull run settled at start-up (train/run_settings.py: the
activation-checkpointing mode, the BucketSize, the head's chunk tokens). The predicted
memory of a Skrull step is the profile's static account plus its activation fit
(under the mode the run chose, where the profile measured it) at the step's largest
micro-batch (``ProfileMemory``; no margin), plus what free-running holds
(``skrull/free_running_bytes``: the unsharded parameters and gradients the
trainer budgets; without it, steps of two or more micro-batches measured up
to x1.12 on an H200). ``--before P.toml`` (the profile an earlier run planned
with) adds a line of BucketSizes: that profile's, the ``--profile``'s per
mode, and each Skrull run's as run. Steps after ``--until`` are not read at all (steps a run
trained past the timed ones under torch.profiler: tools/gpu_checks.sh's TRACE, whose traces
``bench trace-report`` reads). Steps up to ``--warmup`` (compile,
allocator growth) are left out. A kept step over ``SLOW`` times the mode's
median step is named, and the mode's real tokens/s is also given without
those steps: a recompile (a new shape class of a dynamic-shape graph) costs
seconds once, 6.6 s of one 34-step H200 run (docs/results/gpu.md), which a
short run's mean cannot tell from a slower mode. Written beside the runs:
``train_report.md`` and ``train_report.json``. A script, not a test: nothing
asserted.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import statistics

from skrull_ext.bench.args import at_least, profile_path

GIB = 2**30
SLOW = 5.0
"""A kept step longer than this many times the mode's median step is named as slow."""


def scalars(run_dir: str) -> dict[str, dict[int, float]]:
    """Every scalar tag of rank 0's newest TensorBoard run: tag -> step -> value."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = sorted(glob.glob(os.path.join(run_dir, "tb", "*")))
    if not runs:
        return {}
    acc = EventAccumulator(runs[-1], size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def probe_steps(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "probe", "rank0.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)


def dump_steps(tags: dict[str, dict[int, float]]) -> list[dict]:
    """Per-step records of a training dump folder from rank 0's scalars (module docstring):
    each step of a logging interval gets the interval's mean time and tokens."""
    e2e, seen = tags.get("time_metrics/end_to_end(s)", {}), tags.get("n_tokens_seen", {})
    out, prev, prev_seen = [], 0, 0.0
    for k in sorted(e2e):
        tokens = (seen[k] - prev_seen) / (k - prev) if k in seen else None
        out += [{"step": s, "wall_s": e2e[k], "step_tokens": tokens} for s in range(prev + 1, k + 1)]
        prev, prev_seen = k, seen.get(k, prev_seen)
    return out


def median(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.median(xs) if xs else math.nan


def tokens_per_s(steps: list[dict]) -> float:
    wall = sum(s["wall_s"] for s in steps)
    return sum(s.get("step_tokens") or 0 for s in steps) / wall if wall > 0 else math.nan


def time_weighted(rate: dict[int, float], kept: list[dict]) -> float:
    """A per-step rate over the kept steps, each weighted by its wall time: the work of
    those steps over their time, as real tokens/s is (a median of rates is not)."""
    pairs = [(rate[s["step"]], s["wall_s"]) for s in kept if s["step"] in rate]
    wall = sum(w for _, w in pairs)
    return sum(r * w for r, w in pairs) / wall if wall > 0 else math.nan


def last(tags: dict[str, dict[int, float]], tag: str) -> float:
    """A run total's value at the last logged step (NaN when not logged)."""
    values = tags.get(tag, {})
    return values[max(values)] if values else math.nan


def graphs_after(tags: dict[str, dict[int, float]], warmup: int) -> float:
    """Graphs dynamo compiled after step ``warmup`` (``compile/graphs`` counts them since the start)."""
    graphs = tags.get("compile/graphs", {})
    before = [v for k, v in graphs.items() if k <= warmup]
    return graphs[max(graphs)] - max(before) if graphs and before else math.nan


def settings(tags: dict[str, dict[int, float]]) -> dict:
    """What a Skrull run settled at start-up (train/run_settings.py), {} for a run that logged none:
    the checkpointing mode's name (None: a kind no profile measures), the BucketSize and the head's
    chunk tokens (0: unchunked) and whether its chunks computed their gradients in forward (None: a run
    from before the tag), each as logged at the last step."""
    from skrull_ext.train.run_settings import AC_TAG, BUCKET_TAG, CHUNK_TAG, IN_FORWARD_TAG, mode_named

    if BUCKET_TAG not in tags:
        return {}
    return {"activation_checkpoint": mode_named(last(tags, AC_TAG)) if AC_TAG in tags else None,
            "bucket_size": int(last(tags, BUCKET_TAG)),
            "head_chunk_tokens": int(last(tags, CHUNK_TAG)) if CHUNK_TAG in tags else None,
            "head_in_forward": bool(last(tags, IN_FORWARD_TAG)) if IN_FORWARD_TAG in tags else None}


def memory_under(profile, mode: str | None):
    """The profile's memory model as a run of checkpointing ``mode`` priced it (its per-mode fit where
    the profile measured that mode: Profile.under_mode); None without a profile."""
    if profile is None:
        return None
    return (profile.under_mode(mode) if mode is not None else profile).memory()


def summarize_mode(run_dir: str, warmup: int, memory=None, profile=None, until: int | None = None) -> dict:
    """The figures of one mode's run (NaN where the run did not log them). ``memory``: the memory
    model to price it with; else ``profile``'s under the run's logged checkpointing mode. ``until``:
    the last step read (None: every step), so a run total is read at it too."""
    tags = scalars(run_dir)
    if until is not None:
        tags = {tag: {k: v for k, v in values.items() if k <= until} for tag, values in tags.items()}
    settled = settings(tags)
    if memory is None:
        memory = memory_under(profile, settled.get("activation_checkpoint"))
    steps = [s for s in probe_steps(run_dir) or dump_steps(tags) if until is None or s["step"] <= until]
    kept = [s for s in steps if s["step"] > warmup and s.get("wall_s")]
    typical = median([s["wall_s"] for s in kept])
    slow = [s for s in kept if s["wall_s"] > SLOW * typical]
    losses = list(tags.get("loss_metrics/global_avg_loss", {}).values())
    after = lambda tag: [v for k, v in tags.get(tag, {}).items() if k > warmup]  # noqa: E731
    out = {
        "steps": len(steps), "measured_steps": len(kept),
        "real_tokens_per_s": tokens_per_s(kept),
        "step_ms": 1e3 * statistics.mean(s["wall_s"] for s in kept) if kept else math.nan,
        "median_step_ms": 1e3 * typical,
        "slow_steps": [s["step"] for s in slow],
        "slow_steps_ms": [1e3 * s["wall_s"] for s in slow],
        "real_tokens_per_s_without_slow": tokens_per_s([s for s in kept if s not in slow]),
        "mfu_pct": median(after("mfu(%)")),
        "document_tflops": time_weighted(tags.get("documents/tflops", {}), kept),
        "document_mfu_pct": time_weighted(tags.get("documents/mfu(%)", {}), kept),
        "cut_documents": last(tags, "documents/cut_documents"),
        "context_lost_tokens": last(tags, "documents/context_lost_tokens"),
        "recompiles_after_warmup": graphs_after(tags, warmup),
        "peak_reserved_gib": max(after("memory/max_reserved(GiB)"), default=math.nan),
        "peak_active_gib": max(after("memory/max_active(GiB)"), default=math.nan),
        "losses_finite": bool(losses) and all(math.isfinite(x) for x in losses),
        "first_loss": losses[0] if losses else math.nan, "last_loss": losses[-1] if losses else math.nan,
        **settled,
    }
    predicted, measured = tags.get("skrull/predicted_us", {}), tags.get("skrull/measured_us", {})
    if predicted:
        ratios = [measured[k] / predicted[k] for k in predicted if k > warmup and k in measured and predicted[k] > 0]
        out["measured_over_predicted"] = median(ratios)
        out["predicted_step_ms"] = median([predicted[k] / 1e3 for k in predicted if k > warmup])
    from skrull_ext.train.step_phases import PHASES

    phases = {k: median(after(f"skrull/phase_{k}_ms")) for k in [*(p.key for p in PHASES), "rest", "rest_host"]
              if tags.get(f"skrull/phase_{k}_ms")}  # the step by phase, either batching (train/step_phases.py);
    # rest_host: the host's clock over rest's gaps (a GPU's rest that it matches is the device waiting for the host)
    if phases:
        out["phases_ms"] = phases
        outside = tags.get("skrull/step_outside_ms", {})
        out["outside_share"] = median([outside[k] * 1e3 / measured[k] for k in outside
                                       if k > warmup and measured.get(k, 0) > 0])
    tokens_by_step = tags.get("skrull/max_rank_tokens", {})
    active = tags.get("memory/max_active(GiB)", {})
    held = tags.get("skrull/free_running_bytes", {})  # free-running's unsharded parameters and gradients
    if memory is not None and tokens_by_step:
        pairs = [(active[k] * GIB, memory.static + memory.activation_any(int(t)) + held.get(k, 0.0))
                 for k, t in tokens_by_step.items() if k > warmup and k in active]
        out["memory_over_predicted"] = median([m / p for m, p in pairs if p > 0])
        out["memory_over_predicted_max"] = max((m / p for m, p in pairs if p > 0), default=math.nan)
        out["reserved_over_predicted"] = out["peak_reserved_gib"] * GIB / max((p for _, p in pairs), default=math.nan)
    return out


def table(results: dict[str, dict]) -> str:
    def f(x, fmt):
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)

    def phases(r):
        if not r.get("phases_ms"):
            return "-"
        said = " ".join(f"{k} {ms:.0f}" for k, ms in r["phases_ms"].items())
        return f"{said} ({f(r.get('outside_share'), '{:.0%}')})"

    def slow(r):
        if not r.get("slow_steps"):
            return "-"
        named = ", ".join(f"{k} ({ms:,.0f} ms)" for k, ms in zip(r["slow_steps"], r["slow_steps_ms"]))
        return f"{named}: {r['real_tokens_per_s_without_slow']:,.0f} without"

    def chunk(r):
        tokens, in_forward = r.get("head_chunk_tokens"), r.get("head_in_forward")
        if tokens is None:
            return "-"
        if tokens == 0:
            return "unchunked"
        return f"{tokens:,}" + ("" if in_forward is None else ", in forward" if in_forward else ", recomputed")

    rows = ["| mode | activation checkpointing | BucketSize | head chunk tokens "
            "| real tokens/s | mean step ms | median step ms "
            f"| steps over {SLOW:g}x the median: real tokens/s without them "
            "| document-aware TFLOP/s a device | document-aware MFU % | MFU % (torchtitan's, seq_len-priced) "
            "| cut documents | tokens without their context | recompiles after warm-up "
            "| peak reserved GiB | peak active GiB "
            "| measured / predicted step | measured / predicted memory (median, max) | reserved / predicted "
            "| losses finite | step phases ms, median (outside the micro-batches) |",
            "|" + "---|" * 21]
    for mode, r in results.items():
        rows.append(
            f"| {mode} | {r.get('activation_checkpoint') or '-'} | {f(r.get('bucket_size'), '{:,}')} | {chunk(r)} "
            f"| {f(r['real_tokens_per_s'], '{:,.0f}')} | {f(r['step_ms'], '{:.1f}')} | "
            f"{f(r.get('median_step_ms'), '{:.1f}')} | {slow(r)} | "
            f"{f(r.get('document_tflops'), '{:.3g}')} | {f(r.get('document_mfu_pct'), '{:.1f}')} | "
            f"{f(r['mfu_pct'], '{:.1f}')} | {f(r.get('cut_documents'), '{:,.0f}')} | "
            f"{f(r.get('context_lost_tokens'), '{:,.0f}')} | {f(r.get('recompiles_after_warmup'), '{:.0f}')} | "
            f"{f(r['peak_reserved_gib'], '{:.2f}')} | {f(r['peak_active_gib'], '{:.2f}')} | "
            f"{f(r.get('measured_over_predicted'), 'x{:.2f}')} | "
            f"{f(r.get('memory_over_predicted'), 'x{:.2f}')}, {f(r.get('memory_over_predicted_max'), 'x{:.2f}')} | "
            f"{f(r.get('reserved_over_predicted'), 'x{:.2f}')} | "
            f"{'yes' if r['losses_finite'] else 'NO'} | {phases(r)} |")
    rows += ["", *ratios(results)]
    return "\n".join(rows)


BASELINES = ("torchtitan-documents", "torchtitan-stream")
"""The modes every other is compared with, when the report has them."""


def ratios(results: dict[str, dict]) -> list[str]:
    """Each mode against each baseline present: real tokens/s (equal data) and
    document-aware TFLOP/s (equal useful work: a cut document trains less attention)."""
    out = []
    for base in (b for b in BASELINES if b in results):
        ref = results[base]
        for mode, r in results.items():
            if mode == base:
                continue
            tok = r["real_tokens_per_s"] / ref["real_tokens_per_s"]
            flops = r.get("document_tflops", math.nan) / ref.get("document_tflops", math.nan)
            out.append(f"{mode} / {base}: real tokens/s x{tok:.2f}, document-aware TFLOP/s x{flops:.2f}")
    return out


def against(results: dict[str, dict], base: str) -> list[str]:
    """Each other mode against ``base`` (an A/B variant against the run it varies: tools/gpu_checks.sh
    passes the traced Skrull mode): the median step, the document-aware TFLOP/s, and where the median
    step's time moved, phase by phase (ms, the phases both logged)."""
    if base not in results:
        raise SystemExit(f"train-report: --against {base}: no such mode (modes: {', '.join(results)})")
    ref, out = results[base], []
    for mode, r in results.items():
        if mode == base:
            continue
        step = r.get("median_step_ms", math.nan) / ref.get("median_step_ms", math.nan)
        flops = r.get("document_tflops", math.nan) / ref.get("document_tflops", math.nan)
        mine, theirs = r.get("phases_ms") or {}, ref.get("phases_ms") or {}
        moved = ", ".join(f"{k} {mine[k] - theirs[k]:+.1f}" for k in mine if k in theirs)
        out.append(f"{mode} / {base}: median step x{step:.3f}, document-aware TFLOP/s x{flops:.3f}"
                   + (f"; phases ms: {moved}" if moved else ""))
    return out


def bucket_line(results: dict[str, dict], before, profile=None) -> str | None:
    """BucketSizes against ``before``'s (a Profile an earlier run planned with; None: no line): the
    fresh ``profile``'s per measured checkpointing mode, and each run's as run, each as a ratio."""
    if before is None or not before.bucket_size:
        return None
    old = before.bucket_size
    ratio = lambda b: f"{b:,} (x{b / old:.2f})"  # noqa: E731
    said = [f"BucketSize before: {old:,} ({before.path}"
            f"{', measured under ' + before.measured_checkpointing if before.measured_checkpointing else ''})"]
    if profile is not None and profile.bucket_size:
        modes = {m: c.bucket_size for m, c in profile.checkpointing_modes.items()}
        fresh = ", ".join(f"{m} {ratio(b)}" for m, b in modes.items()) if modes else ratio(profile.bucket_size)
        said.append(f"the profile's ({profile.path}): {fresh}")
    said += [f"{name} as run: {ratio(r['bucket_size'])}, {r.get('activation_checkpoint') or 'mode not logged'}"
             for name, r in results.items() if r.get("bucket_size")]
    return "; ".join(said)


def mode_dirs(folder: str) -> dict[str, str]:
    """Mode name -> run folder: a ``bench cp`` output's ``runs/<mode>_0``, or a dump folder itself."""
    runs = sorted(glob.glob(os.path.join(folder, "runs", "*_0")))
    if runs:
        return {os.path.basename(d)[:-2]: d for d in runs}
    if glob.glob(os.path.join(folder, "tb", "*")):
        return {os.path.basename(os.path.normpath(folder)): folder}
    raise SystemExit(f"train-report: {folder}: no runs under {folder}/runs (a `bench cp` output) and no TensorBoard "
                     "events under {folder}/tb (a training dump folder: train with --metrics.enable_tensorboard)"
                     .replace("{folder}", folder))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m skrull_ext.bench train-report", description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="+", help="`bench cp` output folders (their runs/<mode>_<repeat>/) or training "
                                          "dump folders (their tb/); the report is written into the first")
    p.add_argument("--profile", default=None, type=profile_path, help="the profile TOML Skrull ran with (its [memory] predicts memory)")
    p.add_argument("--before", default=None, type=profile_path, help="the profile an earlier run planned with: its BucketSize "
                                                  "beside the --profile's and each run's")
    p.add_argument("--warmup", type=at_least(0), default=2, help="steps left out (default 2)")
    p.add_argument("--until", type=at_least(1), default=None, help="the last step read (default: every step): "
                                                                   "steps traced after the timed ones left out")
    p.add_argument("--against", default=None, metavar="MODE", help="each other mode against this one: median "
                                                                   "step, TFLOP/s and the phases that moved (an A/B)")
    a = p.parse_args(argv)
    from skrull_ext.scheduler.profile_file import Profile

    profile = Profile.load(a.profile) if a.profile else None
    before = Profile.load(a.before) if a.before else None
    modes = {}
    for folder in a.out:
        for name, run_dir in mode_dirs(folder).items():
            modes[name if name not in modes else run_dir] = run_dir
    results = {name: summarize_mode(d, a.warmup, profile=profile, until=a.until) for name, d in modes.items()}
    text = table(results)
    if a.against is not None:
        text += "\n\n" + "\n".join(against(results, a.against))
    if (line := bucket_line(results, before, profile)) is not None:
        text += "\n" + line
    print(text)
    with open(os.path.join(a.out[0], "train_report.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(a.out[0], "train_report.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 0
