# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.


"""Where a training step's time goes, kernel by kernel, read off torch.profiler
(Chrome) traces: the GPU's busy time and idle gaps, what the host ran during
each gap, the kernels by family, the record_function ranges (the trainer's
phases among them) and the host-device synchronisations (trace_steps.py
measures them; this prints them).

    python -m skrull_ext.bench trace-report DIR [--top 15] [--gaps 8] [--out FILE]

DIR is a training run's dump folder (torchtitan's ``[profiler]``, switched on
with ``--profiler.enable_profiling``, writes
``profiling/traces/iteration_N/rank<R>_trace.json.gz``: torchtitan/tools/profiler.py),
any folder above or below it, or one trace file; every ``*trace*.json[.gz]``
under it is read, in iteration then rank order. A file that is not a Chrome
trace is skipped and counted.

The report opens with one summary line per traced step and its breakdown
(GPU time by family, the trainer's phases with the GPU time launched in
each), then, per trace and step, markdown tables: the largest idle gaps,
the families, the top kernels, the ranges, the outermost host ops, the host
syncs. A CPU trace (no device events) gives the host's side and says so.
docs/gpu.md, "Reading the trace report", says how to read it. A script, not
a test: nothing asserted.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from skrull_ext.bench.args import at_least
from skrull_ext.bench.trace_overlap import load_events
from skrull_ext.bench.trace_steps import LONG_GAP_MS, StepReport, analyze
from skrull_ext.errors import UserError


def _pct(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole > 0 else "-"


def summary_line(r: StepReport) -> str:
    """``ProfilerStep#6: span 303.1 ms, GPU idle 17.5% of the step (53.1 ms in 412 gaps); biggest: ...``."""
    head = f"{r.name}: span {r.span_ms:.1f} ms (host {r.host_ms:.1f})"
    if not r.device:
        return f"{head}; no device events in this trace (a CPU trace): the host's ranges only"
    n, long_ms = r.long_gaps()
    said = f"{head}, GPU busy {r.busy_ms:.1f} ms; GPU idle {_pct(r.idle_ms, r.span_ms)} of the step " \
           f"({r.idle_ms:.1f} ms in {len(r.gaps)} gaps, {long_ms:.1f} ms of it in the {n} of >= {LONG_GAP_MS} ms)"
    if r.gaps:
        g = r.gaps[0]
        said += f"; biggest: {g.ms:.2f} ms under {g.ranges}, host op {g.op}"
    if r.syncs:
        said += f"; {sum(s[2] for s in r.syncs)} host syncs, {sum(s[3] for s in r.syncs):.1f} ms"
    return said


PHASE_PREFIX = "skrull/phase_"
"""The trainer's phase ranges (train/step_phases.py's ``RANGE``, not imported: it would import torch)."""


def detail_lines(r: StepReport, families: int = 6) -> list[str]:
    """A step's one-line breakdowns under its summary line: GPU time by family, and the trainer's
    phases (train/step_phases.py's ranges) with the GPU time launched in each."""
    out = []
    if r.device and r.families:
        fams = ", ".join(f"{f} {ms:.1f}" for f, ms in list(r.families.items())[:families])
        out.append(f"  GPU ms by family: {fams}; top kernel: {_short(r.kernels[0][0], 60)} {r.kernels[0][3]:.1f} ms "
                   f"x{r.kernels[0][2]}")
    phases = [(n[len(PHASE_PREFIX):], host, gpu) for n, _, host, gpu in r.ranges if n.startswith(PHASE_PREFIX)]
    if phases:
        said = ", ".join(f"{k} {host:.1f}" + (f"/{gpu:.1f}" if r.device else "") for k, host, gpu in phases)
        out.append(f"  phases, host ms{'/GPU ms launched' if r.device else ''}: {said}")
    return out


def _table(header: Sequence[str], rows: Iterable[Sequence]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def _short(name: str, width: int = 90) -> str:
    name = name.replace("|", "/")
    return name if len(name) <= width else name[: width - 3] + "..."


def _more(shown: int, total: int, what: str) -> list[str]:
    return [f"({total - shown} more {what} not shown)"] if total > shown else []


def render(r: StepReport, top: int = 15, gaps: int = 8, ranges: int = 25) -> str:
    """One step's report in markdown: its summary line, then the tables."""
    lines = [f"### {r.name}", "", summary_line(r), *detail_lines(r), ""]
    if r.device:
        lines += [f"Largest GPU idle gaps ({min(gaps, len(r.gaps))} of {len(r.gaps)}):", ""]
        lines += _table(("gap ms", "at ms into the step", "host ranges open", "host op (share of the gap)"),
                        ((f"{g.ms:.3f}", f"{(g.start - r.start) * 1e-3:.3f}", _short(g.ranges, 200), g.op)
                         for g in r.gaps[:gaps]))
        lines += ["", "GPU time by family:", ""]
        lines += _table(("family", "GPU ms", "share of the step's device time"),
                        ((f, f"{ms:.3f}", _pct(ms, r.device_ms)) for f, ms in r.families.items()))
        lines += ["", f"Top {min(top, len(r.kernels))} kernels by total time:", ""]
        lines += _table(("kernel", "family", "count", "total ms", "mean us"),
                        ((_short(n), f, c, f"{ms:.3f}", f"{ms * 1e3 / c:.1f}") for n, f, c, ms in r.kernels[:top]))
        lines += _more(top, len(r.kernels), "kernels")
    lines += ["", "record_function ranges:" if r.ranges else "record_function ranges: none in this step", ""]
    if r.ranges:
        lines += _table(("range", "count", "host ms", "GPU ms launched inside"),
                        ((_short(n), c, f"{h:.3f}", f"{g:.3f}" if r.device else "-")
                         for n, c, h, g in r.ranges[:ranges]))
        lines += _more(ranges, len(r.ranges), "ranges")
    lines += ["", f"Top {min(top, len(r.host_ops))} outermost host ops by host time (every thread):", ""]
    lines += _table(("op", "count", "host ms"), ((_short(n), c, f"{ms:.3f}") for n, c, ms in r.host_ops[:top]))
    lines += _more(top, len(r.host_ops), "host ops")
    lines += ["", "Host syncs (calls that wait for the device):" if r.syncs else "Host syncs: none", ""]
    if r.syncs:
        lines += _table(("call", "range / op", "count", "host ms"),
                        ((c, _short(w), n, f"{ms:.3f}") for c, w, n, ms in r.syncs))
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines))


_NUMBER = re.compile(r"(\d+)")


def trace_files(path: str | Path) -> list[Path]:
    """The Chrome traces at ``path`` (a file, or every ``*trace*.json[.gz]`` under a folder), in
    iteration then rank order (numbers in the path compared as numbers)."""
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise UserError(f"trace-report: {path}: no such file or folder")
    files = [f for f in p.rglob("*") if f.is_file() and re.search(r"trace.*\.json(\.gz)?$", f.name)]
    natural = lambda f: [int(x) if x.isdigit() else x for x in _NUMBER.split(str(f.relative_to(p)))]  # noqa: E731
    return sorted(files, key=natural)


def report(path: str | Path, top: int = 15, gaps: int = 8) -> str:
    """The whole report of every trace at ``path``."""
    files = trace_files(path)
    if not files:
        raise UserError(f"trace-report: {path}: no *trace*.json[.gz] file under it (train with "
                        "--profiler.enable_profiling; torchtitan writes "
                        "profiling/traces/iteration_N/rank<R>_trace.json.gz)")
    out, summary, skipped = [], [], []
    for f in files:
        try:
            events = load_events(f)
        except (ValueError, KeyError, TypeError, OSError, EOFError) as e:
            skipped.append(f"{f} ({type(e).__name__})")
            continue
        steps = analyze(events, gaps)
        for s in steps:
            summary += [f"- {f.name if len(files) == 1 else f}: {summary_line(s)}", *detail_lines(s)]
        if not steps:
            summary.append(f"- {f}: no complete events")
        out += [f"## {f}", "", *(render(s, top, gaps) + "\n" for s in steps), ""]
    if skipped:
        summary.append(f"skipped {len(skipped)} file(s) that are not Chrome traces: " + "; ".join(skipped))
    return "\n".join(["# Trace report", "", *summary, "", *out]).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m skrull_ext.bench trace-report", description=__doc__.split("\n\n")[0])
    p.add_argument("path", help="a run's dump folder, its profiling/traces (or a folder in it), or one trace file")
    p.add_argument("--top", type=at_least(1), default=15, help="kernels listed per step (default 15)")
    p.add_argument("--gaps", type=at_least(0), default=8, help="idle gaps named per step (default 8)")
    p.add_argument("--out", default=None, help="also write the report to this file")
    a = p.parse_args(argv)
    text = report(a.path, a.top, a.gaps)
    print(text, end="")
    if a.out:
        Path(a.out).write_text(text)
    return 0
